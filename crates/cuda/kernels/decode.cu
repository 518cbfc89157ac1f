// Decoding in one persistent kernel. A run of one-token launches (norm_quant,
// the ternary GEMVs, attention) becomes a table of phases that every block
// walks in step, with a grid-wide barrier between phases. This module's
// source is quantize.cu, ternary.cu and attention.cu, then this file.
//
// Why: a 2B-4T token is ~270 launches that each move 0.6–9 MB, so the gaps
// between launches cost more than the bytes. Here:
// * a phase boundary is one barrier instead of a launch;
// * every block norms and quantizes a GEMV's input itself (the vector is
//   ≤ 28 KB, read from L2) instead of a launch of its own doing it once;
// * each block prefetches into L2 the weight rows it will read `look` phases
//   ahead, so DRAM keeps streaming while blocks wait at barriers (weights
//   never depend on activations).

#define PH_NQ 0
#define PH_GEMV 1
#define PH_ATT 2

// One block an SM, of 512 threads (decode_run: ≤ 128 registers a thread,
// some spilled) or 256 (decode_run_256: none spilled, half the loads in
// flight); every GEMV row is a warp's, as in ternary_gemv1.
#define DEC_WARPS_MAX 16
// Phase descriptors kept in shared memory: the current phase, the `look`
// phases whose weights are being prefetched, and one arriving (look ≤ 4).
#define DEC_RING 6
// Bytes per L2 prefetch instruction.
#define DEC_PIECE 16384
// head_dim ≤ this: attention units run with 4 accumulators a lane (the
// standalone kernel's 8 would not fit the 128 registers a thread has here).
#define DEC_ATT_D 4
#define DEC_MAX_HEAD_DIM (32 * DEC_ATT_D)

// norm_quant's arguments for one row.
struct NqArgs {
    const float* x;
    const float* w;
    float* y;
    i8* q;
    float* d;
    int* lsum;
    int ne0;
    int k_pad;
    int norm;
    float eps;
};
static_assert(sizeof(NqArgs) == 64, "NqArgs layout (tern_cuda::decode::NqArgs)");

// A ternary GEMV phase. With `fused` every block quantizes nq.x into shared
// memory first; otherwise it reads nq.q / nq.d / nq.lsum. `rows` counts
// virtual rows: (gate, up) pairs when pair_act ≥ 0, else the batch's
// matrices' rows end to end.
struct GemvArgs {
    TernaryBatch b;
    NqArgs nq;
    int fused;
    int pair_act;
    int rows;
    int k_pad;
};
static_assert(sizeof(GemvArgs) == 224, "GemvArgs layout (tern_cuda::decode::GemvArgs)");

struct Phase {
    int kind;
    int pad;
    GemvArgs g;
    AttArgs a;
};
static_assert(sizeof(Phase) == 368, "Phase layout (tern_cuda::decode::Phase)");
#define PHASE_WORDS ((int)(sizeof(Phase) / 4))

__device__ __forceinline__ u32 ld_acquire(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Every block waits here until all have arrived; their writes before it are
// visible to all after it. bar[0] counts arrivals, bar[32] (its own 128-byte
// line) is the generation the last arrival bumps. The count is back at 0
// once a barrier opens, so the words carry over from launch to launch.
__device__ __forceinline__ void grid_sync(u32* bar, u32 nblocks) {
    __syncthreads();
    if (threadIdx.x == 0) {
        u32* gen = bar + 32;
        // Read before arriving: the generation cannot move until this block arrives.
        u32 g = ld_acquire(gen);
        __threadfence();
        if (atomicAdd(bar, 1u) == nblocks - 1) {
            atomicExch(bar, 0u);
            __threadfence();
            asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(gen), "r"(g + 1) : "memory");
        } else {
            while (ld_acquire(gen) == g) {
            }
        }
        __threadfence();
    }
    __syncthreads();
}

// This block's rows of a GEMV phase: [r0, r1) of the virtual rows.
__device__ __forceinline__ void block_rows(const GemvArgs& g, int blk, int nblk, int* r0, int* r1) {
    int per = (g.rows + nblk - 1) / nblk;
    *r0 = min(g.rows, blk * per);
    *r1 = min(g.rows, *r0 + per);
}

// Virtual row `vr` as (matrix, row).
__device__ __forceinline__ void locate(const GemvArgs& g, int vr, int* mi, int* row) {
    int i = 0;
    if (g.pair_act < 0)
        while (i + 1 < g.b.n && vr >= g.b.m[i].rows) vr -= g.b.m[i++].rows;
    *mi = i;
    *row = vr;
}

