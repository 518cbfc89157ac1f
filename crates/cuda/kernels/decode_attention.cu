// decode_run's attention phases: the rope angles once a kernel, the
// (KV head, split) units of attention.cu, and a block per (q head, chunk).

// The rotation an attention's rope applies at this token's position, kept
// in shared memory: every layer's rope is the same, so the angles (double
// pow and sincos) are computed once per kernel, not per layer.
struct Angles {
    float2 cs[DEC_MAX_HEAD_DIM / 2];
    const float* factors;
    int pos, n_rot, mode, head_dim;
    float base, fscale;
};

__device__ __forceinline__ void angles_for(const AttArgs& a, int p, Angles* an) {
    const AttRope& r = a.r;
    bool same = an->pos == p && an->n_rot == r.n_rot && an->mode == r.mode && an->head_dim == a.head_dim &&
                an->base == r.base && an->fscale == r.fscale && an->factors == r.factors;
    if (same) return;
    __syncthreads();
    for (int i = threadIdx.x; i < a.head_dim / 2; i += blockDim.x) {
        int x, y;
        double c = 1.0, sn = 0.0;
        if (rope_pair(i, r.n_rot, r.mode, &x, &y)) rope_angle(p, i, r.n_rot, r.base, r.fscale, r.factors, &c, &sn);
        an->cs[i] = make_float2((float)c, (float)sn);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        an->pos = p;
        an->n_rot = r.n_rot;
        an->mode = r.mode;
        an->head_dim = a.head_dim;
        an->base = r.base;
        an->fscale = r.fscale;
        an->factors = r.factors;
    }
    __syncthreads();
}

// One token's attention with f16 caches, a block per (q head, chunk of
// keys), for `decode_run` (the phase's att_block = 1; decode.rs checks the
// shape fits: head_dim a multiple of 32 up to 128, rope in the kernel, f16
// caches). Short caches take one chunk, so that n_head blocks run short
// chains; long ones are cut into up to n_split chunks of at least
// ATH_CHUNK_MIN keys (as many as the grid has blocks for), each leaving its
// (max, sum, acc) row in `part`, and the last of a KV group's units to
// finish merges its heads (counters: one per KV head, zero between uses).
// A unit goes in passes of ATH_KEYS keys; a chunk's next pass's K and V
// rows load while the current one is multiplied, after the whole chunk was
// asked into L2 at the unit's start: a long cache then costs one DRAM round
// trip, not one a pass. One-chunk units load each pass at its start.
// A pass: 8 keys a warp, a quad of lanes a key (lane quarter ql holds dims
// [ql·D/4, (ql+1)·D/4) of the K row, in registers: q's matching dims too),
// and lane l sums V dims [l·D/32, (l+1)·D/32). The token's own k and v are
// read from shared memory as the caches hold them (f16), so no block waits
// for the one that stores them (the group's first). `sm` is the phase's
// scratch (tern_cuda::decode::att_head_floats): q [D], the new k and v as
// f16 [2][D], each warp's max and sum [8] [8] and V sums [8][D].
// A pass's K dims (quad lane ql of key wb + quad) and V dims (lane's of keys
// wb..wb+7) into registers, keys below `end` only: the earlier keys' from
// the caches when `cache`, the token's own (key p) from `cur` when `own`;
// the rest are left as they are.
__device__ __forceinline__ void att_head_loads(const u16* kc, const u16* vc, const u16* cur, int row, int koff, int wb,
                                               int p, int end, int D, bool cache, bool own, uint4 kw[4],
                                               uint2 vr[8]) {
    int lane = threadIdx.x & 31, quad = lane >> 2, ql = lane & 3, qd = D / 4, dpl = D / 32;
    int j = wb + quad;
    if (j < end && ((cache && j < p) || (own && j == p))) {
        const u16* krow = j < p ? kc + (u64)j * row + koff : cur;
#pragma unroll
        for (int u = 0; u < 4; ++u)
            if (8 * u < qd) kw[u] = *(const uint4*)(krow + ql * qd + 8 * u);
    }
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
        int jk = wb + kk;
        if (!((cache && jk < p) || (own && jk == p)) || jk >= end) continue;
        const u16* v = (jk < p ? vc + (u64)jk * row + koff : cur + D) + lane * dpl;
        if (dpl == 4) {
            vr[kk] = *(const uint2*)v;
        } else if (dpl == 2) {
            vr[kk].x = *(const u32*)v;
        } else {
            vr[kk].x = v[0] | (dpl > 1 ? (u32)v[1] << 16 : 0u);
            vr[kk].y = dpl > 2 ? v[2] : 0u;
        }
    }
}

