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

// One block an SM of 256 threads: up to 255 registers a thread hold a GEMV
// row's activations and two rows of weights (512 threads, at 128
// registers, spilled and ran 25–30% slower on an H100). Every GEMV row is a
// warp's, as in ternary_gemv1.
#define DEC_THREADS 256
#define DEC_WARPS_MAX 8
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
__device__ __forceinline__ u64 now_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// `done` (optional, tracing): where thread 0 stamps the block's arrival.
// The arrival is a release and the wait an acquire, both at GPU scope, with
// no full fences: bar.sync orders the block's other threads around them.
__device__ __forceinline__ void grid_sync(u32* bar, u32 nblocks, u64* done) {
    __syncthreads();
    if (threadIdx.x == 0) {
        if (done) *done = now_ns();
        u32* gen = bar + 32;
        // Read before arriving: the generation cannot move until this block arrives.
        u32 g = ld_acquire(gen);
        u32 arrived;
        asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], 1;" : "=r"(arrived) : "l"(bar) : "memory");
        if (arrived == nblocks - 1) {
            // Everyone has arrived: nobody touches the count until the new generation shows.
            asm volatile("st.relaxed.gpu.global.u32 [%0], 0;" ::"l"(bar) : "memory");
            asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(gen), "r"(g + 1) : "memory");
        } else {
            while (ld_acquire(gen) == g) {
            }
        }
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

// This block's weight rows of GEMV phase `ph` into L2, in DEC_PIECE pieces
// spread over the block's threads.
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
    nq_prefetch(n.w, n.ne0, n.k_pad, vec, wpre);
    float d = nq_row(n.x, n.w, n.y, n.q, n.lsum, n.ne0, n.k_pad, n.norm, n.eps, xs, wpre, vec);
    if (threadIdx.x == 0) *n.d = d;
}

// What a warp's row needs besides the dot: the row scale(s) and the residual,
// loaded before the dot so their latency hides behind it.
struct RowEnds {
    float sg, su, res;
};

__device__ __forceinline__ RowEnds row_ends(const GemvArgs& g, int mi, int row, bool pair) {
    const TernaryMat& m = g.b.m[mi];
    RowEnds e;
    e.sg = m.groups == 1 ? m.scales[row] : 1.0f;
    e.su = pair && g.b.m[1].groups == 1 ? g.b.m[1].scales[row] : 1.0f;
    e.res = m.res ? m.res[row] : 0.0f;
    return e;
}

// The weights and row ends of virtual row `vr`.
template <int U>
__device__ __forceinline__ void fetch_vrow(const GemvArgs& g, int vr, bool pair, int* mi, int* row, uint4* wg,
                                           uint4* wu, RowEnds* e) {
    locate(g, vr, mi, row);
    fetch_row<U>(g.b.m[*mi], *row, g.k_pad, 0, wg);
    if (pair) fetch_row<U>(g.b.m[1], *row, g.k_pad, 0, wu);
    *e = row_ends(g, *mi, *row, pair);
}

// chunk_dot with the activations in registers: a[j] is the j-th 16 bytes of
// this lane's block of the chunk.
__device__ __forceinline__ int chunk_dot_regs(uint4 wv, const int4* a) {
    const u32 w[4] = {wv.x, wv.y, wv.z, wv.w};
    int s = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int aw[4] = {a[j].x, a[j].y, a[j].z, a[j].w};
#pragma unroll
        for (int b = 0; b < 4; ++b) s = dp4a_us((w[j] >> (2 * b)) & M2, aw[b], s);
    }
    return s;
}

// The activations a lane pairs with its weight slots, loaded once a phase:
// chunk cs + 8u, lane block tig, and that block's sum.
template <int U>
struct LaneActs {
    int4 a[U][4];
    int ls[U];
};

template <int U>
__device__ __forceinline__ void lane_acts(const i8* q, const int* lsum, int k_pad, LaneActs<U>* la) {
    int lane = threadIdx.x & 31, tig = lane & 3, cs = lane >> 2, n_chunks = k_pad >> 8;
#pragma unroll
    for (int u = 0; u < U; ++u) {
        int c = cs + 8 * u;
        bool in = c < n_chunks;
#pragma unroll
        for (int j = 0; j < 4; ++j)
            la->a[u][j] = in ? ((const int4*)(q + c * 256 + tig * 64))[j] : make_int4(0, 0, 0, 0);
        la->ls[u] = in ? lsum[c * 4 + tig] : 0;
    }
}

