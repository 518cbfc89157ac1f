// Decoding in one persistent kernel. A run of one-token launches (norm_quant,
// the ternary GEMVs, attention) becomes a table of phases that every block
// walks in step, with a grid-wide barrier between phases. This module's
// source is quantize.cu, ternary.cu and attention.cu, then this file.
//
// Why: a 2B-4T token is ~270 launches that each move 0.6–9 MB, so the gaps
// between launches cost more than the bytes. Here:
// * a phase boundary is one barrier (a counter every block adds to once and
//   waits on: one trip to L2 and back) instead of a launch;
// * weights never depend on activations, so each block copies its rows of
//   the phases ahead into a ring in shared memory (bulk copies completing on
//   an mbarrier, issued by thread 0 while it waits at barriers): a GEMV reads
//   its weights from shared memory, and DRAM streams while blocks wait;
// * every block norms and quantizes a GEMV's input itself, from the row's
//   sum of squares and weighted absmax that the phase writing the row left
//   behind (a partial per block): no block reductions on the critical path.

#define PH_NQ 0
#define PH_GEMV 1
#define PH_ATT 2

// One block an SM of 256 threads, with up to 255 registers a thread (an
// earlier 512-thread version, at 128 registers, spilled and ran 25–30%
// slower on an H100). A GEMV's rows go to the warps in tiles of 16.
#define DEC_THREADS 256
#define DEC_WARPS_MAX 8
// Phase descriptors kept in shared memory: the current phase, the `look`
// phases ahead, and one arriving (look ≤ 4).
#define DEC_RING 6
// head_dim ≤ this: attention units run with 4 accumulators a lane (the
// standalone kernel's 8 would crowd the registers the rest needs).
#define DEC_ATT_D 4
#define DEC_MAX_HEAD_DIM (32 * DEC_ATT_D)
// GEMV phases whose weights may be in the shared-memory ring at once (one
// mbarrier each).
#define WR_SLOTS 8
// Blocks the statistics slots have room for (tern_cuda::decode::STAT_BLOCKS).
#define STAT_BLOCKS 1024
// Float4 words of a row a thread quantizes from statistics in registers:
// k_pad ≤ 4 · NQS_WORDS · DEC_THREADS.
#define NQS_WORDS 8

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

// A ternary GEMV phase. `fused`: 0 reads nq.q / nq.d / nq.lsum; 1 has every
// block norm and quantize nq.x into shared memory with block reductions; 2
// the same from the statistics slot `stat_in`. `rows` counts virtual rows:
// (gate, up) pairs when pair_act ≥ 0, else the batch's matrices' rows end
// to end. `stat_out` ≥ 0: each block leaves (Σ out², max |out · stat_w|) of
// the rows it wrote in that slot, for the next phase's norm (stat_w null:
// an unweighted norm). An attention phase uses stat_w / stat_out alone.
struct GemvArgs {
    TernaryBatch b;
    NqArgs nq;
    const float* stat_w;
    int fused;
    int pair_act;
    int rows;
    int k_pad;
    int stat_out;
    int stat_in;
};
static_assert(sizeof(GemvArgs) == 240, "GemvArgs layout (tern_cuda::decode::GemvArgs)");

struct Phase {
    int kind;
    int pad;
    GemvArgs g;
    AttArgs a;
};
static_assert(sizeof(Phase) == 384, "Phase layout (tern_cuda::decode::Phase)");
#define PHASE_WORDS ((int)(sizeof(Phase) / 4))

// What the producer needs of a GEMV phase, in the order of the GEMV phases
// (tern_cuda::decode::Copy): the table holds them after the phases, and each
// block keeps them in shared memory, so that refilling the ring reads no
// global memory while the block waits at a barrier.
struct Copy {
    const u8* w[3];
    int rows[3];
    int n;
    int vrows;
    int k_pad;
    int pair;
    int pad;
};
static_assert(sizeof(Copy) == 56, "Copy layout (tern_cuda::decode::Copy)");
#define COPY_WORDS ((int)(sizeof(Copy) / 4))

