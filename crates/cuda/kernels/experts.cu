// The expert products of a mixture of experts (`Op::MulMatId`, and
// `Op::MoeUpGate`: act(gate) · up), compiled after fmat.cu and paired.cu
// (their level arithmetic): f32 activations, or int8 ones (`act_q8`'s,
// a quantized model's `Precision::Paired`). The routing stays on the device, so a decoding step replays
// as one graph: `moe_plan` groups the batch's (token, slot) pairs by the
// expert the router chose and cuts each expert's pairs into items of up to
// MOE_MAXT; the GEMV's grid has a block row per possible item, and blocks
// past the plan's count return at once. A pair p = t·k_used + j is slot j of
// token t, and its output row is out[p · rows ..].

#define MOE_MAXT FMAT_MAXT

// ids: i32 [k_used, n] (n_pairs of them) → items[0..*n_items] as (expert,
// first, count ≤ per_item) into `sorted`, the pair indices ordered by
// expert: items of MOE_MAXT for the GEMVs, of levels_mma.cu's 64 columns for
// the tensor-core products. One block;
// shared memory: 2 · n_expert ints. Ids outside 0..n_expert are skipped
// (the router makes none). Within an expert the pairs' order depends on
// atomics, which changes no value: each pair's sums are its own.
extern "C" __global__ void __launch_bounds__(1024) moe_plan(const int* ids, int n_pairs, int n_expert, int per_item,
                                                            int4* items, int* n_items, int* sorted) {
    pdl_wait();
    pdl_launch();
    extern __shared__ int moe_sh[];
    int *count = moe_sh, *start = moe_sh + n_expert;
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) count[e] = 0;
    __syncthreads();
    for (int p = threadIdx.x; p < n_pairs; p += blockDim.x) {
        int e = ids[p];
        if (e >= 0 && e < n_expert) atomicAdd(&count[e], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int at = 0, ni = 0;
        for (int e = 0; e < n_expert; ++e) {
            int c = count[e];
            start[e] = at;
            for (int j = 0; j < c; j += per_item) items[ni++] = make_int4(e, at + j, min(per_item, c - j), 0);
            at += c;
            count[e] = 0;
        }
        *n_items = ni;
    }
    __syncthreads();
    for (int p = threadIdx.x; p < n_pairs; p += blockDim.x) {
        int e = ids[p];
        if (e >= 0 && e < n_expert) sorted[start[e] + atomicAdd(&count[e], 1)] = p;
    }
}

// How the expert tensors are held: int8 levels with a scale per 16
// (qlayout.rs), the same with an offset per 16 (either matrix of a pair may
// have none: its `o` is null), stored float bytes read by `dq`, or the
// file's Q4_K blocks (q4k.cu; one token, int8 activations).
#define MOE_LEVELS 0
#define MOE_OFFSET 1
#define MOE_STORED 2
#define MOE_Q4K 3

struct MoeArgs {
    // The (gate) matrix: levels (or stored bytes), scales, offsets.
    const i8* q;
    const float* s;
    const float* o;
    // The up matrix of a gated pair.
    const i8* q2;
    const float* s2;
    const float* o2;
    u64 row_bytes;
    int type, rows, k;
    const float* x;
    // int8 activations (act_q8's q, d and block shift), when not null.
    const i8* qa;
    const float* da;
    int ab;
    int x_pair, k_used;
    // The plan's items and pair order, or, with `items` null (one token),
    // none: item y is pair y alone, of expert ids[y].
    const int4* items;
    const int* n_items;
    const int* sorted;
    const int* ids;
    int n_expert;
    float* out;
    int act;
};

