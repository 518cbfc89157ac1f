// Matrix products of float weights and of block-quantized ones in their
// int8 layouts (qlayout.rs; Q6_K matrices in planes) with f32 activations:
// float models, and the prompts of Q6_K matrices (paired.cu has the int8
// activations of quantized models). Memory-bound at the batch sizes where it runs, so one warp per
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
__device__ __forceinline__ void q8_fetch(const u32* qr, const float* sr, const float* orw, int c0, int nw, u32* w,
                                         float* sc, float* of) {
#pragma unroll
    for (int u = 0; u < Q8_UNROLL; ++u) {
        int c = c0 + 32 * u;
        bool ok = c < nw;
        w[u] = ok ? __ldg(qr + c) : 0u;
        sc[u] = ok ? __ldg(sr + (c >> 2)) : 0.0f;
        if (orw) of[u] = ok ? __ldg(orw + (c >> 2)) : 0.0f;
    }
}

// Instantiated for FMAT_MAXT tokens and for one (the decoding head), which
// fits 64 registers without spilling: four blocks per SM in flight; and
// both for levels with an offset per 16 (`o`, LevelsOffset: Q4_K, Q5_K,
// Q2_K, Q4_1, Q5_1), whose element is s·q + o, so a word adds o·Σx.
#define Q8_KERNEL(NAME, MAXT, MINB, OFFS) \
extern "C" __global__ void __launch_bounds__(256, MINB) NAME(const i8* q, const float* s, const float* o, int rows, \
                                                            int k, const float* x, int n_tok, float* out, \
                                                            u64 out_stride, const float* res) { \
    int row = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31; \
    bool live = row < rows; \
    int nw = k >> 2; \
    const u32* qr = (const u32*)(q + (u64)row * k); \
    const float* sr = s + (u64)row * (k >> 4); \
    const float* orw = OFFS ? o + (u64)row * (k >> 4) : nullptr; \
    u32 w[Q8_UNROLL]; \
    float sc[Q8_UNROLL], of[Q8_UNROLL]; \
    if (live) q8_fetch(qr, sr, orw, lane, nw, w, sc, of); \
    pdl_wait(); \
    pdl_launch(); \
    if (!live) return; \
    float acc[FMAT_MAXT]; \
_Pragma("unroll") \
    for (int t = 0; t < FMAT_MAXT; ++t) acc[t] = 0.0f; \
    for (int c0 = lane; c0 < nw; c0 += 32 * Q8_UNROLL) { \
        if (c0 != lane) q8_fetch(qr, sr, orw, c0, nw, w, sc, of); \
_Pragma("unroll") \
        for (int u = 0; u < Q8_UNROLL; ++u) { \
            int c = c0 + 32 * u; \
            if (c >= nw) break; \
_Pragma("unroll") \
            for (int t = 0; t < MAXT; ++t) { \
                if (t >= n_tok) break; \
                float4 xv = __ldg((const float4*)(x + (u64)t * k) + c); \
                acc[t] += bytes_dot4(w[u] ^ 0x80808080u, xv, Q8_BIAS) * sc[u]; \
                if (OFFS) acc[t] += of[u] * ((xv.x + xv.y) + (xv.z + xv.w)); \
            } \
        } \
    } \
    store_row(acc, min(n_tok, MAXT), lane, row, out, out_stride, res); \
}

Q8_KERNEL(q8_gemv, FMAT_MAXT, 1, false)
Q8_KERNEL(q8_gemv1, 1, 4, false)
Q8_KERNEL(q8o_gemv, FMAT_MAXT, 1, true)
Q8_KERNEL(q8o_gemv1, 1, 4, true)

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
// registers three blocks of threads share an SM. Four blocks fetching half a
// row at a time, and a warp fetching its next row while it multiplies, were
// both slower (git history has the comparison).
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
// Q8_K (d = amax/127 per 256 elements), each lane's level words against the
// matching activation words by dp4a, scaled by the group scales, then by
// d_w · d_x per Q6_K block. Each block first quantizes x into shared memory
// (k/256 warp passes, 10 KB from L2 at 2560, no launch of its own), then
// each of its warps walks its own range of rows (lower/fmat.rs: three
// blocks an SM), a round of up to Q6_UNROLL blocks of a row at a time. The
// float kernel's activation loads, 2 × 4 cache lines a warp per Q6_K block,
// are what bounds it; here they are two 128-byte shared-memory reads.
//
// The weights go through shared memory: a warp loads its next round as
// 16-byte words into registers (130 words for a 10-block round: `ql` 80,
// `qh` 40, scales 10; six loads a lane) while it multiplies the current one,
// which it first stores to its slot (2080 bytes, the planes in turn). Each
// lane then reads the `ql` word L and the `qh` word 8h + j of a block as
// q6k_gemv1 does. Sixteen-byte loads stream the head faster than four-byte
// words loaded straight into the lanes that use them; two rounds in flight
// a warp (two blocks an SM) and bulk copies into a ring of stages stream no
// faster than one round. A round's d: lane i loads block i's, and d_w · d_x
// goes to the other lanes by shuffle.
#define Q6_SLOT (Q6_UNROLL * 208)

