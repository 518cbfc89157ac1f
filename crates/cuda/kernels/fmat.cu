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

// Σ (byte − offset) · x over a word's four bytes, with bias = 2^23 + offset.
// Each byte becomes a float without an int-to-float conversion (a
// quarter-rate instruction, which bounded the head GEMVs): one byte permute
// puts it in the mantissa of 2^23, and one exact subtraction leaves
// byte − offset.
__device__ __forceinline__ float bytes_dot4(u32 bytes, float4 x, float bias) {
    const u32 two23 = 0x4b000000u;
    float a = __uint_as_float(__byte_perm(bytes, two23, 0x7440)) - bias;
    float b = __uint_as_float(__byte_perm(bytes, two23, 0x7441)) - bias;
    float c = __uint_as_float(__byte_perm(bytes, two23, 0x7442)) - bias;
    float d = __uint_as_float(__byte_perm(bytes, two23, 0x7443)) - bias;
    return a * x.x + b * x.y + c * x.z + d * x.w;
}

// Int8 levels with one f32 scale per 16 (qlayout.rs) times f32 activations:
// Q8_0/Q4_0 heads and matrices. One warp per row, 8 rows per block; lane L
// takes the level words L, L + 32, ... (4 levels each), so that a warp's
// level loads read 128 contiguous bytes and its float4 activation loads 512
// (4 cache lines; a lane on a whole 16-level group put lanes 64 bytes apart
// in x and 16 lines in each load). Four lanes share a scale. The levels
// never depend on the previous kernel, so the first loads go out before
// `pdl_wait`. The levels, flipped to 0..255 by their sign bits, stand for
// −128..127.
#define Q8_BIAS 8388736.0f
#define Q8_UNROLL 10
__device__ __forceinline__ void q8_fetch(const u32* qr, const float* sr, int c0, int nw, u32* w, float* sc) {
#pragma unroll
    for (int u = 0; u < Q8_UNROLL; ++u) {
        int c = c0 + 32 * u;
        bool ok = c < nw;
        w[u] = ok ? __ldg(qr + c) : 0u;
        sc[u] = ok ? __ldg(sr + (c >> 2)) : 0.0f;
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
    int nw = k >> 2; \
    const u32* qr = (const u32*)(q + (u64)row * k); \
    const float* sr = s + (u64)row * (k >> 4); \
    u32 w[Q8_UNROLL]; \
    float sc[Q8_UNROLL]; \
    if (live) q8_fetch(qr, sr, lane, nw, w, sc); \
    pdl_wait(); \
    pdl_launch(); \
    if (!live) return; \
    float acc[FMAT_MAXT]; \
_Pragma("unroll") \
    for (int t = 0; t < FMAT_MAXT; ++t) acc[t] = 0.0f; \
    for (int c0 = lane; c0 < nw; c0 += 32 * Q8_UNROLL) { \
        if (c0 != lane) q8_fetch(qr, sr, c0, nw, w, sc); \
_Pragma("unroll") \
        for (int u = 0; u < Q8_UNROLL; ++u) { \
            int c = c0 + 32 * u; \
            if (c >= nw) break; \
_Pragma("unroll") \
            for (int t = 0; t < MAXT; ++t) { \
                if (t >= n_tok) break; \
                float4 xv = __ldg((const float4*)(x + (u64)t * k) + c); \
                acc[t] += bytes_dot4(w[u] ^ 0x80808080u, xv, Q8_BIAS) * sc[u]; \
            } \
        } \
    } \
    store_row(acc, min(n_tok, MAXT), lane, row, out, out_stride, res); \
}

Q8_KERNEL(q8_gemv, FMAT_MAXT, 1)
Q8_KERNEL(q8_gemv1, 1, 4)

// Q6_K split into planes (qlayout.rs `pack_q6k`): for a [k, rows] matrix of
// nb = k·rows/256 blocks, the blocks' `ql` (128 bytes each), `qh` (64),
// `scales` (16) and `d` (2) in turn, so every load is aligned (a 210-byte
// block is not), each block's scales ordered (0, 4), (1, 5), (2, 6), (3, 7),
// (8, 12), ... so that a lane's two are one load. One warp per row, 8 rows
// per block, the warp on one Q6_K block at a time: lane L = 16h + 8g + j
// reads the `ql` word at 4L, which holds elements e = 128h + 32g + 4j .. e + 3
// (low nibbles) and e + 64 .. e + 67 (high nibbles), and the `qh` word at
// 32h + 4j with their top bits. A warp's float4 loads of x then cover 2 × 256
// contiguous bytes (4 cache lines a load; lanes 64 bytes apart would touch
// 16). A 2560-wide row (10 blocks) is fetched in one round, before
// `pdl_wait` (the weights never depend on the previous kernel); at 80
// registers three blocks of threads share an SM, which measured faster than
// four blocks fetching half a row at a time, or than a warp fetching its next
// row while it multiplies (BENCHMARKS.md).
#define Q6_UNROLL 10
struct Q6Lane {
    const u32* ql;
    const u32* qh;
    const u16* sc;
    const u16* d;
    int shift;
};

__device__ __forceinline__ Q6Lane q6_lane(const u8* base, int rows, int k, int row, int lane) {
    u64 nb = (u64)rows * k / 256, b0 = (u64)row * k / 256;
    int h = lane >> 4, g = (lane >> 3) & 1, j = lane & 7;
    Q6Lane p;
    p.ql = (const u32*)(base + b0 * 128) + lane;
    p.qh = (const u32*)(base + nb * 128 + b0 * 64) + 8 * h + j;
    p.sc = (const u16*)(base + nb * 192 + b0 * 16) + 4 * h + 2 * g + (j >> 2);
    p.d = (const u16*)(base + nb * 208) + b0;
    p.shift = 2 * g;
    return p;
}

// One Q6_K block's share of a lane: level words, its two scales (the low
// byte for the low nibbles' group), d.
struct Q6Share {
    u32 ql, qh, sc, d;
};

__device__ __forceinline__ void q6_fetch(const Q6Lane& p, int b0, int nb, Q6Share* w) {
#pragma unroll
    for (int u = 0; u < Q6_UNROLL; ++u) {
        int b = b0 + u;
        bool ok = b < nb;
        w[u].ql = ok ? __ldg(p.ql + 32 * b) : 0u;
        w[u].qh = ok ? __ldg(p.qh + 16 * b) : 0u;
        w[u].sc = ok ? __ldg(p.sc + 8 * b) : 0u;
        w[u].d = ok ? __ldg(p.d + b) : 0u;
    }
}

// Four levels (0..63) as bytes: four low nibbles and the matching bit pairs
// of a `qh` word, moved to bits 4–5 of each byte.
__device__ __forceinline__ u32 q6_levels(u32 nibbles, u32 qh, int shift) {
    return (nibbles & 0x0f0f0f0fu) | (((qh >> shift) & 0x03030303u) << 4);
}

// Q6_K levels are stored 0..63 for −32..31.
#define Q6_BIAS 8388640.0f

#define Q6K_KERNEL(NAME, MAXT, MINB) \
extern "C" __global__ void __launch_bounds__(256, MINB) NAME(const u8* base, int rows, int k, const float* x, \
                                                            int n_tok, float* out, u64 out_stride, const float* res) { \
    int row = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31; \
    bool live = row < rows; \
    int nb = k >> 8; \
    Q6Lane p = q6_lane(base, rows, k, live ? row : 0, lane); \
    int e = 128 * (lane >> 4) + 32 * ((lane >> 3) & 1) + 4 * (lane & 7); \
    Q6Share w[Q6_UNROLL]; \
    if (live) q6_fetch(p, 0, nb, w); \
    pdl_wait(); \
    pdl_launch(); \
    if (!live) return; \
    float acc[FMAT_MAXT]; \
_Pragma("unroll") \
    for (int t = 0; t < FMAT_MAXT; ++t) acc[t] = 0.0f; \
    for (int b0 = 0; b0 < nb; b0 += Q6_UNROLL) { \
        if (b0 != 0) q6_fetch(p, b0, nb, w); \
_Pragma("unroll") \
        for (int u = 0; u < Q6_UNROLL; ++u) { \
            int b = b0 + u; \
            if (b >= nb) break; \
            float dd = h2f((u16)w[u].d); \
            float s0 = dd * (float)(i8)(w[u].sc & 255), s1 = dd * (float)(i8)(w[u].sc >> 8); \
            u32 lo = q6_levels(w[u].ql, w[u].qh, p.shift); \
            u32 hi = q6_levels(w[u].ql >> 4, w[u].qh, p.shift + 4); \
_Pragma("unroll") \
            for (int t = 0; t < MAXT; ++t) { \
                if (t >= n_tok) break; \
                const float* xb = x + (u64)t * k + 256 * b + e; \
                float p0 = bytes_dot4(lo, __ldg((const float4*)xb), Q6_BIAS); \
                float p1 = bytes_dot4(hi, __ldg((const float4*)(xb + 64)), Q6_BIAS); \
                acc[t] += p0 * s0 + p1 * s1; \
            } \
        } \
    } \
    store_row(acc, min(n_tok, MAXT), lane, row, out, out_stride, res); \
}

Q6K_KERNEL(q6k_gemv, FMAT_MAXT, 1)
Q6K_KERNEL(q6k_gemv1, 1, 3)

// Four activations as Q8_K levels: round half away from zero, saturated
// like the CPU's `as i8` (tern_quant::act, Q8_K).
__device__ __forceinline__ u32 q8k_pack4(float4 v, float id) {
    const float f[4] = {v.x, v.y, v.z, v.w};
    u32 w = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) w |= (u32)(max(-128, min(127, (int)roundf(f[i] * id))) & 255) << (8 * i);
    return w;
}

