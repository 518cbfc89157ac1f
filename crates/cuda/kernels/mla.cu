// Multi-head latent attention (DeepSeek-V2/V3 in the absorbed form,
// crates/models/src/mla.rs), compiled after fmat.cu (its level arithmetic):
// a head's slice of a row (`columns`), the per-head products with the key
// and value up-projections (`heads_*`), and attention over the latent cache
// (`mla_store`, `mla_attention`, `mla_merge`).

// out[p · len + j] = x[p · width + start + j]: elements start..start + len of
// every piece of `width` (Op::Columns). Grid-stride over the n outputs.
extern "C" __global__ void columns(const float* x, float* out, u64 n, int width, int start, int len) {
    pdl_wait();
    pdl_launch();
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        u64 p = i / len;
        out[i] = x[p * width + start + (i - p * len)];
    }
}

// Per-head products (Op::MulMatHeads, tern_graph::HeadMatMul): head h reads
// weight rows h·stride + offset .. + len of a [k, rows] weight (a 3-D
// [k, rows, n_head] tensor's rows in order, stride = rows; a legacy
// attn_kv_b's through stride and offset). Token t's slice of head h is at
// (t · n_head + h) · width in x and out. Weights are int8 levels with an f32
// scale per 16 and, where `o` is not null, an offset per 16 (element s·q + o,
// qlayout.rs), or stored floats read by `dq` (`q` with `row_bytes`, `type`).
// Activations stay f32 whatever the op's precision: the GPU's block products
// all take f32 activations.
#define HEADS_MAXT FMAT_MAXT

// The four elements of a level word at scale sc and offset of.
__device__ __forceinline__ float4 levels4(u32 w, float sc, float of) {
    const u32 two23 = 0x4b000000u;
    w ^= 0x80808080u;
    float a = __uint_as_float(__byte_perm(w, two23, 0x7440)) - Q8_BIAS;
    float b = __uint_as_float(__byte_perm(w, two23, 0x7441)) - Q8_BIAS;
    float c = __uint_as_float(__byte_perm(w, two23, 0x7442)) - Q8_BIAS;
    float d = __uint_as_float(__byte_perm(w, two23, 0x7443)) - Q8_BIAS;
    // Rounded as the CPU's dequantization rounds (no fused multiply-add).
    return make_float4(__fadd_rn(__fmul_rn(a, sc), of), __fadd_rn(__fmul_rn(b, sc), of),
                       __fadd_rn(__fmul_rn(c, sc), of), __fadd_rn(__fmul_rn(d, sc), of));
}

