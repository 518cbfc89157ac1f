// One token's products of Q4_K weights read in the file's own blocks
// (4.5 bits a weight; the levels, scales and offsets of qlayout.rs take 12),
// paired with x quantized to Q8_K as the CPU pairs them: the same integer
// sums of each 32-element sub-block, scaled by the sub-block's d·sc and
// offset by −dmin·m times Σa. Compiled after paired.cu (`quant_x`) and
// before experts.cu, whose expert GEMVs read these blocks too.
//
// A Q4_K block (256 elements, 144 bytes): d and dmin (f16), 12 bytes of
// 6-bit scales and minimums, 128 bytes of 4-bit codes, where byte i of
// chunk j (32 bytes) holds element 64j + i in its low nibble and 64j + 32 + i
// in its high one. A lane takes one chunk of a block at a time (a unit:
// 64 elements, sub-blocks 2j and 2j + 1): two 16-byte loads of codes and
// the block's 16-byte header.

#define Q4K_BLOCK 144

struct Q4KUnit {
    uint4 lo, hi;  // the chunk's 32 code bytes
    uint4 head;    // d, dmin (f16 pair), then the 12 scale bytes
};

// Unit u (block u / 4, chunk u % 4) of a row of Q4_K blocks.
__device__ __forceinline__ Q4KUnit q4k_load(const u8* row, int u) {
    const u8* b = row + (u64)(u >> 2) * Q4K_BLOCK;
    const uint4* c = (const uint4*)(b + 16 + 32 * (u & 3));
    Q4KUnit w;
    w.head = __ldg((const uint4*)b);
    w.lo = __ldg(c);
    w.hi = __ldg(c + 1);
    return w;
}

// Byte i of the 12 scale bytes in a block's header words 1..3.
__device__ __forceinline__ int q4k_sbyte(const uint4& h, int i) {
    u32 wd = i < 4 ? h.y : i < 8 ? h.z : h.w;
    return (wd >> (8 * (i & 3))) & 0xff;
}

// Sub-block j's 6-bit scale and minimum (ggml's get_scale_min_k4).
__device__ __forceinline__ void q4k_scale_min(const uint4& h, int j, int* sc, int* m) {
    if (j < 4) {
        *sc = q4k_sbyte(h, j) & 63;
        *m = q4k_sbyte(h, j + 4) & 63;
    } else {
        *sc = (q4k_sbyte(h, j + 4) & 0xf) | ((q4k_sbyte(h, j - 4) >> 6) << 4);
        *m = (q4k_sbyte(h, j + 4) >> 4) | ((q4k_sbyte(h, j) >> 6) << 4);
    }
}

// One sub-block's part: its integer sums Σq·a (codes `w`, low or high
// nibbles) and Σa over the 8 activation words at `a`, scaled as the levels'
// `paired_word` scales a group.
__device__ __forceinline__ float q4k_sub(const u32* w, int shift, const int* a, float s, float o, float dv) {
    int isum = 0, asum = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        int av = a[i];
        isum = __dp4a((int)((w[i] >> shift) & 0x0f0f0f0fu), av, isum);
        asum = __dp4a(0x01010101, av, asum);
    }
    return (float)isum * (s * dv) + o * dv * (float)asum;
}

// Unit u of a row against x's Q8_K levels xq and block scales xd.
__device__ __forceinline__ float q4k_dot(const Q4KUnit& w, int u, const i8* xq, const float* xd) {
    int b = u >> 2, j = u & 3;
    float d = h2f(w.head.x & 0xffff), dmin = h2f(w.head.x >> 16), dv = xd[b];
    u32 c[8] = {w.lo.x, w.lo.y, w.lo.z, w.lo.w, w.hi.x, w.hi.y, w.hi.z, w.hi.w};
    const int* a = (const int*)(xq + 256 * b + 64 * j);
    int sc0, m0, sc1, m1;
    q4k_scale_min(w.head, 2 * j, &sc0, &m0);
    q4k_scale_min(w.head, 2 * j + 1, &sc1, &m1);
    float y = q4k_sub(c, 0, a, d * (float)sc0, -(dmin * (float)m0), dv);
    return y + q4k_sub(c, 4, a + 8, d * (float)sc1, -(dmin * (float)m1), dv);
}

// Units a lane loads before `pdl_wait` (weights never depend on the previous
// kernel): a whole row of k ≤ 4096 at once, of a gated pair's two rows
// k ≤ 2048 (more would spill at four blocks an SM).
#define Q4K_AHEAD(PAIR) ((PAIR) ? 1 : 2)

// grid: ceil(rows / 8), block 256, dynamic shared memory as q8p_gemv1x's
// (x's k levels, then k / 256 scales; `quant_x`, with the folded norm when
// `norm_w`): warp w of block b computes row 8b + w. PAIR: the gate (w) and
// up (w2) rows of a gated FFN and act(gate) · up.
template <bool PAIR>
__device__ __forceinline__ void q4k_gemv1x_rows(const u8* w, const u8* w2, int rows, int k, const float* x,
                                                float* out, const float* res, int act, const float* norm_w,
                                                float eps) {
    extern __shared__ __align__(16) u8 q4k_sm[];
    i8* xq = (i8*)q4k_sm;
    float* xd = (float*)(q4k_sm + k);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int row = blockIdx.x * 8 + warp, nu = (k >> 8) * 4;
    bool live = row < rows;
    u64 rb = (u64)(k >> 8) * Q4K_BLOCK;
    const u8* wr = w + (u64)row * rb;
    const u8* wr2 = PAIR ? w2 + (u64)row * rb : nullptr;
    constexpr int ahead = Q4K_AHEAD(PAIR);
    Q4KUnit g[ahead], up[ahead];
#pragma unroll
    for (int i = 0; i < ahead; ++i) {
        int u = lane + 32 * i;
        if (live && u < nu) {
            g[i] = q4k_load(wr, u);
            if (PAIR) up[i] = q4k_load(wr2, u);
        }
    }
    pdl_wait();
    pdl_launch();
    quant_x(x, k, 8, norm_w, eps, xq, xd);
    if (!live) return;
    float acc = 0.0f, acc2 = 0.0f;
    for (int u0 = lane; u0 < nu; u0 += 32 * ahead) {
#pragma unroll
        for (int i = 0; i < ahead; ++i) {
            int u = u0 + 32 * i;
            if (u >= nu) break;
            if (u0 != lane) {
                g[i] = q4k_load(wr, u);
                if (PAIR) up[i] = q4k_load(wr2, u);
            }
            acc += q4k_dot(g[i], u, xq, xd);
            if (PAIR) acc2 += q4k_dot(up[i], u, xq, xd);
        }
    }
    if (PAIR) {
        float gv = warp_sum(acc), uv = warp_sum(acc2);
        if (lane == 0) out[row] = gated(gv, uv, act);
        return;
    }
    float y = warp_sum(acc);
    if (lane == 0) out[row] = res ? y + res[row] : y;
}

extern "C" __global__ void __launch_bounds__(256, 4) q4k_gemv1x(const u8* w, int rows, int k, const float* x,
                                                                 float* out, const float* res, const float* nw,
                                                                 float eps) {
    q4k_gemv1x_rows<false>(w, nullptr, rows, k, x, out, res, 0, nw, eps);
}

extern "C" __global__ void __launch_bounds__(256, 4) q4k_gemv1x_pair(const u8* w, const u8* w2, int rows, int k,
                                                                      const float* x, float* out, int act,
                                                                      const float* nw, float eps) {
    q4k_gemv1x_rows<true>(w, w2, rows, k, x, out, nullptr, act, nw, eps);
}
