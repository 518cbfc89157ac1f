// The prompt GEMM on Hopper's warpgroup MMA (sm_90a), for matrices with one
// scale a row: Y[t][r] = d[t] · s[r] · Σ_k (c[r][k] − 1) · q[t][k].
//
// Why: the mma.sync GEMM (ternary.cu) decodes each 2-bit code into a
// fragment once per 32 tokens, and at 2,048 tokens its ALU pipe (the
// decoding) is the busiest. Here a warpgroup multiplies 64 rows by NT
// tokens with one `wgmma` per 32 k: each code is decoded once per NT
// tokens, and the levels go from shared memory to the tensor cores.
//
// Block: CW consumer warpgroups (64 rows each) and one producer warp. The producer's bulk tensor copies fill STAGES stages,
// each a chunk (256 k) of both operands, and signal a stage's `full`
// mbarrier; the consumers release it on its `empty` mbarrier once their
// products of it are done. No block barrier: copies run as far ahead as
// the stages allow.
// * Levels (quantize.cu's order, untouched): two k halves of NT rows of
//   128 bytes, 128-byte swizzled by the copy (wgmma's K-major layout).
//   Product i of a chunk reads bytes 32i..32i+31 of the chunk: pieces 2i
//   and 2i + 1 of 16 bytes.
// * Codes: the tile's 64·CW rows of 64 bytes, 64-byte swizzled (the 8 rows
//   a warp reads at once fall on distinct banks).
// Local k 4j + b of piece 4·lb + w is activation word 4w + j of lane block
// lb, whose weight is plane j of word w of the row's lane block lb
// (ternary.cu's pairing), so thread (g, tig) of warp w holds A[16w + g]
// [4·tig + b] (and rows + 8, and k + 16) as plane tig of those words.
// grid: (Σ ceil(rows / 64·CW), ceil(n_tok / NT)), block 128·CW + 32,
// dynamic shared memory wg_smem_bytes(NT, CW, STAGES).

// A tensor map (CUtensorMap), built on the host by cuTensorMapEncodeTiled.
struct __align__(64) TmaMap {
    u64 w[16];
};

// A stage: NT tokens' chunk of levels, then the tile's codes (64 rows a
// consumer warpgroup); a multiple of 1024 bytes, so that every stage keeps
// the swizzles' alignment.
template <int NT, int CW>
__host__ __device__ constexpr int wg_stage_bytes() {
    return NT * 256 + CW * 64 * 64;
}

// Dynamic shared memory: the stages, their mbarriers, room to align.
template <int NT, int CW, int STAGES>
__host__ __device__ constexpr int wg_smem_bytes() {
    return STAGES * wg_stage_bytes<NT, CW>() + 1024 + 1024;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The descriptor of a K-major operand in 128-byte swizzled rows (8 rows of
// 128 bytes an atom, 1024 bytes apart): start address, the unused leading
// offset (1) and the stride between atoms, in 16-byte units.
__device__ __forceinline__ u64 wg_desc(u32 addr) {
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)1 << 16) | ((u64)(1024 >> 4) << 32) | ((u64)1 << 62);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ void wg_bar_init(u32 m, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(m), "r"(count) : "memory");
}
__device__ __forceinline__ void wg_bar_arrive(u32 m) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(m) : "memory");
}
__device__ __forceinline__ void wg_bar_expect(u32 m, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(m), "r"(bytes) : "memory");
}
__device__ __forceinline__ void wg_bar_wait(u32 m, u32 parity) {
    asm volatile(
        "{\n.reg .pred p;\nWAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        "@!p bra WAIT_%=;\n}" ::"r"(m), "r"(parity)
        : "memory");
}
// Box (x, y) of map `tm` into shared memory at `dst`, completing on `m`.
__device__ __forceinline__ void wg_tma(u32 dst, const TmaMap* tm, int x, int y, u32 m) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
            dst),
        "l"((u64)tm), "r"(x), "r"(y), "r"(m)
        : "memory");
}

#define WG_R8(i) "+r"(c[i]), "+r"(c[i + 1]), "+r"(c[i + 2]), "+r"(c[i + 3]), "+r"(c[i + 4]), "+r"(c[i + 5]), \
                 "+r"(c[i + 6]), "+r"(c[i + 7])

