// Mixture-of-experts routing and the weighted sum of the experts' outputs,
// with the CPU's semantics (tern_cpu::ops::moe: `route`, `route_weights`,
// `gate`, `best`, `expert_sum`): the same float operations in the same
// order, so scores, choices and weights are the CPU's bit for bit wherever
// the exponentials round alike (`exp_rn`).
//
// Shapes (ggml order, ne0 first): logits f32 [n_expert, n], bias f32
// [n_expert], ids i32 [k, n], weights f32 [k, n], ys f32 [m, k, n] → y f32
// [m, n]. Routing runs a block of ROUTE_THREADS per token, with the token's
// scores in shared memory; the host refuses (tern_cuda::supports) sizes past
// the limits below, which lower/route.rs mirrors (a host test compares them).

#define ROUTE_THREADS 256
#define ROUTE_MAX_EXPERTS 1024
#define ROUTE_MAX_K 32
#define ROUTE_MAX_GROUPS 64
// The most experts whose choice is made by rank (every expert against
// every other) rather than in k rounds of a block arg-max.
#define ROUTE_RANK_MAX 256

// f32 e^x rounded once from the double result: the correctly rounded value
// but where the exact one lies within about 2^-29 ulp of a rounding
// midpoint. The CPU's libm expf is correctly rounded but for a far smaller
// set of arguments too; CUDA's own expf is off by up to 2 ulp, which would
// move scores and flip near-tied choices far more often.
__device__ __forceinline__ float exp_rn(float x) {
    return (float)exp((double)x);
}

// Whether (va, ia) ranks before (vb, ib) in `best`'s order: larger first,
// NaN last, ties (and NaN with NaN) to the lower index. A strict total
// order, so every reduction below picks the one element the sort puts first.
__device__ __forceinline__ bool route_better(float va, int ia, float vb, int ib) {
    bool na = isnan(va), nb = isnan(vb);
    if (na != nb) return nb;
    if (!na && va != vb) return va > vb;
    return ia < ib;
}

// The better of each lane's candidate and its partners' (index -1: none),
// over the warp; every lane ends with the warp's best.
__device__ __forceinline__ void warp_best(float* v, int* i) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, *v, o);
        int oi = __shfl_xor_sync(0xffffffffu, *i, o);
        if (oi >= 0 && (*i < 0 || route_better(ov, oi, *v, *i))) {
            *v = ov;
            *i = oi;
        }
    }
}

// A token's routing state in shared memory.
struct RouteShared {
    float prob[ROUTE_MAX_EXPERTS];  // gate scores (the weights read these)
    float sel[ROUTE_MAX_EXPERTS];   // selection scores: + bias, groups masked
    u8 taken[ROUTE_MAX_EXPERTS];
    float red[32];
    float best_v[32];
    int best_i[32];
    float gs[ROUTE_MAX_GROUPS];
    int keep[ROUTE_MAX_GROUPS];
    int chosen[ROUTE_MAX_K];
    float sum;
};

// One token's gate scores of logits `l` into `s` (n floats of shared
// memory), the CPU's `gate`: softmax (max, exponentials of l − max, their
// sum, quotients) or 1 / (1 + e^−l). Every thread of the block calls it;
// `s` is complete on return.
__device__ void gate_scores(const float* l, int n, int gating, float* s, RouteShared& sh) {
    if (gating == GATE_SIGMOID) {
        for (int e = threadIdx.x; e < n; e += blockDim.x) s[e] = 1.0f / (1.0f + exp_rn(-l[e]));
        __syncthreads();
        return;
    }
    // fmaxf, like f32::max, passes over NaN; the maximum is exact in any order.
    float m = -INFINITY;
    for (int e = threadIdx.x; e < n; e += blockDim.x) m = fmaxf(m, l[e]);
    m = block_reduce(m, sh.red, -INFINITY, Max());
    for (int e = threadIdx.x; e < n; e += blockDim.x) s[e] = exp_rn(l[e] - m);
    __syncthreads();
    // The sum in index order, by one thread, as the CPU adds: a tree would
    // round differently, and weights that are not renormalised keep the
    // sum's rounding.
    if (threadIdx.x == 0) {
        float sum = 0.0f;
        for (int e = 0; e < n; e++) sum += s[e];
        sh.sum = sum;
    }
    __syncthreads();
    float sum = sh.sum;
    for (int e = threadIdx.x; e < n; e += blockDim.x) s[e] = s[e] / sum;
    __syncthreads();
}

// The weights of `k` chosen experts, the CPU's `route_weights`: their scores
// `prob`, over their sum in slot order (floored at f16's smallest normal,
// 2^-14, as llama.cpp) when `norm`, times `scale`. One thread; an id out of
// range (which the CPU refuses) gives NaN.
__device__ void weights_of(const float* prob, const int* chosen, int n, int k, int norm, float scale, float* w) {
    float v[ROUTE_MAX_K];
    float sum = 0.0f;
    for (int j = 0; j < k; j++) {
        int e = chosen[j];
        v[j] = e >= 0 && e < n ? prob[e] : __int_as_float(0x7fc00000);
        sum += v[j];
    }
    if (norm) {
        sum = fmaxf(sum, 6.103515625e-05f);
        for (int j = 0; j < k; j++) v[j] = v[j] / sum;
    }
    for (int j = 0; j < k; j++) w[j] = v[j] * scale;
}

