// The prompt GEMM on Hopper's warpgroup MMA (sm_90a), for matrices with one
// scale a row: Y[t][r] = d[t] · s[r] · Σ_k (c[r][k] − 1) · q[t][k].
//
// Why: the mma.sync GEMM (ternary.cu) decodes each 2-bit code into a
// fragment once per 32 tokens, and at 2,048 tokens its ALU pipe (the
// decoding) is the busiest. Here a warpgroup multiplies 64 rows by NT
// tokens with one `wgmma` per 32 k: each code is decoded once per NT
// tokens, and the activations go from shared memory to the tensor cores.
//
// Block: two warpgroups (256 threads), 128 rows × NT tokens; warp w takes
// rows 16w..16w+15. A stage holds a chunk (256 k) of both operands, copied
// by cp.async, STAGES − 1 chunks ahead:
// * activations as they are in memory (quantize.cu's permuted order), 16
//   pieces of 16 bytes a token, stored [piece][token][16 bytes] with the
//   pieces wg_piece_stride(NT) apart: 8 tokens of a piece are one of
//   wgmma's K-major core matrices (no swizzle), and product i of a chunk
//   takes pieces 2i and 2i + 1;
// * the block's weight rows, 64 bytes each at a stride of WG_WROW.
// So product i's k order is the pieces' order: local k 4j + b of piece
// 4·lb + w is activation word 4w + j of lane block lb, whose weight is
// plane j of word w of the row's lane block lb (ternary.cu's pairing).
// Thread (g, tig) holds A[g][4·tig + b] (and rows g + 8, and k + 16):
// plane tig of the words, decoded in registers.
// grid: (Σ ceil(rows / 128), ceil(n_tok / NT)); dynamic shared memory
// STAGES · wg_stage_bytes(NT).

#define WG_ROWS 128
// Bytes between weight rows in a stage: 64 + 16, so that the 8 rows a warp
// reads at once fall on distinct banks.
#define WG_WROW 80
#define WG_W_BYTES (WG_ROWS * WG_WROW)
// Chunks in shared memory: the one multiplied, the one before it (whose
// products may still run in the other warpgroup) and the next.
#define WG_STAGES 3

// A stage: NT tokens' chunk of activations (two k halves of NT rows of 128
// bytes, 128-byte swizzled), then the block's weight rows; a multiple of
// 1024 bytes, so that every stage keeps the swizzle's alignment.
template <int NT>
__host__ __device__ constexpr int wg_stage_bytes() {
    return NT * 256 + WG_W_BYTES;
}

// Dynamic shared memory of the kernel: the stages, and room to align them.
template <int NT>
__host__ __device__ constexpr int wg_smem_bytes() {
    return WG_STAGES * wg_stage_bytes<NT>() + 1024;
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
__device__ __forceinline__ void wg_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }

#define WG_R8(i) "+r"(c[i]), "+r"(c[i + 1]), "+r"(c[i + 2]), "+r"(c[i + 3]), "+r"(c[i + 4]), "+r"(c[i + 5]), \
                 "+r"(c[i + 6]), "+r"(c[i + 7])

// c = A (64 × 32 codes, this thread's fragment a) · B (32 × NT levels at
// descriptor `bd`), plus c when acc_in. The first product of a tile starts
// the sum instead of zeroed registers: ptxas serializes every wgmma of a
// loop whose accumulators other instructions define.
template <int NT>
__device__ __forceinline__ void wg_mma(int* c, const u32* a, u64 bd, int acc_in);

template <>
__device__ __forceinline__ void wg_mma<64>(int* c, const u32* a, u64 bd, int acc_in) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.s32.u8.s8 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p;\n}"
        : WG_R8(0), WG_R8(8), WG_R8(16), WG_R8(24)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bd), "r"(acc_in));
}

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

