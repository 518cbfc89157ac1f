// Prompt products of int8 levels (qlayout.rs: a scale, and maybe an offset,
// per 16 elements) with int8 activations (`act_q8`'s, a quantized model's
// `Precision::Paired`) on tensor cores: dense matrices over a batch's tokens,
// the experts of a mixture over the (token, slot) pairs `moe_plan` grouped
// by expert, and per-head products (Op::MulMatHeads, not transposed). Q6_K
// matrices, held in planes, are decoded to levels as a stage is filled.
// Compiled after experts.cu (its plan and `gated`).
//
// Why m16n8k16: a level group is 16 elements, so one `mma` of 16 rows × 8
// columns × 16 k gives each (row, column) the exact integer Σ q·a of one
// group, which the epilogue scales by the group's scale and the activation
// block's d, as the GEMVs' dp4a words do (paired.cu `paired_word`); an offset
// adds o · d · Σa, Σa over the group's 16 activations.
//
// A block: 64 rows × 64 columns, 4 warps of 32 × 32 (2 × 4 mma tiles), k in
// chunks of 64 (4 groups) through MMA_STAGES shared-memory stages filled by
// cp.async, two chunks in flight while one is multiplied. A stage's rows
// are 80 bytes apart: a fragment's 8 rows × 4 words then fall in 32
// distinct banks.

#define MMA_BM 64
#define MMA_BN 64
#define MMA_BK 64
#define MMA_LD 80
#define MMA_STAGES 3

struct MmaArgs {
    // The (gate) matrix: levels [rows · experts, k], scales and offsets
    // [rows · experts, k / 16] (o null: none).
    const i8* q;
    const float* s;
    const float* o;
    // The up matrix of a gated pair (q2 null: not a pair).
    const i8* q2;
    const float* s2;
    const float* o2;
    int rows, k;
    // act_q8's levels [k, columns] and d [k / 2^ab, columns].
    const i8* qa;
    const float* da;
    int ab;
    // Dense: columns are tokens 0..n_tok, out[t · out_stride + row] (+ res).
    int n_tok;
    u64 out_stride;
    const float* res;
    // Experts (items not null): block row y is item y of the plan, (expert,
    // first, count) into `sorted`; pair p's activations are column p
    // (x_pair) or p / k_used, its output out[p · rows + row].
    const int4* items;
    const int* n_items;
    const int* sorted;
    int x_pair, k_used;
    // Heads (n_head > 0): block row y is head y / ⌈n_tok / 64⌉'s weight rows
    // h · stride + offset .. + rows over a tile of tokens; token t's slice
    // of head h is column p = t · n_head + h, its output out[p · rows + row].
    int n_head, stride, offset;
    float* out;
    int act;
};

// One stage: levels of the block's rows (and the up matrix's), the columns'
// activation levels, the rows' scales and offsets for the chunk's 4 groups,
// the columns' d and Σa per group.
struct MmaStage {
    i8 a[MMA_BM * MMA_LD];
    i8 a2[MMA_BM * MMA_LD];
    i8 b[MMA_BN * MMA_LD];
    float sw[MMA_BM][4], ow[MMA_BM][4], sw2[MMA_BM][4], ow2[MMA_BM][4];
    float d[MMA_BN][4];
    float sa[MMA_BN][4];
};

__device__ __forceinline__ void cp16(void* dst, const void* src, bool ok) {
    u32 d = (u32)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(ok ? 16 : 0));
}

__device__ __forceinline__ void cp4(void* dst, const void* src, bool ok) {
    u32 d = (u32)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(d), "l"(src), "r"(ok ? 4 : 0));
}

// One level group (k16), or two sharing their scale (k32: a[2], a[3] and
// b[1] hold k 16..31).
template <bool G32>
__device__ __forceinline__ void mma_s8(int* c, const u32* a, const u32* b) {
    if (G32) {
        asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%10, %11, %12, %13};"
            : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(0), "r"(0), "r"(0), "r"(0));
    } else {
        asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %8, %9, %10};"
            : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(b[0]), "r"(0), "r"(0), "r"(0), "r"(0));
    }
}

// Where Q6_K scale q (of elements 16q .. 16q + 16) sits among a block's 16
// scale bytes in the planes (qlayout.rs `scale_slot`).
__device__ __forceinline__ int q6_slot(int q) { return 2 * (q % 4 + 4 * (q / 8)) + (q / 4) % 2; }

