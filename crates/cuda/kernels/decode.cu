// Decoding in one persistent kernel. A run of one-token launches (norm_quant,
// the ternary GEMVs, attention) becomes a table of phases that every block
// walks in step, with a grid-wide barrier between phases. This module's
// source is quantize.cu, ternary.cu and attention.cu, then decode_table.cu
// (the phase table), decode_ring.cu (barrier and weight ring),
// decode_gemv.cu (GEMV phases), decode_attention.cu (attention phases) and
// this file (the kernel).
//
// Why: a 2B-4T token is ~270 launches that each move 0.6–9 MB, so the gaps
// between launches cost more than the bytes. Here:
// * a phase boundary is one barrier (a counter every block adds to once and
//   waits on: one trip to L2 and back) instead of a launch;
// * weights never depend on activations, so each block copies its rows of
//   the phases ahead into a ring in shared memory (bulk copies completing on
//   an mbarrier, issued by thread 32 while thread 0 waits at barriers): a
//   GEMV reads its weights from shared memory, and DRAM streams while
//   blocks wait;
// * every block norms and quantizes a GEMV's input itself, from the row's
//   sum of squares and weighted absmax that the phase writing the row left
//   behind (a partial per block): no block reductions on the critical path.

// grid: one block per SM (all resident: the barriers need every block).
// block: DEC_THREADS. bar: the table's header (HEADER_BYTES, zero at first
// use). phases: n phases, then n_copies Copy records. Dynamic shared memory:
// DEC_RING descriptors, the staged input row (ne0_max floats), its int8
// levels (k_pad_max) and lane sums (k_pad_max / 64 ints), att_floats
// (≥ DEC_WARPS_MAX · DEC_MAX_HEAD_DIM, rounded up to 4) floats for
// attention, the Copy records, and from the next 128-byte boundary the
// weight ring (ring_cap bytes, a multiple of 16). refill: the producer's
// bytes a barrier (0: no limit). trace (optional, TERN_CUDA_FUSE_TRACE):
// [phase][block] TR_SLOTS stamps in ns (decode_table.cu).
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
            att_phase(ph, blk, nblk, att, lasts, &angles, pos, pos0, stats, xw_rows, att, stamp);
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
