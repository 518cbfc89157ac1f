// decode_run's GEMV phases: the input normed and quantized from the
// writers' statistics, the rows on tensor cores, and the statistics this
// phase leaves for the next.

// norm_quant of one row, by block 0 into global memory.
__device__ __forceinline__ void nq_phase(const NqArgs& n, float* xs) {
    bool vec = nq_vec(n.x, n.w, n.ne0);
    float4 wpre[ROW_UNROLL];
    nq_prefetch(n.w, n.ne0, n.k_pad, vec, wpre);
    float d = nq_row(n.x, n.w, n.y, n.q, n.lsum, n.ne0, n.k_pad, n.norm, n.eps, xs, wpre, vec);
    if (threadIdx.x == 0) *n.d = d;
}

// What a warp's row needs besides the dot: the row scale(s) and the residual,
// loaded before the dot so their latency hides behind it.
struct RowEnds {
    float sg, su, res;
};

__device__ __forceinline__ RowEnds row_ends(const GemvArgs& g, int mi, int row, bool pair) {
    const TernaryMat& m = g.b.m[mi];
    RowEnds e;
    e.sg = m.groups == 1 ? m.scales[row] : 1.0f;
    e.su = pair && g.b.m[1].groups == 1 ? g.b.m[1].scales[row] : 1.0f;
    // From L2: other blocks wrote the residual row during this launch.
    e.res = m.res ? __ldcg(m.res + row) : 0.0f;
    return e;
}

// The row statistics the writers of a row left in `st` (a float2 per
// block: Σ x², max |x · w|), reduced by warp 0 in a fixed order (the same
// result in every run) and shared through shared memory: the others wait at
// the next block barrier. Each lane's loads go out together: a loop of one
// load at a time paid an L2 round trip per 32 blocks.
__device__ __forceinline__ void reduce_stats(const float2* st, int nblk, double* ss, float* am) {
    if (threadIdx.x >= 32) return;
    int lane = threadIdx.x;
    double s = 0.0;
    float a = 0.0f;
    for (int i0 = 0; i0 < nblk; i0 += 256) {
        float2 v[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            int i = i0 + lane + 32 * k;
            v[k] = i < nblk ? __ldcg(st + i) : make_float2(0.0f, 0.0f);
        }
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            s += (double)v[k].x;
            a = fmaxf(a, v[k].y);
        }
    }
    s = warp_reduce(s, Sum());
    a = warp_max(a);
    if (lane == 0) {
        *ss = s;
        *am = a;
    }
}

