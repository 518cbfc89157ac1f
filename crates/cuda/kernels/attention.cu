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
    pdl_wait();
    pdl_launch();
    int t = blockIdx.x, p = pos[t], half = n_rot / 2, hp = head_dim / 2;
    int row = head_dim * n_head_kv;
    u64 dst = (u64)p * row;
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
            double c, s;
            rope_angle(p, i, n_rot, base, fscale, factors, &c, &s);
            double x0 = xh[a], x1 = xh[b];
            ya = (float)(x0 * c - x1 * s);
            yb = (float)(x0 * s + x1 * c);
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

// grid: (n_head_kv, n_tok, n_split), block: 32 * (n_head / n_head_kv).
// q, out: [head_dim * n_head, n_tok]. part: [n_tok, n_head, n_split, head_dim + 2].
// counters: [n_tok, n_head_kv], zero between launches.
extern "C" __global__ void attention(const float* q, const u8* kc, const u8* vc, const int* pos, float* out,
                                     float* part, int* counters, int n_head, int n_head_kv, int head_dim, float scale,
                                     int split, int n_split, int k_type, int v_type) {
    __shared__ int last;
    pdl_wait();
    pdl_launch();
    int kvh = blockIdx.x, t = blockIdx.y, s = blockIdx.z;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int h = kvh * (n_head / n_head_kv) + warp;
    int n_kv = pos[t] + 1, n_active = (n_kv + split - 1) / split;
    if (s >= n_active) return;
    int row = head_dim * n_head_kv;
    const float* qh = q + ((u64)t * n_head + h) * head_dim;
    float qv[ATT_MAXD], acc[ATT_MAXD];
#pragma unroll
    for (int i = 0; i < ATT_MAXD; ++i) {
        int dd = lane + 32 * i;
        qv[i] = dd < head_dim ? qh[dd] * scale : 0.0f;
        acc[i] = 0.0f;
    }
    float mx = -INFINITY, l = 0.0f;
    int j0 = s * split, j1 = min(n_kv, j0 + split);
    u64 off = (u64)kvh * head_dim;
    for (int j = j0; j < j1; j += 4) {
        float sc[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            float p = 0.0f;
            if (j + u < j1) {
#pragma unroll
                for (int i = 0; i < ATT_MAXD; ++i) {
                    int dd = lane + 32 * i;
                    if (dd < head_dim) p += qv[i] * ld_cache(kc, (u64)(j + u) * row + off + dd, k_type);
                }
            }
            sc[u] = p;
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) sc[u] = j + u < j1 ? warp_sum(sc[u]) : -INFINITY;
        float m_new = fmaxf(mx, fmaxf(fmaxf(sc[0], sc[1]), fmaxf(sc[2], sc[3])));
        float corr = expf(mx - m_new);
        float pw[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) pw[u] = j + u < j1 ? expf(sc[u] - m_new) : 0.0f;
        l = l * corr + pw[0] + pw[1] + pw[2] + pw[3];
#pragma unroll
        for (int i = 0; i < ATT_MAXD; ++i) {
            int dd = lane + 32 * i;
            if (dd >= head_dim) continue;
            float a = acc[i] * corr;
#pragma unroll
            for (int u = 0; u < 4; ++u)
                if (j + u < j1) a += pw[u] * ld_cache(vc, (u64)(j + u) * row + off + dd, v_type);
            acc[i] = a;
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