// One token's Q6_K product in the CPU's integers (Precision::Paired): x as
// Q8_K (d = amax/127 per 256 elements), each lane's level words against
// the matching activation words by dp4a (levels − 32 as signed bytes),
// scaled by the group scales, then by d_w · d_x per Q6_K block. Each block
// first quantizes x into shared memory (k + k/64 bytes; k/256 warp passes,
// 10 KB from L2 at 2560, no launch of its own), then its warps walk rows
// gridDim.x · 8 apart (lower.rs: three blocks an SM). The float kernel's
// activation loads, 2 × 4 cache lines a warp per Q6_K block, bounded it at
// 1.7 TB/s; here they are two 128-byte shared-memory reads. Lane mapping and
// weight fetches as q6k_gemv1.
extern "C" __global__ void __launch_bounds__(256, 3) q6k_gemv1_q8(const u8* base, int rows, int k, const float* x,
                                                                   int n_tok, float* out, u64 out_stride,
                                                                   const float* res) {
    extern __shared__ __align__(16) u8 qsm[];
    i8* xq = (i8*)qsm;
    float* dx = (float*)(qsm + k);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nb = k >> 8;
    int row = blockIdx.x * 8 + warp, stride = gridDim.x * 8;
    Q6Lane p = q6_lane(base, rows, k, row < rows ? row : 0, lane);
    int e = 128 * (lane >> 4) + 32 * ((lane >> 3) & 1) + 4 * (lane & 7);
    Q6Share w[Q6_UNROLL];
    if (row < rows) q6_fetch(p, 0, nb, w);
    pdl_wait();
    pdl_launch();
    for (int b = warp; b < nb; b += 8) {
        const float4* xb = (const float4*)(x + 256 * b) + 2 * lane;
        float4 v0 = __ldg(xb), v1 = __ldg(xb + 1);
        float am = fmaxf(fmaxf(fmaxf(fabsf(v0.x), fabsf(v0.y)), fmaxf(fabsf(v0.z), fabsf(v0.w))),
                         fmaxf(fmaxf(fabsf(v1.x), fabsf(v1.y)), fmaxf(fabsf(v1.z), fabsf(v1.w))));
        am = warp_max(am);
        float d = am / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        ((uint2*)(xq + 256 * b))[lane] = make_uint2(q8k_pack4(v0, id), q8k_pack4(v1, id));
        if (lane == 0) dx[b] = d;
    }
    __syncthreads();
    for (; row < rows; row += stride) {
        if (row != (int)blockIdx.x * 8 + warp) {
            p = q6_lane(base, rows, k, row, lane);
            q6_fetch(p, 0, nb, w);
        }
        float acc = 0.0f;
        for (int b0 = 0; b0 < nb; b0 += Q6_UNROLL) {
            if (b0 != 0) q6_fetch(p, b0, nb, w);
#pragma unroll
            for (int u = 0; u < Q6_UNROLL; ++u) {
                int b = b0 + u;
                if (b >= nb) break;
                u32 lo = __vsub4(q6_levels(w[u].ql, w[u].qh, p.shift), 0x20202020u);
                u32 hi = __vsub4(q6_levels(w[u].ql >> 4, w[u].qh, p.shift + 4), 0x20202020u);
                const i8* xa = xq + 256 * b + e;
                int s = (int)(i8)(w[u].sc & 255) * __dp4a((int)lo, *(const int*)xa, 0) +
                        (int)(i8)(w[u].sc >> 8) * __dp4a((int)hi, *(const int*)(xa + 64), 0);
                acc += h2f((u16)w[u].d) * dx[b] * (float)s;
            }
        }
        float y = warp_sum(acc);
        if (lane == 0) out[row] = res ? y + res[row] : y;
    }
}

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
extern "C" __global__ void get_rows_q8(const i8* __restrict__ q, const float* __restrict__ s, int k, const int* ids,
                                       float* __restrict__ out) {
    pdl_wait();
    pdl_launch();
    u64 row = (u64)ids[blockIdx.x];
    float* o = out + (u64)blockIdx.x * k;
#pragma unroll 4
    for (int e = threadIdx.x; e < k; e += blockDim.x)
        o[e] = (float)__ldg(q + row * k + e) * __ldg(s + ((row * k + e) >> 4));
}

