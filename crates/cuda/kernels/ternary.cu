// Ternary × int8 matrix products: the W2A8 GEMV for decoding (dp4a) and the
// m16n8k32 tensor-core GEMM for prompts, both on one weight layout.
//
// Weight layout (tern_cuda::layout): each row is k_pad / 4 bytes of 2-bit
// codes c = t + 1. Chunk c (256 weights) is 64 bytes: four 16-byte lane
// blocks tig = 0..3; in word w of block tig, byte b bits 2j..2j+1 hold weight
// c*256 + 32*(2w + j/2) + 16*(j%2) + 4*tig + b. So `(word >> 2j) & 0x03030303`
// is four consecutive weights, matching activation word (w*4 + j) of the same
// lane block (quantize.cu), and also exactly one m16n8k32 A-fragment register
// of thread tig. Rows are padded to a multiple of 128 with zero codes (the
// prompt GEMM, whose tiles may pass that, checks its rows).
//
// Codes are unsigned, so Σ c·q = Σ t·q + Σ q; the activation lane sums remove
// the second term. Rows with one scale sum exactly in i32 and scale once;
// rows with a scale per 256-chunk (rare TQ files) fold per chunk.

#define M2 0x03030303u

__device__ __forceinline__ int dp4a_us(u32 a, int b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// One ternary matrix of a batched launch. `res` (optional) is added to the
// output (a fused residual connection).
struct TernaryMat {
    const u8* w;
    const float* scales;
    float* out;
    const float* res;
    int rows;
    int groups;
};

// Up to three matrices that share one input (q/k/v, gate/up) in one launch.
struct TernaryBatch {
    TernaryMat m[3];
    int n;
    int block_start[4];
    int pad;
};
static_assert(sizeof(TernaryBatch) == 144, "TernaryBatch layout (tern_cuda::launch::TernaryBatch)");

__device__ __forceinline__ int pick(const TernaryBatch& b, int blk) {
    int i = 0;
    while (i + 1 < b.n && blk >= b.block_start[i + 1]) ++i;
    return i;
}

#define GEMV_MAXT 8
#define GEMV_UNROLL 4

// One lane block: 16 weight words against 16 activation words. Word j of
// the weights holds four 2-bit codes per byte; shift 2b selects the codes
// that pair with activation word 4j + b (quantize.cu's permutation).
__device__ __forceinline__ int chunk_dot_act(uint4 wv, const int4 (&av)[4]) {
    const u32 w[4] = {wv.x, wv.y, wv.z, wv.w};
    int s = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int aw[4] = {av[j].x, av[j].y, av[j].z, av[j].w};
#pragma unroll
        for (int b = 0; b < 4; ++b) s = dp4a_us((w[j] >> (2 * b)) & M2, aw[b], s);
    }
    return s;
}

// chunk_dot_act with the activations read as four 16-byte vectors from `a`.
__device__ __forceinline__ int chunk_dot(uint4 wv, const i8* a) {
    const int4* p = (const int4*)a;
    const int4 av[4] = {p[0], p[1], p[2], p[3]};
    return chunk_dot_act(wv, av);
}

// The weight vectors lane (cs = lane/4, tig = lane%4) reads for U chunk
// slots of `row` from chunk c0 + cs on: lane block tig of chunks c0 + cs,
// c0 + cs + 8, ...; a warp reads 512 contiguous bytes per slot. Weights never
// depend on the previous kernel, so the first fetch (c0 = 0) goes out before
// `pdl_wait`.
template <int U>
__device__ __forceinline__ void fetch_row(const TernaryMat& m, int row, int k_pad, int c0, uint4* wv) {
    int lane = threadIdx.x & 31, tig = lane & 3, cs = lane >> 2, n_chunks = k_pad >> 8;
    const uint4* wr = (const uint4*)(m.w + (u64)row * (k_pad >> 2));
#pragma unroll
    for (int u = 0; u < U; ++u) {
        int c = c0 + cs + 8 * u;
        wv[u] = c < n_chunks ? ld_stream(wr + c * 4 + tig) : make_uint4(0, 0, 0, 0);
    }
}

