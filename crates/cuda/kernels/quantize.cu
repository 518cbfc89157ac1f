// Per-token int8 activations (Q8_Row: one absmax scale per token, round half
// to even) for the ternary matmuls, optionally fused with the RMS norm and
// its weight that precede every projection.
//
// Output layout, per token, `k_pad` bytes (k padded to 256 with zeros):
// chunk c (256 values) holds four 64-byte lane blocks tig = 0..3; word
// (w*4 + j) of block tig holds values c*256 + 32*(2w + j/2) + 16*(j%2) +
// 4*tig + (0..3). That is the order in which the W2A8 GEMV lanes and the
// m16n8k32 fragments consume them (see ternary.cu), so both read whole 16-byte
// vectors. `lsum[t][c*4 + tig]` is the sum of block tig of chunk c.

// The logical element behind word `wi` (of k_pad / 4) of the permuted layout.
__device__ __forceinline__ int permuted_base(int wi) {
    int c = wi >> 6, q = wi & 63, tig = q >> 4, word = q & 15, w = word >> 2, j = word & 3;
    return c * 256 + 32 * (2 * w + (j >> 1)) + 16 * (j & 1) + 4 * tig;
}

// Up to four loads per thread in flight at once: a row read with one load
// at a time pays the memory latency once per element.
#define ROW_UNROLL 4

// `n` floats (n % 4 == 0, both 16-byte aligned) from global to shared memory.
// The loads go to L2 (`ld.global.cg`): in a persistent kernel the row was
// written by other blocks since this SM last read it.
__device__ __forceinline__ void load_row4(const float* src, float* dst, int n) {
    const float4* s4 = (const float4*)src;
    float4* d4 = (float4*)dst;
    int n4 = n >> 2, stride = blockDim.x;
    for (int i0 = threadIdx.x; i0 < n4; i0 += ROW_UNROLL * stride) {
        float4 v[ROW_UNROLL];
#pragma unroll
        for (int u = 0; u < ROW_UNROLL; ++u)
            if (i0 + u * stride < n4) v[u] = __ldcg(s4 + i0 + u * stride);
#pragma unroll
        for (int u = 0; u < ROW_UNROLL; ++u)
            if (i0 + u * stride < n4) d4[i0 + u * stride] = v[u];
    }
}

// Whether a row takes nq_row's register path: each thread's words of the
// permuted layout (k_pad / 4 of them) fit ROW_UNROLL float4 registers.
__device__ __forceinline__ bool nq_fits(int k_pad) {
    return (k_pad >> 2) <= ROW_UNROLL * (int)blockDim.x;
}

// The norm weight's first ROW_UNROLL vectors per thread, which never depend
// on the previous kernel: callers load them before waiting for it, off the
// critical path. On the register path they are the thread's permuted words
// (zero past ne0); otherwise (`staged`) the row's vectors in order.
__device__ __forceinline__ void nq_prefetch(const float* w, int ne0, int k_pad, bool vec, float4* wpre,
                                            bool staged = false) {
    const float4* w4 = (const float4*)w;
    int n4 = ne0 >> 2, stride = blockDim.x;
    if (!(vec && w)) return;
    bool fits = !staged && nq_fits(k_pad);
#pragma unroll
    for (int u = 0; u < ROW_UNROLL; ++u) {
        int i = threadIdx.x + u * stride;
        if (fits) {
            int base = i < (k_pad >> 2) ? permuted_base(i) : ne0;
            wpre[u] = base < ne0 ? w4[base >> 2] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        } else if (i < n4) {
            wpre[u] = w4[i];
        }
    }
}

// The RMS norm's 1/sqrt(mean(x²) + eps) from each thread's partial sum of
// squares (double, like the CPU). One warp finishes the sum and the double
// division and shares the result, rather than every warp doing the same
// hundred-odd instructions of double arithmetic.
__device__ __forceinline__ float block_inv_rms(double ss, double* scratch, int ne0, float eps) {
    __shared__ float inv;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    ss = warp_reduce(ss, Sum());
    __syncthreads();
    if (lane == 0) scratch[warp] = ss;
    __syncthreads();
    if (warp == 0) {
        double v = warp_reduce(lane < nw ? scratch[lane] : 0.0, Sum());
        if (lane == 0) inv = (float)(1.0 / sqrt(v / ne0 + (double)eps));
    }
    __syncthreads();
    return inv;
}