struct Q6Round {
    uint4 w[6];
};

// Round B (block index row · nb + b0) of n blocks: `ql` words lane + 32t
// (< 8n), `qh` words lane + 32t (< 4n), scale words lane (< n).
__device__ __forceinline__ void q6_load_round(const u8* base, u64 nbt, u64 B, int n, int lane, Q6Round& r) {
    const uint4* ql = (const uint4*)(base + B * 128);
    const uint4* qh = (const uint4*)(base + nbt * 128 + B * 64);
    const uint4* sc = (const uint4*)(base + nbt * 192 + B * 16);
#pragma unroll
    for (int t = 0; t < 3; ++t)
        if (lane + 32 * t < 8 * n) r.w[t] = __ldg(ql + lane + 32 * t);
#pragma unroll
    for (int t = 0; t < 2; ++t)
        if (lane + 32 * t < 4 * n) r.w[3 + t] = __ldg(qh + lane + 32 * t);
    if (lane < n) r.w[5] = __ldg(sc + lane);
}

// The slot holds `ql` at 0, `qh` at 128 · Q6_UNROLL, scales at 192 · Q6_UNROLL.
__device__ __forceinline__ void q6_store_round(uint4* slot, int n, int lane, const Q6Round& r) {
#pragma unroll
    for (int t = 0; t < 3; ++t)
        if (lane + 32 * t < 8 * n) slot[lane + 32 * t] = r.w[t];
#pragma unroll
    for (int t = 0; t < 2; ++t)
        if (lane + 32 * t < 4 * n) slot[8 * Q6_UNROLL + lane + 32 * t] = r.w[3 + t];
    if (lane < n) slot[12 * Q6_UNROLL + lane] = r.w[5];
}

__device__ __forceinline__ u32 rotl32(u32 v, u32 n) { return __funnelshift_l(v, v, n); }
__device__ __forceinline__ u32 rotr32(u32 v, u32 n) { return __funnelshift_r(v, v, n); }

// The byte of `v` that `sel` picks, sign-extended (prmt's sign mode).
__device__ __forceinline__ int sext8(u32 v, u32 sel) {
    int r;
    asm("prmt.b32 %0, %1, 0, %2;" : "=r"(r) : "r"(v), "r"(sel));
    return r;
}

// A lane's constants for its two level words. A level byte is built as
// 4·(level − 32): the nibble rotated to bits 2–5 (`ra`), the lane's pair of
// `qh` bits to 6–7 (`rb1`, `rb2`; `mq` keeps only the group's pairs, so bits
// 0–1 stay clear) with the upper bit flipped, so that the byte read as signed
// is 4n + 64q0 + 128q1 − 128. Three instructions a word where the levels
// and a per-byte subtraction took seven; the dp4a sums are exactly 4× the
// CPU's and >> 2 gives them back. Lanes with h = 1 take the high nibbles
// first, so that each activation load covers the 32 banks (x bytes 0–63 and
// 128–191 share banks 0–15).
struct Q6LaneQ8 {
    u32 mq, ra, rb1, rb2, sel1, sel2;
};

// A round of a row from the warp's slot: block u's integer sum times its
// d_w · d_x (lane u's), accumulated in block order.
__device__ __forceinline__ void q6_round_q8(const Q6LaneQ8& c, const u8* pql, const u8* pqh, const u8* psc, int n,
                                            bool full, const i8* x1, const i8* x2, float dd, float& acc) {
#pragma unroll
    for (int u = 0; u < Q6_UNROLL; ++u) {
        if (!full && u >= n) break;
        u32 ql = *(const u32*)(pql + 128 * u), qh = *(const u32*)(pqh + 64 * u), sc = *(const u16*)(psc + 16 * u);
        u32 q = (qh ^ 0xaaaaaaaau) & c.mq;
        u32 l1 = (rotl32(ql, c.ra) & 0x3c3c3c3cu) | (rotl32(q, c.rb1) & 0xc3c3c3c3u);
        u32 l2 = (rotr32(ql, c.ra) & 0x3c3c3c3cu) | (rotl32(q, c.rb2) & 0xc3c3c3c3u);
        int s4 = sext8(sc, c.sel1) * __dp4a((int)l1, *(const int*)(x1 + 256 * u), 0) +
                 sext8(sc, c.sel2) * __dp4a((int)l2, *(const int*)(x2 + 256 * u), 0);
        acc += __shfl_sync(0xffffffffu, dd, u) * (float)(s4 >> 2);
    }
}

