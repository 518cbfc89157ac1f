// The per-token int8 quantization shared by quantize.cu (its own kernel) and
// ternary.cu (the GEMV epilogue that quantizes the next norm's output).

__device__ __forceinline__ double block_sum_d(double v, double* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : 0.0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// The logical element behind word `wi` (of k_pad / 4) of the permuted layout.
__device__ __forceinline__ int permuted_base(int wi) {
    int c = wi >> 6, q = wi & 63, tig = q >> 4, word = q & 15, w = word >> 2, j = word & 3;
    return c * 256 + 32 * (2 * w + (j >> 1)) + 16 * (j & 1) + 4 * tig;
}

// One row: [RMS norm] [* w] → y (optional) and the int8 form (q, d, lsum),
// by the whole block (blockDim a multiple of 32, at most 1024). `xs` (optional,
// ne0 floats of shared memory) caches the row so it is read once. x is read
// through L2 (`__ldcg`): the row may have been written by other blocks of the
// same kernel (the GEMV epilogue in ternary.cu).
__device__ void norm_quant_row(const float* xr, const float* w, float* yr, i8* q, float* d, int* ls, int ne0,
                               int k_pad, int norm, float eps, float* xs) {
    __shared__ double dscratch[32];
    __shared__ float scratch[32];
    double ss = 0.0;
    for (int e = threadIdx.x; e < ne0; e += blockDim.x) {
        float v = __ldcg(xr + e);
        if (xs) xs[e] = v;
        ss += (double)v * (double)v;
    }
    float inv = 1.0f;
    if (norm) {
        ss = block_sum_d(ss, dscratch);
        inv = (float)(1.0 / sqrt(ss / ne0 + (double)eps));
    }
    float amax = 0.0f;
    for (int e = threadIdx.x; e < ne0; e += blockDim.x) {
        float v = xs ? xs[e] : __ldcg(xr + e);
        if (norm) v *= inv;
        if (w) v *= w[e];
        if (xs) xs[e] = v;
        if (yr) yr[e] = v;
        amax = fmaxf(amax, fabsf(v));
    }
    amax = block_max(amax, scratch);
    float sa = 127.0f / fmaxf(amax, 1e-5f);
    if (threadIdx.x == 0) *d = 1.0f / sa;
    u32* qr = (u32*)q;
    // blockDim is a multiple of 16, so each 16-word lane block stays in one
    // half-warp for the shuffle reduction below; k_pad / 4 is a multiple of
    // 64, so whole warps enter or leave the loop together.
    for (int wi = threadIdx.x; wi < k_pad / 4; wi += blockDim.x) {
        int base = permuted_base(wi);
        u32 packed = 0;
        int sum = 0;
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            int e = base + b, v = 0;
            if (e < ne0) {
                float f;
                if (xs) {
                    f = xs[e];
                } else {
                    f = __ldcg(xr + e);
                    if (norm) f *= inv;
                    if (w) f *= w[e];
                }
                v = max(-128, min(127, __float2int_rn(f * sa)));
            }
            sum += v;
            packed |= ((u32)(v & 255)) << (8 * b);
        }
        qr[wi] = packed;
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if ((wi & 15) == 0) ls[wi >> 4] = sum;
    }
    __syncthreads();
}