// Row `row` of `m` times the n_tok (≤ MAXT) activations, summed over the
// warp: one result per token in every lane. `wv` holds the first fetch
// (fetch_row<U> from chunk 0); rows longer than 8·U chunks fetch the rest here.
// Without SCALE the row scale and d are left to the caller (who loaded the
// scale early); per-chunk scales are still applied.
template <int MAXT, int U, bool SCALE = true>
__device__ __forceinline__ void row_dots(const TernaryMat& m, int row, int k_pad, const i8* q, const float* d,
                                         const int* lsum, int n_tok, uint4* wv, float* y) {
    int lane = threadIdx.x & 31, tig = lane & 3, cs = lane >> 2;
    int n_chunks = k_pad >> 8, nls = k_pad >> 6;
    int acc[MAXT];
    float facc[MAXT];
#pragma unroll
    for (int t = 0; t < MAXT; ++t) {
        acc[t] = 0;
        facc[t] = 0.0f;
    }
    for (int c0 = 0; c0 + cs < n_chunks; c0 += 8 * U) {
        if (c0 != 0) fetch_row<U>(m, row, k_pad, c0, wv);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            int c = c0 + cs + 8 * u;
            if (c >= n_chunks) break;
#pragma unroll
            for (int t = 0; t < MAXT; ++t) {
                if (t >= n_tok) break;
                int s = chunk_dot(wv[u], q + (u64)t * k_pad + c * 256 + tig * 64) - lsum[t * nls + c * 4 + tig];
                if (m.groups == 1) {
                    acc[t] += s;
                } else {
                    facc[t] += (float)s * m.scales[(u64)row * m.groups + c];
                }
            }
        }
    }
#pragma unroll
    for (int t = 0; t < MAXT; ++t) {
        if (t >= n_tok) break;
        if (SCALE)
            y[t] = m.groups == 1 ? (float)warp_sum_i(acc[t]) * m.scales[row] * d[t] : warp_sum(facc[t]) * d[t];
        else
            y[t] = m.groups == 1 ? (float)warp_sum_i(acc[t]) : warp_sum(facc[t]);
    }
}

// The GEMV: one warp per row, 8 rows per 256-thread block; n_tok ≤ MAXT
// tokens share each weight load. With `pair_act` ≥ 0 the batch is (gate,
// up): each warp computes both rows and writes gated(gate, up) into the first
// matrix's output. Instantiated for 8 tokens and, with far fewer registers
// (more warps in flight), for one; MINB blocks per SM bound the registers: at
// 64, four 256-thread blocks fit an SM, so the 480 blocks of q/k/v at the
// 2B-4T shape run in one wave, not two.
#define GEMV_KERNEL(NAME, MAXT, MINB) \
extern "C" __global__ void __launch_bounds__(256, MINB) NAME(TernaryBatch b, int k_pad, const i8* q, const float* d, \
                                                              const int* lsum, int n_tok, int pair_act) { \
    int mi = pick(b, blockIdx.x); \
    const TernaryMat& m = b.m[mi]; \
    int row = (blockIdx.x - b.block_start[mi]) * 8 + (threadIdx.x >> 5); \
    bool live = row < m.rows; \
    uint4 wg[GEMV_UNROLL], wu[GEMV_UNROLL]; \
    if (live) { \
        fetch_row<GEMV_UNROLL>(m, row, k_pad, 0, wg); \
        if (pair_act >= 0) fetch_row<GEMV_UNROLL>(b.m[1], row, k_pad, 0, wu); \
    } \
    pdl_wait(); \
    pdl_launch(); \
    if (!live) return; \
    float y[MAXT]; \
    row_dots<MAXT, GEMV_UNROLL>(m, row, k_pad, q, d, lsum, n_tok, wg, y); \
    if (pair_act >= 0) { \
        float up[MAXT]; \
        row_dots<MAXT, GEMV_UNROLL>(b.m[1], row, k_pad, q, d, lsum, n_tok, wu, up); \
_Pragma("unroll") \
        for (int t = 0; t < MAXT; ++t) { \
            if (t >= n_tok) break; \
            y[t] = gated(y[t], up[t], pair_act); \
        } \
    } \
    if ((threadIdx.x & 31) == 0) { \
_Pragma("unroll") \
        for (int t = 0; t < MAXT; ++t) { \
            if (t >= n_tok) break; \
            u64 o = (u64)t * m.rows + row; \
            m.out[o] = m.res ? y[t] + m.res[o] : y[t]; \
        } \
    } \
}

GEMV_KERNEL(ternary_gemv, 8, 1)
GEMV_KERNEL(ternary_gemv1, 1, 4)

