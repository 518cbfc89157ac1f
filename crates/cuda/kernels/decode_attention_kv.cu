// decode_run's one-token attention over caches of GROUP_CACHE_KEYS keys or
// more (tern_cuda::decode; the host runs this module only for those)
// for grouped-query heads (G = 2, 4 or 8 q heads a KV head): a block per
// (KV head, chunk of keys) takes the group's G heads together, so that each
// K and V row crosses from L2 once (att_head's units, a block per q head,
// read it G times) and a chunk is a few passes (a q head's chunks are
// several times longer, as the grid has G times fewer of them), and the
// last block of a KV group to finish merges the chunks' rows.
//
// A warp takes KS = 32 / G keys a step (8 for G = 2); lane l holds dims
// [l·D/32, (l+1)·D/32) of each key's K and V row and of each head's q. The
// KS·G partial dot products of a step are summed across the warp by a
// reduce-scatter (31 shuffles for 32 values) that leaves each lane one
// (key, head) score, value l / R of the step (R = 32 / (KS·G) lanes hold
// each), so the online softmax reduces over the lanes G·R apart and each
// lane adds its V dims for every head.

// Chunks a KV head's cache may be cut into (the lowering's decoding splits
// are at most 128, tern_cuda::lower ATT_MAX_SPLITS_DECODE).
#define AKV_MAX_CHUNKS 128
// Chunk rows the merge loads for an output at once.
#define AKV_MERGE_BATCH 16

// A lane's D/32 (≤ 4) f16 dims at `p`.
__device__ __forceinline__ uint2 akv_dims(const u16* p, int dpl) {
    if (dpl == 4) return *(const uint2*)p;
    if (dpl == 2) return make_uint2(*(const u32*)p, 0u);
    uint2 r = make_uint2(p[0], 0u);
    if (dpl > 1) r.x |= (u32)p[1] << 16;
    if (dpl > 2) r.y = p[2];
    return r;
}

__device__ __forceinline__ void akv_unpack(uint2 r, float f[4]) {
    f[0] = h2f(r.x & 0xffff);
    f[1] = h2f(r.x >> 16);
    f[2] = h2f(r.y & 0xffff);
    f[3] = h2f(r.y >> 16);
}

// The lane's dims of the K (or V) rows of keys wb..wb+KS−1 below `end`,
// into r: the earlier keys' from the cache `c` when `cache`, the token's
// own (key p) from `own_row` when `own`; the rest are left as they are.
template <int KS>
__device__ __forceinline__ void akv_rows(const u16* c, const u16* own_row, int row, int koff, int wb, int p, int end,
                                         int dpl, bool cache, bool own, uint2 r[KS]) {
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
        int j = wb + kk;
        if (j >= end || !((cache && j < p) || (own && j == p))) continue;
        r[kk] = akv_dims((j < p ? c + (u64)j * row + koff : own_row) + lane * dpl, dpl);
    }
}

template <int KS>
__device__ __forceinline__ void akv_zero(uint2 r[KS]) {
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) r[kk] = make_uint2(0, 0);
}

// Stage ST (offset 16 >> ST) of reduce_scatter, then the rest: templates,
// so that every index is a constant and the values stay in registers (a
// loop over the stages left them in local memory).
template <int NV, int ST>
__device__ __forceinline__ void reduce_scatter_from(float (&v)[NV], int lane) {
    if constexpr (ST < 5) {
        constexpr int o = 16 >> ST, n = NV >> ST;
        if constexpr (n >= 2) {
            bool up = lane & o;
#pragma unroll
            for (int i = 0; i < n / 2; ++i) {
                float send = up ? v[i] : v[i + n / 2];
                float keep = up ? v[i + n / 2] : v[i];
                v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
            }
        } else {
            v[0] += __shfl_xor_sync(0xffffffffu, v[0], o);
        }
        reduce_scatter_from<NV, ST + 1>(v, lane);
    }
}

