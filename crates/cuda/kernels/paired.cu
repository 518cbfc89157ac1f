// Block-quantized weights in their int8 layouts (qlayout.rs) times int8
// activations: a quantized model's products (`Precision::Paired`), in the
// CPU's integers. x is quantized as the CPU quantizes it for the weight's
// type (tern_quant::act): Q8_0 (blocks of 32, d rounded to f16) or Q8_K
// (blocks of 256, d in f32), d = amax/127 and round half away from zero,
// bit for bit. A level word times an activation word is one dp4a, exact;
// only the f32 scaling and summing of those integers runs in another order
// than the CPU's. Compiled after fmat.cu (its `store_row`).

// One block of 2^ab activations (xb) quantized into qb and *d by one warp:
// lane i takes elements PER · i .. + PER (PER = 2^ab / 32); ab 5: Q8_0, whose
// d is then rounded to f16 as its block stores it; 8: Q8_K (the two the
// CPU pairs weights with). With `nwb` (the block's slice of a norm's
// weight), x · inv · nwb is quantized: rms_norm's two roundings.
// `quant_load` reads a lane's elements, `quant_store` reduces and writes.
template <int PER>
__device__ __forceinline__ void quant_load(const float* xb, int lane, const float* nwb, float inv, float* v) {
    xb += lane * PER;
#pragma unroll
    for (int i = 0; i < PER; ++i) v[i] = nwb ? xb[i] * inv * nwb[lane * PER + i] : xb[i];
}

template <int PER>
__device__ __forceinline__ void quant_store(const float* v, i8* qb, float* d, int lane) {
    float am = 0.0f;
#pragma unroll
    for (int i = 0; i < PER; ++i) am = fmaxf(am, fabsf(v[i]));
    am = warp_max(am);
    float dq = am / 127.0f, id = dq != 0.0f ? 1.0f / dq : 0.0f;
#pragma unroll
    for (int i = 0; i < PER; ++i) qb[lane * PER + i] = (i8)max(-128, min(127, (int)roundf(v[i] * id)));
    if (lane == 0) *d = PER == 1 ? h2f(f2h(dq)) : dq;
}

__device__ __forceinline__ void quant_block(const float* xb, i8* qb, float* d, int ab, int lane) {
    float v[8];
    if (ab == 5) {
        quant_load<1>(xb, lane, nullptr, 1.0f, v);
        quant_store<1>(v, qb, d, lane);
    } else {
        quant_load<8>(xb, lane, nullptr, 1.0f, v);
        quant_store<8>(v, qb, d, lane);
    }
}

// Blocks warp, warp + 8, ... < n of 2^ab activations quantized by a block's
// eight warps (block b's x at src(b), its levels at xq + b · 2^ab, its
// scale at xd[b]), each warp loading 8 floats a lane before reducing any:
// one block of 256, eight of 32 (a row of 1408 in blocks of 32 is 5.5
// blocks a warp), so that their loads overlap. `norm_w`: x is normed (as
// quant_load's `nwb`).
template <int PER, typename Src>
__device__ __forceinline__ void quant_blocks_t(int n, Src src, i8* xq, float* xd, const float* norm_w, float inv) {
    constexpr int ahead = 8 / PER, ab = PER == 1 ? 5 : 8;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int b0 = warp; b0 < n; b0 += 8 * ahead) {
        float v[ahead][PER];
#pragma unroll
        for (int j = 0; j < ahead; ++j) {
            int b = b0 + 8 * j;
            if (b < n) quant_load<PER>(src(b), lane, norm_w ? norm_w + (b << ab) : nullptr, inv, v[j]);
        }
#pragma unroll
        for (int j = 0; j < ahead; ++j) {
            int b = b0 + 8 * j;
            if (b >= n) break;
            quant_store<PER>(v[j], xq + (b << ab), xd + b, lane);
        }
    }
}

template <typename Src>
__device__ __forceinline__ void quant_blocks(int n, int ab, Src src, i8* xq, float* xd, const float* norm_w,
                                             float inv) {
    if (ab == 5)
        quant_blocks_t<1>(n, src, xq, xd, norm_w, inv);
    else
        quant_blocks_t<8>(n, src, xq, xd, norm_w, inv);
}