__device__ __forceinline__ void l2_prefetch(const u8* p, u32 bytes) {
#if __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#else
    for (u32 o = 0; o < bytes; o += 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + o));
#endif
}

// This block's weight rows of phase `ph` into L2, in DEC_PIECE pieces spread
// over the block's threads.
__device__ __forceinline__ void prefetch_phase(const Phase& ph, int blk, int nblk) {
    if (ph.kind != PH_GEMV) return;
    const GemvArgs& g = ph.g;
    int r0, r1;
    block_rows(g, blk, nblk, &r0, &r1);
    u64 rb = (u64)(g.k_pad >> 2);
    int piece = 0, base = 0;
    for (int mi = 0; mi < g.b.n; ++mi) {
        const TernaryMat& m = g.b.m[mi];
        // Pairs read the same rows of gate and up; a batch's matrices follow each other.
        int lo = g.pair_act >= 0 ? r0 : max(r0 - base, 0);
        int hi = g.pair_act >= 0 ? r1 : min(r1 - base, m.rows);
        base += m.rows;
        if (g.pair_act >= 0 && mi > 1) break;
        if (lo >= hi) continue;
        const u8* a = m.w + (u64)lo * rb;
        u64 bytes = (u64)(hi - lo) * rb;
        for (u64 o = 0; o < bytes; o += DEC_PIECE, ++piece)
            if (piece % (int)blockDim.x == (int)threadIdx.x) l2_prefetch(a + o, (u32)min((u64)DEC_PIECE, bytes - o));
    }
}

// norm_quant of one row, by block 0 into global memory.
__device__ __forceinline__ void nq_phase(const NqArgs& n, float* xs) {
    bool vec = nq_vec(n.x, n.w, n.ne0);
    float4 wpre[ROW_UNROLL];
    nq_prefetch(n.w, n.ne0, vec, wpre);
    float d = nq_row(n.x, n.w, n.y, n.q, n.lsum, n.ne0, n.k_pad, n.norm, n.eps, xs, wpre, vec);
    if (threadIdx.x == 0) *n.d = d;
}

// A block's rows of a ternary GEMV; each warp takes every warps-th row
// of the block's range. The first row's weights are fetched before the
// input's norm chain, which they do not depend on.
__device__ __forceinline__ void gemv_phase(const GemvArgs& g, int blk, int nblk, float* xs, i8* qs, int* ls,
                                           float* sd) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    bool pair = g.pair_act >= 0;
    int r0, r1;
    block_rows(g, blk, nblk, &r0, &r1);
    int vr = r0 + warp, mi = 0, row = 0;
    uint4 wg[GEMV_UNROLL], wu[GEMV_UNROLL];
    if (vr < r1) {
        locate(g, vr, &mi, &row);
        fetch_row<GEMV_UNROLL>(g.b.m[mi], row, g.k_pad, 0, wg);
        if (pair) fetch_row<GEMV_UNROLL>(g.b.m[1], row, g.k_pad, 0, wu);
    }
    const i8* q = g.nq.q;
    const float* d = g.nq.d;
    const int* lsum = g.nq.lsum;
    if (g.fused) {
        const NqArgs& n = g.nq;
        bool vec = nq_vec(n.x, n.w, n.ne0);
        float4 wpre[ROW_UNROLL];
        nq_prefetch(n.w, n.ne0, vec, wpre);
        float dd = nq_row(n.x, n.w, blk == 0 ? n.y : nullptr, qs, ls, n.ne0, g.k_pad, n.norm, n.eps, xs, wpre, vec);
        if (threadIdx.x == 0) *sd = dd;
        __syncthreads();
        q = qs;
        d = sd;
        lsum = ls;
    }
    for (bool first = true; vr < r1; vr += warps, first = false) {
        if (!first) {
            locate(g, vr, &mi, &row);
            fetch_row<GEMV_UNROLL>(g.b.m[mi], row, g.k_pad, 0, wg);
            if (pair) fetch_row<GEMV_UNROLL>(g.b.m[1], row, g.k_pad, 0, wu);
        }
        const TernaryMat& m = g.b.m[mi];
        float y;
        row_dots<1, GEMV_UNROLL>(m, row, g.k_pad, q, d, lsum, 1, wg, &y);
        if (pair) {
            float yu;
            row_dots<1, GEMV_UNROLL>(g.b.m[1], row, g.k_pad, q, d, lsum, 1, wu, &yu);
            y = gated(y, yu, g.pair_act);
        }
        if (lane == 0) m.out[row] = m.res ? y + m.res[row] : y;
    }
}