#define ATH_WARPS 8
#define ATH_KEYS (ATH_WARPS * 8)
// Keys a chunk takes at least (the chunked module runs from
// tern_cuda::decode::LONG_CACHE_KEYS keys).
#define ATH_CHUNK_MIN 256

// One output of the phase: written, counted in the statistics of the next
// norm, and left times that norm's weight `w` (1: no norm weight).
__device__ __forceinline__ void att_out_w(const Phase& ph, u64 at, float o, float w, float* xw, float* ss,
                                          float* am) {
    ph.a.out[at] = o;
    float ow = o * w;
    *ss += o * o;
    *am = fmaxf(*am, fabsf(ow));
    if (xw) xw[at] = ow;
}

// The same, loading the weight of output `at`.
__device__ __forceinline__ void att_out(const Phase& ph, u64 at, float o, float* xw, float* ss, float* am) {
    att_out_w(ph, at, o, ph.g.stat_w ? __ldg(ph.g.stat_w + at) : 1.0f, xw, ss, am);
}

// The last unit of KV group `kvh` merges its heads' chunk rows, an output a
// thread: the same sums as the units' merge (attention.cu).
__device__ __forceinline__ void att_group_merge(const Phase& ph, int kvh, int C, float* xw, float* ss, float* am) {
    const AttArgs& a = ph.a;
    int G = a.n_head / a.n_head_kv, D = a.head_dim;
    for (int i = threadIdx.x; i < G * D; i += blockDim.x) {
        int h = kvh * G + i / D, d = i % D;
        const float* ph0 = a.part + (u64)h * a.n_split * (D + 2);
        float big = -INFINITY;
        for (int c = 0; c < C; ++c) big = fmaxf(big, __ldcg(ph0 + c * (D + 2)));
        float den = 0.0f, num = 0.0f;
        for (int c = 0; c < C; ++c) {
            const float* pc = ph0 + c * (D + 2);
            float e = expf(__ldcg(pc) - big);
            den += __ldcg(pc + 1) * e;
            num += __ldcg(pc + 2 + d) * e;
        }
        att_out(ph, (u64)h * D + d, num / den, xw, ss, am);
    }
}

// One pass of a warp: the scores of keys wb..wb+7 (below `end`) from the K
// dims in `kw`, the running max `m` and sum `l`, and the V sums `acc` from
// the V dims in `vr` (att_head_loads' registers).
__device__ __forceinline__ void att_pass(const float qr[32], const uint4 kw[4], const uint2 vr[8], int wb, int end,
                                         int qd, float& m, float& l, float acc[4]) {
    int lane = threadIdx.x & 31, j = wb + (lane >> 2);
    float s = 0.0f;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
        if (8 * u >= qd) break;
        const u32 w4[4] = {kw[u].x, kw[u].y, kw[u].z, kw[u].w};
#pragma unroll
        for (int e = 0; e < 4; ++e)
            s += qr[8 * u + 2 * e] * h2f(w4[e] & 0xffff) + qr[8 * u + 2 * e + 1] * h2f(w4[e] >> 16);
    }
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    s += __shfl_xor_sync(0xffffffffu, s, 2);
    s = j < end ? s : -INFINITY;
    float mx = s;
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float m_new = fmaxf(m, mx), corr = expf(m - m_new);
    float pj = j < end ? expf(s - m_new) : 0.0f, ps = pj;
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) ps += __shfl_xor_sync(0xffffffffu, ps, o);
    l = l * corr + ps;
    m = m_new;
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i] *= corr;
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
        float pk = __shfl_sync(0xffffffffu, pj, kk * 4);
        const float v4[4] = {h2f(vr[kk].x & 0xffff), h2f(vr[kk].x >> 16), h2f(vr[kk].y & 0xffff),
                             h2f(vr[kk].y >> 16)};
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[i] += pk * v4[i];
    }
}

