// Row lookups, norms and pointwise ops on f32 activations `[ne0, rows]`.

// out[r, :] = dequant(table[ids[r], :]). grid: rows, block: 256.
extern "C" __global__ void get_rows(const u8* table, u64 row_bytes, int type, const int* ids, float* out, int ne0) {
    pdl_wait();
    pdl_launch();
    const u8* row = table + (u64)ids[blockIdx.x] * row_bytes;
    float* o = out + (u64)blockIdx.x * ne0;
    for (int e = threadIdx.x; e < ne0; e += blockDim.x) o[e] = dq(row, e, type);
}

// y = x / sqrt(mean(x²) + eps) [* w]. grid: rows, block: 256. The squares
// (exact in double) are summed in double, as the CPU sums them: the f32
// factor is then the CPU's, bar a double rounding at an f32 tie, so a
// quantized product's int8 activations after the norm are the CPU's too
// (an f32 sum can move the factor by an ulp).
extern "C" __global__ void rms_norm(const float* x, const float* w, float* y, int ne0, float eps) {
    __shared__ double scratch[32];
    pdl_wait();
    pdl_launch();
    const float* xr = x + (u64)blockIdx.x * ne0;
    float* yr = y + (u64)blockIdx.x * ne0;
    double ss = 0.0;
    for (int e = threadIdx.x; e < ne0; e += blockDim.x) ss += (double)xr[e] * (double)xr[e];
    ss = block_reduce(ss, scratch, 0.0, Sum());
    float inv = (float)(1.0 / sqrt(ss / ne0 + (double)eps));
    for (int e = threadIdx.x; e < ne0; e += blockDim.x) {
        float v = xr[e] * inv;
        yr[e] = w ? v * w[e] : v;
    }
}

// out[i] = a[i] op b[i % nb]: op 0 = add, 1 = mul. grid-stride.
extern "C" __global__ void binary(const float* a, const float* b, float* out, u64 n, u64 nb, int op) {
    pdl_wait();
    pdl_launch();
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        float y = b[i % nb];
        out[i] = op == BIN_ADD ? a[i] + y : a[i] * y;
    }
}

extern "C" __global__ void scale(const float* x, float* out, u64 n, float f) {
    pdl_wait();
    pdl_launch();
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) out[i] = x[i] * f;
}

// out = gated(gate, up, act) elementwise.
extern "C" __global__ void gated_act(const float* gate, const float* up, float* out, u64 n, int act) {
    pdl_wait();
    pdl_launch();
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        out[i] = gated(gate[i], up[i], act);
}

// x: [head_dim * n_head, n_tok]. One thread per (token, head, pair).
// mode 0 = adjacent pairs, 1 = NeoX (i, i + n_rot/2); `rope_rotate`.
extern "C" __global__ void rope(const float* x, float* out, const int* pos, const float* factors, int head_dim,
                                int n_head, int n_tok, int n_rot, int mode, float base, float fscale, float y_low,
                                float y_high, float y_ext, float y_mag) {
    pdl_wait();
    pdl_launch();
    u64 total = (u64)n_tok * n_head * (head_dim / 2);
    for (u64 idx = blockIdx.x * (u64)blockDim.x + threadIdx.x; idx < total; idx += (u64)gridDim.x * blockDim.x) {
        int i = idx % (head_dim / 2);
        u64 th = idx / (head_dim / 2);
        int t = th / n_head, a, b;
        float ya, yb;
        rope_rotate(x + th * head_dim, i, pos[t], n_rot, mode, base, fscale, factors, y_low, y_high, y_ext, y_mag, &a,
                    &b, &ya, &yb);
        out[th * head_dim + a] = ya;
        out[th * head_dim + b] = yb;
    }
}

// Streams a staged weight from pinned host memory (mapped into the device's
// address space) into device memory: the copy an offloaded matmul does first.
// Also moves activations between device memory and a mapped host arena at
// the edges of a split, inside its captured work.
// Four 16-byte loads in flight per thread keep the host link busy.
extern "C" __global__ void copy_in(const uint4* __restrict__ src, uint4* __restrict__ dst, u64 n16) {
    const u64 stride = (u64)gridDim.x * blockDim.x;
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        uint4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
        dst[i] = a;
        dst[i + stride] = b;
        dst[i + 2 * stride] = c;
        dst[i + 3 * stride] = d;
    }
    for (; i < n16; i += stride) dst[i] = src[i];
}
