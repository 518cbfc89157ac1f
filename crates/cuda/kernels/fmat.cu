// Matrix products of float and block-quantized weights (F32, F16, BF16,
// Q8_0, Q4_0, Q6_K: output heads, embeddings, non-ternary models) with f32
// activations. Memory-bound at the batch sizes where it runs, so one warp per
// row dequantizes each element once and reuses it for up to 8 tokens.

#define FMAT_MAXT 8

// The end of every GEMV here: each token's warp sum for `row`, written by
// lane 0 at out[t · out_stride + row], plus the residual when there is one.
__device__ __forceinline__ void store_row(const float* acc, int n_tok, int lane, int row, float* out, u64 out_stride,
                                          const float* res) {
#pragma unroll
    for (int t = 0; t < FMAT_MAXT; ++t) {
        if (t >= n_tok) break;
        float y = warp_sum(acc[t]);
        if (lane == 0) {
            u64 o = (u64)t * out_stride + row;
            out[o] = res ? y + res[o] : y;
        }
    }
}

// grid: ceil(rows / 8), block 256. x: [k, n_tok] f32; out: [rows, n_tok].
extern "C" __global__ void __launch_bounds__(256) fmat_gemv(const u8* w, u64 row_bytes, int type, int rows, int k,
                                                           const float* x, int n_tok, float* out, u64 out_stride,
                                                           const float* res) {
    pdl_wait();
    pdl_launch();
    int row = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= rows) return;
    const u8* wr = w + (u64)row * row_bytes;
    float acc[FMAT_MAXT];
#pragma unroll
    for (int t = 0; t < FMAT_MAXT; ++t) acc[t] = 0.0f;
    for (int e = lane; e < k; e += 32) {
        float v = dq(wr, e, type);
#pragma unroll
        for (int t = 0; t < FMAT_MAXT; ++t) {
            if (t >= n_tok) break;
            acc[t] += v * x[(u64)t * k + e];
        }
    }
    store_row(acc, n_tok, lane, row, out, out_stride, res);
}

// Int8 levels with one f32 scale per 16 (qlayout.rs) times f32 activations:
// the Q8_0/Q4_0/Q6_K head. One warp per row, 8 rows per block; lane g takes
// groups g, g + 32, ...: a 16-byte level load and four float4 activation loads.
// The levels never depend on the previous kernel, so the first loads go out
// before `pdl_wait`.
#define Q8_UNROLL 4
__device__ __forceinline__ void q8_fetch(const uint4* qr, const float* sr, int g0, int ng, uint4* w, float* sc) {
#pragma unroll
    for (int u = 0; u < Q8_UNROLL; ++u) {
        int g = g0 + 32 * u;
        bool ok = g < ng;
        w[u] = ok ? __ldg(qr + g) : make_uint4(0, 0, 0, 0);
        sc[u] = ok ? __ldg(sr + g) : 0.0f;
    }
}