// y_h[i] = W[h·stride + offset + i] · x_h: k inputs and len outputs a head.
// grid: (⌈len / 8⌉, n_head, ⌈n_tok / 8⌉), block 256: warp w of block
// (bx, h, bz) takes row 8·bx + w of head h for tokens 8·bz .. + 8, its lanes
// on level words L, L + 32, ... as in q8_gemv (stored floats: elements).
// MODE: HEADS_STORED (dq), HEADS_LEVELS (f32 x), HEADS_PAIRED (act_q8's
// int8 x: qa, da in blocks of 2^ab; a quantized model's products, the
// CPU's integers as in paired.cu).
// HEADS_PAIRED_X: HEADS_PAIRED for one token, each block quantizing its
// head's slice of x itself into shared memory (dynamic: k levels, then
// k / 2^ab scales), as act_q8 would: no act_q8 launch.
#define HEADS_STORED 0
#define HEADS_LEVELS 1
#define HEADS_PAIRED 2
#define HEADS_PAIRED_X 3
template <int MODE>
__device__ __forceinline__ void heads_rows(const i8* q, const float* s, const float* o, u64 row_bytes, int type,
                                           int k, int stride, int offset, int len, int n_head, const float* x,
                                           const i8* qa, const float* da, int ab, int n_tok, float* out) {
    extern __shared__ __align__(16) u8 heads_x[];
    pdl_wait();
    pdl_launch();
    int i = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31, h = blockIdx.y;
    int t0 = blockIdx.z * HEADS_MAXT, nt = min(HEADS_MAXT, n_tok - t0);
    if (MODE == HEADS_PAIRED_X) {
        i8* xq = (i8*)heads_x;
        float* xd = (float*)(heads_x + k);
        for (int b = threadIdx.x >> 5; b < (k >> ab); b += 8)
            quant_block(x + (u64)h * k + (b << ab), xq + (b << ab), xd + b, ab, lane);
        __syncthreads();
        qa = xq;
        da = xd;
    }
    if (i >= len) return;
    u64 row = (u64)h * stride + offset + i;
    const float* xh = x + ((u64)t0 * n_head + h) * k;
    u64 xt = (u64)n_head * k;
    float acc[HEADS_MAXT];
#pragma unroll
    for (int t = 0; t < HEADS_MAXT; ++t) acc[t] = 0.0f;
    if (MODE == HEADS_PAIRED || MODE == HEADS_PAIRED_X) {
        const u32* qr = (const u32*)(q + row * k);
        const float* sr = s + row * (k >> 4);
        const float* orw = o ? o + row * (k >> 4) : nullptr;
        // Token t's head-h slice starts at element ((t0 + t)·n_head + h)·k
        // (in shared memory, the one token's slice at 0).
        u64 e0 = MODE == HEADS_PAIRED_X ? 0 : ((u64)t0 * n_head + h) * k;
        for (int c = lane; c < (k >> 2); c += 32) {
            u32 w = __ldg(qr + c);
            float sc = __ldg(sr + (c >> 2)), of = orw ? __ldg(orw + (c >> 2)) : 0.0f;
#pragma unroll
            for (int t = 0; t < HEADS_MAXT; ++t) {
                if (t >= nt) break;
                u64 e = e0 + t * xt + 4 * c;
                int av = *(const int*)(qa + e);
                acc[t] += paired_word(w, av, sc, of, da[e >> ab], orw != nullptr);
            }
        }
    } else if (MODE == HEADS_LEVELS) {
        const u32* qr = (const u32*)(q + row * k);
        const float* sr = s + row * (k >> 4);
        const float* orw = o ? o + row * (k >> 4) : nullptr;
        for (int c = lane; c < (k >> 2); c += 32) {
            u32 w = __ldg(qr + c) ^ 0x80808080u;
            float sc = __ldg(sr + (c >> 2)), of = orw ? __ldg(orw + (c >> 2)) : 0.0f;
#pragma unroll
            for (int t = 0; t < HEADS_MAXT; ++t) {
                if (t >= nt) break;
                float4 xv = __ldg((const float4*)(xh + t * xt) + c);
                acc[t] += bytes_dot4(w, xv, Q8_BIAS) * sc;
                if (orw) acc[t] += of * ((xv.x + xv.y) + (xv.z + xv.w));
            }
        }
    } else {
        const u8* wr = (const u8*)q + row * row_bytes;
        for (int e = lane; e < k; e += 32) {
            float v = dq(wr, e, type);
#pragma unroll
            for (int t = 0; t < HEADS_MAXT; ++t) {
                if (t >= nt) break;
                acc[t] += v * __ldg(xh + t * xt + e);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < HEADS_MAXT; ++t) {
        if (t >= nt) break;
        float y = warp_sum(acc[t]);
        if (lane == 0) out[((u64)(t0 + t) * n_head + h) * len + i] = y;
    }
}

// y_h[c] = Σ_i x_h[i] · W[h·stride + offset + i][c]: len inputs and k
// outputs a head (the transposed k rows of a legacy attn_kv_b). grid:
// (⌈k / 512⌉, n_head, ⌈n_tok / 8⌉), block 128: thread u owns columns
// 4u .. 4u + 3 of the block's 512 (one level word, inside one group of 16)
// and walks the head's rows in order, so a warp's weight loads read 128
// contiguous bytes a row. The block's tokens' x_h are staged in shared
// memory (dynamic: 8 · len floats). k is a multiple of 4.
// (MODE: HEADS_STORED or HEADS_LEVELS: the CPU's transposed products are
// f32 too, and these are bit for bit theirs.)
template <int MODE>
__device__ __forceinline__ void heads_cols(const i8* q, const float* s, const float* o, u64 row_bytes, int type,
                                           int k, int stride, int offset, int len, int n_head, const float* x,
                                           const i8* qa, const float* da, int ab, int n_tok, float* out) {
    extern __shared__ float heads_xs[];
    pdl_wait();
    pdl_launch();
    int c0 = 4 * (blockIdx.x * 128 + threadIdx.x), h = blockIdx.y;
    int t0 = blockIdx.z * HEADS_MAXT, nt = min(HEADS_MAXT, n_tok - t0);
    for (int e = threadIdx.x; e < nt * len; e += blockDim.x) {
        int t = e / len;
        heads_xs[e] = x[((u64)(t0 + t) * n_head + h) * len + (e - t * len)];
    }
    __syncthreads();
    if (c0 >= k) return;
    float4 acc[HEADS_MAXT];
#pragma unroll
    for (int t = 0; t < HEADS_MAXT; ++t) acc[t] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int i = 0; i < len; ++i) {
        u64 row = (u64)h * stride + offset + i;
        float4 w;
        if (MODE == HEADS_LEVELS) {
            u64 at = row * k + c0;
            w = levels4(__ldg((const u32*)(q + at)), __ldg(s + (at >> 4)), o ? __ldg(o + (at >> 4)) : 0.0f);
        } else {
            const u8* wr = (const u8*)q + row * row_bytes;
            w = make_float4(dq(wr, c0, type), dq(wr, c0 + 1, type), dq(wr, c0 + 2, type), dq(wr, c0 + 3, type));
        }
#pragma unroll
        for (int t = 0; t < HEADS_MAXT; ++t) {
            if (t >= nt) break;
            // The CPU's operations in its order (rows in turn, each a rounded
            // product then a rounded sum): the same bits.
            float a = heads_xs[t * len + i];
            acc[t].x = __fadd_rn(acc[t].x, __fmul_rn(a, w.x));
            acc[t].y = __fadd_rn(acc[t].y, __fmul_rn(a, w.y));
            acc[t].z = __fadd_rn(acc[t].z, __fmul_rn(a, w.z));
            acc[t].w = __fadd_rn(acc[t].w, __fmul_rn(a, w.w));
        }
    }
#pragma unroll
    for (int t = 0; t < HEADS_MAXT; ++t) {
        if (t >= nt) break;
        *(float4*)(out + ((u64)(t0 + t) * n_head + h) * k + c0) = acc[t];
    }
}

#define HEADS_KERNEL(NAME, BODY, MODE, THREADS)                                                                      \
    extern "C" __global__ void __launch_bounds__(THREADS) NAME(                                                      \
        const i8* q, const float* s, const float* o, u64 row_bytes, int type, int k, int stride, int offset, int len, \
        int n_head, const float* x, const i8* qa, const float* da, int ab, int n_tok, float* out) {                  \
        BODY<MODE>(q, s, o, row_bytes, type, k, stride, offset, len, n_head, x, qa, da, ab, n_tok, out);             \
    }

HEADS_KERNEL(heads_q8, heads_rows, HEADS_LEVELS, 256)
HEADS_KERNEL(heads_q8p, heads_rows, HEADS_PAIRED, 256)
HEADS_KERNEL(heads_q8p_x, heads_rows, HEADS_PAIRED_X, 256)
HEADS_KERNEL(heads_dq, heads_rows, HEADS_STORED, 256)
HEADS_KERNEL(heads_q8_t, heads_cols, HEADS_LEVELS, 128)
HEADS_KERNEL(heads_dq_t, heads_cols, HEADS_STORED, 128)

// The batch's cache rows: [c_t | k_pe_t] at row pos[t] of the latent cache
// ([rank + rope, n_ctx], f32 or f16). Positions come from device memory, so
// a captured decoding step replays at any position. grid: n_tok, block 256.
extern "C" __global__ void mla_store(const float* c, const float* k_pe, u8* cache, const int* pos, int rank, int rope,
                                     int type) {
    pdl_wait();
    pdl_launch();
    int t = blockIdx.x, w = rank + rope;
    u64 dst = (u64)pos[t] * w;
    for (int e = threadIdx.x; e < w; e += blockDim.x) {
        float v = e < rank ? c[(u64)t * rank + e] : k_pe[(u64)t * rope + (e - rank)];
        if (type == T_F16)
            ((u16*)cache)[dst + e] = f2h(v);
        else
            ((float*)cache)[dst + e] = v;
    }
}

// kv_a's rows [c | k_pe] ([rank + rope, n_tok]) straight into the latent
// cache at row pos[t]: c normed (× w when not null; `rms_norm`'s double sum
// and roundings) and k_pe rotated (`rope_rotate`, one head of `rope`): the
// two columns, the norm, the rope and `mla_store` of the graph in one launch,
// with their floats. grid: n_tok, block 256.
extern "C" __global__ void __launch_bounds__(256) mla_kv_store(const float* kv, const float* w, float eps, u8* cache,
                                                               const int* pos, int rank, int rope, int type,
                                                               const float* factors, int n_rot, int mode, float base,
                                                               float fscale, float y_low, float y_high, float y_ext,
                                                               float y_mag) {
    __shared__ double scratch[32];
    pdl_wait();
    pdl_launch();
    int t = blockIdx.x, width = rank + rope, p = pos[t];
    const float* row = kv + (u64)t * width;
    u64 dst = (u64)p * width;
    double ss = 0.0;
    for (int e = threadIdx.x; e < rank; e += blockDim.x) ss += (double)row[e] * (double)row[e];
    ss = block_reduce(ss, scratch, 0.0, Sum());
    float inv = (float)(1.0 / sqrt(ss / rank + (double)eps));
    auto put = [&](int e, float v) {
        if (type == T_F16)
            ((u16*)cache)[dst + e] = f2h(v);
        else
            ((float*)cache)[dst + e] = v;
    };
    for (int e = threadIdx.x; e < rank; e += blockDim.x) {
        float v = row[e] * inv;
        put(e, w ? v * w[e] : v);
    }
    for (int i = threadIdx.x; i < rope / 2; i += blockDim.x) {
        int a, b;
        float ya, yb;
        rope_rotate(row + rank, i, p, n_rot, mode, base, fscale, factors, y_low, y_high, y_ext, y_mag, &a, &b, &ya,
                    &yb);
        put(rank + a, ya);
        put(rank + b, yb);
    }
}

// q's rows of n_head heads [nope | rope] ([(nope + rope) · n_head, n_tok])
// split into q_nope [nope · n_head, n_tok] and the rotated q_pe [rope ·
// n_head, n_tok]: two columns and a rope in one launch. A thread per
// (token, head, j): j < nope copies element j, past it rotates pair j − nope.
extern "C" __global__ void mla_q_split(const float* q, float* q_nope, float* q_pe, const int* pos, int n_head,
                                       int n_tok, int nope, int rope, const float* factors, int n_rot, int mode,
                                       float base, float fscale, float y_low, float y_high, float y_ext, float y_mag) {
    pdl_wait();
    pdl_launch();
    int per = nope + rope / 2;
    u64 total = (u64)n_tok * n_head * per;
    for (u64 idx = blockIdx.x * (u64)blockDim.x + threadIdx.x; idx < total; idx += (u64)gridDim.x * blockDim.x) {
        int j = idx % per;
        u64 th = idx / per;
        const float* xh = q + th * (nope + rope);
        if (j < nope) {
            q_nope[th * nope + j] = xh[j];
            continue;
        }
        int a, b;
        float ya, yb;
        rope_rotate(xh + nope, j - nope, pos[th / n_head], n_rot, mode, base, fscale, factors, y_low, y_high, y_ext,
                    y_mag, &a, &b, &ya, &yb);
        q_pe[th * rope + a] = ya;
        q_pe[th * rope + b] = yb;
    }
}

// Attention over the latent cache (Op::LatentAttention): head h of token t
// scores cache row j as (q_lat_h · c_j + q_pe_h · k_pe_j) · scale for
// j ≤ pos[t], and its output is the softmax-weighted sum of the rows' c_j
// (rank values). q_lat [rank · n_head, n_tok], q_pe [rope · n_head, n_tok],
// out [rank · n_head, n_tok].
//
// grid: (n_split, n_tok, ⌈n_head / MLA_HEADS⌉), block 256: a block takes
// rows s·split .. + split of the cache for MLA_HEADS heads of one token, so
// every cache row it loads serves all of them. It walks its rows in tiles of
// MLA_ROWS, widened to f32 in shared memory: thread (g, j) = (tid / 16,
// tid % 16) scores head g against row j of the tile (the running max and
// sum of head g are kept, equal, by its 16 threads, one half-warp); then
// thread u accumulates columns 4·(u % 128) .. + 3 for heads u / 128, + 2,
// + 4, ... (8 heads: 32 floats). With n_split 1 the block writes the output;
// otherwise each block leaves its (acc, max, sum) in `part` ([n_tok,
// n_head, n_split, rank + 4]: the columns, then max and sum) and mla_merge
// combines them. Blocks whose rows all lie past pos[t] return at once.
// rank ≤ 512 and a multiple of 4; rank + rope a multiple of 8.
//
// Shared memory (dynamic): the tile [MLA_ROWS][W + MLA_PAD], the heads' q
// [MLA_HEADS][W + MLA_PAD], the tile's weights [MLA_HEADS][MLA_ROWS], and a
// head's rescale, max and sum (W = rank + rope). The 4 floats after each row
// put the rows that eight threads of a scoring quarter-warp read at distinct
// banks.
#define MLA_HEADS 16
#define MLA_ROWS 16
#define MLA_PAD 4

extern "C" __global__ void __launch_bounds__(256) mla_attention(const float* q_lat, const float* q_pe,
                                                                const u8* cache, const int* pos, float* out,
                                                                float* part, int n_head, int rank, int rope, int type,
                                                                float scale, int split, int n_split) {
    extern __shared__ float4 mla_sh[];
    int w = rank + rope, wp = w + MLA_PAD;
    float* ks = (float*)mla_sh;
    float* qs = ks + MLA_ROWS * wp;
    float* ps = qs + MLA_HEADS * wp;
    float* corr = ps + MLA_HEADS * MLA_ROWS;
    float* mxs = corr + MLA_HEADS;
    float* lsum = mxs + MLA_HEADS;
    int s = blockIdx.x, t = blockIdx.y, h0 = blockIdx.z * MLA_HEADS, tid = threadIdx.x;
    int gc = min(MLA_HEADS, n_head - h0);
    pdl_wait();
    pdl_launch();
    int n_kv = pos[t] + 1, j0 = s * split, j1 = min(n_kv, j0 + split);
    if (j0 >= n_kv) return;
    for (int e = tid; e < MLA_HEADS * w; e += blockDim.x) {
        int g = e / w, d = e - g * w;
        float v = 0.0f;
        if (g < gc) {
            u64 qh = (u64)t * n_head + h0 + g;
            v = d < rank ? q_lat[qh * rank + d] : q_pe[qh * rope + (d - rank)];
        }
        qs[g * wp + d] = v;
    }
    int sg = tid >> 4, sj = tid & 15;
    float m = -INFINITY, l = 0.0f;
    int c0 = 4 * (tid & 127), ag = tid >> 7;
    float4 acc[MLA_HEADS / 2];
#pragma unroll
    for (int u = 0; u < MLA_HEADS / 2; ++u) acc[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    bool f16 = type == T_F16;
    // A tile is MLA_ROWS consecutive rows: 16-byte words of 8 halves or 4 floats.
    int per_word = f16 ? 8 : 4, row_words = w / per_word;
    for (int r0 = j0; r0 < j1; r0 += MLA_ROWS) {
        // The previous tile has been read (and q staged, the first time).
        __syncthreads();
        for (int qi = tid; qi < MLA_ROWS * row_words; qi += blockDim.x) {
            int j = qi / row_words, cw = qi - j * row_words;
            float4* dst = (float4*)(ks + j * wp + cw * per_word);
            // Rows past the block's end are zeros (their weights are 0, and
            // the cache there may hold anything).
            uint4 raw = make_uint4(0, 0, 0, 0);
            if (r0 + j < j1) raw = ((const uint4*)(cache + (u64)(r0 + j) * w * (f16 ? 2 : 4)))[cw];
            if (f16) {
                dst[0] = make_float4(h2f(raw.x & 0xffff), h2f(raw.x >> 16), h2f(raw.y & 0xffff), h2f(raw.y >> 16));
                dst[1] = make_float4(h2f(raw.z & 0xffff), h2f(raw.z >> 16), h2f(raw.w & 0xffff), h2f(raw.w >> 16));
            } else {
                dst[0] = make_float4(__uint_as_float(raw.x), __uint_as_float(raw.y), __uint_as_float(raw.z),
                                     __uint_as_float(raw.w));
            }
        }
        __syncthreads();
        float sc = -INFINITY;
        if (sg < gc && r0 + sj < j1) {
            const float4* qv = (const float4*)(qs + sg * wp);
            const float4* kv = (const float4*)(ks + sj * wp);
            float dot = 0.0f;
            for (int d = 0; d < (w >> 2); ++d) {
                float4 a = qv[d], b = kv[d];
                dot += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
            }
            sc = dot * scale;
        }
        float tmax = sc;
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, o));
        float m_new = fmaxf(m, tmax);
        // A head past n_head sees no row: its weights are 0 and nothing rescales.
        float pj = sc == -INFINITY ? 0.0f : expf(sc - m_new);
        float cr = m_new == -INFINITY ? 1.0f : expf(m - m_new);
        float psum = pj;
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, o);
        l = l * cr + psum;
        m = m_new;
        ps[sg * MLA_ROWS + sj] = pj;
        if (sj == 0) corr[sg] = cr;
        __syncthreads();
        if (c0 < rank) {
#pragma unroll
            for (int u = 0; u < MLA_HEADS / 2; ++u) {
                float cu = corr[ag + 2 * u];
                acc[u] = make_float4(acc[u].x * cu, acc[u].y * cu, acc[u].z * cu, acc[u].w * cu);
            }
            for (int j = 0; j < MLA_ROWS; ++j) {
                float4 v = *(const float4*)(ks + j * wp + c0);
#pragma unroll
                for (int u = 0; u < MLA_HEADS / 2; ++u) {
                    float p = ps[(ag + 2 * u) * MLA_ROWS + j];
                    acc[u].x += p * v.x;
                    acc[u].y += p * v.y;
                    acc[u].z += p * v.z;
                    acc[u].w += p * v.w;
                }
            }
        }
    }
    if (sj == 0) {
        mxs[sg] = m;
        lsum[sg] = l;
    }
    __syncthreads();
    if (c0 >= rank) return;