// x: f32 [k, n] → q: i8 [k, n], d: f32 [k / 2^ab, n], blocks of 2^ab. A warp
// per block. grid: ceil(blocks / 8), block 256.
extern "C" __global__ void __launch_bounds__(256) act_q8(const float* x, i8* q, float* d, u64 blocks, int ab) {
    pdl_wait();
    pdl_launch();
    u64 b = (u64)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (b >= blocks) return;
    quant_block(x + (b << ab), q + (b << ab), d + b, ab, threadIdx.x & 31);
}

// Σ over one level word: its dp4a with the activation word, scaled by the
// group's scale and the activation block's d, plus the group's offset times
// d and the word's Σa when the layout has offsets.
__device__ __forceinline__ float paired_word(u32 w, int a, float sc, float of, float da, bool offs) {
    float y = (float)__dp4a((int)w, a, 0) * (sc * da);
    if (offs) y += of * da * (float)__dp4a(0x01010101, a, 0);
    return y;
}

// Dense matrices, one warp per row, 8 rows a block, up to MAXT tokens:
// qa/da are act_q8's output for the batch, ab its block shift. A lane's
// first Q8_UNROLL level words, scales and offsets are loaded before
// `pdl_wait` (fmat.cu's `q8_fetch`: weights never depend on the previous
// kernel), the next round's at the top of each round.
#define Q8P_KERNEL(NAME, MAXT, MINB)                                                                                 \
    extern "C" __global__ void __launch_bounds__(256, MINB)                                                         \
        NAME(const i8* q, const float* s, const float* o, int rows, int k, const i8* qa, const float* da, int ab,    \
             int n_tok, float* out, u64 out_stride, const float* res) {                                             \
        int row = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;                                     \
        bool live = row < rows;                                                                                      \
        int nw = k >> 2, nb = k >> ab;                                                                               \
        const u32* qr = (const u32*)(q + (u64)row * k);                                                              \
        const float* sr = s + (u64)row * (k >> 4);                                                                   \
        const float* orw = o ? o + (u64)row * (k >> 4) : nullptr;                                                    \
        u32 w[Q8_UNROLL];                                                                                            \
        float sc[Q8_UNROLL], of[Q8_UNROLL];                                                                          \
        if (live) q8_fetch(qr, sr, orw, lane, nw, w, sc, of);                                                        \
        pdl_wait();                                                                                                  \
        pdl_launch();                                                                                                \
        if (!live) return;                                                                                           \
        float acc[FMAT_MAXT];                                                                                        \
        _Pragma("unroll") for (int t = 0; t < FMAT_MAXT; ++t) acc[t] = 0.0f;                                         \
        for (int c0 = lane; c0 < nw; c0 += 32 * Q8_UNROLL) {                                                         \
            if (c0 != lane) q8_fetch(qr, sr, orw, c0, nw, w, sc, of);                                                \
            _Pragma("unroll") for (int u = 0; u < Q8_UNROLL; ++u) {                                                  \
                int c = c0 + 32 * u;                                                                                 \
                if (c >= nw) break;                                                                                  \
                _Pragma("unroll") for (int t = 0; t < MAXT; ++t) {                                                   \
                    if (t >= n_tok) break;                                                                           \
                    int a = __ldg((const int*)(qa + (u64)t * k) + c);                                                \
                    float dv = __ldg(da + (u64)t * nb + ((4 * c) >> ab));                                            \
                    acc[t] += paired_word(w[u], a, sc[u], orw ? of[u] : 0.0f, dv, orw != nullptr);                   \
                }                                                                                                    \
            }                                                                                                        \
        }                                                                                                            \
        store_row(acc, min(n_tok, MAXT), lane, row, out, out_stride, res);                                           \
    }

Q8P_KERNEL(q8p_gemv, FMAT_MAXT, 1)
Q8P_KERNEL(q8p_gemv1, 1, 4)

// One token's x quantized by a block into shared memory: k levels at xq, the
// k / 2^ab scales at xd (`quant_blocks`: at most a few KB from L2). With
// `norm_w` (else null) x is
// first RMS-normed with that weight, with `rms_norm`'s double sum in its
// order (256 threads) and its roundings, so the norm needs no launch. Ends
// with the block's barrier.
__device__ __forceinline__ void quant_x(const float* x, int k, int ab, const float* norm_w, float eps, i8* xq,
                                        float* xd) {
    __shared__ double scratch[32];
    float inv = 1.0f;
    if (norm_w) {
        double ss = 0.0;
        for (int e = threadIdx.x; e < k; e += blockDim.x) ss += (double)x[e] * (double)x[e];
        ss = block_reduce(ss, scratch, 0.0, Sum());
        inv = (float)(1.0 / sqrt(ss / k + (double)eps));
    }
    quant_blocks(k >> ab, ab, [&](int b) { return x + (b << ab); }, xq, xd, norm_w, inv);
    __syncthreads();
}