// One warp: row `row` of expert e against the item's tokens' activations
// (x_pair: a column per pair, else per token; xo: each one's first element),
// for both matrices of a pair.
template <int KIND, bool PAIR, bool PAIRED>
__device__ __forceinline__ void moe_row(const MoeArgs& a, int e, int row, int lane, const u64* xo, int cnt,
                                        const i8* qa, const float* da, float* acc, float* acc2) {
    u64 grow = (u64)e * a.rows + row;
    if (KIND == MOE_Q4K) {
        u64 rb = (u64)(a.k >> 8) * Q4K_BLOCK;
        const u8* wr = (const u8*)a.q + grow * rb;
        const u8* wr2 = (const u8*)a.q2 + grow * rb;
        int nu = (a.k >> 8) * 4;
#pragma unroll 2
        for (int u = lane; u < nu; u += 32) {
            Q4KUnit w = q4k_load(wr, u), w2;
            if (PAIR) w2 = q4k_load(wr2, u);
#pragma unroll
            for (int t = 0; t < MOE_MAXT; ++t) {
                if (t >= cnt) break;
                acc[t] += q4k_dot(w, u, qa + xo[t], da + (xo[t] >> 8));
                if (PAIR) acc2[t] += q4k_dot(w2, u, qa + xo[t], da + (xo[t] >> 8));
            }
        }
        return;
    }
    if (KIND == MOE_STORED) {
        const u8* wr = (const u8*)a.q + grow * a.row_bytes;
        const u8* wr2 = (const u8*)a.q2 + grow * a.row_bytes;
        for (int i = lane; i < a.k; i += 32) {
            float v = dq(wr, i, a.type), v2 = PAIR ? dq(wr2, i, a.type) : 0.0f;
#pragma unroll
            for (int t = 0; t < MOE_MAXT; ++t) {
                if (t >= cnt) break;
                float xv = __ldg(a.x + xo[t] + i);
                acc[t] += v * xv;
                if (PAIR) acc2[t] += v2 * xv;
            }
        }
        return;
    }
    int nw = a.k >> 2;
    u64 g0 = grow * (a.k >> 4);
    const u32* qr = (const u32*)(a.q + grow * a.k);
    const u32* qr2 = (const u32*)(a.q2 + grow * a.k);
    bool offs = KIND == MOE_OFFSET && a.o, offs2 = KIND == MOE_OFFSET && a.o2;
    if constexpr (PAIRED) {
        // A lane takes whole level groups, 16 bytes a load (a warp's loads
        // read 512 contiguous bytes), up to 4 groups of each matrix in
        // flight: the group's exact Σ q·a by four dp4a, then its scale, d and
        // offset, as `paired_word` takes them per word.
        const uint4* gr = (const uint4*)qr;
        const uint4* gr2 = (const uint4*)qr2;
        int ng = a.k >> 4;
#pragma unroll 4
        for (int g = lane; g < ng; g += 32) {
            uint4 w = __ldg(gr + g);
            float sc = __ldg(a.s + g0 + g), of = offs ? __ldg(a.o + g0 + g) : 0.0f;
            uint4 w2 = PAIR ? __ldg(gr2 + g) : make_uint4(0, 0, 0, 0);
            float sc2 = PAIR ? __ldg(a.s2 + g0 + g) : 0.0f;
            float of2 = PAIR && offs2 ? __ldg(a.o2 + g0 + g) : 0.0f;
#pragma unroll
            for (int t = 0; t < MOE_MAXT; ++t) {
                if (t >= cnt) break;
                uint4 av = *((const uint4*)(qa + xo[t]) + g);
                float dv = da[(xo[t] >> a.ab) + ((16 * g) >> a.ab)];
                int sa = 0;
                if (offs || offs2) {
                    sa = __dp4a((int)av.x, 0x01010101, __dp4a((int)av.y, 0x01010101, 0));
                    sa = __dp4a((int)av.z, 0x01010101, __dp4a((int)av.w, 0x01010101, sa));
                }
                int s1 = __dp4a((int)w.x, (int)av.x, __dp4a((int)w.y, (int)av.y, 0));
                s1 = __dp4a((int)w.z, (int)av.z, __dp4a((int)w.w, (int)av.w, s1));
                float y = (float)s1 * (sc * dv);
                if (offs) y += of * dv * (float)sa;
                acc[t] += y;
                if (PAIR) {
                    int s2 = __dp4a((int)w2.x, (int)av.x, __dp4a((int)w2.y, (int)av.y, 0));
                    s2 = __dp4a((int)w2.z, (int)av.z, __dp4a((int)w2.w, (int)av.w, s2));
                    float y2 = (float)s2 * (sc2 * dv);
                    if (offs2) y2 += of2 * dv * (float)sa;
                    acc2[t] += y2;
                }
            }
        }
    } else {
#pragma unroll 4
        for (int c = lane; c < nw; c += 32) {
            u32 w = __ldg(qr + c) ^ 0x80808080u;
            float sc = __ldg(a.s + g0 + (c >> 2));
            float of = offs ? __ldg(a.o + g0 + (c >> 2)) : 0.0f;
            u32 w2 = PAIR ? __ldg(qr2 + c) ^ 0x80808080u : 0u;
            float sc2 = PAIR ? __ldg(a.s2 + g0 + (c >> 2)) : 0.0f;
            float of2 = PAIR && offs2 ? __ldg(a.o2 + g0 + (c >> 2)) : 0.0f;
#pragma unroll
            for (int t = 0; t < MOE_MAXT; ++t) {
                if (t >= cnt) break;
                float4 xv = __ldg((const float4*)(a.x + xo[t]) + c);
                float xs = KIND == MOE_OFFSET ? (xv.x + xv.y) + (xv.z + xv.w) : 0.0f;
                acc[t] += bytes_dot4(w, xv, Q8_BIAS) * sc + of * xs;
                if (PAIR) acc2[t] += bytes_dot4(w2, xv, Q8_BIAS) * sc2 + of2 * xs;
            }
        }
    }
}