// Instantiated for FMAT_MAXT tokens and for one (the decoding head), which
// fits 64 registers without spilling: four blocks per SM in flight.
#define Q8_KERNEL(NAME, MAXT, MINB) \
extern "C" __global__ void __launch_bounds__(256, MINB) NAME(const i8* q, const float* s, int rows, int k, \
                                                            const float* x, int n_tok, float* out, u64 out_stride, \
                                                            const float* res) { \
    int row = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31; \
    bool live = row < rows; \
    int ng = k >> 4; \
    const uint4* qr = (const uint4*)(q + (u64)row * k); \
    const float* sr = s + (u64)row * ng; \
    uint4 w[Q8_UNROLL]; \
    float sc[Q8_UNROLL]; \
    if (live) q8_fetch(qr, sr, lane, ng, w, sc); \
    pdl_wait(); \
    pdl_launch(); \
    if (!live) return; \
    float acc[FMAT_MAXT]; \
_Pragma("unroll") \
    for (int t = 0; t < FMAT_MAXT; ++t) acc[t] = 0.0f; \
    for (int g0 = lane; g0 < ng; g0 += 32 * Q8_UNROLL) { \
        if (g0 != lane) q8_fetch(qr, sr, g0, ng, w, sc); \
_Pragma("unroll") \
        for (int u = 0; u < Q8_UNROLL; ++u) { \
            int g = g0 + 32 * u; \
            if (g >= ng) break; \
            const u32 wv[4] = {w[u].x, w[u].y, w[u].z, w[u].w}; \
_Pragma("unroll") \
            for (int t = 0; t < MAXT; ++t) { \
                if (t >= n_tok) break; \
                const float4* xv = (const float4*)(x + (u64)t * k + g * 16); \
                float p = 0.0f; \
_Pragma("unroll") \
                for (int i = 0; i < 4; ++i) { \
                    float4 xx = __ldg(xv + i); \
                    u32 v = wv[i]; \
                    p += (float)(i8)(v & 255) * xx.x + (float)(i8)((v >> 8) & 255) * xx.y + \
                         (float)(i8)((v >> 16) & 255) * xx.z + (float)(i8)(v >> 24) * xx.w; \
                } \
                acc[t] += p * sc[u]; \
            } \
        } \
    } \
    store_row(acc, min(n_tok, MAXT), lane, row, out, out_stride, res); \
}

Q8_KERNEL(q8_gemv, FMAT_MAXT, 1)
Q8_KERNEL(q8_gemv1, 1, 4)

// F16 weights times f32 activations, 8 halves per 16-byte load (k % 8 == 0).
extern "C" __global__ void __launch_bounds__(256) f16_gemv(const u16* w, int rows, int k, const float* x, int n_tok,
                                                          float* out, u64 out_stride, const float* res) {
    pdl_wait();
    pdl_launch();
    int row = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= rows) return;
    int nv = k >> 3;
    const uint4* wr = (const uint4*)(w + (u64)row * k);
    float acc[FMAT_MAXT];
#pragma unroll
    for (int t = 0; t < FMAT_MAXT; ++t) acc[t] = 0.0f;
    for (int v0 = lane; v0 < nv; v0 += 32 * Q8_UNROLL) {
        uint4 wv[Q8_UNROLL];
#pragma unroll
        for (int u = 0; u < Q8_UNROLL; ++u) {
            int v = v0 + 32 * u;
            wv[u] = v < nv ? __ldg(wr + v) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < Q8_UNROLL; ++u) {
            int v = v0 + 32 * u;
            if (v >= nv) break;
            const u32 h[4] = {wv[u].x, wv[u].y, wv[u].z, wv[u].w};
#pragma unroll
            for (int t = 0; t < FMAT_MAXT; ++t) {
                if (t >= n_tok) break;
                const float4* xv = (const float4*)(x + (u64)t * k + v * 8);
                float4 a = __ldg(xv), b = __ldg(xv + 1);
                acc[t] += h2f(h[0] & 0xffff) * a.x + h2f(h[0] >> 16) * a.y + h2f(h[1] & 0xffff) * a.z +
                          h2f(h[1] >> 16) * a.w + h2f(h[2] & 0xffff) * b.x + h2f(h[2] >> 16) * b.y +
                          h2f(h[3] & 0xffff) * b.z + h2f(h[3] >> 16) * b.w;
            }
        }
    }
    store_row(acc, n_tok, lane, row, out, out_stride, res);
}

// Rows of the int8 layout, dequantized. grid: rows, block: 256.
extern "C" __global__ void get_rows_q8(const i8* q, const float* s, int k, const int* ids, float* out) {
    pdl_wait();
    pdl_launch();
    u64 row = (u64)ids[blockIdx.x];
    float* o = out + (u64)blockIdx.x * k;
    for (int e = threadIdx.x; e < k; e += blockDim.x) o[e] = (float)q[row * k + e] * s[(row * k + e) >> 4];
}
