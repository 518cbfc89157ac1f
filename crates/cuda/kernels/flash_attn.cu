// Prompt attention on tensor cores (FlashAttention-2 style) for f16 caches:
// block = (KV head, 16 query tokens), one warp per query head of the group,
// times S sets of warps: set s takes key tiles s, s + S, ... of the block's
// range and the sets merge their (max, sum, output) rows at the end. A block
// is the causal mask's unit of work, and the last query tiles have the most
// keys: the split halves the longest block's chain of tiles, which is what
// the launch waits for once the short blocks are gone.
// Per tile of FA_BK keys: S = Q·Kᵀ with m16n8k16 f16 MMAs (f32 accumulate), the
// causal mask and online softmax on the S fragments, which are repacked in
// registers as the A operand of O += P·V. K and V tiles are staged row-major
// as they are in the cache (16-byte copies), padded so the fragment loads hit
// distinct banks; K's fragments come by `ldmatrix`, V's transposed by
// `ldmatrix.trans`. Scores are kept in log2 units (q carries scale · log2 e),
// so the softmax is exp2.
// grid: (n_head_kv, ceil(n_tok / 16)), block: 32 · G · S (G ≤ 8, G · S ≤ 8;
// S is 1 for flash_attn, 2 for flash_attn_split); head_dim a multiple of
// 16, at most 128;
// positions ascend within the batch. Blocks start in order of blockIdx.y,
// which takes the last query tiles first: with a causal mask they have the
// most keys, and starting them last left a tail of long blocks on a few SMs.
// Query tokens a block and keys a tile (lower/attention.rs FA_TOKENS and
// FA_KEYS).
#define FA_BQ 16
#define FA_BK 32
#define FA_MAXD 128

__device__ __forceinline__ u32 pack_h2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ void mma_f16(float* c, const u32* a, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The m16n8k16 B fragment of rows k0..k0+15 (keys) of a row-major tile at
// column n0 (8 dims): b0 holds keys 2·tig, 2·tig+1 of dim g, b1 the same 8
// keys on. Threads 0..15 give the addresses of the 16 rows.
__device__ __forceinline__ void ldsm_x2_trans(u32& b0, u32& b1, const u16* row) {
    u32 a = (u32)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];" : "=r"(b0), "=r"(b1) : "r"(a));
}

// The m16n8k16 B fragments of keys k0..k0+7 (rows of a row-major K tile) for
// two k-steps: b[0], b[1] for dims d0..d0+15, b[2], b[3] for d0+16..d0+31.
// Thread t gives the address of key k0 + t % 8 at dim d0 + 8 · (t / 8);
// thread (g, tig) gets key g's dims 2·tig, 2·tig+1 of each 8-dim block.
__device__ __forceinline__ void ldsm_x4(u32* b, const u16* row) {
    u32 a = (u32)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                 : "r"(a));
}

// A 16-byte copy from global to shared memory that does not wait for its
// data (sm_80+); `bytes` 0 fills the destination with zeros.
__device__ __forceinline__ void cp_async16(u16* dst, const u16* src, int bytes) {
    u32 d = (u32)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(bytes));
}

// A warp's output fragments times `a` (row g) and `b` (row g + 8).
__device__ __forceinline__ void scale_rows(float (*o)[4], int nnt, float a, float b) {
#pragma unroll
    for (int n = 0; n < FA_MAXD / 8; ++n) {
        if (n >= nnt) break;
        o[n][0] *= a;
        o[n][1] *= a;
        o[n][2] *= b;
        o[n][3] *= b;
    }
}

