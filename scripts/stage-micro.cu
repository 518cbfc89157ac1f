// What decode_run's "stage" costs, alone: after a grid barrier, every block
// of a persistent grid (one per SM) reads the whole input row that all the
// blocks wrote just before the barrier, from L2, and reduces it (the trace
// says 2.2-2.6 us at 2560 floats and 4.2 at 6912). Per row width, this times
// the barrier and the stage for
//   f32:   every block reads the row (decode_run today);
//   f16:   the same at half the bytes (is the stage bound by bytes?);
//   c2/c4: clusters of 2 or 4 blocks, each reading 1/C of the row and
//          writing it into every block of its cluster through distributed
//          shared memory, then a cluster barrier (exact, C times fewer L2 reads);
//   ll:    no barrier: each value carries the round's flag in its 8-byte
//          word, and readers poll until every flag is theirs (NCCL's LL).
// A third argument, COPY bytes (a multiple of 16 up to 128 KiB), has thread
// 32 of every block start a bulk copy of that many bytes from DRAM into
// shared memory as the round begins (before the barrier's arrival; with ll
// before the polls) and wait for it at the round's end, as decode_run's ring
// producer refills at each phase boundary.
// Build and run on the device machine (prints a markdown table):
//   nvcc -O2 -arch=sm_90a -o /tmp/sm scripts/stage-micro.cu && /tmp/sm &&
//   for k in 256 2560 6912; do for m in f32 f16 c2 c4 ll; do timeout 20 /tmp/sm $m $k; done; done
//   for c in 0 32768; do for m in f32 ll; do timeout 20 /tmp/sm $m 2560 $c; done; done
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <cuda_runtime.h>

#include "micro.cuh"

#define CK(x) do { cudaError_t err_ = (x); if (err_ != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(err_)); exit(1); } } while (0)

constexpr int THREADS = 256;
constexpr int ITERS = 2000;
// Dynamic shared memory a block asks for: the row, and enough beyond it
// that one block fills an SM, as decode_run's weight ring does.
constexpr int SMEM = 200 << 10;
// Where a round's bulk copy lands in shared memory (past any staged row),
// its largest size, and the DRAM it reads: 64 MiB, more than L2 holds.
constexpr int COPY_AT = 64 << 10;
constexpr int COPY_MAX = 128 << 10;
constexpr size_t COPY_SRC = 64ull << 20;

// A round's copy (`bytes` > 0, thread 32): started with `start`, waited for
// with `finish`, which flips the mbarrier's parity.
struct RoundCopy {
    unsigned long long mbar;
    unsigned parity;
};

__device__ __forceinline__ void copy_init(RoundCopy* rc, int bytes) {
    if (bytes > 0 && threadIdx.x == 32) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&rc->mbar)) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        rc->parity = 0;
    }
    __syncthreads();
}

__device__ __forceinline__ void copy_start(RoundCopy* rc, int bytes, const unsigned char* src, int it, void* dst) {
    if (bytes <= 0 || threadIdx.x != 32) return;
    size_t chunks = COPY_SRC / (size_t)bytes;
    const unsigned char* from = src + ((size_t)it * gridDim.x + blockIdx.x) % chunks * (size_t)bytes;
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(&rc->mbar)), "r"(bytes)
                 : "memory");
    for (int o = 0; o < bytes; o += 32768) {
        int n = bytes - o < 32768 ? bytes - o : 32768;
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                smem_addr((char*)dst + o)),
            "l"(from + o), "r"(n), "r"(smem_addr(&rc->mbar))
            : "memory");
    }
}

__device__ __forceinline__ void copy_finish(RoundCopy* rc, int bytes) {
    if (bytes <= 0 || threadIdx.x != 32) return;
    unsigned ok = 0;
    while (!ok)
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(ok)
                     : "r"(smem_addr(&rc->mbar)), "r"(rc->parity)
                     : "memory");
    rc->parity ^= 1;
}

__device__ __forceinline__ float block_sum(float v, float* red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float s = 0.0f;
    for (int w = 0; w < THREADS / 32; ++w) s += red[w];
    return s;
}

// The staged row's sum of squares, as the norm's would be.
__device__ __forceinline__ float sum_squares(const float* xs, int k, float* red) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < k; i += THREADS) ss += xs[i] * xs[i];
    return block_sum(ss, red);
}

__device__ __forceinline__ unsigned short f2h(float v) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
}

__device__ __forceinline__ float h2f(unsigned h) {
    float v;
    asm("cvt.f32.f16 %0, %1;" : "=f"(v) : "h"((unsigned short)h));
    return v;
}

// This block's rank in its cluster, and a cluster barrier (release/acquire:
// peers' stores into this block's shared memory are visible after it).
__device__ __forceinline__ int cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return (int)r;
}

