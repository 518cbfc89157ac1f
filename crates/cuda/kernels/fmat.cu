// Matrix products of float and block-quantized weights (F32, F16, BF16,
// Q8_0, Q4_0, Q6_K: output heads, embeddings, non-ternary models) with f32
// activations. Memory-bound at the batch sizes where it runs, so one warp per
// row dequantizes each element once and reuses it for up to 8 tokens.

#define FMAT_MAXT 8

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
