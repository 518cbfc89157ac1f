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

// grid: tokens, block: 1024. x: [ne0, n_tok] f32. norm: 1 = apply RMS norm
// first; w (optional) multiplies after the norm; y (optional) receives the
// f32 result. q: [n_tok, k_pad] i8, d: [n_tok] f32, lsum: [n_tok, k_pad/64] i32.
// With `cached` the row is read once into dynamic shared memory (ne0 floats).
extern "C" __global__ void __launch_bounds__(1024) norm_quant(const float* x, const float* w, float* y, i8* q, float* d,
                                                            int* lsum, int ne0, int k_pad, int norm, float eps,
                                                            int cached) {
    extern __shared__ float xs[];
    pdl_wait();
    pdl_launch();
    u64 t = blockIdx.x;
    norm_quant_row(x + t * ne0, w, y ? y + t * ne0 : nullptr, q + t * k_pad, d + t, lsum + t * (k_pad / 64), ne0,
                   k_pad, norm, eps, cached ? xs : nullptr);
}