// Quantizes four weighted values into one packed word, returning their sum.
__device__ __forceinline__ u32 quant4(float4 v, float sa, int* sum) {
    const float xv[4] = {v.x, v.y, v.z, v.w};
    u32 packed = 0;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
        int q = max(-128, min(127, __float2int_rn(xv[b] * sa)));
        *sum += q;
        packed |= ((u32)(q & 255)) << (8 * b);
    }
    return packed;
}

// Whether a row can be read and weighted as float4 vectors.
__device__ __forceinline__ bool nq_vec(const float* xr, const float* w, int ne0) {
    return (ne0 & 3) == 0 && ((u64)xr & 15) == 0 && (!w || ((u64)w & 15) == 0);
}

// Four values normed and weighted in the CPU's order, (x·inv)·w (w when
// has_w), with the running absmax of the results.
__device__ __forceinline__ float4 weigh4(float4 v, int norm, float inv, bool has_w, float4 w, float* amax) {
    if (norm) {
        v.x *= inv;
        v.y *= inv;
        v.z *= inv;
        v.w *= inv;
    }
    if (has_w) {
        v.x *= w.x;
        v.y *= w.y;
        v.z *= w.z;
        v.w *= w.w;
    }
    *amax = fmaxf(*amax, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    return v;
}

// A thread's weighted words (word threadIdx.x + u·blockDim of the permuted
// layout in v[u], of nw) as int8 levels at scale sa into qr, their lane
// block sums into ls, and the floats into yr when given. nw / 4 is a
// multiple of 64 and blockDim a multiple of 32, so whole warps take each
// step and every 16-word lane block is one half-warp for the sums.
template <int U>
__device__ __forceinline__ void put_words(const float4* v, int nw, int ne0, float sa, float* yr, i8* qr, int* ls) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
        int i = threadIdx.x + u * blockDim.x;
        if (i >= nw) break;
        int base = permuted_base(i), sum = 0;
        if (yr && base < ne0) *(float4*)(yr + base) = v[u];
        ((u32*)qr)[i] = quant4(v[u], sa, &sum);
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if ((i & 15) == 0) ls[i >> 4] = sum;
    }
}

// nq_row's path for rows staged in shared memory before they are normed
// (rows too long for registers, unaligned rows, no norm weight): sets the
// norm's `inv` and the weighted row's partial absmax of this thread.
// LOADED: the caller has put the row in `xs` already (xr unused).
template <bool LOADED = false>
__device__ __forceinline__ void nq_staged(const float* xr, const float* w, float* xs, int ne0, int norm, float eps,
                                          const float4* wpre, bool vec, u64* staged, double* dscratch,
                                          float* inv_out, float* amax_out) {
    const float4* w4 = (const float4*)w;
    int n4 = ne0 >> 2, stride = blockDim.x;
    float inv = 1.0f, amax = 0.0f;
    if (!LOADED) {
        if (vec)
            load_row4(xr, xs, ne0);
        else
            for (int e = threadIdx.x; e < ne0; e += blockDim.x) xs[e] = __ldcg(xr + e);
    }
    __syncthreads();
    if (staged && threadIdx.x == 0) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(*staged));
    if (norm) {
        double ss = 0.0;
        for (int e = threadIdx.x; e < ne0; e += blockDim.x) ss += (double)xs[e] * (double)xs[e];
        inv = block_inv_rms(ss, dscratch, ne0, eps);
    }
    if (vec && w) {
        // The rest of the weight streams from global memory, its loads together.
        float4* x4 = (float4*)xs;
        for (int i0 = threadIdx.x; i0 < n4; i0 += ROW_UNROLL * stride) {
            float4 wv[ROW_UNROLL];
#pragma unroll
            for (int u = 0; u < ROW_UNROLL; ++u)
                if (i0 + u * stride < n4) wv[u] = i0 == threadIdx.x ? wpre[u] : w4[i0 + u * stride];
#pragma unroll
            for (int u = 0; u < ROW_UNROLL; ++u) {
                int i = i0 + u * stride;
                if (i >= n4) break;
                x4[i] = weigh4(x4[i], norm, inv, true, wv[u], &amax);
            }
        }
    } else {
        for (int e = threadIdx.x; e < ne0; e += blockDim.x) {
            float v = xs[e];
            if (norm) v *= inv;
            if (w) v *= w[e];
            xs[e] = v;
            amax = fmaxf(amax, fabsf(v));
        }
    }
    *inv_out = inv;
    *amax_out = amax;
}

