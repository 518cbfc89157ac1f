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
static_assert(sizeof(AttArgs) == 136, "AttArgs layout (tern_cuda::decode::AttArgs)");

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

// Prompt attention on tensor cores (FlashAttention-2 style) for f16 caches:
// block = (KV head, 16 query tokens), one warp per query head of the group,
// times S sets of warps: set s takes key tiles s, s + S, ... of the block's
// range and the sets merge their (max, sum, output) rows at the end. A block
// is the causal mask's unit of work, and the last query tiles have the most
// keys: the split halves the longest block's chain of tiles, which is what
// the launch waits for once the short blocks are gone.
// Per tile of FA_BK keys: S = Q·Kᵀ with m16n8k16 f16 MMAs (f32 accumulate), the
// causal mask and online softmax on the S fragments, which are repacked in
// registers as the A operand of O += P·V. K and V tiles are staged row-major
// as they are in the cache (16-byte copies), padded so the fragment loads hit
// distinct banks; K's fragments come by `ldmatrix`, V's transposed by
// `ldmatrix.trans`. Scores are kept in log2 units (q carries scale · log2 e),
// so the softmax is exp2.
// grid: (n_head_kv, ceil(n_tok / 16)), block: 32 · G · S (G ≤ 8, G · S ≤ 8;
// S is 1 for flash_attn, 2 for flash_attn_split); head_dim a multiple of
// 16, at most 128;
// positions ascend within the batch. Blocks start in order of blockIdx.y,
// which takes the last query tiles first: with a causal mask they have the
// most keys, and starting them last left a tail of long blocks on a few SMs.
#define FA_BQ 16
// Keys a tile (tern_cuda::lower::FA_KEYS).
#define FA_BK 32
#define FA_MAXD 128

__device__ __forceinline__ u32 pack_h2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ void mma_f16(float* c, const u32* a, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The m16n8k16 B fragment of rows k0..k0+15 (keys) of a row-major tile at
// column n0 (8 dims): b0 holds keys 2·tig, 2·tig+1 of dim g, b1 the same 8
// keys on. Threads 0..15 give the addresses of the 16 rows.
__device__ __forceinline__ void ldsm_x2_trans(u32& b0, u32& b1, const u16* row) {
    u32 a = (u32)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];" : "=r"(b0), "=r"(b1) : "r"(a));
}

// The m16n8k16 B fragments of keys k0..k0+7 (rows of a row-major K tile) for
// two k-steps: b[0], b[1] for dims d0..d0+15, b[2], b[3] for d0+16..d0+31.
// Thread t gives the address of key k0 + t % 8 at dim d0 + 8 · (t / 8);
// thread (g, tig) gets key g's dims 2·tig, 2·tig+1 of each 8-dim block.
__device__ __forceinline__ void ldsm_x4(u32* b, const u16* row) {
    u32 a = (u32)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                 : "r"(a));
}

// A 16-byte copy from global to shared memory that does not wait for its
// data (sm_80+); `bytes` 0 fills the destination with zeros.
__device__ __forceinline__ void cp_async16(u16* dst, const u16* src, int bytes) {
    u32 d = (u32)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(bytes));
}