// Row `row` of `m` (at most 8·U chunks, fetched into wv) against the lane's
// activations, before the row scale and d: per-chunk scales are applied.
template <int U>
__device__ __forceinline__ float row_dot_regs(const TernaryMat& m, int row, int k_pad, const uint4* wv,
                                              const LaneActs<U>& la) {
    int cs = (threadIdx.x & 31) >> 2, n_chunks = k_pad >> 8;
    int acc = 0;
    float facc = 0.0f;
#pragma unroll
    for (int u = 0; u < U; ++u) {
        int c = cs + 8 * u;
        if (c >= n_chunks) break;
        int s = chunk_dot_regs(wv[u], la.a[u]) - la.ls[u];
        if (m.groups == 1)
            acc += s;
        else
            facc += (float)s * m.scales[(u64)row * m.groups + c];
    }
    return m.groups == 1 ? (float)warp_sum_i(acc) : warp_sum(facc);
}

// A block's rows of a ternary GEMV (k_pad ≤ 2048·U); each warp takes every
// warps-th row of the block's range. Every row's loads go out one row ahead
// (the first before the input's norm chain, which they do not depend on),
// and the activations sit in registers: the row loop reads no shared memory.
template <int U>
__device__ __forceinline__ void gemv_rows(const GemvArgs& g, int blk, int nblk, float* xs, i8* qs, int* ls,
                                          u64* mid) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    bool pair = g.pair_act >= 0;
    int r0, r1;
    block_rows(g, blk, nblk, &r0, &r1);
    int vr = r0 + warp, mi = 0, row = 0;
    uint4 wg[U], wu[U];
    RowEnds e = {1.0f, 1.0f, 0.0f};
    if (vr < r1) fetch_vrow<U>(g, vr, pair, &mi, &row, wg, wu, &e);
    const i8* q = g.nq.q;
    const int* lsum = g.nq.lsum;
    float d;
    if (g.fused) {
        const NqArgs& n = g.nq;
        bool vec = nq_vec(n.x, n.w, n.ne0);
        float4 wpre[ROW_UNROLL];
        nq_prefetch(n.w, n.ne0, g.k_pad, vec, wpre);
        d = nq_row(n.x, n.w, blk == 0 ? n.y : nullptr, qs, ls, n.ne0, g.k_pad, n.norm, n.eps, xs, wpre, vec,
                   mid ? mid + 2 : nullptr);
        __syncthreads();
        if (mid && threadIdx.x == 0) *mid = now_ns();
        q = qs;
        lsum = ls;
    } else {
        d = __ldcg(g.nq.d);
    }
    if (vr >= r1) return;
    LaneActs<U> la;
    lane_acts<U>(q, lsum, g.k_pad, &la);
    while (vr < r1) {
        int nvr = vr + warps, nmi = 0, nrow = 0;
        uint4 ng[U], nu[U];
        RowEnds ne = e;
        if (nvr < r1) fetch_vrow<U>(g, nvr, pair, &nmi, &nrow, ng, nu, &ne);
        const TernaryMat& m = g.b.m[mi];
        float y = row_dot_regs<U>(m, row, g.k_pad, wg, la) * e.sg * d;
        if (pair) y = gated(y, row_dot_regs<U>(g.b.m[1], row, g.k_pad, wu, la) * e.su * d, g.pair_act);
        if (lane == 0) m.out[row] = m.res ? y + e.res : y;
#pragma unroll
        for (int u = 0; u < U; ++u) {
            wg[u] = ng[u];
            wu[u] = nu[u];
        }
        e = ne;
        mi = nmi;
        row = nrow;
        vr = nvr;
    }
}

// Rows of up to 16 chunks (k_pad ≤ 4096) take two fetch slots, longer ones four.
__device__ __forceinline__ void gemv_phase(const GemvArgs& g, int blk, int nblk, float* xs, i8* qs, int* ls,
                                           u64* mid) {
    if (g.k_pad <= 4096)
        gemv_rows<2>(g, blk, nblk, xs, qs, ls, mid);
    else
        gemv_rows<GEMV_UNROLL>(g, blk, nblk, xs, qs, ls, mid);
}

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

