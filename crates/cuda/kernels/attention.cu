// Attention over a layer's KV cache: store the new rows, then flash-decoding.
// Cache rows are positions: row p holds `head_dim * n_head_kv` values (f32 or
// f16). Each block takes one (KV head, token, key split); its warps are the
// query heads that share the KV head, so K and V rows are read once per group.
// Splits write partial (max, sum, acc) rows; the last split to finish for a
// (token, KV head) merges them, so one launch does the whole op. Positions
// come from device memory, which keeps the launch identical from step to
// step (CUDA graphs replay it).

// Accumulators per lane: head_dim ≤ 32 · ATT_MAXD. (attention_unit takes
// it as its parameter D, and holds D / 2 rope pairs per lane.)
#define ATT_MAXD 8

__device__ __forceinline__ float ld_cache(const u8* c, u64 i, int type) {
    return type == T_F16 ? h2f(((const u16*)c)[i]) : ((const float*)c)[i];
}

// The dim that accumulator i of a lane holds: lane + 32i, or with f16 V
// read 4 dims at a time, 4·(lane + 32·(i/4)) + i%4.
__device__ __forceinline__ int att_dim(int i, int lane, bool vvec) {
    return vvec ? 4 * (lane + 32 * (i >> 2)) + (i & 3) : lane + 32 * i;
}

// Element i of a cache, f32 or f16.
__device__ __forceinline__ void st_cache(u8* c, u64 i, int type, float v) {
    if (type == T_F16) ((u16*)c)[i] = f2h(v); else ((float*)c)[i] = v;
}

// grid: n_tok, block: 256. k, v: [row, n_tok] f32.
extern "C" __global__ void kv_store(const float* k, const float* v, u8* kc, u8* vc, const int* pos, int row,
                                    int k_type, int v_type) {
    pdl_wait();
    pdl_launch();
    int t = blockIdx.x;
    u64 dst = (u64)pos[t] * row;
    for (int e = threadIdx.x; e < row; e += blockDim.x) {
        st_cache(kc, dst + e, k_type, k[(u64)t * row + e]);
        st_cache(vc, dst + e, v_type, v[(u64)t * row + e]);
    }
}

// The rotary embedding of q and k fused with the cache store: rotated q goes
// to q_out, rotated k and v to the caches at their positions. grid: n_tok,
// block: 256. mode and factors as in `rope`.
extern "C" __global__ void rope_store(const float* q, float* q_out, const float* k, const float* v, u8* kc, u8* vc,
                                      const int* pos, const float* factors, int head_dim, int n_head, int n_head_kv,
                                      int n_rot, int mode, float base, float fscale, int k_type, int v_type) {
    // Angles depend on the position and the pair only: computed once per token.
    __shared__ float cs[128], sn[128];
    pdl_wait();
    pdl_launch();
    int t = blockIdx.x, p = pos[t], half = n_rot / 2, hp = head_dim / 2;
    int row = head_dim * n_head_kv;
    u64 dst = (u64)p * row;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        double c, s;
        rope_angle(p, i, n_rot, base, fscale, factors, &c, &s);
        cs[i] = (float)c;
        sn[i] = (float)s;
    }
    __syncthreads();
    // Pairs of q heads then k heads; pairs past n_rot/2 copy two dimensions.
    int n_pairs = (n_head + n_head_kv) * hp;
    for (int idx = threadIdx.x; idx < n_pairs; idx += blockDim.x) {
        int head = idx / hp, i = idx % hp;
        bool is_q = head < n_head;
        const float* xh = is_q ? q + ((u64)t * n_head + head) * head_dim : k + (u64)t * row + (head - n_head) * head_dim;
        int a, b;
        float ya, yb;
        if (rope_pair(i, n_rot, mode, &a, &b)) {
            float x0 = xh[a], x1 = xh[b];
            ya = x0 * cs[i] - x1 * sn[i];
            yb = x0 * sn[i] + x1 * cs[i];
        } else {
            ya = xh[a];
            yb = xh[b];
        }
        if (is_q) {
            float* oh = q_out + ((u64)t * n_head + head) * head_dim;
            oh[a] = ya;
            oh[b] = yb;
        } else {
            u64 o = dst + (head - n_head) * head_dim;
            st_cache(kc, o + a, k_type, ya);
            st_cache(kc, o + b, k_type, yb);
        }
    }
    for (int e = threadIdx.x; e < row; e += blockDim.x) {
        st_cache(vc, dst + e, v_type, v[(u64)t * row + e]);
    }
}