// The words in front of a table (tern_cuda::decode::HEADER_BYTES): the
// barrier counter (word 0), the launch count and the blocks done with this
// launch (words 32 and 48, on their own line), then two statistics slots of
// STAT_BLOCKS float2 from byte 256.
// Trace stamps per (phase, block), 8 u64 (tern_cuda::decode::trace_summary):
// start, input quantized, done, input staged, weights ready, rows done,
// ring refilled.
#define TR_START 0
#define TR_QUANT 1
#define TR_DONE 2
#define TR_STAGED 3
#define TR_READY 4
#define TR_ROWS 5
#define TR_ISSUED 6
// Phase 0 only: the kernel's entry.
#define TR_ENTRY 7
#define TR_SLOTS 8

#define BAR_EPOCH 32
#define BAR_DONE 48
#define STATS_AT 64
// Then, from word ROWS_AT, two slots of ROW_MAX floats: the rows those
// writers also leave multiplied by the next norm's weight.
#define ROWS_AT (STATS_AT + 2 * STAT_BLOCKS * 2)
#define ROW_MAX 8192

__device__ __forceinline__ u32 ld_acquire(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ u64 now_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ u32 smem_addr(const void* p) {
    return (u32)__cvta_generic_to_shared(p);
}

// The weight ring's mbarriers and each in-flight phase's segment: its
// offset in the ring and its end in bytes issued since the launch began.
struct WRing {
    u64 mbar[WR_SLOTS];
    u32 seg[WR_SLOTS];
    u32 end[WR_SLOTS];
};

// The producer thread's state: GEMV phases issued and freed, and bytes
// issued and freed (monotonic; ring offsets are these mod cap).
// `done` of `size` bytes of the last segment started (index issued − 1)
// are copied; done == size once it is all under way.
struct Producer {
    u32 issued, freed, head, tail, done, size;
};

// The ring needs the bulk copy engine and transaction-counting mbarriers
// (sm_90); the backend runs decode_run on such devices only, and the other
// architectures' builds trap if it ever starts there.
#if __CUDA_ARCH__ >= 900
#define SM90(...) __VA_ARGS__
#else
#define SM90(...) __trap()
#endif

__device__ __forceinline__ void mbar_init(u64* m) {
    SM90(asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(m)) : "memory"));
}

// A spinning wait that has not ended in two seconds is a bug (a barrier
// some block never reaches, a copy never issued): trap, so that the launch
// fails with an error instead of hanging the GPU.
struct SpinGuard {
    u32 it = 0;
    u64 t0 = 0;
    __device__ __forceinline__ void tick() {
        if ((++it & 1023) != 0) return;
        u64 t = now_ns();
        if (t0 == 0)
            t0 = t;
        else if (t - t0 > 2000000000ull)
            __trap();
    }
};

__device__ __forceinline__ void mbar_wait(u64* m, u32 parity) {
    u32 a = smem_addr(m), ok;
    SpinGuard guard;
    do {
        guard.tick();
        SM90(asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
            : "=r"(ok)
            : "r"(a), "r"(parity)
            : "memory"));
    } while (!ok);
}

// Bytes from global to shared memory on the copy engine; `m` counts them.
__device__ __forceinline__ void bulk_copy(u8* dst, const u8* src, u32 bytes, u64* m) {
    // Pieces of at most 32 KiB: one bulk copy's size is a 32-bit count, but
    // smaller pieces start streaming sooner.
    for (u32 o = 0; o < bytes; o += 32768) {
        u32 n = min(32768u, bytes - o);
        SM90(asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                smem_addr(dst + o)),
            "l"(src + o), "r"(n), "r"(smem_addr(m))
            : "memory"));
    }
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