// One token's attention: the units (KV head, split) of the active splits go
// round the blocks; a block runs (its warps) / group units side by side, each
// on its own named barrier (1..15).
__device__ __forceinline__ void att_phase(const AttArgs& a, int blk, int nblk, float* att, int* lasts, Angles* an,
                                          const int* pos, int pos0) {
    // The kernel read the token's position at its start; another positions
    // tensor is read here.
    int p = a.pos == pos ? pos0 : a.pos[0];
    if (a.r.on) angles_for(a, p, an);
    int warp = threadIdx.x >> 5;
    int group = a.n_head / a.n_head_kv, per = min((int)(blockDim.x >> 5) / group, 15);
    int slot = warp / group;
    if (slot >= per) return;
    AttUnit u = {warp % group, (int)threadIdx.x - slot * group * 32, group * 32, 1 + slot};
    int n_active = (p + a.split) / a.split;
    int units = a.n_head_kv * n_active;
    for (int un = blk * per + slot; un < units; un += nblk * per)
        attention_unit<DEC_ATT_D>(a, un % a.n_head_kv, 0, un / a.n_head_kv, u, att + slot * group * a.head_dim,
                                  lasts + slot, false, a.r.on ? an->cs : nullptr, p);
}

// grid: one block per SM (all resident: the barriers need every block).
// block: DEC_THREADS. bar: 64 words, zero at first use. Dynamic shared
// memory: DEC_RING descriptors, then the staged input row (ne0_max floats),
// its int8 levels (k_pad_max) and lane sums (k_pad_max / 64 ints), then
// DEC_WARPS_MAX · DEC_MAX_HEAD_DIM floats of attention q heads. trace
// (optional, TERN_CUDA_FUSE_TRACE): [phase][block] (start, done) times in ns.
extern "C" __global__ void __launch_bounds__(DEC_THREADS, 1) decode_run(const Phase* phases, int n, u32* bar, int look,
                                                                       int ne0_max, int k_pad_max, u64* trace,
                                                                       const int* pos) {
    extern __shared__ __align__(16) u8 dsm[];
    __shared__ int lasts[16];
    __shared__ Angles angles;
    Phase* ring = (Phase*)dsm;
    float* xs = (float*)(dsm + DEC_RING * sizeof(Phase));
    i8* qs = (i8*)(xs + ((ne0_max + 3) & ~3));
    int* ls = (int*)(qs + k_pad_max);
    float* att = (float*)(ls + k_pad_max / 64);
    int blk = blockIdx.x, nblk = gridDim.x;
    if (threadIdx.x == 0) angles.pos = -1;
    look = max(0, min(look, DEC_RING - 2));
    const u32* src = (const u32*)phases;
    // Descriptors 0..look now, and phases 0..look-1's weights into L2: the
    // table and the weights never depend on the previous kernel.
    for (int i = threadIdx.x; i < min(look + 1, n) * PHASE_WORDS; i += blockDim.x) {
        int p = i / PHASE_WORDS;
        ((u32*)(ring + p % DEC_RING))[i % PHASE_WORDS] = src[i];
    }
    // Positions are inputs, written before the graph's first kernel.
    int pos0 = pos ? pos[0] : 0;
    __syncthreads();
    for (int p = 0; p < min(look, n); ++p) prefetch_phase(ring[p % DEC_RING], blk, nblk);
    pdl_wait();
    for (int p = 0; p < n; ++p) {
        if (trace && threadIdx.x == 0) trace[((u64)p * nblk + blk) * 4] = now_ns();
        if (p + look < n) prefetch_phase(ring[(p + look) % DEC_RING], blk, nblk);
        // Descriptor p + look + 1 is loaded now and stored at the phase's end,
        // into the slot of phase p − 1, which no thread reads any more.
        int next = p + look + 1;
        bool carry = next < n && (int)threadIdx.x < PHASE_WORDS;
        u32 word = carry ? src[(u64)next * PHASE_WORDS + threadIdx.x] : 0;
        if (p == n - 1) pdl_launch();
        u64* stamp = trace ? trace + ((u64)p * nblk + blk) * 4 : nullptr;
        const Phase& ph = ring[p % DEC_RING];
        if (ph.kind == PH_GEMV) {
            gemv_phase(ph.g, blk, nblk, xs, qs, ls, stamp ? stamp + 1 : nullptr);
        } else if (ph.kind == PH_ATT) {
            att_phase(ph.a, blk, nblk, att, lasts, &angles, pos, pos0);
        } else if (blk == 0) {
            nq_phase(ph.g.nq, xs);
        }
        if (carry) ((u32*)(ring + next % DEC_RING))[threadIdx.x] = word;
        if (p + 1 < n) {
            grid_sync(bar, nblk, stamp ? stamp + 2 : nullptr);
        } else if (stamp) {
            __syncthreads();
            if (threadIdx.x == 0) stamp[2] = now_ns();
        }
    }
}
