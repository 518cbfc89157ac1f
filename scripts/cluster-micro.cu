// Can one thread-block cluster carry a whole decoding layer? decode_run's
// layer is five grid-wide steps, each a barrier and an L2 stage (~2.9 us
// together with no work at all: stage-micro.cu), so 30 layers cannot reach
// 0.5 ms a token. A cluster of up to 16 blocks meets through its own barrier
// and shares rows through distributed shared memory instead; the price is
// that its few SMs must pull a whole layer's weights (17.4 MB at the 2B-4T
// shape) while the rest of the GPU only prefetches them into L2.
// Modes (one a process):
//   stream|ld C G BYTES [dram]: G clusters of C blocks (one an SM), each block
//       pulling BYTES of its own region through a ring of bulk copies that
//       seven consumer warps read; from L2 (warm) unless `dram`. Prints the
//       GB/s of a block and of the grid; `ld` reads with the load units
//       (eight 16-byte loads a thread in flight) instead of bulk copies.
//   bar C: a cluster barrier (arrive.release / wait.acquire) a round.
//   gather C K: a round is every block writing its K/C floats into every
//       block's shared memory (DSMEM), a cluster barrier, and every block
//       reading the whole row back.
// Build and run on the device machine:
//   nvcc -O2 -gencode=arch=compute_90a,code=sm_90a -o /tmp/cm scripts/cluster-micro.cu
//   /tmp/cm stream 16 1 1048576; /tmp/cm bar 16; /tmp/cm gather 16 2560
#include <cooperative_groups.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>

#include "micro.cuh"

namespace cg = cooperative_groups;

#define CK(x) do { cudaError_t err_ = (x); if (err_ != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(err_)); exit(1); } } while (0)

constexpr int THREADS = 256;
constexpr int CONSUMER_WARPS = THREADS / 32 - 1;
// Stage size in KiB (-DSTAGE_KB=...); 192 KiB of stages in all.
#ifndef STAGE_KB
#define STAGE_KB 16
#endif
constexpr int STAGE = STAGE_KB << 10;
constexpr int NSTAGE = 192 / STAGE_KB;
constexpr int SMEM = STAGE * NSTAGE + 1024;

__device__ __forceinline__ void mbar_init(unsigned long long* b, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(b)), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_wait(unsigned long long* b, unsigned parity) {
    asm volatile(
        "{\n .reg .pred p;\n W_%=: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W_%=;\n}\n" ::"r"(smem_addr(b)),
        "r"(parity)
        : "memory");
}

__device__ __forceinline__ void mbar_arrive(unsigned long long* b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(b)) : "memory");
}

__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(smem_addr(bar))
                 : "memory");
}