// Sums each of NV values over the warp and scatters the sums: lane l keeps
// value l·NV/32 in v[0] (NV = 32), or value l / (32/NV) (NV < 32). A stage
// halves what a lane holds: it keeps the half its bit of the offset selects
// and adds its partner's copy of that half.
template <int NV>
__device__ __forceinline__ void reduce_scatter(float (&v)[NV]) {
    reduce_scatter_from<NV, 0>(v, threadIdx.x & 31);
}

// Keys a warp takes a step for G heads, and the keys of a block's pass.
template <int G>
struct Akv {
    static constexpr int KS = G == 2 ? 8 : 32 / G;
    static constexpr int NV = KS * G, R = 32 / NV;
    static constexpr int PASS = ATH_WARPS * KS;
};

// A warp step's scores: keys wb..wb+KS−1 (below `end`) for the G heads
// from the K dims in kr; q[h][i]: head h's dims (scaled). Updates the
// running max m and sum l of the lane's (key, head) slot's head, scales the
// V sums acc[h][i] to the new max, and returns the slot's weight.
template <int G>
__device__ __forceinline__ float akv_scores(const float (&q)[G][4], const uint2* kr, int wb, int end, float& m,
                                            float& l, float (&acc)[G][4]) {
    constexpr int KS = Akv<G>::KS, NV = Akv<G>::NV, R = Akv<G>::R;
    int lane = threadIdx.x & 31;
    float s[NV];
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
        float kf[4];
        akv_unpack(kr[kk], kf);
#pragma unroll
        for (int h = 0; h < G; ++h) s[kk * G + h] = q[h][0] * kf[0] + q[h][1] * kf[1] + q[h][2] * kf[2] + q[h][3] * kf[3];
    }
    reduce_scatter<NV>(s);
    bool live = wb + lane / (G * R) < end;
    float sc = live ? s[0] : -INFINITY, mx = sc;
#pragma unroll
    for (int o = G * R; o < 32; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float m_new = fmaxf(m, mx), corr = expf(m - m_new);
    float p = live ? expf(sc - m_new) : 0.0f, ps = p;
#pragma unroll
    for (int o = G * R; o < 32; o <<= 1) ps += __shfl_xor_sync(0xffffffffu, ps, o);
    l = l * corr + ps;
    m = m_new;
    // Head h's values sit in lane (kk·G + h)·R: its correction in lane h·R.
#pragma unroll
    for (int h = 0; h < G; ++h) {
        float c = __shfl_sync(0xffffffffu, corr, h * R);
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[h][i] *= c;
    }
    return p;
}

// A warp step's V sums: each key's weight for each head (`p` of its lane)
// times the lane's V dims in vr.
template <int G>
__device__ __forceinline__ void akv_values(float p, const uint2* vr, float (&acc)[G][4]) {
    constexpr int KS = Akv<G>::KS, R = Akv<G>::R;
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
        float vf[4];
        akv_unpack(vr[kk], vf);
#pragma unroll
        for (int h = 0; h < G; ++h) {
            float pk = __shfl_sync(0xffffffffu, p, (kk * G + h) * R);
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[h][i] += pk * vf[i];
        }
    }
}