// Bytes [from, to) (multiples of 16) of copy c's segment for block rows
// [r0, r1) to `dst`. A segment's rows lie as the virtual rows go: pairs
// have rows r0..r1 of gate, then of up; in a batch, matrix i holds virtual
// rows [base, base + rows).
__device__ void copy_span(const Copy& c, int r0, int r1, u8* dst, u32 from, u32 to, u64* m) {
    u32 rb = (u32)(c.k_pad >> 2), at = 0;
    int base = 0;
    for (int i = 0; i < (c.pair ? 2 : c.n); ++i) {
        int l0 = c.pair ? r0 : max(r0 - base, 0), l1 = c.pair ? r1 : min(r1 - base, c.rows[i]);
        base += c.rows[i];
        if (l0 >= l1) continue;
        u32 len = (u32)(l1 - l0) * rb, x = max(from, at), y = min(to, at + len);
        if (x < y) bulk_copy(dst + x, c.w[i] + (u64)l0 * rb + (x - at), y - x, m);
        at += len;
    }
}

// The producer (one thread): the weight rows of the next GEMV phases into
// the ring while they fit (space and mbarriers), a segment never wrapping.
// At most `budget` bytes a call (~0u: no limit), so that 132 blocks do not
// ask DRAM for a whole large segment at the same barrier; segments up to
// index `must` (the next GEMV phase's) are finished regardless.
__device__ void issue_ahead(const Copy* copies, int n_copies, Producer* pr, WRing* wr, u8* ring, u32 cap, int blk,
                            int nblk, u32 budget, u32 must) {
    for (;;) {
        if (pr->done < pr->size) {
            u32 idx = pr->issued - 1, slot = idx % WR_SLOTS;
            const Copy& c = copies[idx];
            int per = (c.vrows + nblk - 1) / nblk;
            int r0 = min(c.vrows, blk * per), r1 = min(c.vrows, r0 + per);
            u32 lim = idx <= must ? pr->size : pr->done + min(budget, pr->size - pr->done);
            if (lim == pr->done) return;
            copy_span(c, r0, r1, ring + wr->seg[slot], pr->done, lim, &wr->mbar[slot]);
            budget -= min(budget, lim - pr->done);
            pr->done = lim;
            if (pr->done < pr->size) return;
            continue;
        }
        if ((int)pr->issued >= n_copies || pr->issued - pr->freed >= WR_SLOTS) return;
        if (pr->issued > must && budget == 0) return;
        const Copy& c = copies[pr->issued];
        int per = (c.vrows + nblk - 1) / nblk;
        int r0 = min(c.vrows, blk * per), r1 = min(c.vrows, r0 + per);
        u32 bytes = (u32)(r1 - r0) * (u32)(c.k_pad >> 2) * (c.pair ? 2u : 1u);
        // An empty ring starts again at offset 0: a segment that does not fit
        // before the end would otherwise wait for the space behind it forever.
        if (pr->tail == pr->head) pr->head = pr->tail = (pr->head + cap - 1) / cap * cap;
        u32 start = pr->head, off = start % cap;
        if (off + bytes > cap) {
            start += cap - off;
            off = 0;
        }
        if (start + bytes - pr->tail > cap) return;
        u32 slot = pr->issued % WR_SLOTS;
        u64* m = &wr->mbar[slot];
        wr->seg[slot] = off;
        wr->end[slot] = start + bytes;
        if (bytes == 0) {
            SM90(asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(m)) : "memory"));
        } else {
            SM90(asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(m)),
                              "r"(bytes)
                              : "memory"));
        }
        pr->head = start + bytes;
        pr->done = 0;
        pr->size = bytes;
        ++pr->issued;
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
    // From L2: other blocks wrote the residual row during this launch.
    e.res = m.res ? __ldcg(m.res + row) : 0.0f;
    return e;
}