// grid: (n_head_kv, n_tok, n_split), block: 32 * (n_head / n_head_kv), dynamic
// shared memory: the block's q heads (n_head / n_head_kv * head_dim floats).
// q, out: [head_dim * n_head, n_tok]. part: [n_tok, n_head, n_split, head_dim + 2].
// counters: [n_tok, n_head_kv], zero between launches.
//
// Keys go 32 at a time: lane j scores key j against the whole q (its K row
// read with 16-byte loads), the warp merges the 32 scores into the running
// softmax, then every lane accumulates P·V for its dims d = lane + 32i over
// the 32 keys. All loads of a step are independent, so they overlap.
//
// With `r.on` (one token) the attention also does rope_store's work: q
// arrives unrotated and is rotated as it is staged, and the split that holds
// the token's own position rotates the new k row and stores it and the v row
// in the caches before any of its warps reads them. That split is the only
// reader of that position, so no other block waits for the store.
struct AttRope {
    const float* k;
    const float* v;
    const float* factors;
    int n_rot;
    int mode;
    float base;
    float fscale;
    int on;
    int pad;
};
static_assert(sizeof(AttRope) == 48, "AttRope layout (tern_cuda::launch::AttRope)");

// Everything one attention op reads, as `attention`'s arguments.
struct AttArgs {
    const float* q;
    u8* kc;
    u8* vc;
    const int* pos;
    float* out;
    float* part;
    int* counters;
    int n_head;
    int n_head_kv;
    int head_dim;
    float scale;
    int split;
    int n_split;
    int k_type;
    int v_type;
    AttRope r;
};
static_assert(sizeof(AttArgs) == 136, "AttArgs layout (tern_cuda::args::AttentionArgs)");

// The threads that take one (KV head, token, split): `nthreads` = 32 ·
// group of them, `tid` this thread's index among them and `warp` its query
// head within the group; named barrier `bar` syncs just them, so that a
// persistent block can run several units side by side.
struct AttUnit {
    int warp;
    int tid;
    int nthreads;
    int bar;
};

__device__ __forceinline__ void unit_sync(const AttUnit& u) {
    asm volatile("bar.sync %0, %1;" ::"r"(u.bar), "r"(u.nthreads) : "memory");
}

// One unit's work. `qs_all` holds the group's q heads (group · head_dim
// floats), `last` one shared int. With `pdl` the unit waits for the previous
// kernel once the work that does not depend on it is issued. `angles`
// (optional) holds each rotated pair's (cos, sin) at this token's position,
// computed once for every layer. `known_pos` ≥ 0 is pos[0] already read
// (one token), saving the unit that load. `st` (optional): the warp's running
// (Σ o², max |o · sw|) of the outputs o it writes (sw null: |o|), for a
// norm that follows (decode.cu), which also reads o · sw from `xw` (the
// output row's layout).
__device__ __forceinline__ void att_stats(float2* st, float ss, float am) {
    ss = warp_sum(ss);
    am = warp_max(am);
    if ((threadIdx.x & 31) == 0) *st = make_float2(st->x + ss, fmaxf(st->y, am));
}