// The last block of KV group `kvh` merges its G heads' C chunk rows. The
// outputs' chunk sums load first, B chunks a round, together with each
// (head, chunk)'s (max, sum): the weights exp(max − the head's max) and
// each head's denominator go to shared memory (`sm`: 2·G·C + G floats)
// while the sums are in flight, so a merge of up to B chunks waits for L2
// once.
template <int G>
__device__ __forceinline__ void akv_merge(const Phase& ph, int kvh, int C, float* sm, float* xw, float* ss, float* am) {
    constexpr int MAXO = (G * DEC_MAX_HEAD_DIM + DEC_THREADS - 1) / DEC_THREADS, B = 32 / MAXO;
    const AttArgs& a = ph.a;
    int D = a.head_dim;
    float* wm = sm;
    float* wl = sm + G * C;
    float* den = wl + G * C;
    const float* rows = a.part + (u64)kvh * G * a.n_split * (D + 2);
    float v[MAXO][B];
    auto load = [&](int c0) {
#pragma unroll
        for (int o = 0; o < MAXO; ++o) {
            int at = threadIdx.x + o * DEC_THREADS, h = at / D, d = at % D;
            const float* r = rows + (u64)h * a.n_split * (D + 2) + 2 + d;
#pragma unroll
            for (int k = 0; k < B; ++k)
                v[o][k] = at < G * D && c0 + k < C ? __ldcg(r + (u64)(c0 + k) * (D + 2)) : 0.0f;
        }
    };
    load(0);
    for (int i = threadIdx.x; i < G * C; i += blockDim.x) {
        const float* r = rows + ((u64)(i / C) * a.n_split + i % C) * (D + 2);
        wm[i] = __ldcg(r);
        wl[i] = __ldcg(r + 1);
    }
    // The next norm's weights of this thread's outputs, for att_out.
    float sw[MAXO];
#pragma unroll
    for (int o = 0; o < MAXO; ++o) {
        int at = threadIdx.x + o * DEC_THREADS;
        sw[o] = ph.g.stat_w && at < G * D ? __ldg(ph.g.stat_w + (u64)kvh * G * D + at) : 1.0f;
    }
    __syncthreads();
    // A warp a head: its chunks' weights and their sum, a lane a chunk.
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (warp < G) {
        float big = -INFINITY;
        for (int c = lane; c < C; c += 32) big = fmaxf(big, wm[warp * C + c]);
        big = warp_max(big);
        float dn = 0.0f;
        for (int c = lane; c < C; c += 32) {
            float e = expf(wm[warp * C + c] - big);
            wm[warp * C + c] = e;
            dn += wl[warp * C + c] * e;
        }
        dn = warp_sum(dn);
        if (lane == 0) den[warp] = dn;
    }
    __syncthreads();
    float num[MAXO];
#pragma unroll
    for (int o = 0; o < MAXO; ++o) num[o] = 0.0f;
    for (int c0 = 0; c0 < C; c0 += B) {
        if (c0 > 0) load(c0);
#pragma unroll
        for (int o = 0; o < MAXO; ++o) {
            int h = (threadIdx.x + o * DEC_THREADS) / D;
#pragma unroll
            for (int k = 0; k < B; ++k)
                if (c0 + k < C && h < G) num[o] += v[o][k] * wm[h * C + c0 + k];
        }
    }
#pragma unroll
    for (int o = 0; o < MAXO; ++o) {
        int at = threadIdx.x + o * DEC_THREADS, h = at / D;
        if (at < G * D) att_out_w(ph, (u64)kvh * G * D + at, num[o] / den[h], sw[o], xw, ss, am);
    }
}