// The kernel for SETS sets of warps (1 or 2; with one set the merge and the
// guards for rows with no key compile away) and head_dim D (0: the
// argument's; a fixed D unrolls the dims' loops without their bounds tests).
template <int SETS, int D>
__device__ __forceinline__ void flash_attn_sets(const float* q, const u16* kc, const u16* vc, const int* pos,
                                                float* out, int n_tok, int n_head, int n_head_kv, int head_arg,
                                                float scale) {
    extern __shared__ __align__(16) u16 sm[];
    const int head_dim = D ? D : head_arg;
    // Two buffers of a round's K and V tiles: the next round's copies are in
    // flight while the current one is multiplied.
    const int group = n_head / n_head_kv, n_sets = SETS;
    const int KS = head_dim + 8, TILE = n_sets * FA_BK * KS;
    pdl_wait();
    pdl_launch();
    int kvh = blockIdx.x, t0 = (gridDim.y - 1 - blockIdx.y) * FA_BQ;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    int set = warp / group, h = kvh * group + warp % group;
    int row = head_dim * n_head_kv;
    u64 off = (u64)kvh * head_dim;
    int nks = head_dim / 16, nnt = head_dim / 8;
    int ta = t0 + g, tb = t0 + g + 8;
    int pa = ta < n_tok ? pos[ta] : 0, pb = tb < n_tok ? pos[tb] : 0;
    // Positions ascend: keys up to pmin need no mask in any row of the tile.
    int pmin = pos[t0], pmax = pos[min(t0 + FA_BQ, n_tok) - 1];

    // log2 e: exp(x) = exp2(x · log2 e), and exp2f is the hardware's ex2.
    const float qs = scale * 1.4426950408889634f;
    u32 qf[FA_MAXD / 16][4];
    const float* qa = q + ((u64)ta * n_head + h) * head_dim;
    const float* qb = q + ((u64)tb * n_head + h) * head_dim;
#pragma unroll
    for (int k = 0; k < FA_MAXD / 16; ++k) {
        if (k >= nks) break;
        int c = k * 16 + tig * 2;
        bool va = ta < n_tok, vb = tb < n_tok;
        qf[k][0] = va ? pack_h2(qa[c] * qs, qa[c + 1] * qs) : 0u;
        qf[k][1] = vb ? pack_h2(qb[c] * qs, qb[c + 1] * qs) : 0u;
        qf[k][2] = va ? pack_h2(qa[c + 8] * qs, qa[c + 9] * qs) : 0u;
        qf[k][3] = vb ? pack_h2(qb[c + 8] * qs, qb[c + 9] * qs) : 0u;
    }
    float o[FA_MAXD / 8][4];
#pragma unroll
    for (int n = 0; n < FA_MAXD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float ma = -INFINITY, mb = -INFINITY, la = 0.0f, lb = 0.0f;

    // Keys past pmax are zero-filled; their scores are masked below.
    // Thread t copies 16-byte column t % per_row of keys t / per_row, then
    // every key_step-th key on (threads past key_step · per_row copy none).
    const int per_row = head_dim / 8, key_step = blockDim.x / per_row;
    const int my_key = threadIdx.x / per_row, my_col = threadIdx.x % per_row;
    auto load_tile = [&](int kb, u16* ks, u16* vs) {
        if (my_key < key_step)
            for (int key = my_key; key < n_sets * FA_BK; key += key_step) {
                bool in = kb + key <= pmax;
                u64 at = (u64)(in ? kb + key : 0) * row + off + my_col * 8;
                cp_async16(ks + key * KS + my_col * 8, kc + at, in ? 16 : 0);
                cp_async16(vs + key * KS + my_col * 8, vc + at, in ? 16 : 0);
            }
        asm volatile("cp.async.commit_group;");
    };
    const int step = n_sets * FA_BK;
    load_tile(0, sm, sm + TILE);
    for (int kt = 0; kt <= pmax; kt += step) {
        int cur = (kt / step) & 1;
        // The other buffer was last read in the previous round, which every
        // warp finished before that round's closing barrier.
        if (kt + step <= pmax) {
            load_tile(kt + step, sm + (cur ^ 1) * 2 * TILE, sm + (cur ^ 1) * 2 * TILE + TILE);
            asm volatile("cp.async.wait_group 1;" ::: "memory");
        } else {
            asm volatile("cp.async.wait_group 0;" ::: "memory");
        }
        __syncthreads();
        // This warp's set's tile of the round; a tile wholly past pmax is
        // zeros that every row masks.
        int kb = kt + set * FA_BK;
        if (kb > pmax) {
            __syncthreads();
            continue;
        }
        const u16* ks = sm + cur * 2 * TILE + set * FA_BK * KS;
        const u16* vs = ks + TILE;
        float s[FA_BK / 8][4];
#pragma unroll
        for (int j = 0; j < FA_BK / 8; ++j) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
            for (int k = 0; k < FA_MAXD / 16; k += 2) {
                if (k >= nks) break;
                // With an odd nks the last load also reads 16 dims past the
                // row (into the next row, or the V tile after the last): inside
                // the allocation, and unused.
                u32 b[4];
                ldsm_x4(b, ks + (j * 8 + (lane & 7)) * KS + k * 16 + (lane >> 3) * 8);
                mma_f16(s[j], qf[k], b[0], b[1]);
                if (k + 1 < nks) mma_f16(s[j], qf[k + 1], b[2], b[3]);
            }
        }
        if (kb + FA_BK - 1 > pmin) {
#pragma unroll
            for (int j = 0; j < FA_BK / 8; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    int key = kb + j * 8 + tig * 2 + e;
                    if (key > pa) s[j][e] = -INFINITY;
                    if (key > pb) s[j][2 + e] = -INFINITY;
                }
        }
        float mxa = -INFINITY, mxb = -INFINITY;
#pragma unroll
        for (int j = 0; j < FA_BK / 8; ++j) {
            mxa = fmaxf(mxa, fmaxf(s[j][0], s[j][1]));
            mxb = fmaxf(mxb, fmaxf(s[j][2], s[j][3]));
        }
#pragma unroll
        for (int o2 = 1; o2 <= 2; o2 <<= 1) {
            mxa = fmaxf(mxa, __shfl_xor_sync(0xffffffffu, mxa, o2));
            mxb = fmaxf(mxb, __shfl_xor_sync(0xffffffffu, mxb, o2));
        }
        // A row may have no key yet in a later set's tiles (all masked): its
        // maximum stays −inf, and the exponents then take 0 in its place.
        float na = fmaxf(ma, mxa), nb = fmaxf(mb, mxb);
        float ua = SETS > 1 && na == -INFINITY ? 0.0f : na, ub = SETS > 1 && nb == -INFINITY ? 0.0f : nb;
        float ca = exp2f(ma - ua), cb = exp2f(mb - ub);
        float sa = 0.0f, sb = 0.0f;
        u32 pf[FA_BK / 16][4];
#pragma unroll
        for (int j = 0; j < FA_BK / 8; ++j) {
            float e0 = exp2f(s[j][0] - ua), e1 = exp2f(s[j][1] - ua);
            float e2 = exp2f(s[j][2] - ub), e3 = exp2f(s[j][3] - ub);
            sa += e0 + e1;
            sb += e2 + e3;
            int hi = j & 1;
            pf[j >> 1][hi ? 2 : 0] = pack_h2(e0, e1);
            pf[j >> 1][hi ? 3 : 1] = pack_h2(e2, e3);
        }
#pragma unroll
        for (int o2 = 1; o2 <= 2; o2 <<= 1) {
            sa += __shfl_xor_sync(0xffffffffu, sa, o2);
            sb += __shfl_xor_sync(0xffffffffu, sb, o2);
        }
        la = la * ca + sa;
        lb = lb * cb + sb;
        // Far from the first keys a row's maximum seldom moves, and then ca
        // and cb are exactly 1: the warp rescales only when one moved.
        bool moved = na != ma || nb != mb;
        ma = na;
        mb = nb;
        if (__any_sync(0xffffffffu, moved)) scale_rows(o, nnt, ca, cb);
#pragma unroll
        for (int sl = 0; sl < FA_BK / 16; ++sl)
#pragma unroll
            for (int n = 0; n < FA_MAXD / 8; ++n) {
                if (n >= nnt) break;
                u32 b0, b1;
                ldsm_x2_trans(b0, b1, vs + (sl * 16 + (lane & 15)) * KS + n * 8);
                mma_f16(o[n], pf[sl], b0, b1);
            }
        __syncthreads();
    }
    // Sets 1.. leave their rows in shared memory (the tiles are free now:
    // every warp passed the last round's barrier); set 0 rescales all of
    // them to the common maximum and adds. Set 0 always has key 0, which
    // every row sees, so its maxima are finite.
    if (SETS > 1) {
        const int W = nnt * 4 + 4;
        float* mg = (float*)sm;
        if (set > 0) {
            float* p = mg + (u64)((set - 1) * group + warp % group) * W * 32 + lane;
#pragma unroll
            for (int n = 0; n < FA_MAXD / 8; ++n) {
                if (n >= nnt) break;
#pragma unroll
                for (int e = 0; e < 4; ++e) p[(n * 4 + e) * 32] = o[n][e];
            }
            p[(W - 4) * 32] = ma;
            p[(W - 3) * 32] = mb;
            p[(W - 2) * 32] = la;
            p[(W - 1) * 32] = lb;
        }
        __syncthreads();
        if (set > 0) return;
        float Ma = ma, Mb = mb;
        for (int s2 = 1; s2 < n_sets; ++s2) {
            const float* p = mg + (u64)((s2 - 1) * group + warp) * W * 32 + lane;
            Ma = fmaxf(Ma, p[(W - 4) * 32]);
            Mb = fmaxf(Mb, p[(W - 3) * 32]);
        }
        float fa = exp2f(ma - Ma), fb = exp2f(mb - Mb);
        la *= fa;
        lb *= fb;
        scale_rows(o, nnt, fa, fb);
        for (int s2 = 1; s2 < n_sets; ++s2) {
            const float* p = mg + (u64)((s2 - 1) * group + warp) * W * 32 + lane;
            float xa = exp2f(p[(W - 4) * 32] - Ma), xb = exp2f(p[(W - 3) * 32] - Mb);
            la += p[(W - 2) * 32] * xa;
            lb += p[(W - 1) * 32] * xb;
#pragma unroll
            for (int n = 0; n < FA_MAXD / 8; ++n) {
                if (n >= nnt) break;
                o[n][0] += p[(n * 4) * 32] * xa;
                o[n][1] += p[(n * 4 + 1) * 32] * xa;
                o[n][2] += p[(n * 4 + 2) * 32] * xb;
                o[n][3] += p[(n * 4 + 3) * 32] * xb;
            }
        }
    }
    float ia = 1.0f / la, ib = 1.0f / lb;
    float* oa = out + ((u64)ta * n_head + h) * head_dim;
    float* ob = out + ((u64)tb * n_head + h) * head_dim;
#pragma unroll
    for (int n = 0; n < FA_MAXD / 8; ++n) {
        if (n >= nnt) break;
        int c = n * 8 + tig * 2;
        if (ta < n_tok) {
            oa[c] = o[n][0] * ia;
            oa[c + 1] = o[n][1] * ia;
        }
        if (tb < n_tok) {
            ob[c] = o[n][2] * ib;
            ob[c + 1] = o[n][3] * ib;
        }
    }
}