// The staged row `xs` (normed and weighted, with the row's absmax `amax`)
// written to `yr` when given, and quantized into `qr_` (k_pad bytes,
// permuted) and `ls` (k_pad/64 lane sums). Returns d = 1/s_a.
__device__ __forceinline__ float nq_levels(const float* xs, float amax, float* yr, i8* qr_, int* ls, int ne0,
                                           int k_pad) {
    if (yr) {
        for (int e = threadIdx.x; e < ne0; e += blockDim.x) yr[e] = xs[e];
    }
    float sa = 127.0f / fmaxf(amax, 1e-5f);
    u32* qr = (u32*)qr_;
    // blockDim is a multiple of 16, so each 16-word lane block stays in one
    // half-warp for the shuffle reduction below; k_pad / 4 is a multiple of
    // 64, so whole warps enter or leave the loop together.
    for (int wi = threadIdx.x; wi < k_pad / 4; wi += blockDim.x) {
        int base = permuted_base(wi);
        u32 packed = 0;
        int sum = 0;
        // One 16-byte read (base is a multiple of 4): the permuted order
        // makes word reads 8-way bank conflicts, vector reads 4-way.
        float4 x4 = base + 4 <= ne0 ? *(const float4*)(xs + base) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const float xv[4] = {x4.x, x4.y, x4.z, x4.w};
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            int e = base + b, v = 0;
            if (e < ne0) v = max(-128, min(127, __float2int_rn((base + 4 <= ne0 ? xv[b] : xs[e]) * sa)));
            sum += v;
            packed |= ((u32)(v & 255)) << (8 * b);
        }
        qr[wi] = packed;
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if ((wi & 15) == 0) ls[wi >> 4] = sum;
    }
    return 1.0f / sa;
}