template <int NT>
__device__ __forceinline__ void wg_gemm(const TernaryBatch& b, int k_pad, const i8* q, const float* d,
                                        const int* lsum, int n_tok) {
    constexpr int STAGE = wg_stage_bytes<NT>(), STAGES = WG_STAGES, HALF = NT * 128, W_AT = 2 * HALF;
    constexpr int B_LOADS = NT * 16 / 256, W_LOADS = WG_ROWS * 4 / 256;
    extern __shared__ __align__(128) u8 wg_sm[];
    __shared__ int tsum[NT];
    pdl_wait();
    pdl_launch();
    int mi = pick(b, blockIdx.x);
    const TernaryMat& m = b.m[mi];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    int tile_row = (blockIdx.x - b.block_start[mi]) * WG_ROWS, row0 = tile_row + warp * 16;
    int tok0 = blockIdx.y * NT;
    int n_chunks = k_pad >> 8, nls = k_pad >> 6;
    u64 row_bytes = k_pad >> 2;
    // The swizzle is of address bits, so stages start on 1024 bytes.
    u32 base = ((u32)__cvta_generic_to_shared(wg_sm) + 1023) & ~1023u;
    u8* sm = wg_sm + (base - (u32)__cvta_generic_to_shared(wg_sm));

    if (threadIdx.x < NT) {
        int t = tok0 + threadIdx.x, s = 0;
        if (t < n_tok)
            for (int i = 0; i < nls; ++i) s += lsum[(u64)t * nls + i];
        tsum[threadIdx.x] = s;
    }

    // Chunk c through registers: a half-warp loads a token's 16 pieces (one
    // 256-byte run), four lanes a weight row's 4 lane blocks; tokens past
    // n_tok and rows past the matrix are zeros. Load i of a thread is
    // 16·i tokens (64·i rows) past its first, so every address but the
    // chunk's offset is fixed for the whole loop.
    int my_t = threadIdx.x >> 4, my_p = threadIdx.x & 15, my_r = threadIdx.x >> 2, my_lb = threadIdx.x & 3;
    const i8* a_src = q + (u64)(tok0 + my_t) * k_pad + my_p * 16;
    const u8* w_src = m.w + (u64)(tile_row + my_r) * row_bytes + my_lb * 16;
    // Piece p of token t: k half p / 8, row t, 16-byte unit (p % 8) ^ (t % 8);
    // t % 8 is the same for all of a thread's loads.
    u32 a_dst = (my_p >> 3) * HALF + my_t * 128 + (((my_p & 7) ^ (my_t & 7)) << 4);
    u32 w_dst = W_AT + my_r * WG_WROW + my_lb * 16;
    uint4 va[B_LOADS], vw[W_LOADS];
    auto load = [&](int c) {
#pragma unroll
        for (int it = 0; it < B_LOADS; ++it)
            va[it] = tok0 + my_t + 16 * it < n_tok ? ld_stream((const uint4*)(a_src + (u64)16 * it * k_pad + c * 256))
                                                   : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int it = 0; it < W_LOADS; ++it)
            vw[it] = tile_row + my_r + 64 * it < m.rows
                         ? ld_stream((const uint4*)(w_src + (u64)64 * it * row_bytes + c * 64))
                         : make_uint4(0, 0, 0, 0);
    };
    auto store = [&](int st) {
        u8* sb = sm + st * STAGE;
#pragma unroll
        for (int it = 0; it < B_LOADS; ++it) *(uint4*)(sb + a_dst + it * 16 * 128) = va[it];
#pragma unroll
        for (int it = 0; it < W_LOADS; ++it) *(uint4*)(sb + w_dst + it * 64 * WG_WROW) = vw[it];
        // wgmma reads shared memory through the async proxy.
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    };
    // Chunk st's fragments: plane tig of the row's words (see the top).
    const u8* wrow = sm + W_AT + (warp * 16 + g) * WG_WROW;
    auto decode = [&](int st, u32 (*a)[4]) {
        const u8* ws = wrow + st * STAGE;
#pragma unroll
        for (int lb = 0; lb < 4; ++lb) {
            uint4 lo = *(const uint4*)(ws + lb * 16), hi = *(const uint4*)(ws + 8 * WG_WROW + lb * 16);
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

    int acc[NT / 2];
    u32 a0[8][4], a1[8][4];
    // One step: chunk c's products (fragments `a`, decoded one step ago)
    // start; while they run, chunk c + 1 goes to shared memory, chunk c + 2
    // is asked for, and chunk c + 1 is decoded into `an` once chunk c − 1's
    // products, the last readers of `an`, are done. The barrier comes after
    // that wait: then every warpgroup is done with chunk c − 1, whose stage
    // the next step fills (three stages: c, c + 1, and c − 1 still read).
    auto step = [&](int c, u32 (*a)[4], u32 (*an)[4]) {
        u32 tile = base + (c % STAGES) * STAGE;
        wg_fence();
#pragma unroll
        for (int i = 0; i < 8; ++i) wg_mma<NT>(acc, a[i], wg_desc(tile + (i >> 2) * HALF + (i & 3) * 32), c > 0 || i > 0);
        wg_commit();
        if (c + 1 < n_chunks) {
            store((c + 1) % STAGES);
            if (c + 2 < n_chunks) load(c + 2);
        }
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
        __syncthreads();
        if (c + 1 < n_chunks) decode((c + 1) % STAGES, an);
    };
    load(0);
    store(0);
    if (n_chunks > 1) load(1);
    __syncthreads();
    decode(0, a0);
    for (int c = 0; c < n_chunks; c += 2) {
        step(c, a0, a1);
        if (c + 1 < n_chunks) step(c + 1, a1, a0);
    }
    wg_wait_all();

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

// 128 rows × 128 tokens, 4 stages of 42 KB: one block an SM.
extern "C" __global__ void __launch_bounds__(256, 1) ternary_gemm_wg(TernaryBatch b, int k_pad, const i8* q,
                                                                    const float* d, const int* lsum, int n_tok) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    wg_gemm<128>(b, k_pad, q, d, lsum, n_tok);
#endif
}

// 128 rows × 64 tokens: 4 stages of 26 KB, two blocks an SM.
extern "C" __global__ void __launch_bounds__(256, 2) ternary_gemm_wg64(TernaryBatch b, int k_pad, const i8* q,
                                                                      const float* d, const int* lsum, int n_tok) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    wg_gemm<64>(b, k_pad, q, d, lsum, n_tok);
#endif
}