// Rows of the Q6_K planes, dequantized. grid: rows looked up, block: 256.
// The weights are read-only and never alias `out`, so a thread's loads for
// all its elements go out before its first store (a decoding step's lookup
// is the first kernel of the step, on its critical path).
extern "C" __global__ void get_rows_q6k(const u8* __restrict__ base, int rows, int k, const int* ids,
                                        float* __restrict__ out) {
    pdl_wait();
    pdl_launch();
    u64 nb = (u64)rows * k / 256, b0 = (u64)ids[blockIdx.x] * k / 256;
    const i8* sc = (const i8*)base + nb * 192;
    const u16* dv = (const u16*)(base + nb * 208);
    float* o = out + (u64)blockIdx.x * k;
#pragma unroll 4
    for (int e = threadIdx.x; e < k; e += blockDim.x) {
        u64 b = b0 + (e >> 8);
        int i = e & 255, h = i >> 7, g = (i >> 5) & 3, l = i & 31;
        u32 nib = (__ldg(base + b * 128 + 64 * h + 32 * (g & 1) + l) >> (4 * (g >> 1))) & 15;
        u32 pair = (__ldg(base + nb * 128 + b * 64 + 32 * h + l) >> (2 * g)) & 3;
        int q = i >> 4, at = 2 * ((q & 3) + 4 * (q >> 3)) + ((q >> 2) & 1);
        o[e] = h2f(__ldg(dv + b)) * (float)__ldg(sc + b * 16 + at) * (float)((int)(nib | (pair << 4)) - 32);
    }
}