// Each block pulls `per_block` bytes of its own region, `passes` times,
// through NSTAGE stages; consumers read every 16-byte unit of a stage.
__global__ void stream_kernel(const unsigned char* src, size_t per_block, int passes, unsigned long long* span,
                              unsigned* sink) {
    extern __shared__ __align__(1024) unsigned char ring[];
    __shared__ unsigned long long full[NSTAGE], empty[NSTAGE];
    if (threadIdx.x == 0) {
        for (int s = 0; s < NSTAGE; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], CONSUMER_WARPS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const unsigned char* mine = src + (size_t)blockIdx.x * per_block;
    long chunks = (long)(per_block / STAGE) * passes;
    unsigned long long t0 = now_ns();
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (warp == 0) {
        if (lane == 0) {
            for (long c = 0; c < chunks; c++) {
                int s = (int)(c % NSTAGE);
                if (c >= NSTAGE) mbar_wait(&empty[s], (unsigned)((c / NSTAGE - 1) & 1));
                size_t off = (size_t)(c % (long)(per_block / STAGE)) * STAGE;
                bulk_copy(ring + s * STAGE, mine + off, STAGE, &full[s]);
            }
        }
    } else {
        unsigned acc = 0;
        int t = threadIdx.x - 32;
        for (long c = 0; c < chunks; c++) {
            int s = (int)(c % NSTAGE);
            mbar_wait(&full[s], (unsigned)((c / NSTAGE) & 1));
            const uint4* v = (const uint4*)(ring + s * STAGE);
            for (int i = t; i < STAGE / 16; i += CONSUMER_WARPS * 32) {
                uint4 u = v[i];
                acc ^= u.x ^ u.y ^ u.z ^ u.w;
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[s]);
        }
        if (acc == 0x12345678u) sink[0] = acc;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        span[2 * blockIdx.x] = t0;
        span[2 * blockIdx.x + 1] = now_ns();
    }
}

// The same bytes through the load units instead of the copy engine: every
// thread keeps eight 16-byte L2 loads in flight.
__global__ void ld_kernel(const unsigned char* src, size_t per_block, int passes, unsigned long long* span,
                          unsigned* sink) {
    const uint4* mine = (const uint4*)(src + (size_t)blockIdx.x * per_block);
    size_t units = per_block / 16;
    unsigned long long t0 = now_ns();
    unsigned acc = 0;
    for (int p = 0; p < passes; p++) {
        for (size_t i = threadIdx.x; i < units; i += 8 * THREADS) {
            uint4 v[8];
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] = __ldcg(mine + i + k * THREADS);
#pragma unroll
            for (int k = 0; k < 8; k++) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
        }
    }
    if (acc == 0x12345678u) sink[0] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        span[2 * blockIdx.x] = t0;
        span[2 * blockIdx.x + 1] = now_ns();
    }
}

__global__ void bar_kernel(int rounds, unsigned long long* out) {
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();
    unsigned long long t0 = now_ns();
    for (int i = 0; i < rounds; i++) {
        asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
    }
    if (threadIdx.x == 0) out[blockIdx.x] = now_ns() - t0;
}

// Two row buffers (by round parity) so that a round's writes never land in
// the buffer a slower block is still reading.
__global__ void gather_kernel(int k, int rounds, unsigned long long* out, float* sink) {
    extern __shared__ __align__(16) float row[];
    cg::cluster_group cluster = cg::this_cluster();
    int c = (int)cluster.num_blocks(), me = (int)cluster.block_rank();
    int slice = k / c;
    cluster.sync();
    unsigned long long t0 = now_ns();
    float total = 0.f;
    for (int r = 0; r < rounds; r++) {
        float* buf = row + (r & 1) * k;
        // this block's slice of the row, written into every block (float4s)
        for (int i = threadIdx.x; i < c * (slice / 4); i += blockDim.x) {
            int dst = i / (slice / 4), j = i % (slice / 4);
            float4 v = make_float4(r + j, me, j, r);
            float4* remote = (float4*)cluster.map_shared_rank(buf + me * slice, dst);
            remote[j] = v;
        }
        asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
        float s = 0.f;
        for (int i = threadIdx.x; i < k; i += blockDim.x) s += buf[i];
        total += s;
    }
    if (threadIdx.x == 0) out[blockIdx.x] = now_ns() - t0;
    if (total == 1234.5f) sink[0] = total;
}