// Chunk k0 of Q6_K planes (qlayout.rs `pack_q6k`: every block's ql, then
// qh, scales, d; `nb` blocks in all) decoded into levels q − 32 and scales
// d · sc: thread i takes row i / 2, elements 32 (i % 2) .. + 32 of the
// chunk. A chunk is a quarter of a 256-element block: half n = c / 2 of it,
// ql's low nibbles (c even) or high ones, and qh's bit pairs 2 (2 (c % 2) + e / 32).
__device__ __forceinline__ void q6_fill(MmaStage& st, const u8* base, u64 nb, u64 row0, int n_rows, int k, int k0) {
    int tid = threadIdx.x, r = tid >> 1, half = tid & 1;
    u32 w[8];
    float sc[2];
    if (r < n_rows) {
        u64 blk = (row0 + r) * (u64)(k >> 8) + (k0 >> 8);
        int c = (k0 & 255) >> 6, n = c >> 1, h = c & 1;
        const uint4* ql = (const uint4*)(base + blk * 128 + n * 64 + 32 * half);
        const uint4* qh = (const uint4*)(base + nb * 128 + blk * 64 + n * 32);
        uint4 l0 = __ldg(ql), l1 = __ldg(ql + 1), h0 = __ldg(qh), h1 = __ldg(qh + 1);
        u32 lw[8] = {l0.x, l0.y, l0.z, l0.w, l1.x, l1.y, l1.z, l1.w};
        u32 hw[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
        int shift = 2 * (2 * h + half);
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            u32 lo = (h ? lw[u] >> 4 : lw[u]) & 0x0f0f0f0fu;
            u32 hi = ((hw[u] >> shift) & 0x03030303u) << 4;
            w[u] = __vsub4(lo | hi, 0x20202020u);
        }
        const i8* scl = (const i8*)(base + nb * 192 + blk * 16);
        float d = h2f(__ldg((const u16*)(base + nb * 208) + blk));
#pragma unroll
        for (int g = 0; g < 2; ++g) sc[g] = d * (float)scl[q6_slot(4 * c + 2 * half + g)];
    } else {
#pragma unroll
        for (int u = 0; u < 8; ++u) w[u] = 0;
        sc[0] = sc[1] = 0.0f;
    }
    uint4* dst = (uint4*)(st.a + r * MMA_LD + 32 * half);
    dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
    dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
    st.sw[r][2 * half] = sc[0];
    st.sw[r][2 * half + 1] = sc[1];
}

// Fills stage `st` with chunk k0: thread i copies rows/columns (i + 128j) / 4,
// 16-byte part (i + 128j) % 4, for j = 0, 1; rows past the matrix and
// columns past the item are zero-filled (a zero d and scale add nothing).
// Q6: the rows are Q6_K planes, decoded here.
template <bool PAIR, bool OFFS, bool Q6>
__device__ __forceinline__ void mma_fill(MmaStage& st, const MmaArgs& a, u64 row0, int n_rows, const u64* col_off,
                                         const bool* col_ok, int k0) {
    int tid = threadIdx.x, nb = a.k >> a.ab;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        int c = tid + 128 * j, r = c >> 2, part = c & 3;
        bool ok = r < n_rows;
        u64 at = (row0 + (ok ? r : 0)) * a.k + k0 + 16 * part;
        if (!Q6) cp16(st.a + r * MMA_LD + 16 * part, a.q + at, ok);
        if (PAIR) cp16(st.a2 + r * MMA_LD + 16 * part, a.q2 + at, ok);
        cp16(st.b + r * MMA_LD + 16 * part, a.qa + col_off[j] * a.k + k0 + 16 * part, col_ok[j]);
        cp4(&st.d[r][part], a.da + col_off[j] * nb + ((k0 + 16 * part) >> a.ab), col_ok[j]);
    }
    if (Q6) {
        q6_fill(st, (const u8*)a.q, (u64)a.rows * (a.k >> 8), row0, n_rows, a.k, k0);
        return;
    }
    if (tid < MMA_BM) {
        bool ok = tid < n_rows;
        u64 g = (row0 + (ok ? tid : 0)) * (a.k >> 4) + (k0 >> 4);
        cp16(st.sw[tid], a.s + g, ok);
        if (OFFS) cp16(st.ow[tid], a.o + g, ok && a.o);
        if (PAIR) cp16(st.sw2[tid], a.s2 + g, ok);
        if (PAIR && OFFS) cp16(st.ow2[tid], a.o2 + g, ok && a.o2);
    }
}

// Block row y's columns: its first column, their count, the weight row of
// its first row, and column c's index p (see MmaArgs).
struct MmaCols {
    int first, n_cols, head;
    u64 row0;
};