// A phase's units: with CHUNKS, C ≥ 2 chunks of S keys (`att_head` chose
// them); without, one unit a q head.
template <bool CHUNKS>
__device__ __forceinline__ void att_head_units(const Phase& ph, int blk, int nblk, float* sm, const Angles* an, int p,
                                               int C, int S, float* xw_rows, float* ss, float* am, u64* tr) {
    __shared__ int last;
    const AttArgs& a = ph.a;
    const AttRope& r = a.r;
    int G = a.n_head / a.n_head_kv, D = a.head_dim, row = D * a.n_head_kv, hp = D / 2;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, ql = lane & 3;
    int qd = D / 4, dpl = D / 32;
    float* qsh = sm;
    u16* cur = (u16*)(qsh + D);
    float* pm = (float*)(cur + 2 * D);
    float* pl = pm + ATH_WARPS;
    float* pacc = pl + ATH_WARPS;
    const u16* kc = (const u16*)a.kc;
    const u16* vc = (const u16*)a.vc;
    float* xw = ph.g.stat_out >= 0 ? xw_rows + ph.g.stat_out * ROW_MAX : nullptr;
    int n = p + 1;
    for (int u = blk; u < a.n_head * C; u += nblk) {
        int h = CHUNKS ? u % a.n_head : u, ch = CHUNKS ? u / a.n_head : 0, kvh = h / G;
        int k0 = ch * S, k1 = CHUNKS ? min(n, k0 + S) : n;
        if constexpr (CHUNKS) {
            // The chunk's earlier K and V rows into L2, a 128-byte line a thread.
            int lines = (D * 2 + 127) / 128, kend = min(k1, p);
            for (int i = threadIdx.x; i < 2 * (kend - k0) * lines; i += blockDim.x) {
                int which = i / ((kend - k0) * lines), rest = i % ((kend - k0) * lines);
                const u16* at = (which ? vc : kc) + (u64)(k0 + rest / lines) * row + kvh * D + (rest % lines) * 64;
                asm volatile("prefetch.global.L2 [%0];" ::"l"(at));
            }
        }
        // The first pass's earlier keys do not depend on this token: their
        // loads go out with q, k and v's.
        uint4 kw[4] = {};
        uint2 vr[8] = {};
        att_head_loads(kc, vc, cur, row, kvh * D, k0 + warp * 8, p, k1, D, true, false, kw, vr);
        for (int idx = threadIdx.x; idx < 2 * hp + D; idx += blockDim.x) {
            if (idx < 2 * hp) {
                int which = idx / hp, i = idx % hp, x, y;
                bool rot = rope_pair(i, r.n_rot, r.mode, &x, &y);
                float c = rot ? an->cs[i].x : 1.0f, sn = rot ? an->cs[i].y : 0.0f;
                const float* src = which == 0 ? a.q + (u64)h * D : r.k + (u64)kvh * D;
                float x0 = __ldcg(src + x), x1 = __ldcg(src + y);
                float r0 = x0 * c - x1 * sn, r1 = x0 * sn + x1 * c;
                if (which == 0) {
                    qsh[x] = r0 * a.scale;
                    qsh[y] = r1 * a.scale;
                } else {
                    cur[x] = f2h(r0);
                    cur[y] = f2h(r1);
                }
            } else {
                cur[D + idx - 2 * hp] = f2h(__ldcg(r.v + (u64)kvh * D + idx - 2 * hp));
            }
        }
        __syncthreads();
        if (tr && threadIdx.x == 0 && u == blk) tr[TR_STAGED] = now_ns();
        if (h % G == 0 && ch == 0) {
            u64 dst = (u64)p * row + (u64)kvh * D;
            for (int d = threadIdx.x; d < 2 * D; d += blockDim.x) ((u16*)(d < D ? a.kc : a.vc))[dst + d % D] = cur[d];
        }
        float qr[32];
#pragma unroll
        for (int e = 0; e < 32; ++e) qr[e] = e < qd ? qsh[ql * qd + e] : 0.0f;
        float m = -INFINITY, l = 0.0f, acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int j0 = k0; j0 < k1; j0 += ATH_KEYS) {
            int wb = j0 + warp * 8;
            if (wb >= k1) break;
            if constexpr (CHUNKS) {
                // The next pass's rows, in flight while this one is multiplied.
                att_head_loads(kc, vc, cur, row, kvh * D, wb, p, k1, D, false, true, kw, vr);
                uint4 kn[4] = {};
                uint2 vn[8] = {};
                att_head_loads(kc, vc, cur, row, kvh * D, wb + ATH_KEYS, p, k1, D, true, false, kn, vn);
                att_pass(qr, kw, vr, wb, k1, qd, m, l, acc);
#pragma unroll
                for (int i = 0; i < 4; ++i) kw[i] = kn[i];
#pragma unroll
                for (int kk = 0; kk < 8; ++kk) vr[kk] = vn[kk];
            } else {
                if (j0 > 0) {
                    kw[0] = kw[1] = kw[2] = kw[3] = make_uint4(0, 0, 0, 0);
#pragma unroll
                    for (int kk = 0; kk < 8; ++kk) vr[kk] = make_uint2(0, 0);
                }
                att_head_loads(kc, vc, cur, row, kvh * D, wb, p, k1, D, j0 > 0, true, kw, vr);
                att_pass(qr, kw, vr, wb, k1, qd, m, l, acc);
            }
        }
        if (tr && threadIdx.x == 0 && u == blk) tr[TR_ROWS] = now_ns();
        // Each warp's partials (a warp with no keys leaves max −inf, sums 0),
        // then one thread per output merges them: into the output, or into
        // the chunk's row of `part`.
        if (lane == 0) {
            pm[warp] = m;
            pl[warp] = l;
        }
#pragma unroll
        for (int i = 0; i < 4; ++i)
            if (i < dpl) pacc[warp * D + lane * dpl + i] = acc[i];
        __syncthreads();
        float* row_c = a.part + ((u64)h * a.n_split + ch) * (D + 2);
        for (int d = threadIdx.x; d < D; d += blockDim.x) {
            float big = -INFINITY;
            for (int w = 0; w < ATH_WARPS; ++w) big = fmaxf(big, pm[w]);
            float den = 0.0f, num = 0.0f;
            for (int w = 0; w < ATH_WARPS; ++w) {
                float e = expf(pm[w] - big);
                den += pl[w] * e;
                num += pacc[w * D + d] * e;
            }
            if constexpr (!CHUNKS) {
                att_out(ph, (u64)h * D + d, num / den, xw, ss, am);
            } else {
                row_c[2 + d] = num;
                if (d == 0) {
                    row_c[0] = big;
                    row_c[1] = den;
                }
            }
        }
        if constexpr (CHUNKS) {
            // The block's rows of `part` go out with one release: the barrier
            // orders every thread's stores before thread 0's atomic, whose
            // gpu-scope release covers them, and its acquire covers the
            // merge's loads of the other blocks' rows (256 threads each
            // fencing waited for their own stores and the SM's ring copies).
            __syncthreads();
            if (threadIdx.x == 0) {
                int* ctr = a.counters + kvh, old;
                asm volatile("atom.add.acq_rel.gpu.global.s32 %0, [%1], 1;" : "=r"(old) : "l"(ctr) : "memory");
                last = old == G * C - 1;
                if (last) *ctr = 0;
            }
            __syncthreads();
            if (last) att_group_merge(ph, kvh, C, xw, ss, am);
        }
        __syncthreads();
    }
}