__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// Four floats into shared memory at `p` of cluster block `rank`.
__device__ __forceinline__ void st_cluster4(float* p, int rank, float4 v) {
    unsigned local = (unsigned)__cvta_generic_to_shared(p), remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
    asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(remote), "f"(v.x), "f"(v.y), "f"(v.z),
                 "f"(v.w)
                 : "memory");
}

// One 16-byte word of the row as floats: an f32 word is 4 values (`lo`),
// an f16 word 8 (then `hi` too).
template <bool HALF>
__device__ __forceinline__ void load_word(const void* row, int i, float4* lo, float4* hi) {
    uint4 w = __ldcg((const uint4*)row + i);
    if (HALF) {
        const unsigned u[4] = {w.x, w.y, w.z, w.w};
        *lo = make_float4(h2f(u[0] & 0xffff), h2f(u[0] >> 16), h2f(u[1] & 0xffff), h2f(u[1] >> 16));
        *hi = make_float4(h2f(u[2] & 0xffff), h2f(u[2] >> 16), h2f(u[3] & 0xffff), h2f(u[3] >> 16));
    } else {
        *lo = make_float4(__uint_as_float(w.x), __uint_as_float(w.y), __uint_as_float(w.z), __uint_as_float(w.w));
    }
}

// C = 1: plain blocks; C > 1: clusters of C (the kernel is launched with
// that cluster shape). `out`: per block, mean barrier and stage ns.
template <int C, bool HALF>
__global__ void __launch_bounds__(THREADS, 1)
    stage(void* row, int k, unsigned* bar, int iters, unsigned long long* out, float* sink, const unsigned char* src,
          int copy) {
    extern __shared__ __align__(128) float xs[];
    __shared__ float red[THREADS / 32];
    __shared__ RoundCopy rc;
    copy_init(&rc, copy);
    int nb = gridDim.x, b = blockIdx.x;
    int per = HALF ? 8 : 4, nw = k / per;
    unsigned target = 0;
    unsigned long long t_bar = 0, t_stage = 0;
    int rank = C > 1 ? cluster_rank() : 0;
    for (int it = 0; it < iters; ++it) {
        // The writers: each block its slice of the row.
        for (int i = b * THREADS + threadIdx.x; i < k; i += nb * THREADS) {
            float v = (float)((it * 7 + i) % 97) * 0.01f;
            if (HALF) ((unsigned short*)row)[i] = f2h(v);
            else ((float*)row)[i] = v;
        }
        __syncthreads();
        copy_start(&rc, copy, src, it, (char*)xs + COPY_AT);
        unsigned long long t0 = now_ns();
        if (threadIdx.x == 0) {
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(bar) : "memory");
            target += (unsigned)nb;
            while ((int)(ld_acquire(bar) - target) < 0) {
            }
        }
        __syncthreads();
        unsigned long long t1 = now_ns();
        // The stage: the row into shared memory (every block's own copy),
        // then a reduction over it, as the norm's sum of squares is.
        for (int i = rank + C * (int)threadIdx.x; i < nw; i += C * THREADS) {
            float4 lo, hi = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            load_word<HALF>(row, i, &lo, &hi);
            float* dst = xs + i * per;
            if (C > 1) {
                for (int r = 0; r < C; ++r) {
                    st_cluster4(dst, r, lo);
                    if (HALF) st_cluster4(dst + 4, r, hi);
                }
            } else {
                *(float4*)dst = lo;
                if (HALF) *(float4*)(dst + 4) = hi;
            }
        }
        if (C > 1) cluster_sync();
        else __syncthreads();
        float ss = sum_squares(xs, k, red);
        unsigned long long t2 = now_ns();
        if (threadIdx.x == 0) {
            t_bar += t1 - t0;
            t_stage += t2 - t1;
            sink[b] = ss;
        }
        // Nobody rewrites the row (next iteration) before all have read it,
        // and no block's shared row is written by a peer still reading it.
        if (C > 1) cluster_sync();
        copy_finish(&rc, copy);
        if (threadIdx.x == 0) {
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(bar) : "memory");
            target += (unsigned)nb;
            while ((int)(ld_acquire(bar) - target) < 0) {
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        out[2 * b] = t_bar / iters;
        out[2 * b + 1] = t_stage / iters;
    }
}


