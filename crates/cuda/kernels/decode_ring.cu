// decode_run's synchronisation: the grid barrier's atomics, the mbarriers
// and bulk copies of the weight ring, and its producer.

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
__device__ __forceinline__ void block_rows(int rows, int blk, int nblk, int* r0, int* r1) {
    int per = (rows + nblk - 1) / nblk;
    *r0 = min(rows, blk * per);
    *r1 = min(rows, *r0 + per);
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
            int r0, r1;
            block_rows(c.vrows, blk, nblk, &r0, &r1);
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
        int r0, r1;
        block_rows(c.vrows, blk, nblk, &r0, &r1);
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