__device__ __forceinline__ int mma_col(const MmaArgs& a, const MmaCols& m, int c) {
    if (a.items) return a.sorted[m.first + c];
    return a.n_head ? (m.first + c) * a.n_head + m.head : m.first + c;
}

template <bool PAIR, bool OFFS, bool Q6, bool G32>
__device__ __forceinline__ void levels_mma(const MmaArgs& a) {
    extern __shared__ __align__(16) u8 mma_sm[];
    MmaStage* st = (MmaStage*)mma_sm;
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gid = lane >> 2, tq = lane & 3;
    int row_base = blockIdx.x * MMA_BM;
    MmaCols cols = {0, 0, 0, (u64)row_base};
    pdl_wait();
    pdl_launch();
    if (a.items) {
        if ((int)blockIdx.y >= *a.n_items) return;
        int4 it = a.items[blockIdx.y];
        cols.first = it.y;
        cols.n_cols = it.z;
        cols.row0 += (u64)it.x * a.rows;
    } else {
        int tiles = (a.n_tok + MMA_BN - 1) / MMA_BN, tile = blockIdx.y % tiles;
        cols.head = blockIdx.y / tiles;
        cols.first = tile * MMA_BN;
        cols.n_cols = min(MMA_BN, a.n_tok - cols.first);
        if (a.n_head) cols.row0 += (u64)cols.head * a.stride + a.offset;
    }
    int n_rows = min(MMA_BM, a.rows - row_base);
    u64 row0 = cols.row0;
    int n_cols = cols.n_cols;
    // The activation columns this thread copies (fill's j = 0, 1).
    u64 col_off[2];
    bool col_ok[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        int c = (tid + 128 * j) >> 2;
        col_ok[j] = c < n_cols;
        int p = col_ok[j] ? mma_col(a, cols, c) : 0;
        col_off[j] = (u64)(a.items && !a.x_pair ? p / a.k_used : p);
    }
    float acc[2][4][4], acc2[2][4][4];
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int n = 0; n < 4; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                acc[m][n][i] = 0.0f;
                if (PAIR) acc2[m][n][i] = 0.0f;
            }
    int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
    int chunks = a.k / MMA_BK;
    // MMA_STAGES − 1 chunks in flight ahead of the one multiplied; a group
    // is committed every round, empty past the last chunk, so that
    // `wait_group` counts the same in every round.
#pragma unroll
    for (int c = 0; c < MMA_STAGES - 1; ++c) {
        if (c < chunks) mma_fill<PAIR, OFFS, Q6>(st[c], a, row0, n_rows, col_off, col_ok, c * MMA_BK);
        asm volatile("cp.async.commit_group;");
    }
    for (int kc = 0; kc < chunks; ++kc) {
        MmaStage& s = st[kc % MMA_STAGES];
        asm volatile("cp.async.wait_group %0;" ::"n"(MMA_STAGES - 2) : "memory");
        // Chunk kc has landed, and every warp is done with chunk kc − 1,
        // whose stage the next fill takes.
        __syncthreads();
        int next = kc + MMA_STAGES - 1;
        if (next < chunks) mma_fill<PAIR, OFFS, Q6>(st[next % MMA_STAGES], a, row0, n_rows, col_off, col_ok, next * MMA_BK);
        asm volatile("cp.async.commit_group;");
        if (OFFS) {
            // Σa of each column's 4 groups: thread i takes column i / 2, groups 2 (i % 2) ..
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                int c = tid >> 1, g = 2 * (tid & 1) + h;
                const int* w = (const int*)(s.b + c * MMA_LD + 16 * g);
                int sum = 0;
#pragma unroll
                for (int u = 0; u < 4; ++u) sum = __dp4a(w[u], 0x01010101, sum);
                s.sa[c][g] = (float)sum;
            }
            __syncthreads();
        }
        // A step: one level group, or two where a scale spans 32 (G32).
#pragma unroll
        for (int g = 0; g < 4; g += G32 ? 2 : 1) {
            u32 af[2][4], af2[2][4], bf[4][2];
            float sw[2][2], ow[2][2], sw2[2][2], ow2[2][2];
#pragma unroll
            for (int m = 0; m < 2; ++m)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    int r = wm + 16 * m + gid + 8 * h;
                    const i8* ar = s.a + r * MMA_LD + 16 * g + 4 * tq;
                    af[m][h] = *(const u32*)ar;
                    if (G32) af[m][2 + h] = *(const u32*)(ar + 16);
                    sw[m][h] = s.sw[r][g];
                    if (OFFS) ow[m][h] = s.ow[r][g];
                    if (PAIR) {
                        const i8* ar2 = s.a2 + r * MMA_LD + 16 * g + 4 * tq;
                        af2[m][h] = *(const u32*)ar2;
                        if (G32) af2[m][2 + h] = *(const u32*)(ar2 + 16);
                        sw2[m][h] = s.sw2[r][g];
                        if (OFFS) ow2[m][h] = s.ow2[r][g];
                    }
                }