// LL: no barrier. Each value travels with its iteration's flag in one 8-byte
// word (value bits low, flag high; an aligned 8-byte store is seen whole or
// not at all), and readers poll the words until every flag is theirs. Rows
// alternate between two buffers: a block writes buffer it % 2 only after it
// read the row of it − 1, which every block wrote after reading the row of
// it − 2, so no reader can still be in the buffer it overwrites. That needs
// every block to write part of every row (k ≥ blocks): values go to blocks
// in turn. (A first version gave each block 256 consecutive values, so at
// 256 floats block 0 alone wrote, never waited, and overran its readers.) `out`:
// per block, mean ns from its own slice written to the whole row reduced.
template <int WORDS>
__global__ void __launch_bounds__(THREADS, 1)
    stage_ll(unsigned long long* rows, int k, int iters, unsigned long long* out, float* sink, const unsigned char* src,
             int copy) {
    extern __shared__ __align__(128) float xs[];
    __shared__ float red[THREADS / 32];
    __shared__ RoundCopy rc;
    copy_init(&rc, copy);
    int nb = gridDim.x, b = blockIdx.x, pairs = k / 2;
    unsigned long long t_h = 0;
    for (int it = 0; it < iters; ++it) {
        unsigned long long* row = rows + (size_t)(it & 1) * k;
        unsigned flag = (unsigned)it + 1;
        for (int i = b + nb * (int)threadIdx.x; i < k; i += nb * THREADS) {
            float v = (float)((it * 7 + i) % 97) * 0.01f;
            unsigned long long w = ((unsigned long long)flag << 32) | __float_as_uint(v);
            asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(row + i), "l"(w) : "memory");
        }
        copy_start(&rc, copy, src, it, (char*)xs + COPY_AT);
        unsigned long long t0 = now_ns();
        unsigned long long a[WORDS], c[WORDS];
        bool ready[WORDS];
#pragma unroll
        for (int u = 0; u < WORDS; ++u) ready[u] = threadIdx.x + u * THREADS >= pairs;
        for (;;) {
#pragma unroll
            for (int u = 0; u < WORDS; ++u)
                if (!ready[u])
                    asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];"
                                 : "=l"(a[u]), "=l"(c[u])
                                 : "l"(row + 2 * (threadIdx.x + u * THREADS))
                                 : "memory");
            bool all = true;
#pragma unroll
            for (int u = 0; u < WORDS; ++u) {
                if (!ready[u]) {
                    ready[u] = (unsigned)(a[u] >> 32) == flag && (unsigned)(c[u] >> 32) == flag;
                    if (ready[u]) {
                        int i = threadIdx.x + u * THREADS;
                        *(float2*)(xs + 2 * i) = make_float2(__uint_as_float((unsigned)a[u]), __uint_as_float((unsigned)c[u]));
                    }
                }
                all = all && ready[u];
            }
            if (all) break;
        }
        __syncthreads();
        float ss = sum_squares(xs, k, red);
        unsigned long long t2 = now_ns();
        if (threadIdx.x == 0) {
            t_h += t2 - t0;
            sink[b] = ss;
        }
        copy_finish(&rc, copy);
    }
    if (threadIdx.x == 0) {
        out[2 * b] = 0;
        out[2 * b + 1] = t_h / iters;
    }
}

// A launch of `grid` blocks, in clusters of C when C > 1 (`attr` holds the
// cluster attribute and must outlive the config).
template <int C>
cudaLaunchConfig_t launch_config(int grid, cudaLaunchAttribute* attr) {
    attr->id = cudaLaunchAttributeClusterDimension;
    attr->val.clusterDim.x = C;
    attr->val.clusterDim.y = 1;
    attr->val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(THREADS);
    cfg.dynamicSmemBytes = SMEM;
    cfg.attrs = attr;
    cfg.numAttrs = C > 1 ? 1 : 0;
    return cfg;
}

// Times `launch` (one launch of `iters` rounds on `grid` blocks, which
// leave per block their mean barrier and stage ns in `out`) and prints the
// table's row.
template <typename Launch>
void measure(const char* name, int k, int grid, unsigned long long* out, Launch launch) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventRecord(e0));
    launch();
    CK(cudaEventRecord(e1));
    CK(cudaDeviceSynchronize());
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    unsigned long long* h = (unsigned long long*)malloc(grid * 16);
    CK(cudaMemcpy(h, out, grid * 16, cudaMemcpyDeviceToHost));
    double bar_ns = 0, st_ns = 0, st_max = 0;
    for (int i = 0; i < grid; ++i) {
        bar_ns += h[2 * i];
        st_ns += h[2 * i + 1];
        st_max = std::max(st_max, (double)h[2 * i + 1]);
    }
    printf("| %d | %s | %d | %.2f | %.2f | %.2f | %.2f |\n", k, name, grid, bar_ns / grid / 1e3, st_ns / grid / 1e3,
           st_max / 1e3, ms * 1e3 / ITERS);
    free(h);
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
}