// Chunks of S keys (a multiple of a pass), C of them: as many as make
// each at least ATH_CHUNK_MIN keys, up to the lowering's partial rows
// (n_split) and the blocks the grid has for every head. Each range of
// cache lengths has a module of its own (kernels.rs), built with
// DEC_LONG_CACHES 0 (one chunk a head), 1 (att_head_units' chunks, from
// LONG_CACHE_KEYS keys) or 2 (att_kv's, a block per KV head and chunk,
// from GROUP_CACHE_KEYS keys with grouped q heads): a path's code alone, even
// unused, costs the other paths' kernels registers, and registers speed.
#ifndef DEC_LONG_CACHES
#define DEC_LONG_CACHES 0
#endif
// The grouped path (decode_attention_kv.cu, after this file).
__device__ __forceinline__ int akv_chunks(const AttArgs& a, int nblk, int n, int* S);
__device__ __forceinline__ void att_kv(const Phase& ph, int blk, int nblk, float* sm, const Angles* an, int p, int C,
                                       int S, float* xw_rows, float* ss, float* am, u64* tr);

__device__ __forceinline__ void att_head(const Phase& ph, int blk, int nblk, float* sm, const Angles* an, int p,
                                         float* xw_rows, float* ss, float* am, u64* tr) {
    int n = p + 1;
#if DEC_LONG_CACHES == 2
    int S;
    int C = akv_chunks(ph.a, nblk, n, &S);
    if (C >= 2) {
        att_kv(ph, blk, nblk, sm, an, p, C, S, xw_rows, ss, am, tr);
        return;
    }
#elif DEC_LONG_CACHES == 1
    const AttArgs& a = ph.a;
    int C = a.part ? min(min(a.n_split, nblk / a.n_head), (n + ATH_CHUNK_MIN - 1) / ATH_CHUNK_MIN) : 1;
    if (C >= 2) {
        int S = ((n + C - 1) / C + ATH_KEYS - 1) / ATH_KEYS * ATH_KEYS;
        att_head_units<true>(ph, blk, nblk, sm, an, p, (n + S - 1) / S, S, xw_rows, ss, am, tr);
        return;
    }
#endif
    att_head_units<false>(ph, blk, nblk, sm, an, p, 1, n, xw_rows, ss, am, tr);
}