// (x · inv) · w of rms_norm's fused multiply, four at a time.
__device__ __forceinline__ float4 normed4(float4 v, float4 w, float inv) {
    return make_float4(v.x * inv * w.x, v.y * inv * w.y, v.z * inv * w.z, v.w * inv * w.w);
}

// Dynamic shared memory: x's levels (k bytes), its d per block (k/64 bytes),
// then a slot a warp from the next 16-byte boundary (lower/fmat.rs).
//
// `nw` (else null): x is first RMS-normed with weight `nw` (rms_norm's
// sum, order and float operations; the model's final norm, which then
// needs no launch of its own). Each warp takes a contiguous range of rows
// and keeps each one's sum in lane (row mod 32), so that the outputs go out
// as runs of up to 128 bytes: the head may write its logits straight into
// pinned host memory (CudaBackend::in_place), where 4-byte stores
// would each be a transfer over the link.
extern "C" __global__ void __launch_bounds__(256, 3) q6k_gemv1_q8(const u8* base, int rows, int k, const float* x,
                                                                   int n_tok, float* out, u64 out_stride,
                                                                   const float* res, const float* nw, float eps) {
    extern __shared__ __align__(16) u8 qsm[];
    __shared__ float scratch[32];
    i8* xq = (i8*)qsm;
    float* dx = (float*)(qsm + k);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nb = k >> 8;
    int h = lane >> 4, g = (lane >> 3) & 1, j = lane & 7;
    u64 gw = (u64)blockIdx.x * 8 + warp, n_warps = (u64)gridDim.x * 8;
    int first = (int)((u64)rows * gw / n_warps), end = (int)((u64)rows * (gw + 1) / n_warps), row = first;
    u64 nbt = (u64)rows * nb;
    u8* slot = qsm + ((k + k / 64 + 15) & ~15) + warp * Q6_SLOT;
    const u16* dp = (const u16*)(base + nbt * 208) + lane;
    Q6Round r;
    u32 d = 0;
    if (row < end) {
        int n = min(Q6_UNROLL, nb);
        q6_load_round(base, nbt, (u64)row * nb, n, lane, r);
        if (lane < n) d = __ldg(dp + (u64)row * nb);
    }
    pdl_wait();
    pdl_launch();
    float inv = 1.0f;
    if (nw) {
        float ss = 0.0f;
        for (int e = threadIdx.x; e < k; e += blockDim.x) ss += x[e] * x[e];
        ss = block_sum(ss, scratch);
        inv = (float)(1.0 / sqrt((double)ss / k + (double)eps));
    }
    for (int b = warp; b < nb; b += 8) {
        const float4* xb = (const float4*)(x + 256 * b) + 2 * lane;
        float4 v0 = __ldg(xb), v1 = __ldg(xb + 1);
        if (nw) {
            const float4* wb = (const float4*)(nw + 256 * b) + 2 * lane;
            v0 = normed4(v0, __ldg(wb), inv);
            v1 = normed4(v1, __ldg(wb + 1), inv);
        }
        float am = fmaxf(fmaxf(fmaxf(fabsf(v0.x), fabsf(v0.y)), fmaxf(fabsf(v0.z), fabsf(v0.w))),
                         fmaxf(fmaxf(fabsf(v1.x), fabsf(v1.y)), fmaxf(fabsf(v1.z), fabsf(v1.w))));
        am = warp_max(am);
        float dq = am / 127.0f, id = dq != 0.0f ? 1.0f / dq : 0.0f;
        ((uint2*)(xq + 256 * b))[lane] = make_uint2(q8k_pack4(v0, id), q8k_pack4(v1, id));
        if (lane == 0) dx[b] = dq;
    }
    __syncthreads();
    Q6LaneQ8 c;
    c.mq = g ? 0xccccccccu : 0x33333333u;
    c.ra = h ? 30 : 2;
    c.rb1 = (h ? 2 : 6) - 2 * g;
    c.rb2 = (h ? 6 : 2) - 2 * g;
    c.sel1 = h ? 0x9991u : 0x8880u;
    c.sel2 = c.sel1 ^ 0x1111u;
    int e = 128 * h + 32 * g + 4 * j;
    const i8* x1 = xq + e + 64 * h;
    const i8* x2 = xq + e + 64 * (1 - h);
    const u8* pql = slot + 4 * lane;
    const u8* pqh = slot + 128 * Q6_UNROLL + 4 * (8 * h + j);
    const u8* psc = slot + 192 * Q6_UNROLL + 2 * (4 * h + 2 * g + (j >> 2));
    float acc = 0.0f, keep = 0.0f;
    for (int b0 = 0; row < end;) {
        int n = min(Q6_UNROLL, nb - b0);
        int nrow = row, nb0 = b0 + Q6_UNROLL;
        if (nb0 >= nb) {
            nrow += 1;
            nb0 = 0;
        }
        int nn = nrow < end ? min(Q6_UNROLL, nb - nb0) : 0;
        __syncwarp();
        q6_store_round((uint4*)slot, n, lane, r);
        __syncwarp();
        float dd = h2f((u16)d) * dx[b0 + min(lane, n - 1)];
        u64 B = (u64)nrow * nb + nb0;
        d = lane < nn ? __ldg(dp + B) : 0u;
        q6_load_round(base, nbt, B, nn, lane, r);
        if (n == Q6_UNROLL)
            q6_round_q8(c, pql, pqh, psc, n, true, x1 + 256 * b0, x2 + 256 * b0, dd, acc);
        else
            q6_round_q8(c, pql, pqh, psc, n, false, x1 + 256 * b0, x2 + 256 * b0, dd, acc);
        if (nb0 == 0) {
            // Every lane has the sum; lane i of a run of 32 keeps row i's.
            float y = warp_sum(acc);
            int i = (row - first) & 31;
            if (lane == i) keep = y;
            if (i == 31 || row + 1 == end) {
                int o = row - i + lane;
                if (lane <= i) out[o] = res ? keep + res[o] : keep;
            }
            acc = 0.0f;
        }
        row = nrow;
        b0 = nb0;
    }
}