extern "C" __global__ void __launch_bounds__(256) flash_attn(const float* q, const u16* kc, const u16* vc,
                                                            const int* pos, float* out, int n_tok, int n_head,
                                                            int n_head_kv, int head_dim, float scale) {
    flash_attn_sets<1, 0>(q, kc, vc, pos, out, n_tok, n_head, n_head_kv, head_dim, scale);
}

extern "C" __global__ void __launch_bounds__(256) flash_attn_split(const float* q, const u16* kc, const u16* vc,
                                                                  const int* pos, float* out, int n_tok, int n_head,
                                                                  int n_head_kv, int head_dim, float scale) {
    flash_attn_sets<2, 0>(q, kc, vc, pos, out, n_tok, n_head, n_head_kv, head_dim, scale);
}

// head_dim 128 (BitNet b1.58, llama-family models).
extern "C" __global__ void __launch_bounds__(256) flash_attn_128(const float* q, const u16* kc, const u16* vc,
                                                                const int* pos, float* out, int n_tok, int n_head,
                                                                int n_head_kv, int head_dim, float scale) {
    flash_attn_sets<1, 128>(q, kc, vc, pos, out, n_tok, n_head, n_head_kv, head_dim, scale);
}

extern "C" __global__ void __launch_bounds__(256) flash_attn_split_128(const float* q, const u16* kc, const u16* vc,
                                                                      const int* pos, float* out, int n_tok,
                                                                      int n_head, int n_head_kv, int head_dim,
                                                                      float scale) {
    flash_attn_sets<2, 128>(q, kc, vc, pos, out, n_tok, n_head, n_head_kv, head_dim, scale);
}