// nq_row for a row whose statistics are known and whose writers also left
// it multiplied by the norm weight (`xw`): each thread loads its words of
// the permuted layout and norms and quantizes them with no reduction and no
// norm weight to fetch. The order is (x·w)·inv where the CPU has (x·inv)·w,
// inv is a float rsqrt where the CPU's is exact, and the scale comes from
// max |x·w| · inv, so a level can round to 128 where the CPU gives 127
// (clamped). Returns d = 1/s_a.
__device__ __forceinline__ float nq_from_stats(const NqArgs& n, const float* xw, const float2* st, int nblk,
                                               float* yr, i8* qr, int* ls) {
    int nw = n.k_pad >> 2, stride = blockDim.x;
    float4 v[NQS_WORDS];
#pragma unroll
    for (int u = 0; u < NQS_WORDS; ++u) {
        int i = threadIdx.x + u * stride, base = i < nw ? permuted_base(i) : n.ne0;
        v[u] = base < n.ne0 ? __ldcg((const float4*)(xw + base)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    __shared__ double red_ss;
    __shared__ float red_am;
    reduce_stats(st, nblk, &red_ss, &red_am);
    __syncthreads();
    double ss = red_ss;
    float am = red_am;
    // In float: the CPU's double division, square root and reciprocal are
    // ~30 dependent FP64 steps on every stage's critical path, and inv
    // nearly cancels out of the levels (x·w·inv · 127 / (am·inv)).
    float inv = n.norm ? rsqrtf(__fdividef((float)ss, (float)n.ne0) + n.eps) : 1.0f;
    float sa = 127.0f / fmaxf(am * inv, 1e-5f), unused = 0.0f;
#pragma unroll
    for (int u = 0; u < NQS_WORDS; ++u) v[u] = weigh4(v[u], n.norm, inv, false, v[u], &unused);
    put_words<NQS_WORDS>(v, nw, n.ne0, sa, yr, qr, ls);
    return 1.0f / sa;
}

// Writes this block's statistics of the rows it wrote: each warp's (Σ y²,
// max |y·w|) summed in warp order by thread 0.
__device__ __forceinline__ void put_stats(float2* out, int blk, float ss, float am) {
    __shared__ float2 wred[DEC_WARPS_MAX];
    int warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    if ((threadIdx.x & 31) == 0) wred[warp] = make_float2(ss, am);
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0.0;
        float a = 0.0f;
        for (int i = 0; i < warps; ++i) {
            s += (double)wred[i].x;
            a = fmaxf(a, wred[i].y);
        }
        out[blk] = make_float2((float)s, a);
    }
}

// Row tiles of 16 a block's GEMV rows may take, times the warps a tile's
// chunks split over (tern_cuda::decode::MAX_BLOCK_ROWS: 256 rows, so 16
// tiles, 32 for pairs).
#define MMA_ITEMS 32

// One warp's part of a 16-row tile: rows `rows` (16 rows of `rb` bytes in
// shared memory, `valid` of them real), chunks [c0, c1), against the
// activations `q` (shared). Tensor cores do the dot products: the m16n8k32
// A fragment of thread (g, tig) is lane block tig of rows g and g + 8 (the
// layout's 16-byte vectors), and bits 2j..2j+1 of its bytes pair with
// activation word 4w + j of the block. Masking plane j in place (no shift)
// leaves codes times 4^j, so each plane accumulates apart and the planes
// are summed as acc_j / 4^j at the end: one LOP3 per four weights. Only
// column 0 of the product is used (one token); lanes g ≠ 0 feed the unused
// columns. Returns Σ c·q over the chunks for rows g (.x) and g + 8 (.y), in
// the lanes with tig = 0.
__device__ __forceinline__ int2 tile_dot(const u8* rows, u32 rb, int valid, const i8* q, int c0, int c1) {
    int lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    int acc[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[j][r] = 0;
    bool lo_in = g < valid, hi_in = g + 8 < valid;
    const u8* rlo = rows + (u64)g * rb + tig * 16;
    const u8* rhi = rlo + 8 * (u64)rb;
    for (int c = c0; c < c1; ++c) {
        uint4 wl = lo_in ? *(const uint4*)(rlo + c * 64) : make_uint4(0, 0, 0, 0);
        uint4 wh = hi_in ? *(const uint4*)(rhi + c * 64) : make_uint4(0, 0, 0, 0);
        const uint4* ap = (const uint4*)(q + c * 256 + tig * 64);
        const uint4 a4[4] = {ap[0], ap[1], ap[2], ap[3]};
        const u32 act[16] = {a4[0].x, a4[0].y, a4[0].z, a4[0].w, a4[1].x, a4[1].y, a4[1].z, a4[1].w,
                             a4[2].x, a4[2].y, a4[2].z, a4[2].w, a4[3].x, a4[3].y, a4[3].z, a4[3].w};
        const u32 lw[4] = {wl.x, wl.y, wl.z, wl.w}, hw[4] = {wh.x, wh.y, wh.z, wh.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            u32 mask = M2 << (2 * j);
#pragma unroll
            for (int w = 0; w < 4; w += 2)
                mma_u8s8(acc[j], lw[w] & mask, hw[w] & mask, lw[w + 1] & mask, hw[w + 1] & mask, act[4 * w + j],
                         act[4 * (w + 1) + j]);
        }
    }
    // Column 0 is c0 (row g) and c2 (row g + 8) of the lanes with tig = 0;
    // plane j's sums are multiples of 4^j, so the shifts are exact.
    int lo = acc[0][0] + (acc[1][0] >> 2) + (acc[2][0] >> 4) + (acc[3][0] >> 6);
    int hi = acc[0][2] + (acc[1][2] >> 2) + (acc[2][2] >> 4) + (acc[3][2] >> 6);
    return make_int2(lo, hi);
}

// A block's rows of a ternary GEMV with its weights in the ring (`wsm`,
// complete once mbarrier `m` passes `parity`). The rows go in tiles of 16
// (pairs: the gate tiles, then the up tiles); with fewer tiles than warps a
// tile's chunks split over several warps, whose integer sums add exactly.
// Thread i then finishes row i: it loaded the row's ends (scales, residual,
// next norm's weight) at the phase's start, so no row waits on a load. A
// phase that leaves statistics also leaves its rows times the next norm's
// weight in `xw_rows`.
__device__ __forceinline__ void gemv_phase(const GemvArgs& g, int blk, int nblk, const u8* wsm, u64* m, u32 parity,
                                           float* xs, i8* qs, int* ls, float2* stats, float* xw_rows, u64* tr) {
    __shared__ int part[MMA_ITEMS][16];
    __shared__ int tsum;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    bool pair = g.pair_act >= 0;
    bool stamp = tr && threadIdx.x == 0;
    int r0, r1;
    block_rows(g.rows, blk, nblk, &r0, &r1);
    int nrows = r1 - r0;
    u32 rb = (u32)(g.k_pad >> 2);
    RowEnds mine = {1.0f, 1.0f, 0.0f};
    float msw = 1.0f;
    int mi = 0, row = 0;
    if ((int)threadIdx.x < nrows) {
        locate(g, r0 + threadIdx.x, &mi, &row);
        mine = row_ends(g, mi, row, pair);
        if (g.stat_w) msw = __ldg(g.stat_w + row);
    }
    const i8* q = g.nq.q;
    const int* lsum = g.nq.lsum;
    float d;
    if (g.fused == FUSED_STATS) {
        d = nq_from_stats(g.nq, xw_rows + g.stat_in * ROW_MAX, stats + g.stat_in * STAT_BLOCKS, nblk,
                          blk == 0 ? g.nq.y : nullptr, qs, ls);
        if (stamp) tr[TR_STAGED] = now_ns();
    } else if (g.fused == FUSED_BLOCK) {
        const NqArgs& n = g.nq;
        bool vec = nq_vec(n.x, n.w, n.ne0);
        float4 wpre[ROW_UNROLL];
        nq_prefetch(n.w, n.ne0, g.k_pad, vec, wpre);
        d = nq_row(n.x, n.w, blk == 0 ? n.y : nullptr, qs, ls, n.ne0, g.k_pad, n.norm, n.eps, xs, wpre, vec,
                   tr ? tr + TR_STAGED : nullptr);
    } else {
        // The levels another phase wrote: into shared memory, from L2.
        d = __ldcg(g.nq.d);
        for (int i = threadIdx.x; i < g.k_pad / 16; i += blockDim.x) ((uint4*)qs)[i] = __ldcg((const uint4*)q + i);
        for (int i = threadIdx.x; i < g.k_pad / 64; i += blockDim.x) ls[i] = __ldcg(lsum + i);
    }
    __syncthreads();
    if (stamp) tr[TR_QUANT] = now_ns();
    if (warp == 0) {
        int t = 0;
        for (int i = lane; i < g.k_pad / 64; i += 32) t += ls[i];
        t = warp_sum_i(t);
        if (lane == 0) tsum = t;
    }
    mbar_wait(m, parity);
    if (stamp) tr[TR_READY] = now_ns();
    int nt = (nrows + 15) >> 4, tiles = pair ? 2 * nt : nt;
    int kparts = tiles == 0 || tiles >= warps ? 1 : warps / tiles, items = tiles * kparts;
    int n_chunks = g.k_pad >> 8;
    for (int it = warp; it < items; it += warps) {
        int tile = it / kparts, kp = it % kparts, t16 = tile % max(nt, 1);
        const u8* rows = wsm + (u64)(tile >= nt ? nrows : 0) * rb + (u64)t16 * 16 * rb;
        int2 v = tile_dot(rows, rb, nrows - t16 * 16, qs, kp * n_chunks / kparts, (kp + 1) * n_chunks / kparts);
        if ((lane & 3) == 0) {
            part[it][lane >> 2] = v.x;
            part[it][(lane >> 2) + 8] = v.y;
        }
    }
    __syncthreads();
    if (stamp) tr[TR_ROWS] = now_ns();
    float ss = 0.0f, am = 0.0f;
    int i = threadIdx.x;
    if (i < nrows) {
        int t16 = i >> 4, r = i & 15, sg = 0, su = 0;
        for (int kp = 0; kp < kparts; ++kp) {
            sg += part[t16 * kparts + kp][r];
            if (pair) su += part[(nt + t16) * kparts + kp][r];
        }
        const TernaryMat& mt = g.b.m[mi];
        float y = (float)(sg - tsum) * mine.sg * d;
        if (pair) y = gated(y, (float)(su - tsum) * mine.su * d, g.pair_act);
        float o = mt.res ? y + mine.res : y;
        mt.out[row] = o;
        ss = o * o;
        am = fabsf(o * msw);
        if (g.stat_out >= 0) xw_rows[g.stat_out * ROW_MAX + row] = o * msw;
    }
    if (g.stat_out >= 0) {
        ss = warp_sum(ss);
        am = warp_max(am);
        put_stats(stats + g.stat_out * STAT_BLOCKS, blk, ss, am);
    }
}