// grid: (ceil(rows / (8 · MOE_ROWS(QX))), the plan's most items), block
// 256: warp w of block (x, y) computes rows (MOE_ROWS · x + r) · 8 + w of
// item y's expert for the item's pairs. QX (a decoding step's one token,
// int8 activations): the block quantizes the activations it reads itself,
// as act_q8 would, into shared memory (dynamic: MOE_MAXT vectors of k
// levels, then their k / 2^ab scales): the token's x, or each pair's column
// of x (x_pair); no act_q8 launch. Such a block takes two rows a warp, so
// that fewer blocks quantize the same vector (lower/experts.rs
// `QX_ROWS`).
#define MOE_ROWS(QX) ((QX) ? 2 : 1)
template <int KIND, bool PAIR, bool PAIRED, bool QX>
__device__ __forceinline__ void moe_gemv(const MoeArgs& a) {
    extern __shared__ __align__(16) u8 moe_x[];
    pdl_wait();
    pdl_launch();
    int4 item;
    if (a.items) {
        if ((int)blockIdx.y >= *a.n_items) return;
        item = a.items[blockIdx.y];
    } else {
        // One token: the router's k_used experts are distinct, so each pair
        // is an item of its own, and no plan is needed.
        int e = a.ids[blockIdx.y];
        if (e < 0 || e >= a.n_expert) return;
        item = make_int4(e, blockIdx.y, 1, 0);
    }
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int pairs[MOE_MAXT];
    u64 xo[MOE_MAXT];
#pragma unroll
    for (int t = 0; t < MOE_MAXT; ++t) {
        int p = t < item.z ? (a.sorted ? a.sorted[item.y + t] : item.y + t) : 0;
        pairs[t] = p;
        xo[t] = (u64)(a.x_pair ? p : p / a.k_used) * a.k;
    }
    const i8* qa = a.qa;
    const float* da = a.da;
    if (QX) {
        // One token: its x serves every pair, or pair t's column is vector t.
        int nv = a.x_pair ? item.z : 1, nb = a.k >> a.ab;
        i8* xq = (i8*)moe_x;
        float* xd = (float*)(moe_x + MOE_MAXT * a.k);
        // Block b of the nv vectors is block b % nb of vector b / nb.
        auto src = [&](int b) {
            int v = b / nb, bi = b - v * nb;
            u64 at = a.x_pair ? (u64)(a.sorted ? a.sorted[item.y + v] : item.y + v) * a.k : 0;
            return a.x + at + ((u64)bi << a.ab);
        };
        quant_blocks(nv * nb, a.ab, src, xq, xd, nullptr, 1.0f);
        __syncthreads();
#pragma unroll
        for (int t = 0; t < MOE_MAXT; ++t) xo[t] = (u64)(a.x_pair ? t : 0) * a.k;
        qa = xq;
        da = xd;
    }
    for (int r = 0; r < MOE_ROWS(QX); ++r) {
        int row = (blockIdx.x * MOE_ROWS(QX) + r) * 8 + warp;
        if (row >= a.rows) return;
        float acc[MOE_MAXT], acc2[MOE_MAXT];
#pragma unroll
        for (int t = 0; t < MOE_MAXT; ++t) {
            acc[t] = 0.0f;
            acc2[t] = 0.0f;
        }
        moe_row<KIND, PAIR, PAIRED>(a, item.x, row, lane, xo, item.z, qa, da, acc, acc2);
#pragma unroll
        for (int t = 0; t < MOE_MAXT; ++t) {
            if (t >= item.z) break;
            float y = warp_sum(acc[t]);
            if (PAIR) y = gated(y, warp_sum(acc2[t]), a.act);
            if (lane == 0) a.out[(u64)pairs[t] * a.rows + row] = y;
        }
    }
}

