// What one grid-wide barrier of decode_run costs, alone, and whether another
// shape of barrier costs less. One block per SM (all resident), each round
// every block writes a few values (the rows and statistics a phase leaves),
// then all meet at a barrier; the period of a round is the barrier's
// latency. Modes:
//   one:     every block adds to one counter (red.release), thread 0 polls
//            it (ld.acquire) -- decode_run today;
//   split:   eight counters on their own 128-byte lines, block b adds to
//            counter b % 8, lanes 0..7 of warp 0 poll one counter each (the
//            132 atomics spread over eight L2 slices instead of one);
//   flags:   block b stores the round to its own word (st.release), warp 0
//            polls all words (no atomics; 132 words over five lines);
//   relaxed: `one` without the release fence (not a correct barrier for
//            data: the bound of what the fence costs).
// With COPY=1 each block also keeps a bulk copy of 16 KiB from DRAM to
// shared memory in flight, as decode_run's weight ring does.
// Build and run on the device machine (prints a markdown table):
//   nvcc -O2 -arch=sm_90a -o /tmp/bm scripts/barrier-micro.cu &&
//   for c in 0 1; do for m in one split flags relaxed; do timeout 20 /tmp/bm $m $c; done; done
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>

#include "micro.cuh"

#define CK(x)                                                                      \
    do {                                                                           \
        cudaError_t err_ = (x);                                                    \
        if (err_ != cudaSuccess) {                                                 \
            printf("%s: %s\n", #x, cudaGetErrorString(err_));                       \
            exit(1);                                                               \
        }                                                                          \
    } while (0)

constexpr int THREADS = 256;
constexpr int ITERS = 20000;
constexpr int SPLIT = 8;
// Words between counters: each on its own 128-byte line.
constexpr int LINE = 32;
constexpr int SMEM = 200 << 10;
constexpr unsigned COPY_BYTES = 16384;
// Source chunks: 64 MiB, more than L2 holds, so copies come from DRAM.
constexpr int CHUNKS = 4096;

enum Mode { ONE, SPLIT_MODE, FLAGS, RELAXED };

// Arrivals counter k receives a round: the blocks b < nb with b % SPLIT == k.
__device__ __forceinline__ unsigned split_share(int k, int nb) {
    return (unsigned)((nb - k + SPLIT - 1) / SPLIT);
}

__global__ void __launch_bounds__(THREADS, 1)
    rounds(Mode mode, int copy, unsigned* bar, float* rows, const unsigned char* weights, int iters,
           unsigned long long* out) {
    extern __shared__ __align__(128) unsigned char dsm[];
    __shared__ __align__(8) unsigned long long mbar;
    int nb = gridDim.x, b = blockIdx.x;
    if (threadIdx.x == 0 && copy) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&mbar)) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    unsigned phase = 0;
    unsigned long long t0 = now_ns();
    for (int it = 1; it <= iters; ++it) {
        // A phase's outputs: 20 rows and a statistics pair a block.
        if (threadIdx.x < 22) rows[b * 32 + threadIdx.x] = (float)(it + threadIdx.x);
        if (threadIdx.x == 32 && copy) {
            // The previous round's copy is done (waited below); start another.
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(&mbar)),
                         "r"(COPY_BYTES)
                         : "memory");
            asm volatile(
                "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                    smem_addr(dsm)),
                "l"(weights + (size_t)((it * nb + b) % CHUNKS) * COPY_BYTES), "r"(COPY_BYTES), "r"(smem_addr(&mbar))
                : "memory");
        }
        __syncthreads();
        if (mode == ONE || mode == RELAXED) {
            if (threadIdx.x == 0) {
                if (mode == ONE)
                    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(bar) : "memory");
                else
                    asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(bar) : "memory");
                unsigned target = (unsigned)it * (unsigned)nb;
                while ((int)(ld_acquire(bar) - target) < 0) {
                }
            }
        } else if (mode == SPLIT_MODE) {
            if (threadIdx.x == 0)
                asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(bar + (b % SPLIT) * LINE) : "memory");
            if (threadIdx.x < SPLIT) {
                unsigned target = (unsigned)it * split_share(threadIdx.x, nb);
                while ((int)(ld_acquire(bar + threadIdx.x * LINE) - target) < 0) {
                }
            }
            __syncwarp();
        } else {
            if (threadIdx.x == 0)
                asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(bar + b), "r"((unsigned)it) : "memory");
            if (threadIdx.x < 32) {
                for (int i = threadIdx.x; i < nb; i += 32)
                    while ((int)(ld_acquire(bar + i) - (unsigned)it) < 0) {
                    }
            }
            __syncwarp();
        }
        __syncthreads();
        if (copy && threadIdx.x == 32) {
            unsigned ok = 0;
            while (!ok)
                asm volatile(
                    "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                    : "=r"(ok)
                    : "r"(smem_addr(&mbar)), "r"(phase)
                    : "memory");
            phase ^= 1;
        }
    }
    if (threadIdx.x == 0) out[b] = (now_ns() - t0) / iters;
}

int main(int argc, char** argv) {
    const char* m = argc > 1 ? argv[1] : "one";
    int copy = argc > 2 ? atoi(argv[2]) : 0;
    Mode mode = !strcmp(m, "split") ? SPLIT_MODE : !strcmp(m, "flags") ? FLAGS : !strcmp(m, "relaxed") ? RELAXED : ONE;
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    unsigned* bar;
    float* rows;
    unsigned char* weights;
    unsigned long long* out;
    CK(cudaMalloc(&bar, 4096 * 4));
    CK(cudaMalloc(&rows, sms * 32 * 4));
    CK(cudaMalloc(&weights, (size_t)CHUNKS * COPY_BYTES));
    CK(cudaMalloc(&out, sms * 8));
    CK(cudaFuncSetAttribute(rounds, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
    for (int rep = 0; rep < 2; ++rep) {
        CK(cudaMemset(bar, 0, 4096 * 4));
        rounds<<<sms, THREADS, SMEM>>>(mode, copy, bar, rows, weights, rep ? ITERS : 100, out);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
    }
    unsigned long long* h = (unsigned long long*)malloc(sms * 8);
    CK(cudaMemcpy(h, out, sms * 8, cudaMemcpyDeviceToHost));
    unsigned long long mx = 0;
    for (int i = 0; i < sms; ++i) mx = h[i] > mx ? h[i] : mx;
    printf("| %s | %d | %d | %.3f |\n", m, copy, sms, mx / 1e3);
    return 0;
}
