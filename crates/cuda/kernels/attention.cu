// Attention over a layer's KV cache: store the new rows, then flash-decoding.
// Cache rows are positions: row p holds `head_dim * n_head_kv` values (f32 or
// f16). Each block takes one (KV head, token, key split); its warps are the
// query heads that share the KV head, so K and V rows are read once per group.
// Splits write partial (max, sum, acc) rows; the last split to finish for a
// (token, KV head) merges them, so one launch does the whole op. Positions
// come from device memory, which keeps the launch identical from step to
// step (CUDA graphs replay it).

#define ATT_MAXD 8

__device__ __forceinline__ float ld_cache(const u8* c, u64 i, int type) {
    return type == T_F16 ? h2f(((const u16*)c)[i]) : ((const float*)c)[i];
}

// grid: n_tok, block: 256. k, v: [row, n_tok] f32.
extern "C" __global__ void kv_store(const float* k, const float* v, u8* kc, u8* vc, const int* pos, int row,
                                    int k_type, int v_type) {
    pdl_wait();
    pdl_launch();
    int t = blockIdx.x;
    u64 dst = (u64)pos[t] * row;
    for (int e = threadIdx.x; e < row; e += blockDim.x) {
        float kv = k[(u64)t * row + e], vv = v[(u64)t * row + e];
        if (k_type == T_F16) ((u16*)kc)[dst + e] = f2h(kv); else ((float*)kc)[dst + e] = kv;
        if (v_type == T_F16) ((u16*)vc)[dst + e] = f2h(vv); else ((float*)vc)[dst + e] = vv;
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
        if (i >= half) {
            a = n_rot + 2 * (i - half);
            b = a + 1;
            ya = xh[a];
            yb = xh[b];
        } else {
            a = mode == 0 ? 2 * i : i;
            b = mode == 0 ? 2 * i + 1 : i + half;
            float x0 = xh[a], x1 = xh[b];
            ya = x0 * cs[i] - x1 * sn[i];
            yb = x0 * sn[i] + x1 * cs[i];
        }
        if (is_q) {
            float* oh = q_out + ((u64)t * n_head + head) * head_dim;
            oh[a] = ya;
            oh[b] = yb;
        } else {
            u64 o = dst + (head - n_head) * head_dim;
            if (k_type == T_F16) {
                ((u16*)kc)[o + a] = f2h(ya);
                ((u16*)kc)[o + b] = f2h(yb);
            } else {
                ((float*)kc)[o + a] = ya;
                ((float*)kc)[o + b] = yb;
            }
        }
    }
    for (int e = threadIdx.x; e < row; e += blockDim.x) {
        float vv = v[(u64)t * row + e];
        if (v_type == T_F16) ((u16*)vc)[dst + e] = f2h(vv); else ((float*)vc)[dst + e] = vv;
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
extern "C" __global__ void attention(const float* q, const u8* kc, const u8* vc, const int* pos, float* out,
                                     float* part, int* counters, int n_head, int n_head_kv, int head_dim, float scale,
                                     int split, int n_split, int k_type, int v_type) {
    extern __shared__ float qs_all[];
    __shared__ int last;
    pdl_wait();
    pdl_launch();
    int kvh = blockIdx.x, t = blockIdx.y, s = blockIdx.z;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int h = kvh * (n_head / n_head_kv) + warp;
    int n_kv = pos[t] + 1, n_active = (n_kv + split - 1) / split;
    if (s >= n_active) return;
    int row = head_dim * n_head_kv;
    float* qs = qs_all + warp * head_dim;
    const float* qh = q + ((u64)t * n_head + h) * head_dim;
    for (int dd = lane; dd < head_dim; dd += 32) qs[dd] = qh[dd] * scale;
    __syncwarp();
    float acc[ATT_MAXD];
#pragma unroll
    for (int i = 0; i < ATT_MAXD; ++i) acc[i] = 0.0f;
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
        for (int i = 0; i < ATT_MAXD; ++i) acc[i] *= corr;
        // Eight keys per step, their V loads issued together; keys past the
        // end have weight 0 and read row jb (always valid).
        int nk = min(32, j1 - jb);
        for (int u0 = 0; u0 < nk; u0 += 8) {
            float pu[8];
            u64 vr[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                pu[u] = __shfl_sync(0xffffffffu, pj, u0 + u);
                vr[u] = (u64)(u0 + u < nk ? jb + u0 + u : jb) * row + off;
            }
#pragma unroll
            for (int i = 0; i < ATT_MAXD; ++i) {
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
#pragma unroll
        for (int i = 0; i < ATT_MAXD; ++i) {
            int dd = lane + 32 * i;
            if (dd < head_dim) oh[dd] = acc[i] / l;
        }
        return;
    }
    float* pp = part + (((u64)t * n_head + h) * n_split + s) * (head_dim + 2);
#pragma unroll
    for (int i = 0; i < ATT_MAXD; ++i) {
        int dd = lane + 32 * i;
        if (dd < head_dim) pp[2 + dd] = acc[i];
    }
    if (lane == 0) {
        pp[0] = mx;
        pp[1] = l;
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        int* ctr = counters + (u64)t * n_head_kv + kvh;
        last = atomicAdd(ctr, 1) == n_active - 1;
        if (last) *ctr = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    const float* ph = part + ((u64)t * n_head + h) * n_split * (head_dim + 2);
    float big = -INFINITY;
    for (int i = 0; i < n_active; ++i) big = fmaxf(big, __ldcg(ph + i * (head_dim + 2)));
    float sum = 0.0f;
    for (int i = 0; i < n_active; ++i) sum += __ldcg(ph + i * (head_dim + 2) + 1) * expf(__ldcg(ph + i * (head_dim + 2)) - big);
    for (int dd = lane; dd < head_dim; dd += 32) {
        float a = 0.0f;
        for (int i = 0; i < n_active; ++i) {
            const float* pi = ph + i * (head_dim + 2);
            a += __ldcg(pi + 2 + dd) * expf(__ldcg(pi) - big);
        }
        oh[dd] = a / sum;
    }
}
