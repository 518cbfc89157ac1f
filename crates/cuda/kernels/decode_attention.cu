// decode_run's attention phases: the rope angles once a kernel, the
// (KV head, split) units of attention.cu, and a block per KV head.

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

// One token's attention with f16 caches, a block per KV head, for
// `decode_run` (the phase's att_block = 1; decode.rs checks the shape fits).
// Every load that can go out at once does: q, the new k and v (rotated and
// stored here), then each warp's 32 keys' K rows (one a lane), then their V
// rows; the warps' softmax partials merge in shared memory, so there is no
// split merge through global atomics. `sm` is the phase's scratch: q heads
// [G][D] (rotated, scaled), each warp's (max, sum) [8][G] and sums
// [8][G][D] (tern_cuda::decode::att_block_floats). Lane l holds dims
// 4l..4l+3 of each head's sums.
// Groups of up to ATB_G q heads a KV head (more would spill).
#define ATB_WARPS 8
#define ATB_G 4
__device__ __forceinline__ void att_block(const Phase& ph, int blk, int nblk, float* sm, const Angles* an, int p,
                                          float2* stats, float* xw_rows, float* ss, float* am) {
    const AttArgs& a = ph.a;
    const AttRope& r = a.r;
    int G = a.n_head / a.n_head_kv, D = a.head_dim, row = D * a.n_head_kv, hp = D / 2;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float* qsh = sm;
    float* pm = qsh + G * D;
    float* pl = pm + ATB_WARPS * G;
    float* pacc = pl + ATB_WARPS * G;
    const u16* kc = (const u16*)a.kc;
    const u16* vc = (const u16*)a.vc;
    bool want = ph.g.stat_out >= 0;
    float* xw = want ? xw_rows + ph.g.stat_out * ROW_MAX : nullptr;
    for (int kvh = blk; kvh < a.n_head_kv; kvh += nblk) {
        u64 dst = (u64)p * row + (u64)kvh * D;
        // q heads and the new k by rotation pairs (q also scaled); the new k
        // and v go to the caches at position p, where the warps read them
        // after the barrier like every other key (f16, as the CPU reads them).
        for (int idx = threadIdx.x; idx < (G + 1) * hp; idx += blockDim.x) {
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
                ((u16*)a.kc)[dst + x] = f2h(r0);
                ((u16*)a.kc)[dst + y] = f2h(r1);
            }
        }
        for (int d = threadIdx.x; d < D; d += blockDim.x) ((u16*)a.vc)[dst + d] = f2h(__ldcg(r.v + (u64)kvh * D + d));
        __syncthreads();
        float m[ATB_G], l[ATB_G], acc[ATB_G][4];
#pragma unroll
        for (int g = 0; g < ATB_G; ++g) {
            m[g] = -INFINITY;
            l[g] = 0.0f;
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[g][i] = 0.0f;
        }
        for (int jb = warp * 32; jb <= p; jb += ATB_WARPS * 32) {
            int j = jb + lane, nk = min(32, p + 1 - jb);
            // Scores: lane j against every q head of the group, its K row
            // read once, in two batches of loads.
            float sc[ATB_G];
#pragma unroll
            for (int g = 0; g < ATB_G; ++g) sc[g] = 0.0f;
            if (j <= p) {
                const uint4* kr = (const uint4*)(kc + (u64)j * row + (u64)kvh * D);
                for (int c0 = 0; c0 < D / 8; c0 += 8) {
                    uint4 kv[8];
#pragma unroll
                    for (int u = 0; u < 8; ++u)
                        if (c0 + u < D / 8) kv[u] = kr[c0 + u];
#pragma unroll
                    for (int u = 0; u < 8; ++u) {
                        if (c0 + u >= D / 8) break;
                        const u32 w4[4] = {kv[u].x, kv[u].y, kv[u].z, kv[u].w};
#pragma unroll
                        for (int h = 0; h < 4; ++h) {
                            float k0 = h2f(w4[h] & 0xffff), k1 = h2f(w4[h] >> 16);
                            int d = (c0 + u) * 8 + 2 * h;
#pragma unroll
                            for (int g = 0; g < ATB_G; ++g)
                                if (g < G) sc[g] += qsh[g * D + d] * k0 + qsh[g * D + d + 1] * k1;
                        }
                    }
                }
            }
            float pj[ATB_G];
#pragma unroll
            for (int g = 0; g < ATB_G; ++g) {
                pj[g] = 0.0f;
                if (g >= G) break;
                float mx = warp_max(j <= p ? sc[g] : -INFINITY);
                float m_new = fmaxf(m[g], mx), corr = expf(m[g] - m_new);
                pj[g] = j <= p ? expf(sc[g] - m_new) : 0.0f;
                l[g] = l[g] * corr + warp_sum(pj[g]);
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[g][i] *= corr;
                m[g] = m_new;
            }
            // The keys' V rows (dims 4·lane..+3), sixteen in flight at a time.
            int d0 = 4 * lane;
            bool dl = d0 < D;
            for (int u0 = 0; u0 < nk; u0 += 16) {
                uint2 vv[16];
#pragma unroll
                for (int u = 0; u < 16; ++u) {
                    int key = jb + u0 + u;
                    vv[u] = dl && u0 + u < nk ? *(const uint2*)(vc + (u64)key * row + (u64)kvh * D + d0)
                                              : make_uint2(0, 0);
                }
#pragma unroll
                for (int u = 0; u < 16; ++u) {
                    if (u0 + u >= nk) break;
                    const float v4[4] = {h2f(vv[u].x & 0xffff), h2f(vv[u].x >> 16), h2f(vv[u].y & 0xffff),
                                         h2f(vv[u].y >> 16)};
#pragma unroll
                    for (int g = 0; g < ATB_G; ++g) {
                        if (g >= G) break;
                        float pu = __shfl_sync(0xffffffffu, pj[g], u0 + u);
#pragma unroll
                        for (int i = 0; i < 4; ++i) acc[g][i] += pu * v4[i];
                    }
                }
            }
        }
        // Each warp's partials, then one thread per output merges them.
#pragma unroll
        for (int g = 0; g < ATB_G; ++g) {
            if (g >= G) break;
            if (lane == 0) {
                pm[warp * G + g] = m[g];
                pl[warp * G + g] = l[g];
            }
            if (4 * lane < D)
#pragma unroll
                for (int i = 0; i < 4; ++i) pacc[(warp * G + g) * D + 4 * lane + i] = acc[g][i];
        }
        __syncthreads();
        for (int o = threadIdx.x; o < G * D; o += blockDim.x) {
            int g = o / D, d = o % D;
            float big = -INFINITY;
            for (int w = 0; w < ATB_WARPS; ++w) big = fmaxf(big, pm[w * G + g]);
            float den = 0.0f, num = 0.0f;
            for (int w = 0; w < ATB_WARPS; ++w) {
                float e = expf(pm[w * G + g] - big);
                den += pl[w * G + g] * e;
                num += pacc[(w * G + g) * D + d] * e;
            }
            float out = num / den;
            u64 at = (u64)(kvh * G + g) * D + d;
            a.out[at] = out;
            float ow = ph.g.stat_w ? out * __ldg(ph.g.stat_w + at) : out;
            *ss += out * out;
            *am = fmaxf(*am, fabsf(ow));
            if (xw) xw[at] = ow;
        }
        __syncthreads();
    }
}

// One token's attention: the units (KV head, split) of the active splits go
// round the blocks; a block runs (its warps) / group units side by side, each
// on its own named barrier (1..15). With ph.g.stat_out ≥ 0 each warp sums
// the statistics of the outputs it writes, for the norm after. With
// ph.att_block = 1 a block takes a KV head instead, in `scratch`
// (the attention region, sized for it).
__device__ __forceinline__ void att_phase(const Phase& ph, int blk, int nblk, float* att, int* lasts, Angles* an,
                                          const int* pos, int pos0, float2* stats, float* xw_rows, float* scratch) {
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
        att_block(ph, blk, nblk, scratch, an, p, stats, xw_rows, &ss, &am);
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