// Floats of scratch a block needs (tern_cuda::decode::att_kv_floats): q
// [G][D], the new k and v as f16 [2][D], each warp's max and sum [8][G]
// [8][G] and V sums [8][G][D]; the merge reuses it.
template <int G>
__device__ void att_kv_units(const Phase& ph, int blk, int nblk, float* sm, const Angles* an, int p, int C, int S,
                             float* xw_rows, float* ss, float* am, u64* tr) {
    constexpr int KS = Akv<G>::KS, R = Akv<G>::R, PASS = Akv<G>::PASS;
    __shared__ int last;
    const AttArgs& a = ph.a;
    const AttRope& r = a.r;
    int D = a.head_dim, row = D * a.n_head_kv, hp = D / 2, dpl = D / 32;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float* qsh = sm;
    u16* cur = (u16*)(qsh + G * D);
    float* pm = (float*)(cur + 2 * D);
    float* pl = pm + ATH_WARPS * G;
    float* pacc = pl + ATH_WARPS * G;
    const u16* kc = (const u16*)a.kc;
    const u16* vc = (const u16*)a.vc;
    float* xw = ph.g.stat_out >= 0 ? xw_rows + ph.g.stat_out * ROW_MAX : nullptr;
    int n = p + 1;
    for (int u = blk; u < a.n_head_kv * C; u += nblk) {
        int kvh = u % a.n_head_kv, ch = u / a.n_head_kv, koff = kvh * D;
        int k0 = ch * S, k1 = min(n, k0 + S);
        for (int idx = threadIdx.x; idx < (G + 1) * hp + D; idx += blockDim.x) {
            if (idx < (G + 1) * hp) {
                int which = idx / hp, i = idx % hp, x, y;
                bool rot = rope_pair(i, r.n_rot, r.mode, &x, &y);
                float c = rot ? an->cs[i].x : 1.0f, sn = rot ? an->cs[i].y : 0.0f;
                const float* src = which < G ? a.q + (u64)(kvh * G + which) * D : r.k + (u64)kvh * D;
                float x0 = __ldcg(src + x), x1 = __ldcg(src + y);
                float r0 = x0 * c - x1 * sn, r1 = x0 * sn + x1 * c;
                if (which < G) {
                    qsh[which * D + x] = r0 * a.scale;
                    qsh[which * D + y] = r1 * a.scale;
                } else {
                    cur[x] = f2h(r0);
                    cur[y] = f2h(r1);
                }
            } else {
                cur[D + idx - (G + 1) * hp] = f2h(__ldcg(r.v + (u64)kvh * D + idx - (G + 1) * hp));
            }
        }
        // The next norm's weights of the group's outputs, which the merging
        // block reads, into L2 (a line a thread): they were last read a
        // token ago. Then the first step's K and V rows: they do not depend
        // on this token, but going out before q, k and v's (or with the
        // chunk asked into L2 ahead of them) they slowed the stage more
        // than they saved.
        if (ph.g.stat_w && threadIdx.x < G * D / 32)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(ph.g.stat_w + (u64)kvh * G * D + threadIdx.x * 32));
        uint2 kr[KS], vr[KS];
        akv_zero<KS>(kr);
        akv_zero<KS>(vr);
        akv_rows<KS>(kc, cur, row, koff, k0 + warp * KS, p, k1, dpl, true, false, kr);
        akv_rows<KS>(vc, cur + D, row, koff, k0 + warp * KS, p, k1, dpl, true, false, vr);
        __syncthreads();
        if (tr && threadIdx.x == 0 && u == blk) tr[TR_STAGED] = now_ns();
        if (ch == 0) {
            u64 dst = (u64)p * row + koff;
            for (int d = threadIdx.x; d < 2 * D; d += blockDim.x) ((u16*)(d < D ? a.kc : a.vc))[dst + d % D] = cur[d];
        }
        float q[G][4];
#pragma unroll
        for (int h = 0; h < G; ++h)
#pragma unroll
            for (int i = 0; i < 4; ++i) q[h][i] = i < dpl ? qsh[h * D + lane * dpl + i] : 0.0f;
        float m = -INFINITY, l = 0.0f, acc[G][4];
#pragma unroll
        for (int h = 0; h < G; ++h)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[h][i] = 0.0f;
        for (int j0 = k0; j0 < k1; j0 += PASS) {
            int wb = j0 + warp * KS;
            if (wb >= k1) break;
            // The token's own key, then the next step's K rows in flight
            // while the V sums are formed, and its V rows while the next
            // scores are: one set of registers for each.
            akv_rows<KS>(kc, cur, row, koff, wb, p, k1, dpl, false, true, kr);
            akv_rows<KS>(vc, cur + D, row, koff, wb, p, k1, dpl, false, true, vr);
            float pw = akv_scores<G>(q, kr, wb, k1, m, l, acc);
            akv_zero<KS>(kr);
            akv_rows<KS>(kc, cur, row, koff, wb + PASS, p, k1, dpl, true, false, kr);
            akv_values<G>(pw, vr, acc);
            akv_zero<KS>(vr);
            akv_rows<KS>(vc, cur + D, row, koff, wb + PASS, p, k1, dpl, true, false, vr);
        }
        if (tr && threadIdx.x == 0 && u == blk) tr[TR_ROWS] = now_ns();
        // Each warp's partials (a warp with no keys leaves max −inf, sums 0):
        // head h's max and sum from its lane of key 0, the V sums from all.
        if (lane < G * R && lane % R == 0) {
            pm[warp * G + lane / R] = m;
            pl[warp * G + lane / R] = l;
        }
#pragma unroll
        for (int h = 0; h < G; ++h)
#pragma unroll
            for (int i = 0; i < 4; ++i)
                if (i < dpl) pacc[(warp * G + h) * D + lane * dpl + i] = acc[h][i];
        __syncthreads();
        for (int o = threadIdx.x; o < G * D; o += blockDim.x) {
            int h = o / D, d = o % D;
            float big = -INFINITY;
            for (int w = 0; w < ATH_WARPS; ++w) big = fmaxf(big, pm[w * G + h]);
            float dn = 0.0f, num = 0.0f;
            for (int w = 0; w < ATH_WARPS; ++w) {
                float e = expf(pm[w * G + h] - big);
                dn += pl[w * G + h] * e;
                num += pacc[(w * G + h) * D + d] * e;
            }
            float* rc = a.part + ((u64)(kvh * G + h) * a.n_split + ch) * (D + 2);
            rc[2 + d] = num;
            if (d == 0) {
                rc[0] = big;
                rc[1] = dn;
            }
        }
        // The rows go out with one release (see att_head_units).
        __syncthreads();
        if (threadIdx.x == 0) {
            int* ctr = a.counters + kvh, old;
            asm volatile("atom.add.acq_rel.gpu.global.s32 %0, [%1], 1;" : "=r"(old) : "l"(ctr) : "memory");
            last = old == C - 1;
            if (last) *ctr = 0;
        }
        __syncthreads();
        if (last) akv_merge<G>(ph, kvh, C, sm, xw, ss, am);
        __syncthreads();
    }
}