// The kernel for SETS sets of warps (flash_attn: 1, flash_attn_split: 2);
// with one set the merge and the guards for rows with no key compile away.
template <int SETS>
__device__ __forceinline__ void flash_attn_sets(const float* q, const u16* kc, const u16* vc, const int* pos,
                                                float* out, int n_tok, int n_head, int n_head_kv, int head_dim,
                                                float scale) {
    extern __shared__ __align__(16) u16 sm[];
    // Two buffers of a round's K and V tiles: the next round's copies are in
    // flight while the current one is multiplied.
    const int group = n_head / n_head_kv, n_sets = SETS;
    const int KS = head_dim + 8, TILE = n_sets * FA_BK * KS;
    pdl_wait();
    pdl_launch();
    int kvh = blockIdx.x, t0 = (gridDim.y - 1 - blockIdx.y) * FA_BQ;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    int set = warp / group, h = kvh * group + warp % group;
    int row = head_dim * n_head_kv;
    u64 off = (u64)kvh * head_dim;
    int nks = head_dim / 16, nnt = head_dim / 8;
    int ta = t0 + g, tb = t0 + g + 8;
    int pa = ta < n_tok ? pos[ta] : 0, pb = tb < n_tok ? pos[tb] : 0;
    int pmax = pos[min(t0 + FA_BQ, n_tok) - 1];

    // log2 e: exp(x) = exp2(x · log2 e), and exp2f is the hardware's ex2.
    const float qs = scale * 1.4426950408889634f;
    u32 qf[FA_MAXD / 16][4];
    const float* qa = q + ((u64)ta * n_head + h) * head_dim;
    const float* qb = q + ((u64)tb * n_head + h) * head_dim;
#pragma unroll
    for (int k = 0; k < FA_MAXD / 16; ++k) {
        if (k >= nks) break;
        int c = k * 16 + tig * 2;
        bool va = ta < n_tok, vb = tb < n_tok;
        qf[k][0] = va ? pack_h2(qa[c] * qs, qa[c + 1] * qs) : 0u;
        qf[k][1] = vb ? pack_h2(qb[c] * qs, qb[c + 1] * qs) : 0u;
        qf[k][2] = va ? pack_h2(qa[c + 8] * qs, qa[c + 9] * qs) : 0u;
        qf[k][3] = vb ? pack_h2(qb[c + 8] * qs, qb[c + 9] * qs) : 0u;
    }
    float o[FA_MAXD / 8][4];
#pragma unroll
    for (int n = 0; n < FA_MAXD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float ma = -INFINITY, mb = -INFINITY, la = 0.0f, lb = 0.0f;

    // Keys past pmax are zero-filled; their scores are masked below.
    auto load_tile = [&](int kb, u16* ks, u16* vs) {
        int per_row = head_dim / 8;
        for (int idx = threadIdx.x; idx < n_sets * FA_BK * per_row; idx += blockDim.x) {
            int key = idx / per_row, c = idx % per_row;
            bool in = kb + key <= pmax;
            u64 at = (u64)(in ? kb + key : 0) * row + off + c * 8;
            cp_async16(ks + key * KS + c * 8, kc + at, in ? 16 : 0);
            cp_async16(vs + key * KS + c * 8, vc + at, in ? 16 : 0);
        }
        asm volatile("cp.async.commit_group;");
    };
    const int step = n_sets * FA_BK;
    load_tile(0, sm, sm + TILE);
    for (int kt = 0; kt <= pmax; kt += step) {
        int cur = (kt / step) & 1;
        // The other buffer was last read in the previous round, which every
        // warp finished before that round's closing barrier.
        if (kt + step <= pmax) {
            load_tile(kt + step, sm + (cur ^ 1) * 2 * TILE, sm + (cur ^ 1) * 2 * TILE + TILE);
            asm volatile("cp.async.wait_group 1;" ::: "memory");
        } else {
            asm volatile("cp.async.wait_group 0;" ::: "memory");
        }
        __syncthreads();
        // This warp's set's tile of the round; a tile wholly past pmax is
        // zeros that every row masks.
        int kb = kt + set * FA_BK;
        if (kb > pmax) {
            __syncthreads();
            continue;
        }
        const u16* ks = sm + cur * 2 * TILE + set * FA_BK * KS;
        const u16* vs = ks + TILE;
        float s[FA_BK / 8][4];
#pragma unroll
        for (int j = 0; j < FA_BK / 8; ++j) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
            for (int k = 0; k < FA_MAXD / 16; k += 2) {
                if (k >= nks) break;
                // With an odd nks the last load also reads 16 dims past the
                // row (into the next row, or the V tile after the last): inside
                // the allocation, and unused.
                u32 b[4];
                ldsm_x4(b, ks + (j * 8 + (lane & 7)) * KS + k * 16 + (lane >> 3) * 8);
                mma_f16(s[j], qf[k], b[0], b[1]);
                if (k + 1 < nks) mma_f16(s[j], qf[k + 1], b[2], b[3]);
            }
        }
        float mxa = -INFINITY, mxb = -INFINITY;
#pragma unroll
        for (int j = 0; j < FA_BK / 8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                int key = kb + j * 8 + tig * 2 + e;
                if (key > pa) s[j][e] = -INFINITY;
                if (key > pb) s[j][2 + e] = -INFINITY;
                mxa = fmaxf(mxa, s[j][e]);
                mxb = fmaxf(mxb, s[j][2 + e]);
            }
#pragma unroll
        for (int o2 = 1; o2 <= 2; o2 <<= 1) {
            mxa = fmaxf(mxa, __shfl_xor_sync(0xffffffffu, mxa, o2));
            mxb = fmaxf(mxb, __shfl_xor_sync(0xffffffffu, mxb, o2));
        }
        // A row may have no key yet in a later set's tiles (all masked): its
        // maximum stays −inf, and the exponents then take 0 in its place.
        float na = fmaxf(ma, mxa), nb = fmaxf(mb, mxb);
        float ua = SETS > 1 && na == -INFINITY ? 0.0f : na, ub = SETS > 1 && nb == -INFINITY ? 0.0f : nb;
        float ca = exp2f(ma - ua), cb = exp2f(mb - ub);
        float sa = 0.0f, sb = 0.0f;
        u32 pf[FA_BK / 16][4];
#pragma unroll
        for (int j = 0; j < FA_BK / 8; ++j) {
            float e0 = exp2f(s[j][0] - ua), e1 = exp2f(s[j][1] - ua);
            float e2 = exp2f(s[j][2] - ub), e3 = exp2f(s[j][3] - ub);
            sa += e0 + e1;
            sb += e2 + e3;
            int hi = j & 1;
            pf[j >> 1][hi ? 2 : 0] = pack_h2(e0, e1);
            pf[j >> 1][hi ? 3 : 1] = pack_h2(e2, e3);
        }
#pragma unroll
        for (int o2 = 1; o2 <= 2; o2 <<= 1) {
            sa += __shfl_xor_sync(0xffffffffu, sa, o2);
            sb += __shfl_xor_sync(0xffffffffu, sb, o2);
        }
        la = la * ca + sa;
        lb = lb * cb + sb;
        ma = na;
        mb = nb;
#pragma unroll
        for (int n = 0; n < FA_MAXD / 8; ++n) {
            if (n >= nnt) break;
            o[n][0] *= ca;
            o[n][1] *= ca;
            o[n][2] *= cb;
            o[n][3] *= cb;
        }
#pragma unroll
        for (int sl = 0; sl < FA_BK / 16; ++sl)
#pragma unroll
            for (int n = 0; n < FA_MAXD / 8; ++n) {
                if (n >= nnt) break;
                u32 b0, b1;
                ldsm_x2_trans(b0, b1, vs + (sl * 16 + (lane & 15)) * KS + n * 8);
                mma_f16(o[n], pf[sl], b0, b1);
            }
        __syncthreads();
    }
    // Sets 1.. leave their rows in shared memory (the tiles are free now:
    // every warp passed the last round's barrier); set 0 rescales all of
    // them to the common maximum and adds. Set 0 always has key 0, which
    // every row sees, so its maxima are finite.
    if (SETS > 1) {
        const int W = nnt * 4 + 4;
        float* mg = (float*)sm;
        if (set > 0) {
            float* p = mg + (u64)((set - 1) * group + warp % group) * W * 32 + lane;
#pragma unroll
            for (int n = 0; n < FA_MAXD / 8; ++n) {
                if (n >= nnt) break;
#pragma unroll
                for (int e = 0; e < 4; ++e) p[(n * 4 + e) * 32] = o[n][e];
            }
            p[(W - 4) * 32] = ma;
            p[(W - 3) * 32] = mb;
            p[(W - 2) * 32] = la;
            p[(W - 1) * 32] = lb;
        }
        __syncthreads();
        if (set > 0) return;
        float Ma = ma, Mb = mb;
        for (int s2 = 1; s2 < n_sets; ++s2) {
            const float* p = mg + (u64)((s2 - 1) * group + warp) * W * 32 + lane;
            Ma = fmaxf(Ma, p[(W - 4) * 32]);
            Mb = fmaxf(Mb, p[(W - 3) * 32]);
        }
        float fa = exp2f(ma - Ma), fb = exp2f(mb - Mb);
        la *= fa;
        lb *= fb;
#pragma unroll
        for (int n = 0; n < FA_MAXD / 8; ++n) {
            if (n >= nnt) break;
            o[n][0] *= fa;
            o[n][1] *= fa;
            o[n][2] *= fb;
            o[n][3] *= fb;
        }
        for (int s2 = 1; s2 < n_sets; ++s2) {
            const float* p = mg + (u64)((s2 - 1) * group + warp) * W * 32 + lane;
            float xa = exp2f(p[(W - 4) * 32] - Ma), xb = exp2f(p[(W - 3) * 32] - Mb);
            la += p[(W - 2) * 32] * xa;
            lb += p[(W - 1) * 32] * xb;
#pragma unroll
            for (int n = 0; n < FA_MAXD / 8; ++n) {
                if (n >= nnt) break;
                o[n][0] += p[(n * 4) * 32] * xa;
                o[n][1] += p[(n * 4 + 1) * 32] * xa;
                o[n][2] += p[(n * 4 + 2) * 32] * xb;
                o[n][3] += p[(n * 4 + 3) * 32] * xb;
            }
        }
    }
    float ia = 1.0f / la, ib = 1.0f / lb;
    float* oa = out + ((u64)ta * n_head + h) * head_dim;
    float* ob = out + ((u64)tb * n_head + h) * head_dim;
#pragma unroll
    for (int n = 0; n < FA_MAXD / 8; ++n) {
        if (n >= nnt) break;
        int c = n * 8 + tig * 2;
        if (ta < n_tok) {
            oa[c] = o[n][0] * ia;
            oa[c + 1] = o[n][1] * ia;
        }
        if (tb < n_tok) {
            ob[c] = o[n][2] * ib;
            ob[c + 1] = o[n][3] * ib;
        }
    }
}

extern "C" __global__ void __launch_bounds__(256) flash_attn(const float* q, const u16* kc, const u16* vc,
                                                            const int* pos, float* out, int n_tok, int n_head,
                                                            int n_head_kv, int head_dim, float scale) {
    flash_attn_sets<1>(q, kc, vc, pos, out, n_tok, n_head, n_head_kv, head_dim, scale);
}

extern "C" __global__ void __launch_bounds__(256) flash_attn_split(const float* q, const u16* kc, const u16* vc,
                                                                  const int* pos, float* out, int n_tok, int n_head,
                                                                  int n_head_kv, int head_dim, float scale) {
    flash_attn_sets<2>(q, kc, vc, pos, out, n_tok, n_head, n_head_kv, head_dim, scale);
}