// One token's attention: the units (KV head, split) of the active splits go
// round the blocks; a block runs (its warps) / group units side by side, each
// on its own named barrier (1..15).
__device__ __forceinline__ void att_phase(const AttArgs& a, int blk, int nblk, float* att, int* lasts) {
    int warp = threadIdx.x >> 5;
    int group = a.n_head / a.n_head_kv, per = min((int)(blockDim.x >> 5) / group, 15);
    int slot = warp / group;
    if (slot >= per) return;
    AttUnit u = {warp % group, (int)threadIdx.x - slot * group * 32, group * 32, 1 + slot};
    int n_active = (a.pos[0] + a.split) / a.split;
    int units = a.n_head_kv * n_active;
    for (int un = blk * per + slot; un < units; un += nblk * per)
        attention_unit<DEC_ATT_D>(a, un % a.n_head_kv, 0, un / a.n_head_kv, u, att + slot * group * a.head_dim, lasts + slot,
                       false);
}

// grid: one block per SM (all resident: the barriers need every block).
// block: 512 or 256 threads (the two entry points below). bar: 64 words, zero at first use. Dynamic shared
// memory: DEC_RING descriptors, then the staged input row (ne0_max floats),
// its int8 levels (k_pad_max) and lane sums (k_pad_max / 64 ints), then
// DEC_WARPS_MAX · DEC_MAX_HEAD_DIM floats of attention q heads.
__device__ __forceinline__ void decode_body(const Phase* phases, int n, u32* bar, int look, int ne0_max,
                                            int k_pad_max) {
    extern __shared__ __align__(16) u8 dsm[];
    __shared__ float sd;
    __shared__ int lasts[16];
    Phase* ring = (Phase*)dsm;
    float* xs = (float*)(dsm + DEC_RING * sizeof(Phase));
    i8* qs = (i8*)(xs + ((ne0_max + 3) & ~3));
    int* ls = (int*)(qs + k_pad_max);
    float* att = (float*)(ls + k_pad_max / 64);
    int blk = blockIdx.x, nblk = gridDim.x;
    look = max(0, min(look, DEC_RING - 2));
    const u32* src = (const u32*)phases;
    // Descriptors 0..look now, and phases 0..look-1's weights into L2: the
    // table and the weights never depend on the previous kernel.
    for (int i = threadIdx.x; i < min(look + 1, n) * PHASE_WORDS; i += blockDim.x) {
        int p = i / PHASE_WORDS;
        ((u32*)(ring + p % DEC_RING))[i % PHASE_WORDS] = src[i];
    }
    __syncthreads();
    for (int p = 0; p < min(look, n); ++p) prefetch_phase(ring[p % DEC_RING], blk, nblk);
    pdl_wait();
    for (int p = 0; p < n; ++p) {
        if (p + look < n) prefetch_phase(ring[(p + look) % DEC_RING], blk, nblk);
        // Descriptor p + look + 1 is loaded now and stored at the phase's end,
        // into the slot of phase p − 1, which no thread reads any more.
        int next = p + look + 1;
        bool carry = next < n && (int)threadIdx.x < PHASE_WORDS;
        u32 word = carry ? src[(u64)next * PHASE_WORDS + threadIdx.x] : 0;
        if (p == n - 1) pdl_launch();
        const Phase& ph = ring[p % DEC_RING];
        if (ph.kind == PH_GEMV) {
            gemv_phase(ph.g, blk, nblk, xs, qs, ls, &sd);
        } else if (ph.kind == PH_ATT) {
            att_phase(ph.a, blk, nblk, att, lasts);
        } else if (blk == 0) {
            nq_phase(ph.g.nq, xs);
        }
        if (carry) ((u32*)(ring + next % DEC_RING))[threadIdx.x] = word;
        if (p + 1 < n) grid_sync(bar, nblk);
    }
}

extern "C" __global__ void __launch_bounds__(512, 1) decode_run(const Phase* phases, int n, u32* bar, int look,
                                                               int ne0_max, int k_pad_max) {
    decode_body(phases, n, bar, look, ne0_max, k_pad_max);
}

extern "C" __global__ void __launch_bounds__(256, 1) decode_run_256(const Phase* phases, int n, u32* bar, int look,
                                                                   int ne0_max, int k_pad_max) {
    decode_body(phases, n, bar, look, ne0_max, k_pad_max);
}