// F32 weights (a MoE router's) times f32 activations, 4 floats per 16-byte
// load (k % 4 == 0), up to Q8_UNROLL loads a lane in flight.
extern "C" __global__ void __launch_bounds__(256) f32_gemv(const float* w, int rows, int k, const float* x, int n_tok,
                                                          float* out, u64 out_stride, const float* res) {
    pdl_wait();
    pdl_launch();
    int row = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= rows) return;
    int nv = k >> 2;
    const float4* wr = (const float4*)(w + (u64)row * k);
    float acc[FMAT_MAXT];
#pragma unroll
    for (int t = 0; t < FMAT_MAXT; ++t) acc[t] = 0.0f;
    for (int v0 = lane; v0 < nv; v0 += 32 * Q8_UNROLL) {
        float4 wv[Q8_UNROLL];
#pragma unroll
        for (int u = 0; u < Q8_UNROLL; ++u) {
            int v = v0 + 32 * u;
            wv[u] = v < nv ? __ldg(wr + v) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int u = 0; u < Q8_UNROLL; ++u) {
            int v = v0 + 32 * u;
            if (v >= nv) break;
#pragma unroll
            for (int t = 0; t < FMAT_MAXT; ++t) {
                if (t >= n_tok) break;
                float4 a = __ldg((const float4*)(x + (u64)t * k) + v);
                acc[t] += wv[u].x * a.x + wv[u].y * a.y + wv[u].z * a.z + wv[u].w * a.w;
            }
        }
    }
    store_row(acc, n_tok, lane, row, out, out_stride, res);
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