// Chunks of the grouped path for a cache of n keys (1: the path does not take
// it): as many as the grid has blocks for every KV head, each a whole
// number of passes, within the lowering's partial rows; S gets their keys.
__device__ __forceinline__ int akv_chunks(const AttArgs& a, int nblk, int n, int* S) {
    int G = a.n_head / a.n_head_kv;
    if (!a.part || !(G == 2 || G == 4 || G == 8)) return 1;
    int pass = G == 8 ? Akv<8>::PASS : Akv<4>::PASS;
    int C = min(min(min(a.n_split, AKV_MAX_CHUNKS), nblk / a.n_head_kv), (n + pass - 1) / pass);
    if (C < 2) return 1;
    *S = ((n + C - 1) / C + pass - 1) / pass * pass;
    return (n + *S - 1) / *S;
}

__device__ __forceinline__ void att_kv(const Phase& ph, int blk, int nblk, float* sm, const Angles* an, int p, int C,
                                       int S, float* xw_rows, float* ss, float* am, u64* tr) {
    switch (ph.a.n_head / ph.a.n_head_kv) {
        case 2: att_kv_units<2>(ph, blk, nblk, sm, an, p, C, S, xw_rows, ss, am, tr); break;
        case 4: att_kv_units<4>(ph, blk, nblk, sm, an, p, C, S, xw_rows, ss, am, tr); break;
        default: att_kv_units<8>(ph, blk, nblk, sm, an, p, C, S, xw_rows, ss, am, tr); break;
    }
}