template <int C, bool HALF>
void run(const char* name, int k, int sms, const unsigned char* src, int copy) {
    auto kernel = stage<C, HALF>;
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
    cudaLaunchAttribute attr;
    int grid = sms;
    if (C > 1) {
        cudaLaunchConfig_t probe = launch_config<C>(sms, &attr);
        int clusters = 0;
        CK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &probe));
        // Every block must be resident at once for the grid barrier.
        grid = std::min(sms, clusters * C) / C * C;
    }
    void* row;
    unsigned* bar;
    unsigned long long* out;
    float* sink;
    CK(cudaMalloc(&row, k * 4));
    CK(cudaMalloc(&bar, 4));
    CK(cudaMemset(bar, 0, 4));
    CK(cudaMalloc(&out, grid * 16));
    CK(cudaMalloc(&sink, grid * 4));
    cudaLaunchConfig_t cfg = launch_config<C>(grid, &attr);
    measure(name, k, grid, out,
            [&] { CK(cudaLaunchKernelEx(&cfg, kernel, row, k, bar, ITERS, out, sink, src, copy)); });
    CK(cudaFree(row));
    CK(cudaFree(bar));
    CK(cudaFree(out));
    CK(cudaFree(sink));
}

template <int WORDS>
void run_ll(int k, int sms, const unsigned char* src, int copy) {
    auto kernel = stage_ll<WORDS>;
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
    unsigned long long* rows;
    unsigned long long* out;
    float* sink;
    CK(cudaMalloc(&rows, (size_t)k * 16));
    CK(cudaMemset(rows, 0, (size_t)k * 16));
    CK(cudaMalloc(&out, sms * 16));
    CK(cudaMalloc(&sink, sms * 4));
    std::string name = std::string("LL u64 (no barrier)") + (copy > 0 ? ", copies of " + std::to_string(copy / 1024) + " KiB" : "");
    measure(name.c_str(), k, sms, out, [&] {
        kernel<<<sms, THREADS, SMEM>>>(rows, k, ITERS, out, sink, src, copy);
        CK(cudaGetLastError());
    });
    CK(cudaFree(rows));
    CK(cudaFree(out));
    CK(cudaFree(sink));
}

int main(int argc, char** argv) {
    // One mode a process (the caller puts a timeout on each): MODE K, with
    // MODE one of f32 f16 c2 c4 ll; no arguments prints the table's header.
    setvbuf(stdout, nullptr, _IONBF, 0);
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    if (argc < 3) {
        printf("| k floats | layout | blocks | barrier us | stage us (mean) | stage us (slowest block) | period us |\n");
        printf("|---:|---|---:|---:|---:|---:|---:|\n");
        return 0;
    }
    std::string mode = argv[1];
    int k = atoi(argv[2]);
    int copy = argc > 3 ? atoi(argv[3]) : 0;
    // Rows of whole 16-byte words (8 halves), in shared memory; LL rows need
    // a value for every block (its rounds rely on every block writing).
    bool modes = mode == "f32" || mode == "f16" || mode == "c2" || mode == "c4" || mode == "ll";
    bool copy_ok = copy >= 0 && copy % 16 == 0 && copy <= COPY_MAX && k * 4 <= COPY_AT;
    if (!modes || k <= 0 || k % 8 != 0 || k * 4 > SMEM || (mode == "ll" && (k < sms || k > 32 * THREADS)) || !copy_ok) {
        fprintf(stderr,
                "usage: %s [MODE K [COPY]]: MODE f32|f16|c2|c4|ll, K a multiple of 8 up to %d (ll: %d to %d), COPY "
                "bytes a multiple of 16 up to %d\n",
                argv[0], COPY_AT / 4, sms, 32 * THREADS, COPY_MAX);
        return 2;
    }
    unsigned char* src = nullptr;
    if (copy > 0) CK(cudaMalloc(&src, COPY_SRC));
    std::string copies = copy > 0 ? ", copies of " + std::to_string(copy / 1024) + " KiB" : "";
    if (mode == "f32") run<1, false>(("f32" + copies).c_str(), k, sms, src, copy);
    else if (mode == "f16") run<1, true>(("f16" + copies).c_str(), k, sms, src, copy);
    else if (mode == "c2") run<2, false>(("f32, clusters of 2" + copies).c_str(), k, sms, src, copy);
    else if (mode == "c4") run<4, false>(("f32, clusters of 4" + copies).c_str(), k, sms, src, copy);
    else if (k <= 2 * THREADS) run_ll<1>(k, sms, src, copy);
    else if (k <= 10 * THREADS) run_ll<5>(k, sms, src, copy);
    else run_ll<16>(k, sms, src, copy);
    return 0;
}