#pragma unroll
            for (int n = 0; n < 4; ++n) {
                const i8* br = s.b + (wn + 8 * n + gid) * MMA_LD + 16 * g + 4 * tq;
                bf[n][0] = *(const u32*)br;
                if (G32) bf[n][1] = *(const u32*)(br + 16);
            }
#pragma unroll
            for (int n = 0; n < 4; ++n) {
                int c = wn + 8 * n + 2 * tq;
                // An activation block spans 32 at least: group g's d is g + 1's.
                float d[2] = {s.d[c][g], s.d[c + 1][g]};
                float sa[2] = {0.0f, 0.0f};
                if (OFFS) {
                    sa[0] = G32 ? s.sa[c][g] + s.sa[c][g + 1] : s.sa[c][g];
                    sa[1] = G32 ? s.sa[c + 1][g] + s.sa[c + 1][g + 1] : s.sa[c + 1][g];
                }
#pragma unroll
                for (int m = 0; m < 2; ++m) {
                    int ci[4];
                    mma_s8<G32>(ci, af[m], bf[n]);
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        float y = (float)ci[i] * sw[m][i >> 1];
                        if (OFFS) y += ow[m][i >> 1] * sa[i & 1];
                        acc[m][n][i] += y * d[i & 1];
                    }
                    if (PAIR) {
                        mma_s8<G32>(ci, af2[m], bf[n]);
#pragma unroll
                        for (int i = 0; i < 4; ++i) {
                            float y = (float)ci[i] * sw2[m][i >> 1];
                            if (OFFS) y += ow2[m][i >> 1] * sa[i & 1];
                            acc2[m][n][i] += y * d[i & 1];
                        }
                    }
                }
            }
        }
    }
    // c0, c1: row gid, columns 2tq, 2tq + 1; c2, c3: row gid + 8.
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            int c = wn + 8 * n + 2 * tq + (i & 1);
            if (c >= n_cols) continue;
            int p = mma_col(a, cols, c);
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
                int r = wm + 16 * mt + gid + 8 * (i >> 1);
                if (r >= n_rows) continue;
                float y = acc[mt][n][i];
                if (PAIR) y = gated(y, acc2[mt][n][i], a.act);
                if (a.items || a.n_head) {
                    a.out[(u64)p * a.rows + row_base + r] = y;
                } else {
                    u64 o = (u64)p * a.out_stride + row_base + r;
                    a.out[o] = a.res ? y + a.res[o] : y;
                }
            }
        }
}

#define MMA_KERNEL(NAME, PAIR, OFFS, Q6, G32)                                                                        \
    extern "C" __global__ void __launch_bounds__(128) NAME(                                                          \
        const i8* q, const float* s, const float* o, const i8* q2, const float* s2, const float* o2, int rows, int k,\
        const i8* qa, const float* da, int ab, int n_tok, u64 out_stride, const float* res, const int4* items,       \
        const int* n_items, const int* sorted, int x_pair, int k_used, int n_head, int stride, int offset,           \
        float* out, int act) {                                                                                       \
        MmaArgs a = {q,     s,       o,      q2,     s2,     o2,     rows,   k,      qa,  da,  ab,    n_tok,         \
                     out_stride, res, items, n_items, sorted, x_pair, k_used, n_head, stride, offset, out, act};     \
        levels_mma<PAIR, OFFS, Q6, G32>(a);                                                                          \
    }

// The _32 kernels: for types whose scale (and offset) spans 32 elements
// (qlayout.rs `scale_span`), one k32 mma and epilogue per two groups.
MMA_KERNEL(q8p_mma, false, false, false, false)
MMA_KERNEL(q8p_mma_o, false, true, false, false)
MMA_KERNEL(q8p_mma_pair, true, false, false, false)
MMA_KERNEL(q8p_mma_opair, true, true, false, false)
MMA_KERNEL(q8p_mma_32, false, false, false, true)
MMA_KERNEL(q8p_mma_o_32, false, true, false, true)
MMA_KERNEL(q8p_mma_pair_32, true, false, false, true)
MMA_KERNEL(q8p_mma_opair_32, true, true, false, true)
MMA_KERNEL(q6k_mma, false, false, true, false)