// One token's attention: the units (KV head, split) of the active splits go
// round the blocks; a block runs (its warps) / group units side by side, each
// on its own named barrier (1..15). With ph.g.stat_out ≥ 0 each warp sums
// the statistics of the outputs it writes, for the norm after. With
// ph.att_block = 1 a block takes a q head instead (att_head), in `scratch`
// (the attention region, sized for it).
__device__ __forceinline__ void att_phase(const Phase& ph, int blk, int nblk, float* att, int* lasts, Angles* an,
                                          const int* pos, int pos0, float2* stats, float* xw_rows, float* scratch,
                                          u64* tr) {
    __shared__ float2 ast[DEC_WARPS_MAX];
    const AttArgs& a = ph.a;
    // The kernel read the token's position at its start; another positions
    // tensor is read here.
    int p = a.pos == pos ? pos0 : a.pos[0];
    if (a.r.on) angles_for(a, p, an);
    int warp = threadIdx.x >> 5;
    bool want = ph.g.stat_out >= 0;
    if (ph.att_block) {
        float ss = 0.0f, am = 0.0f;
        att_head(ph, blk, nblk, scratch, an, p, xw_rows, &ss, &am, tr);
        if (want) put_stats(stats + ph.g.stat_out * STAT_BLOCKS, blk, warp_sum(ss), warp_max(am));
        return;
    }
    if (want && (threadIdx.x & 31) == 0) ast[warp] = make_float2(0.0f, 0.0f);
    __syncwarp();
    int group = a.n_head / a.n_head_kv, per = min((int)(blockDim.x >> 5) / group, 15);
    int slot = warp / group;
    if (slot < per) {
        AttUnit u = {warp % group, (int)threadIdx.x - slot * group * 32, group * 32, 1 + slot};
        int n_active = (p + a.split) / a.split;
        int units = a.n_head_kv * n_active;
        for (int un = blk * per + slot; un < units; un += nblk * per)
            attention_unit<DEC_ATT_D>(a, un % a.n_head_kv, 0, un / a.n_head_kv, u, att + slot * group * a.head_dim,
                                      lasts + slot, false, a.r.on ? an->cs : nullptr, p, ph.g.stat_w,
                                      want ? &ast[warp] : nullptr, want ? xw_rows + ph.g.stat_out * ROW_MAX : nullptr);
    }
    if (want) {
        __syncwarp();
        float2 v = ast[warp];
        put_stats(stats + ph.g.stat_out * STAT_BLOCKS, blk, v.x, v.y);
    }
}