// gate/up for one token with k_pad ≤ 4096 (two fetch slots of 8 chunks a
// row): 16 rows per block, each warp two (gate, up) row pairs, all four rows'
// weights fetched before pdl_wait. The 2B-4T's 6912 pairs then take 432
// blocks, one wave at four blocks per SM; a pair per warp took 864 (1.6
// waves, the second wave's loads all after the wait). The four rows share
// each chunk's activation loads: each row reading its own would take four
// times the L1 traffic.
#define PAIR_UNROLL 2

// R rows of one warp against one token, the activation words of each chunk
// read once for all R rows (a lane's 64 bytes pair with R weight vectors).
// `wv[r]` holds row r's first fetch (fetch_row<U> from chunk 0).
template <int R, int U>
__device__ __forceinline__ void rows_dots1(const TernaryMat* const* ms, const int* rows, int k_pad, const i8* q,
                                           const float* d, const int* lsum, uint4 (*wv)[U], float* y) {
    int lane = threadIdx.x & 31, tig = lane & 3, cs = lane >> 2;
    int n_chunks = k_pad >> 8;
    int acc[R];
    float facc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        acc[r] = 0;
        facc[r] = 0.0f;
    }
    for (int c0 = 0; c0 + cs < n_chunks; c0 += 8 * U) {
        if (c0 != 0)
#pragma unroll
            for (int r = 0; r < R; ++r) fetch_row<U>(*ms[r], rows[r], k_pad, c0, wv[r]);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            int c = c0 + cs + 8 * u;
            if (c >= n_chunks) break;
            const int4* av = (const int4*)(q + c * 256 + tig * 64);
            int4 a[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) a[j] = av[j];
            int ls = lsum[c * 4 + tig];
#pragma unroll
            for (int r = 0; r < R; ++r) {
                int s = chunk_dot_act(wv[r][u], a) - ls;
                if (ms[r]->groups == 1)
                    acc[r] += s;
                else
                    facc[r] += (float)s * ms[r]->scales[(u64)rows[r] * ms[r]->groups + c];
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
        y[r] = ms[r]->groups == 1 ? (float)warp_sum_i(acc[r]) * ms[r]->scales[rows[r]] * d[0] : warp_sum(facc[r]) * d[0];
}

extern "C" __global__ void __launch_bounds__(256, 4) ternary_gemv1_pair(TernaryBatch b, int k_pad, const i8* q,
                                                                       const float* d, const int* lsum, int n_tok,
                                                                       int pair_act) {
    const TernaryMat& g = b.m[0];
    const TernaryMat& up = b.m[1];
    int r0 = (int)blockIdx.x * 16 + (int)(threadIdx.x >> 5), r1 = r0 + 8;
    // Rows past the end repeat a live row (same loads, results dropped).
    int r1c = r1 < g.rows ? r1 : r0;
    if (r0 >= g.rows) return;
    const TernaryMat* ms[4] = {&g, &up, &g, &up};
    const int rows[4] = {r0, r0, r1c, r1c};
    uint4 wv[4][PAIR_UNROLL];
#pragma unroll
    for (int r = 0; r < 4; ++r) fetch_row<PAIR_UNROLL>(*ms[r], rows[r], k_pad, 0, wv[r]);
    pdl_wait();
    pdl_launch();
    float y[4];
    rows_dots1<4, PAIR_UNROLL>(ms, rows, k_pad, q, d, lsum, wv, y);
    if ((threadIdx.x & 31) == 0) {
        float a = gated(y[0], y[1], pair_act);
        g.out[r0] = g.res ? a + g.res[r0] : a;
        if (r1 < g.rows) {
            float c = gated(y[2], y[3], pair_act);
            g.out[r1] = g.res ? c + g.res[r1] : c;
        }
    }
}

#define MMA_MT 2
#define MMA_NT 4
#define B_TOK (8 * MMA_NT)
#define B_LANE 72
#define B_ROW (4 * B_LANE)

__device__ __forceinline__ void mma_u8s8(int* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ u32 word_of(uint4 v, int w) {
    return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;
}

// Block: WARPS warps stacked in rows, 32·WARPS rows × 32 tokens; each warp
// 32 rows (MMA_MT m-tiles of 16) × 32 tokens (MMA_NT n-tiles of 8). The
// activation tile of a chunk (32 tokens × 256 bytes) is staged in shared
// memory with lane blocks padded to 72 bytes, which keeps the 8-byte fragment
// loads of a half-warp on distinct banks. Each chunk's tile and the warp's
// weight words are loaded into registers one chunk ahead, and the tile is
// stored into the other of two buffers after the current chunk's products:
// the loads' latency hides under the MMAs, and a chunk takes one block
// barrier.
// grid: (Σ ceil(rows / 32·WARPS), ceil(n_tok / 32)); `block_start` counts
// blocks, so matrices sharing the input (q/k/v, gate/up) fill one grid.
// Without GROUPED every matrix has one scale a row (the lowering checks).
template <int WARPS, bool GROUPED>
__device__ __forceinline__ void gemm_body(const TernaryBatch& b, int k_pad, const i8* q, const float* d,
                                          const int* lsum, int n_tok) {
    constexpr int THREADS = 32 * WARPS, TOK = B_TOK, PIECES = TOK * 16 / THREADS;
    static_assert(PIECES * THREADS == TOK * 16 && TOK <= THREADS, "tile shape");
    __shared__ __align__(16) u8 sb[2][TOK * B_ROW];
    __shared__ int tsum[TOK];
    __shared__ int csum[GROUPED ? 2 : 1][TOK];
    pdl_wait();
    pdl_launch();
    int mi = pick(b, blockIdx.x);
    const TernaryMat& m = b.m[mi];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    int row0 = (blockIdx.x - b.block_start[mi]) * (32 * WARPS) + warp * 32;
    int tok0 = blockIdx.y * TOK;
    int n_chunks = k_pad >> 8, nls = k_pad >> 6;
    u64 row_bytes = k_pad >> 2;
    bool grouped = GROUPED && m.groups != 1;

    if (threadIdx.x < TOK) {
        int t = tok0 + threadIdx.x, s = 0;
        if (t < n_tok)
            for (int i = 0; i < nls; ++i) s += lsum[(u64)t * nls + i];
        tsum[threadIdx.x] = s;
    }

    int acc[MMA_MT][MMA_NT][4];
    float facc[GROUPED ? MMA_MT : 1][GROUPED ? MMA_NT : 1][4];
#pragma unroll
    for (int i = 0; i < MMA_MT; ++i)
#pragma unroll
        for (int j = 0; j < MMA_NT; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                acc[i][j][r] = 0;
                if constexpr (GROUPED) facc[i][j][r] = 0.0f;
            }

    // Chunk c's activation tile, TOK tokens × 16 pieces of 16 bytes: PIECES
    // pieces a thread, loaded, then stored in the padded layout.
    auto load_acts = [&](int c, uint4* v) {
#pragma unroll
        for (int i = 0; i < PIECES; ++i) {
            int idx = threadIdx.x + THREADS * i, t = tok0 + (idx >> 4);
            v[i] = t < n_tok ? *(const uint4*)(q + (u64)t * k_pad + c * 256 + (idx & 15) * 16) : make_uint4(0, 0, 0, 0);
        }
    };
    auto store_acts = [&](const uint4* v, u8* buf) {
#pragma unroll
        for (int i = 0; i < PIECES; ++i) {
            int idx = threadIdx.x + THREADS * i, tok = idx >> 4, piece = idx & 15;
            u64* dst = (u64*)(buf + tok * B_ROW + (piece >> 2) * B_LANE + (piece & 3) * 16);
            dst[0] = ((u64)v[i].y << 32) | v[i].x;
            dst[1] = ((u64)v[i].w << 32) | v[i].z;
        }
    };
    // Rows past the matrix (a block wider than its padding) read as zeros;
    // their outputs are dropped.
    auto load_w = [&](int c, uint4 (*a)[2]) {
#pragma unroll
        for (int i = 0; i < MMA_MT; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                int row = row0 + i * 16 + g + 8 * h;
                a[i][h] = row < m.rows ? ld_stream((const uint4*)(m.w + (u64)row * row_bytes + c * 64 + tig * 16))
                                       : make_uint4(0, 0, 0, 0);
            }
    };
    // Per-block scales: chunk c's level sum of token tok0 + threadIdx.x.
    auto chunk_sum = [&](int c) {
        int t = tok0 + threadIdx.x, s = 0;
        if (t < n_tok)
            for (int i = 0; i < 4; ++i) s += lsum[(u64)t * nls + c * 4 + i];
        return s;
    };
    bool sums = grouped && threadIdx.x < TOK;
    uint4 v[PIECES], a[MMA_MT][2], an[MMA_MT][2];
    int cs = 0;
    load_acts(0, v);
    load_w(0, a);
    if constexpr (GROUPED)
        if (sums) csum[0][threadIdx.x] = chunk_sum(0);
    store_acts(v, sb[0]);
    __syncthreads();

    for (int c = 0; c < n_chunks; ++c) {
        int cur = c & 1;
        bool more = c + 1 < n_chunks;
        if (more) {
            load_acts(c + 1, v);
            load_w(c + 1, an);
            if (sums) cs = chunk_sum(c + 1);
        }
#pragma unroll
        for (int s = 0; s < 8; ++s) {
            int w = s >> 1, sh = (s & 1) * 4;
            u32 bf[MMA_NT][2];
#pragma unroll
            for (int j = 0; j < MMA_NT; ++j) {
                const u32* p = (const u32*)(sb[cur] + (j * 8 + g) * B_ROW + tig * B_LANE + s * 8);
                bf[j][0] = p[0];
                bf[j][1] = p[1];
            }
#pragma unroll
            for (int i = 0; i < MMA_MT; ++i) {
                u32 lo = word_of(a[i][0], w), hi = word_of(a[i][1], w);
                u32 a0 = (lo >> sh) & M2, a2 = (lo >> (sh + 2)) & M2;
                u32 a1 = (hi >> sh) & M2, a3 = (hi >> (sh + 2)) & M2;
#pragma unroll
                for (int j = 0; j < MMA_NT; ++j) mma_u8s8(acc[i][j], a0, a1, a2, a3, bf[j][0], bf[j][1]);
            }
        }
        if constexpr (GROUPED) {
            if (grouped) {
#pragma unroll
                for (int i = 0; i < MMA_MT; ++i)
#pragma unroll
                    for (int j = 0; j < MMA_NT; ++j)
#pragma unroll
                        for (int r = 0; r < 4; ++r) {
                            int row = row0 + i * 16 + g + 8 * (r >> 1), tok = j * 8 + tig * 2 + (r & 1);
                            float sc = row < m.rows ? m.scales[(u64)row * m.groups + c] : 0.0f;
                            facc[i][j][r] += (float)(acc[i][j][r] - csum[cur][tok]) * sc;
                            acc[i][j][r] = 0;
                        }
            }
        }
        // The other buffer was last read in chunk c − 1, before the barrier
        // that ended it.
        if (more) {
            store_acts(v, sb[cur ^ 1]);
            if constexpr (GROUPED)
                if (sums) csum[cur ^ 1][threadIdx.x] = cs;
#pragma unroll
            for (int i = 0; i < MMA_MT; ++i) {
                a[i][0] = an[i][0];
                a[i][1] = an[i][1];
            }
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < MMA_MT; ++i)
#pragma unroll
        for (int j = 0; j < MMA_NT; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                int row = row0 + i * 16 + g + 8 * (r >> 1), tl = j * 8 + tig * 2 + (r & 1), t = tok0 + tl;
                if (row >= m.rows || t >= n_tok) continue;
                float y;
                if constexpr (GROUPED)
                    y = grouped ? facc[i][j][r] * d[t] : (float)(acc[i][j][r] - tsum[tl]) * m.scales[row] * d[t];
                else
                    y = (float)(acc[i][j][r] - tsum[tl]) * m.scales[row] * d[t];
                u64 o = (u64)t * m.rows + row;
                m.out[o] = m.res ? y + m.res[o] : y;
            }
}

// 256 rows × 32 tokens, one scale a row: the prompt GEMM of every ternary
// format as repacked (118 registers, 2 blocks an SM). Twice the rows of the
// 128 × 32 tiles below, so each activation fragment loaded serves twice the
// rows; 256 × 64 (one block an SM), 128 × 64 and 512 × 32 tiles were slower.
extern "C" __global__ void __launch_bounds__(256) ternary_gemm(TernaryBatch b, int k_pad, const i8* q, const float* d,
                                                              const int* lsum, int n_tok) {
    gemm_body<8, false>(b, k_pad, q, d, lsum, n_tok);
}

// 128 rows × 32 tokens for matrices with a scale per 256-chunk (TQ files
// whose blocks disagree); 168 registers, 3 blocks an SM.
extern "C" __global__ void __launch_bounds__(128) ternary_gemm_grouped(TernaryBatch b, int k_pad, const i8* q,
                                                                      const float* d, const int* lsum, int n_tok) {
    gemm_body<4, true>(b, k_pad, q, d, lsum, n_tok);
}