// The row statistics the writers of a row left in `st` (a float2 per
// block: Σ x², max |x · w|), reduced by warp 0 in a fixed order (the same
// result in every run) and shared through shared memory: the others wait at
// the next block barrier. Each lane's loads go out together: a loop of one
// load at a time paid an L2 round trip per 32 blocks.
__device__ __forceinline__ void reduce_stats(const float2* st, int nblk, double* ss, float* am) {
    if (threadIdx.x >= 32) return;
    int lane = threadIdx.x;
    double s = 0.0;
    float a = 0.0f;
    for (int i0 = 0; i0 < nblk; i0 += 256) {
        float2 v[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            int i = i0 + lane + 32 * k;
            v[k] = i < nblk ? __ldcg(st + i) : make_float2(0.0f, 0.0f);
        }
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            s += (double)v[k].x;
            a = fmaxf(a, v[k].y);
        }
    }
    s = warp_reduce(s, Sum());
    a = warp_max(a);
    if (lane == 0) {
        *ss = s;
        *am = a;
    }
}

// nq_row for a row whose statistics are known and whose writers also left
// it multiplied by the norm weight (`xw`): each thread loads its words of
// the permuted layout and norms and quantizes them with no reduction and no
// norm weight to fetch. The order is (x·w)·inv where the CPU has (x·inv)·w,
// and the scale comes from max |x·w| · inv, so a level can round to 128
// where the CPU gives 127 (clamped). Returns d = 1/s_a.
__device__ __forceinline__ float nq_from_stats(const NqArgs& n, const float* xw, const float2* st, int nblk,
                                               float* yr, i8* qr, int* ls) {
    int nw = n.k_pad >> 2, stride = blockDim.x;
    float4 v[NQS_WORDS];
#pragma unroll
    for (int u = 0; u < NQS_WORDS; ++u) {
        int i = threadIdx.x + u * stride, base = i < nw ? permuted_base(i) : n.ne0;
        v[u] = base < n.ne0 ? __ldcg((const float4*)(xw + base)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    __shared__ double red_ss;
    __shared__ float red_am;
    reduce_stats(st, nblk, &red_ss, &red_am);
    __syncthreads();
    double ss = red_ss;
    float am = red_am;
    float inv = n.norm ? (float)(1.0 / sqrt(ss / n.ne0 + (double)n.eps)) : 1.0f;
    float sa = 127.0f / fmaxf(am * inv, 1e-5f), unused = 0.0f;
#pragma unroll
    for (int u = 0; u < NQS_WORDS; ++u) {
        int i = threadIdx.x + u * stride;
        // nw is a multiple of 64: whole warps leave together, and each
        // 16-word lane block is one half-warp for the sums.
        if (i >= nw) break;
        int base = permuted_base(i), sum = 0;
        float4 y = weigh4(v[u], n.norm, inv, false, v[u], &unused);
        if (yr && base < n.ne0) *(float4*)(yr + base) = y;
        ((u32*)qr)[i] = quant4(y, sa, &sum);
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if ((i & 15) == 0) ls[i >> 4] = sum;
    }
    return 1.0f / sa;
}

// Writes this block's statistics of the rows it wrote: each warp's (Σ y²,
// max |y·w|) summed in warp order by thread 0.
__device__ __forceinline__ void put_stats(float2* out, int blk, float ss, float am) {
    __shared__ float2 wred[DEC_WARPS_MAX];
    int warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    if ((threadIdx.x & 31) == 0) wred[warp] = make_float2(ss, am);
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0.0;
        float a = 0.0f;
        for (int i = 0; i < warps; ++i) {
            s += (double)wred[i].x;
            a = fmaxf(a, wred[i].y);
        }
        out[blk] = make_float2((float)s, a);
    }
}

// Row tiles of 16 a block's GEMV rows may take, times the warps a tile's
// chunks split over (tern_cuda::decode::MAX_BLOCK_ROWS: 256 rows, so 16
// tiles, 32 for pairs).
#define MMA_ITEMS 32

// One warp's part of a 16-row tile: rows `rows` (16 rows of `rb` bytes in
// shared memory, `valid` of them real), chunks [c0, c1), against the
// activations `q` (shared). Tensor cores do the dot products: the m16n8k32
// A fragment of thread (g, tig) is lane block tig of rows g and g + 8 (the
// layout's 16-byte vectors), and bits 2j..2j+1 of its bytes pair with
// activation word 4w + j of the block. Masking plane j in place (no shift)
// leaves codes times 4^j, so each plane accumulates apart and the planes
// are summed as acc_j / 4^j at the end: one LOP3 per four weights. Only
// column 0 of the product is used (one token); lanes g ≠ 0 feed the unused
// columns. Returns Σ c·q over the chunks for rows g (.x) and g + 8 (.y), in
// the lanes with tig = 0.
__device__ __forceinline__ int2 tile_dot(const u8* rows, u32 rb, int valid, const i8* q, int c0, int c1) {
    int lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    int acc[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[j][r] = 0;
    bool lo_in = g < valid, hi_in = g + 8 < valid;
    const u8* rlo = rows + (u64)g * rb + tig * 16;
    const u8* rhi = rlo + 8 * (u64)rb;
    for (int c = c0; c < c1; ++c) {
        uint4 wl = lo_in ? *(const uint4*)(rlo + c * 64) : make_uint4(0, 0, 0, 0);
        uint4 wh = hi_in ? *(const uint4*)(rhi + c * 64) : make_uint4(0, 0, 0, 0);
        const uint4* ap = (const uint4*)(q + c * 256 + tig * 64);
        const uint4 a4[4] = {ap[0], ap[1], ap[2], ap[3]};
        const u32 act[16] = {a4[0].x, a4[0].y, a4[0].z, a4[0].w, a4[1].x, a4[1].y, a4[1].z, a4[1].w,
                             a4[2].x, a4[2].y, a4[2].z, a4[2].w, a4[3].x, a4[3].y, a4[3].z, a4[3].w};
        const u32 lw[4] = {wl.x, wl.y, wl.z, wl.w}, hw[4] = {wh.x, wh.y, wh.z, wh.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            u32 mask = M2 << (2 * j);
#pragma unroll
            for (int w = 0; w < 4; w += 2)
                mma_u8s8(acc[j], lw[w] & mask, hw[w] & mask, lw[w + 1] & mask, hw[w + 1] & mask, act[4 * w + j],
                         act[4 * (w + 1) + j]);
        }
    }
    // Column 0 is c0 (row g) and c2 (row g + 8) of the lanes with tig = 0;
    // plane j's sums are multiples of 4^j, so the shifts are exact.
    int lo = acc[0][0] + (acc[1][0] >> 2) + (acc[2][0] >> 4) + (acc[3][0] >> 6);
    int hi = acc[0][2] + (acc[1][2] >> 2) + (acc[2][2] >> 4) + (acc[3][2] >> 6);
    return make_int2(lo, hi);
}

// A block's rows of a ternary GEMV with its weights in the ring (`wsm`,
// complete once mbarrier `m` passes `parity`). The rows go in tiles of 16
// (pairs: the gate tiles, then the up tiles); with fewer tiles than warps a
// tile's chunks split over several warps, whose integer sums add exactly.
// Thread i then finishes row i: it loaded the row's ends (scales, residual,
// next norm's weight) at the phase's start, so no row waits on a load. A
// phase that leaves statistics also leaves its rows times the next norm's
// weight in `xw_rows`.
__device__ __forceinline__ void gemv_phase(const GemvArgs& g, int blk, int nblk, const u8* wsm, u64* m, u32 parity,
                                           float* xs, i8* qs, int* ls, float2* stats, float* xw_rows, u64* tr) {
    __shared__ int part[MMA_ITEMS][16];
    __shared__ int tsum;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    bool pair = g.pair_act >= 0;
    bool stamp = tr && threadIdx.x == 0;
    int r0, r1;
    block_rows(g, blk, nblk, &r0, &r1);
    int nrows = r1 - r0;
    u32 rb = (u32)(g.k_pad >> 2);
    RowEnds mine = {1.0f, 1.0f, 0.0f};
    float msw = 1.0f;
    int mi = 0, row = 0;
    if ((int)threadIdx.x < nrows) {
        locate(g, r0 + threadIdx.x, &mi, &row);
        mine = row_ends(g, mi, row, pair);
        if (g.stat_w) msw = __ldg(g.stat_w + row);
    }
    const i8* q = g.nq.q;
    const int* lsum = g.nq.lsum;
    float d;
    if (g.fused == 2) {
        d = nq_from_stats(g.nq, xw_rows + g.stat_in * ROW_MAX, stats + g.stat_in * STAT_BLOCKS, nblk,
                          blk == 0 ? g.nq.y : nullptr, qs, ls);
        if (stamp) tr[TR_STAGED] = now_ns();
    } else if (g.fused == 1) {
        const NqArgs& n = g.nq;
        bool vec = nq_vec(n.x, n.w, n.ne0);
        float4 wpre[ROW_UNROLL];
        nq_prefetch(n.w, n.ne0, g.k_pad, vec, wpre);
        d = nq_row(n.x, n.w, blk == 0 ? n.y : nullptr, qs, ls, n.ne0, g.k_pad, n.norm, n.eps, xs, wpre, vec,
                   tr ? tr + TR_STAGED : nullptr);
    } else {
        // The levels another phase wrote: into shared memory, from L2.
        d = __ldcg(g.nq.d);
        for (int i = threadIdx.x; i < g.k_pad / 16; i += blockDim.x) ((uint4*)qs)[i] = __ldcg((const uint4*)q + i);
        for (int i = threadIdx.x; i < g.k_pad / 64; i += blockDim.x) ls[i] = __ldcg(lsum + i);
    }
    __syncthreads();
    if (stamp) tr[TR_QUANT] = now_ns();
    if (warp == 0) {
        int t = 0;
        for (int i = lane; i < g.k_pad / 64; i += 32) t += ls[i];
        t = warp_sum_i(t);
        if (lane == 0) tsum = t;
    }
    mbar_wait(m, parity);
    if (stamp) tr[TR_READY] = now_ns();
    int nt = (nrows + 15) >> 4, tiles = pair ? 2 * nt : nt;
    int kparts = tiles == 0 || tiles >= warps ? 1 : warps / tiles, items = tiles * kparts;
    int n_chunks = g.k_pad >> 8;
    for (int it = warp; it < items; it += warps) {
        int tile = it / kparts, kp = it % kparts, t16 = tile % max(nt, 1);
        const u8* rows = wsm + (u64)(tile >= nt ? nrows : 0) * rb + (u64)t16 * 16 * rb;
        int2 v = tile_dot(rows, rb, nrows - t16 * 16, qs, kp * n_chunks / kparts, (kp + 1) * n_chunks / kparts);
        if ((lane & 3) == 0) {
            part[it][lane >> 2] = v.x;
            part[it][(lane >> 2) + 8] = v.y;
        }
    }
    __syncthreads();
    if (stamp) tr[TR_ROWS] = now_ns();
    float ss = 0.0f, am = 0.0f;
    int i = threadIdx.x;
    if (i < nrows) {
        int t16 = i >> 4, r = i & 15, sg = 0, su = 0;
        for (int kp = 0; kp < kparts; ++kp) {
            sg += part[t16 * kparts + kp][r];
            if (pair) su += part[(nt + t16) * kparts + kp][r];
        }
        const TernaryMat& mt = g.b.m[mi];
        float y = (float)(sg - tsum) * mine.sg * d;
        if (pair) y = gated(y, (float)(su - tsum) * mine.su * d, g.pair_act);
        float o = mt.res ? y + mine.res : y;
        mt.out[row] = o;
        ss = o * o;
        am = fabsf(o * msw);
        if (g.stat_out >= 0) xw_rows[g.stat_out * ROW_MAX + row] = o * msw;
    }
    if (g.stat_out >= 0) {
        ss = warp_sum(ss);
        am = warp_max(am);
        put_stats(stats + g.stat_out * STAT_BLOCKS, blk, ss, am);
    }
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

// One token's attention with f16 caches, a block per KV head, for
// `decode_run` (the phase's g.fused = 1; decode.rs checks the shape fits).
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
// ph.g.fused = 1 a block takes a KV head instead (att_block), in `scratch`
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
    if (ph.g.fused == 1) {
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

// grid: one block per SM (all resident: the barriers need every block).
// block: DEC_THREADS. bar: the table's header (HEADER_BYTES, zero at first
// use). phases: n phases, then n_copies Copy records. Dynamic shared memory:
// DEC_RING descriptors, the staged input row (ne0_max floats), its int8
// levels (k_pad_max) and lane sums (k_pad_max / 64 ints), att_floats
// (≥ DEC_WARPS_MAX · DEC_MAX_HEAD_DIM, rounded up to 4) floats for
// attention, the Copy records, and from
// the next 128-byte boundary the weight ring (ring_cap bytes, a multiple of
// 16). trace (optional, TERN_CUDA_FUSE_TRACE): [phase][block] (start,
// quantized, done, staged) times in ns.
//
// Thread 0 keeps the barrier, thread 32 (lane 0 of warp 1) the ring: at a
// phase boundary one arrives and waits while the other frees the phase's
// weights and refills the ring, so neither waits for the other.
extern "C" __global__ void __launch_bounds__(DEC_THREADS, 1)
    decode_run(const Phase* phases, int n, u32* bar, int look, int ne0_max, int k_pad_max, u64* trace, const int* pos,
               u32 ring_cap, int n_copies, int spin_ns, int att_floats, u32 refill) {
    extern __shared__ __align__(128) u8 dsm[];
    __shared__ int lasts[16];
    __shared__ Angles angles;
    __shared__ WRing wr;
    const int PRODUCER = 32;
    Phase* ring = (Phase*)dsm;
    float* xs = (float*)(dsm + DEC_RING * sizeof(Phase));
    i8* qs = (i8*)(xs + ((ne0_max + 3) & ~3));
    int* ls = (int*)(qs + k_pad_max);
    float* att = (float*)(ls + k_pad_max / 64);
    Copy* copies = (Copy*)(att + ((att_floats + 3) & ~3));
    u8* wring = (u8*)(((u64)(copies + n_copies) + 127) & ~(u64)127);
    float2* stats = (float2*)(bar + STATS_AT);
    float* xw_rows = (float*)(bar + ROWS_AT);
    int blk = blockIdx.x, nblk = gridDim.x;
    look = max(0, min(look, DEC_RING - 2));
    const u32* src = (const u32*)phases;
    Producer pr = {0, 0, 0, 0, 0, 0};
    u32 budget = refill ? refill : ~0u;
    u32 target = 0, epoch = 0;
    // The table and the weights never depend on the previous kernel:
    // descriptors 0..look, the copy records and the first phases' weights
    // go out before pdl_wait.
    if (threadIdx.x == 0) {
        if (trace) trace[(u64)blk * TR_SLOTS + TR_ENTRY] = now_ns();
        angles.pos = -1;
        // The counter stands at (n − 1) · nblk arrivals per earlier launch.
        epoch = ld_acquire(bar + BAR_EPOCH);
        target = epoch * (u32)(n - 1) * (u32)nblk;
    }
    if (threadIdx.x == PRODUCER) {
        for (int i = 0; i < WR_SLOTS; ++i) mbar_init(&wr.mbar[i]);
        SM90(asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"));
        SM90(asm volatile("fence.proxy.async.shared::cta;" ::: "memory"));
    }
    for (int i = threadIdx.x; i < min(look + 1, n) * PHASE_WORDS; i += blockDim.x) {
        int p = i / PHASE_WORDS;
        ((u32*)(ring + p % DEC_RING))[i % PHASE_WORDS] = src[i];
    }
    const u32* csrc = (const u32*)(phases + n);
    for (int i = threadIdx.x; i < n_copies * COPY_WORDS; i += blockDim.x) ((u32*)copies)[i] = csrc[i];
    // Positions are inputs, written before the graph's first kernel.
    int pos0 = pos ? pos[0] : 0;
    __syncthreads();
    if (threadIdx.x == PRODUCER) issue_ahead(copies, n_copies, &pr, &wr, wring, ring_cap, blk, nblk, ~0u, 0);
    __syncthreads();
    pdl_wait();
    u32 gi = 0;
    for (int p = 0; p < n; ++p) {
        u64* stamp = trace ? trace + ((u64)p * nblk + blk) * TR_SLOTS : nullptr;
        if (stamp && threadIdx.x == 0) stamp[TR_START] = now_ns();
        // Descriptor p + look + 1 is loaded now and stored at the phase's end,
        // into the slot of phase p − 1, which no thread reads any more.
        int next = p + look + 1;
        bool carry = next < n && (int)threadIdx.x < PHASE_WORDS;
        u32 word = carry ? src[(u64)next * PHASE_WORDS + threadIdx.x] : 0;
        if (p == n - 1) pdl_launch();
        const Phase& ph = ring[p % DEC_RING];
        bool gemv = ph.kind == PH_GEMV;
        if (gemv) {
            u32 slot = gi % WR_SLOTS;
            gemv_phase(ph.g, blk, nblk, wring + wr.seg[slot], &wr.mbar[slot], (gi / WR_SLOTS) & 1, xs, qs, ls, stats,
                       xw_rows, stamp);
            ++gi;
        } else if (ph.kind == PH_ATT) {
            att_phase(ph, blk, nblk, att, lasts, &angles, pos, pos0, stats, xw_rows, att);
        } else if (blk == 0) {
            nq_phase(ph.g.nq, xs);
        }
        if (carry) ((u32*)(ring + next % DEC_RING))[threadIdx.x] = word;
        __syncthreads();
        if (threadIdx.x == 0) {
            if (stamp) stamp[TR_DONE] = now_ns();
            if (p + 1 < n) {
                // Arrive (a release: bar.sync ordered the block's writes
                // before it), then wait (acquire).
                asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(bar) : "memory");
                target += (u32)nblk;
                SpinGuard guard;
                while ((int)(ld_acquire(bar) - target) < 0) {
                    // Fewer polls of the counter's line leave the L2 slice
                    // to the arrivals (TERN_CUDA_SPIN_NS).
                    if (spin_ns) __nanosleep(spin_ns);
                    guard.tick();
                }
            } else {
                // The last block done bumps the launch count for the next launch.
                u32 done;
                asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], 1;" : "=r"(done) : "l"(bar + BAR_DONE) : "memory");
                if (done == (u32)nblk - 1) {
                    asm volatile("st.relaxed.gpu.global.u32 [%0], 0;" ::"l"(bar + BAR_DONE) : "memory");
                    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(bar + BAR_EPOCH), "r"(epoch + 1) : "memory");
                }
            }
        } else if (threadIdx.x == PRODUCER && p + 1 < n) {
            // This phase's weights are read: free them and refill the ring.
            if (gemv) {
                pr.tail = wr.end[pr.freed % WR_SLOTS];
                ++pr.freed;
            }
            // The next GEMV phase is number gi: its weights must all be on
            // their way before the barrier opens.
            issue_ahead(copies, n_copies, &pr, &wr, wring, ring_cap, blk, nblk, budget, gi);
            if (stamp) stamp[TR_ISSUED] = now_ns();
        }
        if (p + 1 < n) __syncthreads();
    }
}