// One token's product, x quantized by each block itself into shared memory
// (dynamic: k levels, then k / 2^ab scales; `quant_x`), so a decoding
// step's paired products need neither an act_q8 nor a norm launch; then
// each warp its row. The first level words are loaded before `pdl_wait`.
// PAIR: each warp takes row `row` of both the gate (q, s, o) and the up
// matrix (q2, s2, o2) and writes act(gate) · up, so a gated FFN's two
// products and its activation are one launch.
template <bool PAIR>
__device__ __forceinline__ void q8p_gemv1x_rows(const i8* q, const float* s, const float* o, const i8* q2,
                                                const float* s2, const float* o2, int rows, int k, const float* x,
                                                int ab, float* out, const float* res, int act,
                                                const float* norm_w, float eps) {
    extern __shared__ __align__(16) u8 q8p_sm[];
    i8* xq = (i8*)q8p_sm;
    float* xd = (float*)(q8p_sm + k);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int row = blockIdx.x * 8 + warp;
    bool live = row < rows;
    int nw = k >> 2;
    const u32* qr = (const u32*)(q + (u64)row * k);
    const float* sr = s + (u64)row * (k >> 4);
    const float* orw = o ? o + (u64)row * (k >> 4) : nullptr;
    u32 w[Q8_UNROLL];
    float sc[Q8_UNROLL], of[Q8_UNROLL];
    if (live) q8_fetch(qr, sr, orw, lane, nw, w, sc, of);
    pdl_wait();
    pdl_launch();
    quant_x(x, k, ab, norm_w, eps, xq, xd);
    if (!live) return;
    float acc[FMAT_MAXT];
#pragma unroll
    for (int t = 0; t < FMAT_MAXT; ++t) acc[t] = 0.0f;
    for (int c0 = lane; c0 < nw; c0 += 32 * Q8_UNROLL) {
        if (c0 != lane) q8_fetch(qr, sr, orw, c0, nw, w, sc, of);
#pragma unroll
        for (int u = 0; u < Q8_UNROLL; ++u) {
            int c = c0 + 32 * u;
            if (c >= nw) break;
            int a = ((const int*)xq)[c];
            acc[0] += paired_word(w[u], a, sc[u], orw ? of[u] : 0.0f, xd[(4 * c) >> ab], orw != nullptr);
        }
    }
    if (PAIR) {
        // The up row, in the same walk over x's levels in shared memory.
        const u32* qr2 = (const u32*)(q2 + (u64)row * k);
        const float* sr2 = s2 + (u64)row * (k >> 4);
        const float* orw2 = o2 ? o2 + (u64)row * (k >> 4) : nullptr;
        for (int c0 = lane; c0 < nw; c0 += 32 * Q8_UNROLL) {
            q8_fetch(qr2, sr2, orw2, c0, nw, w, sc, of);
#pragma unroll
            for (int u = 0; u < Q8_UNROLL; ++u) {
                int c = c0 + 32 * u;
                if (c >= nw) break;
                int a = ((const int*)xq)[c];
                acc[1] += paired_word(w[u], a, sc[u], orw2 ? of[u] : 0.0f, xd[(4 * c) >> ab], orw2 != nullptr);
            }
        }
        float g = warp_sum(acc[0]), up = warp_sum(acc[1]);
        if (lane == 0) out[row] = gated(g, up, act);
        return;
    }
    store_row(acc, 1, lane, row, out, rows, res);
}

extern "C" __global__ void __launch_bounds__(256, 4) q8p_gemv1x(const i8* q, const float* s, const float* o, int rows,
                                                                 int k, const float* x, int ab, float* out,
                                                                 const float* res, const float* nw, float eps) {
    q8p_gemv1x_rows<false>(q, s, o, nullptr, nullptr, nullptr, rows, k, x, ab, out, res, 0, nw, eps);
}

extern "C" __global__ void __launch_bounds__(256, 4) q8p_gemv1x_pair(const i8* q, const float* s, const float* o,
                                                                      const i8* q2, const float* s2, const float* o2,
                                                                      int rows, int k, const float* x, int ab,
                                                                      float* out, int act, const float* nw,
                                                                      float eps) {
    q8p_gemv1x_rows<true>(q, s, o, q2, s2, o2, rows, k, x, ab, out, nullptr, act, nw, eps);
}