#define MOE_KERNEL(NAME, KIND, PAIR, PAIRED, QX)                                                                     \
    extern "C" __global__ void __launch_bounds__(256) NAME(                                                          \
        const i8* q, const float* s, const float* o, const i8* q2, const float* s2, const float* o2, u64 row_bytes,   \
        int type, int rows, int k, const float* x, const i8* qa, const float* da, int ab, int x_pair, int k_used,     \
        const int4* items, const int* n_items, const int* sorted, const int* ids, int n_expert, float* out, int act) { \
        MoeArgs a = {q,  s,      o,      q2,    s2,      o2,     row_bytes, type,     rows, k,  x,  qa,              \
                     da, ab,     x_pair, k_used, items, n_items, sorted,    ids,      n_expert, out, act};           \
        moe_gemv<KIND, PAIR, PAIRED, QX>(a);                                                                         \
    }

MOE_KERNEL(moe_q8, MOE_LEVELS, false, false, false)
MOE_KERNEL(moe_q8_pair, MOE_LEVELS, true, false, false)
MOE_KERNEL(moe_q8o, MOE_OFFSET, false, false, false)
MOE_KERNEL(moe_q8o_pair, MOE_OFFSET, true, false, false)
MOE_KERNEL(moe_dq, MOE_STORED, false, false, false)
MOE_KERNEL(moe_dq_pair, MOE_STORED, true, false, false)
MOE_KERNEL(moe_q8p, MOE_LEVELS, false, true, false)
MOE_KERNEL(moe_q8p_pair, MOE_LEVELS, true, true, false)
MOE_KERNEL(moe_q8op, MOE_OFFSET, false, true, false)
MOE_KERNEL(moe_q8op_pair, MOE_OFFSET, true, true, false)
MOE_KERNEL(moe_q8p_x, MOE_LEVELS, false, true, true)
MOE_KERNEL(moe_q8p_pair_x, MOE_LEVELS, true, true, true)
MOE_KERNEL(moe_q8op_x, MOE_OFFSET, false, true, true)
MOE_KERNEL(moe_q8op_pair_x, MOE_OFFSET, true, true, true)
MOE_KERNEL(moe_q4k_x, MOE_Q4K, false, true, true)
MOE_KERNEL(moe_q4k_pair_x, MOE_Q4K, true, true, true)