// Each token's k best experts, best first, into ids [k, n]; with `w` not
// null also their weights (`weights_of`) into w [k, n], the RouteWeights of
// the same logits fused in. bias: null or [n_expert], added to the scores
// for the choice only. n_group > 0: group-limited choice (n_expert / n_group
// experts a group, a group's score the sum of its two best, the experts of
// all but the group_used best groups at −inf). grid: n, block: ROUTE_THREADS.
extern "C" __global__ void __launch_bounds__(ROUTE_THREADS)
    route(const float* logits, const float* bias, int* ids, float* w, int n_expert, int k, int gating, int n_group,
          int group_used, int norm, float scale) {
    __shared__ RouteShared sh;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5, n = n_expert;
    for (int e = tid; e < n; e += blockDim.x) sh.taken[e] = 0;
    pdl_wait();
    pdl_launch();
    const float* l = logits + (u64)blockIdx.x * n;
    gate_scores(l, n, gating, sh.prob, sh);
    for (int e = tid; e < n; e += blockDim.x) sh.sel[e] = bias ? sh.prob[e] + bias[e] : sh.prob[e];
    __syncthreads();

    if (n_group > 0) {
        // Two best a group, in index order as the CPU walks it (NaN never
        // compares greater, so it is passed over); experts past
        // n_group · per belong to no group and are never masked.
        const int per = n / n_group;
        if (tid < n_group) {
            float a = -INFINITY, b = -INFINITY;
            for (int e = tid * per; e < (tid + 1) * per; e++) {
                float v = sh.sel[e];
                if (v > a) {
                    b = a;
                    a = v;
                } else if (v > b) {
                    b = v;
                }
            }
            sh.gs[tid] = a + b;
        }
        __syncthreads();
        // A group is kept when fewer than group_used groups rank before it.
        if (tid < n_group) {
            int rank = 0;
            for (int g = 0; g < n_group; g++) rank += route_better(sh.gs[g], g, sh.gs[tid], tid);
            sh.keep[tid] = rank < group_used;
        }
        __syncthreads();
        for (int e = tid; e < n; e += blockDim.x) {
            int g = e / per;
            if (g < n_group && !sh.keep[g]) sh.sel[e] = -INFINITY;
        }
        __syncthreads();
    }

    int* out = ids + (u64)blockIdx.x * k;
    if (n <= ROUTE_RANK_MAX) {
        // An expert's rank is how many rank before it in `route_better`'s
        // strict total order; the k of rank below k are the choice, best
        // first: what k rounds of arg-max pick, in one pass (the threads
        // read each score together, a broadcast).
        for (int e = tid; e < n; e += blockDim.x) {
            float v = sh.sel[e];
            int rank = 0;
            for (int f = 0; f < n; f++) rank += route_better(sh.sel[f], f, v, e);
            if (rank < k) {
                sh.chosen[rank] = e;
                out[rank] = e;
            }
        }
        __syncthreads();
    } else {
        // k rounds of a block arg-max over the experts not yet taken: each
        // thread's best of its experts, the warp's, then warp 0 over the warps'.
        for (int j = 0; j < k; j++) {
            float bv = 0.0f;
            int bi = -1;
            for (int e = tid; e < n; e += blockDim.x) {
                if (!sh.taken[e] && (bi < 0 || route_better(sh.sel[e], e, bv, bi))) {
                    bv = sh.sel[e];
                    bi = e;
                }
            }
            warp_best(&bv, &bi);
            if (lane == 0) {
                sh.best_v[warp] = bv;
                sh.best_i[warp] = bi;
            }
            __syncthreads();
            if (warp == 0) {
                bv = lane < nw ? sh.best_v[lane] : 0.0f;
                bi = lane < nw ? sh.best_i[lane] : -1;
                warp_best(&bv, &bi);
                // k ≤ n_expert (the host checks), so some expert is left.
                if (lane == 0) {
                    sh.chosen[j] = bi;
                    sh.taken[bi] = 1;
                    out[j] = bi;
                }
            }
            __syncthreads();
        }
    }
    if (w && tid == 0) weights_of(sh.prob, sh.chosen, n, k, norm, scale, w + (u64)blockIdx.x * k);
}

// The weights of the experts in ids [k, n] (a Route's output), into w
// [k, n]: `weights_of` over the token's gate scores. grid: n, block:
// ROUTE_THREADS.
extern "C" __global__ void __launch_bounds__(ROUTE_THREADS)
    route_weights(const float* logits, const int* ids, float* w, int n_expert, int k, int gating, int norm,
                  float scale) {
    __shared__ RouteShared sh;
    pdl_wait();
    pdl_launch();
    const float* l = logits + (u64)blockIdx.x * n_expert;
    gate_scores(l, n_expert, gating, sh.prob, sh);
    if (threadIdx.x == 0) {
        u64 t = (u64)blockIdx.x * k;
        weights_of(sh.prob, ids + t, n_expert, k, norm, scale, w + t);
    }
}

// y[i, t] = Σ_j w[j, t] · ys[i, j, t], j = 0..k in order from 0, each
// product rounded before the add (no fused multiply-add), as the CPU's
// `expert_sum` does: the same result bit for bit. total = m · n;
// grid-stride.
extern "C" __global__ void expert_sum(const float* ys, const float* w, float* y, int m, int k, u64 total) {
    pdl_wait();
    pdl_launch();
    for (u64 idx = blockIdx.x * (u64)blockDim.x + threadIdx.x; idx < total; idx += (u64)gridDim.x * blockDim.x) {
        u64 t = idx / m, i = idx - t * m;
        const float* wt = w + t * k;
        const float* yt = ys + t * k * m + i;
        float acc = 0.0f;
        for (int j = 0; j < k; j++) acc = __fadd_rn(acc, __fmul_rn(wt[j], yt[(u64)j * m]));
        y[idx] = acc;
    }
}