// c = A (64 × 32 codes, this thread's fragment a) · B (32 × NT levels at
// descriptor `bd`), plus c when acc_in. The first product of a tile starts
// the sum instead of zeroed registers: ptxas serializes every wgmma of a
// loop whose accumulators other instructions define.
template <int NT>
__device__ __forceinline__ void wg_mma(int* c, const u32* a, u64 bd, int acc_in);

template <>
__device__ __forceinline__ void wg_mma<128>(int* c, const u32* a, u64 bd, int acc_in) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.s32.u8.s8 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, p;\n}"
        : WG_R8(0), WG_R8(8), WG_R8(16), WG_R8(24), WG_R8(32), WG_R8(40), WG_R8(48), WG_R8(56)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bd), "r"(acc_in));
}

template <int NT, int CW, int STAGES>
__device__ __forceinline__ void wg_gemm(const TernaryBatch& b, int mi, const TmaMap* tq, const TmaMap* tw,
                                        int k_pad, const float* d, const int* lsum, int n_tok) {
    constexpr int STAGE = wg_stage_bytes<NT, CW>(), HALF = NT * 128, W_AT = 2 * HALF, ROWS = 64 * CW;
    constexpr int PRODUCER = 128 * CW;
    extern __shared__ __align__(128) u8 wg_sm[];
    __shared__ int tsum[NT];
    const TernaryMat& m = b.m[mi];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int tile_row = (blockIdx.x - b.block_start[mi]) * ROWS;
    int tok0 = blockIdx.y * NT;
    int n_chunks = k_pad >> 8, nls = k_pad >> 6;
    // The swizzles are of address bits, so the stages start on 1024 bytes;
    // the mbarriers (full[s], empty[s]) follow them.
    u32 raw = (u32)__cvta_generic_to_shared(wg_sm), base = (raw + 1023) & ~1023u;
    u8* sm = wg_sm + (base - raw);
    u32 bars = base + STAGES * STAGE;
    if (threadIdx.x == PRODUCER) {
        for (int s = 0; s < STAGES; ++s) {
            wg_bar_init(bars + 16 * s, 1);
            wg_bar_init(bars + 16 * s + 8, 4 * CW);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        // The maps never depend on the previous kernel; the level sums do.
        asm volatile("prefetch.tensormap [%0];" ::"l"((u64)tq) : "memory");
        asm volatile("prefetch.tensormap [%0];" ::"l"((u64)tw) : "memory");
    }
    pdl_wait();
    if (threadIdx.x < NT) {
        int t = tok0 + threadIdx.x, s = 0;
        if (t < n_tok)
            for (int i = 0; i < nls; ++i) s += lsum[(u64)t * nls + i];
        tsum[threadIdx.x] = s;
    }
    __syncthreads();
    pdl_launch();

    if (threadIdx.x >= PRODUCER) {
        // The producer: chunk c into stage c % S once the consumers have
        // released its previous chunk (c − S).
        if (lane == 0) {
            for (int c = 0; c < n_chunks; ++c) {
                int s = c % STAGES;
                u32 full = bars + 16 * s, st = base + s * STAGE;
                if (c >= STAGES) wg_bar_wait(full + 8, ((c / STAGES) - 1) & 1);
                wg_bar_expect(full, STAGE);
                wg_tma(st, tq, c * 256, tok0, full);
                wg_tma(st + HALF, tq, c * 256 + 128, tok0, full);
                wg_tma(st + W_AT, tw, c * 64, tile_row, full);
            }
        }
        return;
    }

    int g = lane >> 2, tig = lane & 3, row0 = tile_row + warp * 16;
    // Row r of a stage's codes, unit lb: 64-byte swizzle (unit ^= r / 2 % 4).
    int rlo = warp * 16 + g, rhi = rlo + 8;
    auto decode = [&](int s, u32 (*a)[4]) {
        const u8* ws = sm + s * STAGE + W_AT;
#pragma unroll
        for (int lb = 0; lb < 4; ++lb) {
            uint4 lo = *(const uint4*)(ws + rlo * 64 + ((lb ^ ((rlo >> 1) & 3)) << 4));
            uint4 hi = *(const uint4*)(ws + rhi * 64 + ((lb ^ ((rhi >> 1) & 3)) << 4));
            const u32 lw[4] = {lo.x, lo.y, lo.z, lo.w}, hw[4] = {hi.x, hi.y, hi.z, hi.w};
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                u32* f = a[2 * lb + h];
                f[0] = (lw[2 * h] >> (2 * tig)) & M2;
                f[1] = (hw[2 * h] >> (2 * tig)) & M2;
                f[2] = (lw[2 * h + 1] >> (2 * tig)) & M2;
                f[3] = (hw[2 * h + 1] >> (2 * tig)) & M2;
            }
        }
    };
    // Chunk c: wait for its stage, decode, multiply, and release the stage
    // once the products are done (lane 0 of each of the 8 consumer warps
    // arrives). A warpgroup waits for its own products before it decodes
    // the next chunk into the same registers; meanwhile the tensor cores
    // run the other warpgroup's. (Keeping a chunk's products in flight
    // across the next stage's wait makes ptxas serialize every wgmma.)
    int acc[NT / 2];
    u32 a[8][4];
    for (int c = 0; c < n_chunks; ++c) {
        int s = c % STAGES;
        wg_bar_wait(bars + 16 * s, (c / STAGES) & 1);
        decode(s, a);
        u32 tile = base + s * STAGE;
        wg_fence();
#pragma unroll
        for (int i = 0; i < 8; ++i) wg_mma<NT>(acc, a[i], wg_desc(tile + (i >> 2) * HALF + (i & 3) * 32), c > 0 || i > 0);
        wg_commit();
        wg_wait<0>();
        if (lane == 0) wg_bar_arrive(bars + 16 * s + 8);
    }

    // Accumulator i·4 + r: row g + 8·(r / 2), token 8i + 2·tig + r % 2.
#pragma unroll
    for (int i = 0; i < NT / 8; ++i)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            int row = row0 + g + 8 * (r >> 1), tl = 8 * i + 2 * tig + (r & 1), t = tok0 + tl;
            if (row >= m.rows || t >= n_tok) continue;
            float y = (float)(acc[4 * i + r] - tsum[tl]) * m.scales[row] * d[t];
            u64 o = (u64)t * m.rows + row;
            m.out[o] = m.res ? y + m.res[o] : y;
        }
}
#endif