// One row through the whole block: x (ne0 floats) is loaded (into
// registers, or staged in `xs`: shared, ne0 floats), normed (norm: inv =
// 1/sqrt(mean(x²) + eps), summed in double) and weighted in the CPU's order
// (x·inv)·w, written to `yr` when given, and quantized into `qr` (k_pad
// bytes, permuted) and `ls` (k_pad/64 lane sums).
// Returns d = 1/s_a in every thread. `staged` (optional, tracing) gets the
// time the row is loaded (after its sum of squares, in registers).
__device__ __forceinline__ float nq_row(const float* xr, const float* w, float* yr, i8* qr_, int* ls,
                                        int ne0, int k_pad, int norm, float eps, float* xs, const float4* wpre,
                                        bool vec, u64* staged = nullptr) {
    __shared__ double dscratch[32];
    __shared__ float scratch[32];
    int stride = blockDim.x;
    float inv = 1.0f, amax = 0.0f;
    if (vec && nq_fits(k_pad)) {
        // Each thread loads its own words of the permuted layout straight
        // from the row (four consecutive floats each), norms, weights and
        // quantizes them in registers: no pass through shared memory and no
        // barrier besides the two reductions.
        int nw = k_pad >> 2;
        float4 v[ROW_UNROLL];
#pragma unroll
        for (int u = 0; u < ROW_UNROLL; ++u) {
            int i = threadIdx.x + u * stride, base = i < nw ? permuted_base(i) : ne0;
            v[u] = base < ne0 ? __ldcg((const float4*)(xr + base)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        if (norm) {
            double ss = 0.0;
#pragma unroll
            for (int u = 0; u < ROW_UNROLL; ++u)
                ss += (double)v[u].x * (double)v[u].x + (double)v[u].y * (double)v[u].y +
                      (double)v[u].z * (double)v[u].z + (double)v[u].w * (double)v[u].w;
            inv = block_inv_rms(ss, dscratch, ne0, eps);
        }
        if (staged && threadIdx.x == 0) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(*staged));
#pragma unroll
        for (int u = 0; u < ROW_UNROLL; ++u) v[u] = weigh4(v[u], norm, inv, w != nullptr, wpre[u], &amax);
        amax = block_max(amax, scratch);
        float sa = 127.0f / fmaxf(amax, 1e-5f);
        put_words<ROW_UNROLL>(v, nw, ne0, sa, yr, qr_, ls);
        return 1.0f / sa;
    }
    nq_staged(xr, w, xs, ne0, norm, eps, wpre, vec, staged, dscratch, &inv, &amax);
    return nq_levels(xs, block_max(amax, scratch), yr, qr_, ls, ne0, k_pad);
}

// grid: tokens, block: up to 1024 (lower.rs picks it). x: [ne0, n_tok] f32. norm: 1 = apply RMS norm
// first; w (optional) multiplies after it; y (optional) receives the f32
// result. q: [n_tok, k_pad] i8, d: [n_tok] f32 (1 / s_a), lsum: [n_tok,
// k_pad/64] i32. Rows past nq_fits are staged in dynamic shared memory (ne0 floats).
extern "C" __global__ void __launch_bounds__(1024) norm_quant(const float* x, const float* w, float* y, i8* q, float* d,
                                                            int* lsum, int ne0, int k_pad, int norm, float eps) {
    extern __shared__ __align__(16) float xs[];
    const float* xr = x + (u64)blockIdx.x * ne0;
    bool vec = nq_vec(xr, w, ne0);
    float4 wpre[ROW_UNROLL];
    nq_prefetch(w, ne0, k_pad, vec, wpre);
    pdl_wait();
    pdl_launch();
    float dd = nq_row(xr, w, y ? y + (u64)blockIdx.x * ne0 : nullptr, q + (u64)blockIdx.x * k_pad,
                      lsum + (u64)blockIdx.x * (k_pad / 64), ne0, k_pad, norm, eps, xs, wpre, vec);
    if (threadIdx.x == 0) d[blockIdx.x] = dd;
}

// norm_quant of act(gate) · up (`gated`), the product formed as the row is
// staged in shared memory: a prompt's [6912, n_tok] f32 product (57 MB at
// 2,048 tokens for the 2B-4T ffn_down) is never written to global memory
// and read back. grid: tokens, block: 256. gate, up: [ne0, n_tok]
// f32; the rest as norm_quant's, with no f32 output. Dynamic shared
// memory: ne0 floats. Bounded to 4 blocks an SM (64 registers, a few bytes
// spilled) instead of 3 at 74; `__launch_bounds__`, not `__maxnreg__`, which
// NVRTC before 12.4 rejects.
extern "C" __global__ void __launch_bounds__(256, 4) gated_norm_quant(const float* gate, const float* up, int act,
                                                                    const float* w, i8* q, float* d, int* lsum,
                                                                    int ne0, int k_pad, int norm, float eps) {
    extern __shared__ __align__(16) float xs[];
    __shared__ double dscratch[32];
    __shared__ float scratch[32];
    const float* gr = gate + (u64)blockIdx.x * ne0;
    const float* ur = up + (u64)blockIdx.x * ne0;
    bool vec = nq_vec(gr, w, ne0) && nq_vec(ur, nullptr, ne0);
    float4 wpre[ROW_UNROLL];
    nq_prefetch(w, ne0, k_pad, vec, wpre, true);
    pdl_wait();
    pdl_launch();
    if (vec) {
        const float4 *g4 = (const float4*)gr, *u4 = (const float4*)ur;
        float4* x4 = (float4*)xs;
        int n4 = ne0 >> 2, stride = blockDim.x;
        for (int i0 = threadIdx.x; i0 < n4; i0 += ROW_UNROLL * stride) {
            float4 gv[ROW_UNROLL], uv[ROW_UNROLL];
#pragma unroll
            for (int u = 0; u < ROW_UNROLL; ++u) {
                int i = i0 + u * stride;
                if (i < n4) {
                    gv[u] = __ldcs(g4 + i);
                    uv[u] = __ldcs(u4 + i);
                }
            }
#pragma unroll
            for (int u = 0; u < ROW_UNROLL; ++u) {
                int i = i0 + u * stride;
                if (i < n4)
                    x4[i] = make_float4(gated(gv[u].x, uv[u].x, act), gated(gv[u].y, uv[u].y, act),
                                        gated(gv[u].z, uv[u].z, act), gated(gv[u].w, uv[u].w, act));
            }
        }
    } else {
        for (int e = threadIdx.x; e < ne0; e += blockDim.x) xs[e] = gated(gr[e], ur[e], act);
    }
    float inv, amax;
    nq_staged<true>(nullptr, w, xs, ne0, norm, eps, wpre, vec, nullptr, dscratch, &inv, &amax);
    float dd = nq_levels(xs, block_max(amax, scratch), nullptr, q + (u64)blockIdx.x * k_pad,
                         lsum + (u64)blockIdx.x * (k_pad / 64), ne0, k_pad);
    if (threadIdx.x == 0) d[blockIdx.x] = dd;
}