template <int D>
__device__ __forceinline__ void attention_unit(const AttArgs& A, int kvh, int t, int s, const AttUnit& U,
                                               float* qs_all, int* last, bool pdl, const float2* angles, int known_pos,
                                               const float* sw, float2* st, float* xw) {
    // References, not copies: in the persistent kernel A sits in shared
    // memory, and fields reloaded from there cost less than the registers
    // copies would hold across the whole unit.
    const float* const& q = A.q;
    u8* const& kc = A.kc;
    u8* const& vc = A.vc;
    float* const& out = A.out;
    float* const& part = A.part;
    const int &n_head = A.n_head, &n_head_kv = A.n_head_kv, &head_dim = A.head_dim;
    const int &split = A.split, &n_split = A.n_split, &k_type = A.k_type, &v_type = A.v_type;
    const float& scale = A.scale;
    const AttRope& r = A.r;
    // Before pdl_wait, what does not depend on the previous kernel: the
    // positions (inputs), the rope angles (double pow and sincos, long
    // latency), and the cache rows of earlier positions, fetched into L1.
    int warp = U.warp, lane = U.tid & 31;
    int h = kvh * (n_head / n_head_kv) + warp;
    int p = known_pos >= 0 ? known_pos : A.pos[t];
    int n_kv = p + 1, n_active = (n_kv + split - 1) / split;
    int row = head_dim * n_head_kv;
    float rcs[(D / 2)], rsn[(D / 2)];
    // The norm weight of the dims this lane writes when there is one split.
    bool vvec = v_type == T_F16 && (head_dim & 3) == 0;
    float swr[D];
#pragma unroll
    for (int i = 0; i < D; ++i) {
        int dd = att_dim(i, lane, vvec);
        swr[i] = st && sw && dd < head_dim ? sw[(u64)h * head_dim + dd] : 1.0f;
    }
    if (s < n_active) {
        if (r.on) {
#pragma unroll
            for (int m = 0; m < (D / 2); ++m) {
                int i = lane + 32 * m, a, b;
                rcs[m] = 1.0f;
                rsn[m] = 0.0f;
                if (i < head_dim / 2 && rope_pair(i, r.n_rot, r.mode, &a, &b)) {
                    if (angles) {
                        rcs[m] = angles[i].x;
                        rsn[m] = angles[i].y;
                    } else {
                        double c, sd;
                        rope_angle(p, i, r.n_rot, r.base, r.fscale, r.factors, &c, &sd);
                        rcs[m] = (float)c;
                        rsn[m] = (float)sd;
                    }
                }
            }
        }
        // Only rows written by earlier steps: this batch's own positions
        // (from pos[0] on) may be written by the kernel before this one.
        int jp = min(min(p, known_pos >= 0 ? known_pos : A.pos[0]), s * split + split);
        for (int j = s * split + U.tid; j < jp; j += U.nthreads) {
            u64 e = (u64)j * row + (u64)kvh * head_dim;
            prefetch_l1(kc + e * (k_type == T_F16 ? 2 : 4), head_dim * (k_type == T_F16 ? 2 : 4));
            prefetch_l1(vc + e * (v_type == T_F16 ? 2 : 4), head_dim * (v_type == T_F16 ? 2 : 4));
        }
    }
    if (pdl) {
        pdl_wait();
        pdl_launch();
    }
    if (s >= n_active) return;
    float* qs = qs_all + warp * head_dim;
    const float* qh = q + ((u64)t * n_head + h) * head_dim;
    if (r.on) {
        // Pairs as in rope_store: (2i, 2i+1) or NeoX (i, i + n_rot/2); those
        // past n_rot/2 are copied. Warp 0 of the last split also rotates k.
        bool store = s == n_active - 1 && warp == 0;
        const float* kh = r.k + (u64)t * row + (u64)kvh * head_dim;
        u64 dst = (u64)p * row + (u64)kvh * head_dim;
#pragma unroll
        for (int m = 0; m < (D / 2); ++m) {
            int i = lane + 32 * m, a, b;
            if (i >= head_dim / 2) break;
            rope_pair(i, r.n_rot, r.mode, &a, &b);
            float cs = rcs[m], sn = rsn[m];
            // Pairs past n_rot/2 pass through: cos 1, sin 0 gives x0·1 − x1·0
            // and x0·0 + x1·1, the same floats.
            // From L2: in the persistent kernel other blocks wrote these rows
            // since this SM may last have cached them.
            float x0 = __ldcg(qh + a), x1 = __ldcg(qh + b);
            qs[a] = (x0 * cs - x1 * sn) * scale;
            qs[b] = (x0 * sn + x1 * cs) * scale;
            if (store) {
                float k0 = __ldcg(kh + a), k1 = __ldcg(kh + b);
                st_cache(kc, dst + a, k_type, k0 * cs - k1 * sn);
                st_cache(kc, dst + b, k_type, k0 * sn + k1 * cs);
            }
        }
        if (store) {
            const float* vh = r.v + (u64)t * row + (u64)kvh * head_dim;
            for (int dd = lane; dd < head_dim; dd += 32) st_cache(vc, dst + dd, v_type, __ldcg(vh + dd));
        }
        unit_sync(U);
    } else {
        for (int dd = lane; dd < head_dim; dd += 32) qs[dd] = __ldcg(qh + dd) * scale;
    }
    __syncwarp();
    float acc[D];
#pragma unroll
    for (int i = 0; i < D; ++i) acc[i] = 0.0f;
    float mx = -INFINITY, l = 0.0f;
    int j0 = s * split, j1 = min(n_kv, j0 + split);
    u64 off = (u64)kvh * head_dim;
    bool vec = k_type == T_F16 ? (head_dim & 7) == 0 : (head_dim & 3) == 0;
    for (int jb = j0; jb < j1; jb += 32) {
        int j = jb + lane;
        float sc = -INFINITY;
        if (j < j1) {
            float p = 0.0f;
            if (k_type == T_F16 && vec) {
                const uint4* kr = (const uint4*)((const u16*)kc + (u64)j * row + off);
#pragma unroll 16
                for (int c = 0; c < head_dim / 8; ++c) {
                    uint4 kv = kr[c];
                    const float* qq = qs + c * 8;
                    p += qq[0] * h2f(kv.x & 0xffff) + qq[1] * h2f(kv.x >> 16) + qq[2] * h2f(kv.y & 0xffff) +
                         qq[3] * h2f(kv.y >> 16) + qq[4] * h2f(kv.z & 0xffff) + qq[5] * h2f(kv.z >> 16) +
                         qq[6] * h2f(kv.w & 0xffff) + qq[7] * h2f(kv.w >> 16);
                }
            } else if (vec) {
                const float4* kr = (const float4*)((const float*)kc + (u64)j * row + off);
#pragma unroll 16
                for (int c = 0; c < head_dim / 4; ++c) {
                    float4 kv = kr[c];
                    const float* qq = qs + c * 4;
                    p += qq[0] * kv.x + qq[1] * kv.y + qq[2] * kv.z + qq[3] * kv.w;
                }
            } else {
                for (int dd = 0; dd < head_dim; ++dd) p += qs[dd] * ld_cache(kc, (u64)j * row + off + dd, k_type);
            }
            sc = p;
        }
        float m_new = fmaxf(mx, warp_max(sc));
        float corr = expf(mx - m_new);
        float pj = j < j1 ? expf(sc - m_new) : 0.0f;
        l = l * corr + warp_sum(pj);
#pragma unroll
        for (int i = 0; i < D; ++i) acc[i] *= corr;
        int nk = min(32, j1 - jb);
        if (vvec) {
            // f16 V: lane holds dims 4·(lane + 32g) .. +3 (att_dim); sixteen
            // keys' 8-byte loads in flight per step. Keys past the end have
            // weight 0 and read row jb (always valid).
            for (int u0 = 0; u0 < nk; u0 += 16) {
                float pu[16];
#pragma unroll
                for (int u = 0; u < 16; ++u) {
                    pu[u] = __shfl_sync(0xffffffffu, pj, (u0 + u) & 31);
                    if (u0 + u >= nk) pu[u] = 0.0f;
                }
#pragma unroll
                for (int g = 0; g < D / 4; ++g) {
                    int d0 = 4 * (lane + 32 * g);
                    if (d0 >= head_dim) continue;
                    uint2 vv[16];
#pragma unroll
                    for (int u = 0; u < 16; ++u) {
                        int key = u0 + u < nk ? jb + u0 + u : jb;
                        vv[u] = *(const uint2*)((const u16*)vc + (u64)key * row + off + d0);
                    }
#pragma unroll
                    for (int u = 0; u < 16; ++u) {
                        acc[4 * g + 0] += pu[u] * h2f(vv[u].x & 0xffff);
                        acc[4 * g + 1] += pu[u] * h2f(vv[u].x >> 16);
                        acc[4 * g + 2] += pu[u] * h2f(vv[u].y & 0xffff);
                        acc[4 * g + 3] += pu[u] * h2f(vv[u].y >> 16);
                    }
                }
            }
            mx = m_new;
            continue;
        }
        // Eight keys per step, their V loads issued together; keys past the
        // end have weight 0 and read row jb (always valid).
        for (int u0 = 0; u0 < nk; u0 += 8) {
            float pu[8];
            u64 vr[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                pu[u] = __shfl_sync(0xffffffffu, pj, u0 + u);
                vr[u] = (u64)(u0 + u < nk ? jb + u0 + u : jb) * row + off;
            }
#pragma unroll
            for (int i = 0; i < D; ++i) {
                int dd = lane + 32 * i;
                if (dd >= head_dim) continue;
                float vv[8];
#pragma unroll
                for (int u = 0; u < 8; ++u) vv[u] = ld_cache(vc, vr[u] + dd, v_type);
#pragma unroll
                for (int u = 0; u < 8; ++u) acc[i] += pu[u] * vv[u];
            }
        }
        mx = m_new;
    }
    float* oh = out + ((u64)t * n_head + h) * head_dim;
    if (n_active == 1) {
        float ss = 0.0f, am = 0.0f;
#pragma unroll
        for (int i = 0; i < D; ++i) {
            int dd = att_dim(i, lane, vvec);
            if (dd >= head_dim) continue;
            float o = acc[i] / l;
            oh[dd] = o;
            ss += o * o;
            am = fmaxf(am, fabsf(o * swr[i]));
            if (xw) xw[(u64)h * head_dim + dd] = o * swr[i];
        }
        if (st) att_stats(st, ss, am);
        return;
    }
    float* pp = part + (((u64)t * n_head + h) * n_split + s) * (head_dim + 2);
#pragma unroll
    for (int i = 0; i < D; ++i) {
        int dd = att_dim(i, lane, vvec);
        if (dd < head_dim) pp[2 + dd] = acc[i];
    }
    if (lane == 0) {
        pp[0] = mx;
        pp[1] = l;
    }
    __threadfence();
    unit_sync(U);
    if (U.tid == 0) {
        int* ctr = A.counters + (u64)t * n_head_kv + kvh;
        *last = atomicAdd(ctr, 1) == n_active - 1;
        if (*last) *ctr = 0;
    }
    unit_sync(U);
    if (!*last) return;
    __threadfence();
    // The merge: the splits' (max, sum) a lane each, then every lane's dims
    // over the splits, four splits' loads in flight at a time.
    const float* ph = part + ((u64)t * n_head + h) * n_split * (head_dim + 2);
    float big = -INFINITY;
    for (int i = lane; i < n_active; i += 32) big = fmaxf(big, __ldcg(ph + i * (head_dim + 2)));
    big = warp_max(big);
    float sum = 0.0f;
    for (int i = lane; i < n_active; i += 32) {
        const float* pi = ph + i * (head_dim + 2);
        sum += __ldcg(pi + 1) * expf(__ldcg(pi) - big);
    }
    sum = warp_sum(sum);
    float a[D];
#pragma unroll
    for (int i = 0; i < D; ++i) a[i] = 0.0f;
    for (int i0 = 0; i0 < n_active; i0 += 4) {
        float wv[4], vals[4][D];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const float* pi = ph + min(i0 + u, n_active - 1) * (head_dim + 2);
            wv[u] = i0 + u < n_active ? expf(__ldcg(pi) - big) : 0.0f;
#pragma unroll
            for (int i = 0; i < D; ++i) {
                int dd = lane + 32 * i;
                vals[u][i] = dd < head_dim ? __ldcg(pi + 2 + dd) : 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < 4; ++u)
#pragma unroll
            for (int i = 0; i < D; ++i) a[i] += vals[u][i] * wv[u];
    }
    float ss = 0.0f, am = 0.0f;
#pragma unroll
    for (int i = 0; i < D; ++i) {
        int dd = lane + 32 * i;
        if (dd >= head_dim) continue;
        float o = a[i] / sum;
        oh[dd] = o;
        ss += o * o;
        float ow = sw && st ? o * sw[(u64)h * head_dim + dd] : o;
        am = fmaxf(am, fabsf(ow));
        if (xw) xw[(u64)h * head_dim + dd] = ow;
    }
    if (st) att_stats(st, ss, am);
}

// grid: (n_head_kv, n_tok, n_split), block: 32 * (n_head / n_head_kv) (see above).
extern "C" __global__ void attention(const float* q, u8* kc, u8* vc, const int* pos, float* out, float* part,
                                     int* counters, int n_head, int n_head_kv, int head_dim, float scale, int split,
                                     int n_split, int k_type, int v_type, AttRope r) {
    extern __shared__ float qs_all[];
    __shared__ int last;
    AttArgs a = {q, kc, vc, pos, out, part, counters, n_head, n_head_kv, head_dim, scale, split, n_split, k_type, v_type, r};
    AttUnit u = {(int)threadIdx.x >> 5, (int)threadIdx.x, (int)blockDim.x, 1};
    attention_unit<ATT_MAXD>(a, blockIdx.x, blockIdx.y, blockIdx.z, u, qs_all, &last, true, nullptr, -1, nullptr,
                             nullptr, nullptr);
}