// Two shapes, 128 tokens a block (tern_cuda::lower::WgShape): three
// consumer warpgroups (192 rows, 4 stages), which share each stage's levels
// among more rows, and for grids too small to fill the SMs with those, two
// (128 rows, 5 stages), which leave fewer SMs idle. 256 tokens a warpgroup
// needs more registers than one block an SM has for two warpgroups.
// tq: the levels [n_tok][k_pad] as 128-byte × 128-token boxes; tw0..2: the
// batch's codes [rows][k_pad / 4] as 64-byte × 64·CW-row boxes.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_BODY(CW, STAGES)      \
    int mi = pick(b, blockIdx.x); \
    wg_gemm<128, CW, STAGES>(b, mi, &tq, mi == 0 ? &tw0 : mi == 1 ? &tw1 : &tw2, k_pad, d, lsum, n_tok);
#else
#define WG_BODY(CW, STAGES)
#endif
#define WG_KERNEL(NAME, CW, STAGES)                                                                                  \
    extern "C" __global__ void __launch_bounds__(128 * CW + 32, 1)                                                   \
        NAME(TernaryBatch b, const __grid_constant__ TmaMap tq, const __grid_constant__ TmaMap tw0,                  \
             const __grid_constant__ TmaMap tw1, const __grid_constant__ TmaMap tw2, int k_pad, const float* d,      \
             const int* lsum, int n_tok) {                                                                           \
        WG_BODY(CW, STAGES)                                                                                          \
    }
WG_KERNEL(ternary_gemm_wg, 3, 4)
WG_KERNEL(ternary_gemm_wg_narrow, 2, 5)