// Float weights (f32, or f16 when HALF) times f32 activations for a batch
// past 8 tokens (a MoE router's prompt: few rows, long k). A block of 256
// threads takes 16 rows × 16 tokens, one output a thread, so that even 64
// rows give a grid of hundreds of blocks; k in chunks of 32 staged in shared
// memory transposed: threads 0..127 copy the rows' chunk, 128..255 the
// tokens' (a float4 each), and thread (tx, ty) sums row tx of token ty in k
// order, a warp storing 16 consecutive rows of two tokens. k % 32 == 0.
template <bool HALF>
__device__ __forceinline__ void float_gemm(const void* w, int rows, int k, const float* x, int n_tok, float* out,
                                           u64 out_stride, const float* res) {
    __shared__ float ws[32][17], xs[32][17];
    pdl_wait();
    pdl_launch();
    int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    int r0 = blockIdx.x * 16, t0 = blockIdx.y * 16;
    // The copier: row (or token) lr of the tile, elements lk .. lk + 3 of the chunk.
    bool copies_w = tid < 128;
    int lr = (tid & 127) >> 3, lk = (tid & 7) * 4;
    bool ok = copies_w ? r0 + lr < rows : t0 + lr < n_tok;
    float acc = 0.0f;
    for (int k0 = 0; k0 < k; k0 += 32) {
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (ok && copies_w) {
            u64 at = (u64)(r0 + lr) * k + k0 + lk;
            if (HALF) {
                uint2 h = __ldg((const uint2*)((const u16*)w + at));
                v = make_float4(h2f(h.x & 0xffff), h2f(h.x >> 16), h2f(h.y & 0xffff), h2f(h.y >> 16));
            } else {
                v = __ldg((const float4*)((const float*)w + at));
            }
        } else if (ok) {
            v = __ldg((const float4*)(x + (u64)(t0 + lr) * k + k0 + lk));
        }
        __syncthreads();
        float(*dst)[17] = copies_w ? ws : xs;
        dst[lk][lr] = v.x;
        dst[lk + 1][lr] = v.y;
        dst[lk + 2][lr] = v.z;
        dst[lk + 3][lr] = v.w;
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < 32; ++kk) acc += ws[kk][tx] * xs[kk][ty];
    }
    int r = r0 + tx, t = t0 + ty;
    if (r >= rows || t >= n_tok) return;
    u64 o = (u64)t * out_stride + r;
    out[o] = res ? acc + res[o] : acc;
}

// grid: (⌈rows / 16⌉, ⌈n_tok / 16⌉), block 256.
extern "C" __global__ void __launch_bounds__(256) f32_gemm(const float* w, int rows, int k, const float* x, int n_tok,
                                                          float* out, u64 out_stride, const float* res) {
    float_gemm<false>(w, rows, k, x, n_tok, out, out_stride, res);
}

extern "C" __global__ void __launch_bounds__(256) f16_gemm(const u16* w, int rows, int k, const float* x, int n_tok,
                                                          float* out, u64 out_stride, const float* res) {
    float_gemm<true>(w, rows, k, x, n_tok, out, out_stride, res);
}

// Rows of the int8 layout, dequantized (plus the offsets `o`, when not
// null: s·q + o, the CPU's values exactly). grid: rows, block: 256.
extern "C" __global__ void get_rows_q8(const i8* __restrict__ q, const float* __restrict__ s,
                                       const float* __restrict__ o, int k, const int* ids, float* __restrict__ out) {
    pdl_wait();
    pdl_launch();
    u64 row = (u64)ids[blockIdx.x];
    float* y = out + (u64)blockIdx.x * k;
#pragma unroll 4
    for (int e = threadIdx.x; e < k; e += blockDim.x) {
        u64 i = row * k + e;
        float v = __fmul_rn((float)__ldg(q + i), __ldg(s + (i >> 4)));
        y[e] = o ? __fadd_rn(v, __ldg(o + (i >> 4))) : v;
    }
}

// Rows of the Q6_K planes, dequantized. grid: (rows looked up, k / 256),
// block: 256, an element a thread. A decoding step's lookup is the first
// kernel of the step, on its critical path: every element's four loads go
// out at once, one DRAM round trip (a block a row took three).
extern "C" __global__ void get_rows_q6k(const u8* __restrict__ base, int rows, int k, const int* ids,
                                        float* __restrict__ out) {
    pdl_wait();
    pdl_launch();
    u64 nb = (u64)rows * k / 256, b0 = (u64)ids[blockIdx.x] * k / 256;
    const i8* sc = (const i8*)base + nb * 192;
    const u16* dv = (const u16*)(base + nb * 208);
    float* o = out + (u64)blockIdx.x * k;
    int e = blockIdx.y * blockDim.x + threadIdx.x;
    if (e < k) {
        u64 b = b0 + (e >> 8);
        int i = e & 255, h = i >> 7, g = (i >> 5) & 3, l = i & 31;
        u32 nib = (__ldg(base + b * 128 + 64 * h + 32 * (g & 1) + l) >> (4 * (g >> 1))) & 15;
        u32 pair = (__ldg(base + nb * 128 + b * 64 + 32 * h + l) >> (2 * g)) & 3;
        int q = i >> 4, at = 2 * ((q & 3) + 4 * (q >> 3)) + ((q >> 2) & 1);
        o[e] = h2f(__ldg(dv + b)) * (float)__ldg(sc + b * 16 + at) * (float)((int)(nib | (pair << 4)) - 32);
    }
}