// A launch of `grid` blocks in clusters of `cluster` (up to 16: the
// non-portable sizes allowed) with `smem` bytes of dynamic shared memory.
struct ClusterLaunch {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    ClusterLaunch(void* fn, int grid, int cluster, int smem) {
        cfg.gridDim = dim3(grid);
        cfg.blockDim = dim3(THREADS);
        cfg.dynamicSmemBytes = smem;
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = cluster;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        CK(cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
        CK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    }
};

static void launch(void* fn, int grid, int cluster, int smem, void** args) {
    ClusterLaunch l(fn, grid, cluster, smem);
    CK(cudaLaunchKernelExC(&l.cfg, fn, args));
    CK(cudaDeviceSynchronize());
}

static int max_clusters(void* fn, int cluster, int smem) {
    ClusterLaunch l(fn, cluster, cluster, smem);
    int n = 0;
    CK(cudaOccupancyMaxActiveClusters(&n, fn, &l.cfg));
    return n;
}

int main(int argc, char** argv) {
    if (argc < 3) {
        printf("usage: stream|ld C G BYTES [dram] | bar C | gather C K\n");
        return 2;
    }
    const char* mode = argv[1];
    int c = atoi(argv[2]);
    unsigned long long* d_out;
    CK(cudaMalloc(&d_out, 2 * 1024 * sizeof(unsigned long long)));
    unsigned long long h[2048];
    if (!strcmp(mode, "stream") || !strcmp(mode, "ld")) {
        int g = atoi(argv[3]);
        size_t per_block = strtoull(argv[4], 0, 10);
        bool dram = argc > 5 && !strcmp(argv[5], "dram");
        int blocks = c * g;
        // DRAM runs read a region far larger than L2 each pass.
        size_t stride = dram ? (size_t)64 << 20 : per_block;
        size_t total = stride * blocks;
        unsigned char* src;
        CK(cudaMalloc(&src, total));
        CK(cudaMemset(src, 1, total));
        unsigned* sink;
        CK(cudaMalloc(&sink, 16));
        bool ld = !strcmp(mode, "ld");
        void* fn = ld ? (void*)ld_kernel : (void*)stream_kernel;
        printf("max active clusters of %d: %d\n", c, max_clusters(fn, c, SMEM));
        int passes = dram ? 1 : 8;
        size_t region = dram ? (size_t)(64 << 20) : per_block;
        // region per block is `stride`; a dram pass reads the whole 64 MiB once
        size_t bytes_a_pass = dram ? region : per_block;
        void* args[] = {&src, &bytes_a_pass, &passes, &d_out, &sink};
        // warm-up pass (fills L2 for the L2 runs), then the timed one
        launch(fn, blocks, c, SMEM, args);
        launch(fn, blocks, c, SMEM, args);
        CK(cudaMemcpy(h, d_out, 2 * blocks * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
        unsigned long long lo = ~0ull, hi = 0, sum = 0;
        for (int b = 0; b < blocks; b++) {
            lo = h[2 * b] < lo ? h[2 * b] : lo;
            hi = h[2 * b + 1] > hi ? h[2 * b + 1] : hi;
            sum += h[2 * b + 1] - h[2 * b];
        }
        double bytes = (double)bytes_a_pass * passes;
        double per_block_gbs = bytes / ((double)sum / blocks);
        double grid_gbs = bytes * blocks / (double)(hi - lo);
        printf("%s C=%d G=%d %s %zu B/block x %d: block %.1f GB/s, grid %.1f GB/s (%.2f us)\n", mode, c, g,
               dram ? "dram" : "L2", bytes_a_pass, passes, per_block_gbs, grid_gbs, (hi - lo) / 1000.0);
    } else if (!strcmp(mode, "bar")) {
        int rounds = 20000;
        void* args[] = {&rounds, &d_out};
        launch((void*)bar_kernel, c, c, 0, args);
        CK(cudaMemcpy(h, d_out, c * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
        printf("cluster barrier C=%d: %.3f us a round\n", c, h[0] / 1000.0 / rounds);
    } else if (!strcmp(mode, "gather")) {
        int k = atoi(argv[3]);
        int rounds = 20000;
        float* sink;
        CK(cudaMalloc(&sink, 16));
        void* args[] = {&k, &rounds, &d_out, &sink};
        launch((void*)gather_kernel, c, c, 2 * k * 4, args);
        CK(cudaMemcpy(h, d_out, c * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
        printf("gather C=%d k=%d: %.3f us a round\n", c, k, h[0] / 1000.0 / rounds);
    }
    return 0;
}