#pragma unroll
    for (int u = 0; u < MLA_HEADS / 2; ++u) {
        int g = ag + 2 * u;
        if (g >= gc) continue;
        u64 qh = (u64)t * n_head + h0 + g;
        if (n_split == 1) {
            float inv = 1.0f / lsum[g];
            *(float4*)(out + qh * rank + c0) = make_float4(acc[u].x * inv, acc[u].y * inv, acc[u].z * inv, acc[u].w * inv);
        } else {
            float* pp = part + (qh * n_split + s) * (rank + 4);
            *(float4*)(pp + c0) = acc[u];
            if (c0 == 0) {
                pp[rank] = mxs[g];
                pp[rank + 1] = lsum[g];
            }
        }
    }
}

// Each (token, head)'s output from its active splits' states in `part`
// (mla_attention): Σ acc·e^(max − M) / Σ sum·e^(max − M), M the largest
// max. Split s is active when its first row s·split ≤ pos[t]; every active
// split saw a row. grid: (n_head, n_tok), block 128: thread u the columns
// 4u .. 4u + 3 (rank ≤ 512).
extern "C" __global__ void __launch_bounds__(128) mla_merge(const float* part, const int* pos, float* out, int n_head,
                                                            int rank, int split, int n_split) {
    pdl_wait();
    pdl_launch();
    int h = blockIdx.x, t = blockIdx.y, c0 = 4 * threadIdx.x;
    int n_active = min(n_split, pos[t] / split + 1);
    u64 qh = (u64)t * n_head + h;
    const float* ph = part + qh * n_split * (rank + 4);
    float big = -INFINITY;
    for (int i = 0; i < n_active; ++i) big = fmaxf(big, __ldcg(ph + (u64)i * (rank + 4) + rank));
    float sum = 0.0f;
    float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int i = 0; i < n_active; ++i) {
        const float* pi = ph + (u64)i * (rank + 4);
        float wgt = expf(__ldcg(pi + rank) - big);
        sum += __ldcg(pi + rank + 1) * wgt;
        if (c0 < rank) {
            float4 v = __ldcg((const float4*)(pi + c0));
            a.x += v.x * wgt;
            a.y += v.y * wgt;
            a.z += v.z * wgt;
            a.w += v.w * wgt;
        }
    }
    if (c0 >= rank) return;
    float inv = 1.0f / sum;
    *(float4*)(out + qh * rank + c0) = make_float4(a.x * inv, a.y * inv, a.z * inv, a.w * inv);
}
