// Prompt attention over the latent cache (Op::LatentAttention, absorbed MLA)
// on tensor cores, for f16 caches; compiled after flash_attn.cu (its mma,
// ldmatrix and copy helpers). mla.cu's `mla_attention` states the op: head h
// of token t scores cache row j ≤ pos[t] as (q_lat·c_j + q_pe·k_pe_j) ·
// scale, and its output is the softmax-weighted sum of the rows' c_j. Every
// head reads the same rows, so this is attention with one KV head whose key
// is a whole cache row [c | k_pe] (W = rank + rope dims) and whose value is
// its first `rank` dims.
//
// grid: (n_split, ⌈n_tok / 2⌉, ⌈n_head / 16⌉), block 256 (8 warps). A block
// takes keys s·split .. + split of two tokens for 16 heads (a prompt: one
// split; decoding: splits whose states `mla_merge` combines, as
// mla_attention's): m-tile i (16 rows) is token 2x + i's heads 16y ..
// 16y + 15. Warp w = 4i + u works on m-tile i: it computes S's partial sums
// over k-steps u, u + 4, ... of each 32-key tile (its Q fragments loaded
// once, scaled by scale · log2 e and rounded to f16), the four warps of a
// tile add the partials in shared memory in a fixed order (so all four hold
// the same S), apply the causal mask and online softmax, and warp u
// accumulates value columns u·rank/4 .. (u + 1)·rank/4 of P·V. K tiles (32
// rows of W f16, padded by 8 so ldmatrix rows hit distinct banks) are
// double-buffered by cp.async. Positions ascend within the batch, so a
// block's keys end at its last token's position. rank a multiple of 64, at
// most 512; rope a multiple of 16; W ≤ 576.

#define MLA_MMA_KEYS 32
#define MLA_MMA_MAXSTEPS 9

// The m16n8k16 B fragment of 8 keys (rows of a row-major tile) over one
// k-step of 16 dims: thread t gives key t % 8's address at dim 8 · (t / 8)
// (threads 16..31 repeat 0..15).
__device__ __forceinline__ void ldsm_x2(u32& b0, u32& b1, const u16* row) {
    u32 a = (u32)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(b0), "=r"(b1) : "r"(a));
}

extern "C" __global__ void __launch_bounds__(256) mla_attention_mma(const float* q_lat, const float* q_pe,
                                                                    const u16* cache, const int* pos, float* out,
                                                                    float* part, int n_tok, int n_head, int rank,
                                                                    int rope, float scale, int split, int n_split) {
    extern __shared__ __align__(16) u16 mm_sm[];
    const int W = rank + rope, KS = W + 8, nks = W / 16;
    u16* ktile = mm_sm;                                      // [2][MLA_MMA_KEYS][KS]
    float* spart = (float*)(mm_sm + 2 * MLA_MMA_KEYS * KS);  // [8 warps][16][32 lanes]
    pdl_wait();
    pdl_launch();
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    int mt = warp >> 2, u = warp & 3;
    int sp = blockIdx.x, t0 = blockIdx.y * 2, t1 = min(t0 + 1, n_tok - 1), h0 = blockIdx.z * 16;
    // A lone last token's partner m-tile computes the same rows again and
    // stores nothing.
    bool t_valid = t0 + mt < n_tok;
    int t = t_valid ? t0 + mt : t1;
    int p_t = pos[t], p_max = max(pos[t0], pos[t1]);
    // This split's keys: j0 .. j_end (inclusive), none past the pair's last position.
    int j0 = sp * split, j_end = min(p_max, j0 + split - 1);
    if (j0 > p_max) return;
    int ha = h0 + g, hb = h0 + g + 8;
    bool va = t_valid && ha < n_head, vb = t_valid && hb < n_head;

    // This warp's Q fragments: k-steps u, u + 4, ... (dims 16s ..).
    const float qs = scale * 1.4426950408889634f;
    u32 qf[MLA_MMA_MAXSTEPS][4];
#pragma unroll
    for (int i = 0; i < MLA_MMA_MAXSTEPS; ++i) {
        int s = u + 4 * i;
        qf[i][0] = qf[i][1] = qf[i][2] = qf[i][3] = 0u;
        if (s >= nks) continue;
        int c = 16 * s + 2 * tig;
        const float *qa, *qb;
        if (c < rank) {
            qa = q_lat + ((u64)t * n_head + ha) * rank + c;
            qb = q_lat + ((u64)t * n_head + hb) * rank + c;
        } else {
            qa = q_pe + ((u64)t * n_head + ha) * rope + (c - rank);
            qb = q_pe + ((u64)t * n_head + hb) * rope + (c - rank);
        }
        if (va) qf[i][0] = pack_h2(qa[0] * qs, qa[1] * qs), qf[i][2] = pack_h2(qa[8] * qs, qa[9] * qs);
        if (vb) qf[i][1] = pack_h2(qb[0] * qs, qb[1] * qs), qf[i][3] = pack_h2(qb[8] * qs, qb[9] * qs);
    }

    // Value columns of this warp: n-tiles of 8 from u · rank / 4.
    const int nvt = rank / 32, v0 = u * (rank / 4);
    float o[16][4];
#pragma unroll
    for (int n = 0; n < 16; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float ma = -INFINITY, mb = -INFINITY, la = 0.0f, lb = 0.0f;

    int n_tiles = (j_end - j0) / MLA_MMA_KEYS + 1;
    // Copies of tile `i` into buffer i % 2: 16-byte pieces of its rows.
    auto load = [&](int i) {
        u16* dst = ktile + (i & 1) * MLA_MMA_KEYS * KS;
        int per_row = W / 8;
        for (int c = threadIdx.x; c < MLA_MMA_KEYS * per_row; c += 256) {
            int r = c / per_row, col = 8 * (c % per_row);
            int key = j0 + i * MLA_MMA_KEYS + r;
            bool in = key <= j_end;
            cp_async16(dst + r * KS + col, cache + (u64)(in ? key : 0) * W + col, in ? 16 : 0);
        }
        asm volatile("cp.async.commit_group;");
    };
    load(0);
    for (int i = 0; i < n_tiles; ++i) {
        __syncthreads();  // every warp is done with tile i − 1 and the partials
        if (i + 1 < n_tiles) {
            load(i + 1);
            asm volatile("cp.async.wait_group 1;" ::: "memory");
        } else {
            asm volatile("cp.async.wait_group 0;" ::: "memory");
        }
        __syncthreads();
        const u16* kt = ktile + (i & 1) * MLA_MMA_KEYS * KS;
        // Partial S over this warp's k-steps: 16 rows × 32 keys.
        float s[4][4];
#pragma unroll
        for (int j = 0; j < 4; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int si = 0; si < MLA_MMA_MAXSTEPS; ++si) {
            int st = u + 4 * si;
            if (st >= nks) break;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                u32 b0, b1;
                ldsm_x2(b0, b1, kt + (8 * j + (lane & 7)) * KS + 16 * st + 8 * ((lane >> 3) & 1));
                mma_f16(s[j], qf[si], b0, b1);
            }
        }
        float* mine = spart + warp * 16 * 32;
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) mine[(4 * j + e) * 32 + lane] = s[j][e];
        __syncthreads();
        // The tile's S: the four partials of this m-tile, in warp order.
        const float* base = spart + (4 * mt) * 16 * 32;
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float v = 0.0f;
#pragma unroll
                for (int w = 0; w < 4; ++w) v += base[w * 16 * 32 + (4 * j + e) * 32 + lane];
                int key = j0 + i * MLA_MMA_KEYS + 8 * j + 2 * tig + (e & 1);
                s[j][e] = key <= p_t && key <= j_end ? v : -INFINITY;
            }
        // Online softmax of rows g (e 0, 1) and g + 8 (e 2, 3).
        float ta = -INFINITY, tb = -INFINITY;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            ta = fmaxf(ta, fmaxf(s[j][0], s[j][1]));
            tb = fmaxf(tb, fmaxf(s[j][2], s[j][3]));
        }
        ta = fmaxf(ta, __shfl_xor_sync(0xffffffffu, ta, 1));
        ta = fmaxf(ta, __shfl_xor_sync(0xffffffffu, ta, 2));
        tb = fmaxf(tb, __shfl_xor_sync(0xffffffffu, tb, 1));
        tb = fmaxf(tb, __shfl_xor_sync(0xffffffffu, tb, 2));
        float na = fmaxf(ma, ta), nb = fmaxf(mb, tb);
        // A row with no key yet keeps m = −inf: its factors are 1 and its P 0.
        float ra = na == -INFINITY ? 1.0f : exp2f(ma - na), rb = nb == -INFINITY ? 1.0f : exp2f(mb - nb);
        float sa = 0.0f, sb = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            s[j][0] = na == -INFINITY ? 0.0f : exp2f(s[j][0] - na);
            s[j][1] = na == -INFINITY ? 0.0f : exp2f(s[j][1] - na);
            s[j][2] = nb == -INFINITY ? 0.0f : exp2f(s[j][2] - nb);
            s[j][3] = nb == -INFINITY ? 0.0f : exp2f(s[j][3] - nb);
            sa += s[j][0] + s[j][1];
            sb += s[j][2] + s[j][3];
        }
        sa += __shfl_xor_sync(0xffffffffu, sa, 1);
        sa += __shfl_xor_sync(0xffffffffu, sa, 2);
        sb += __shfl_xor_sync(0xffffffffu, sb, 1);
        sb += __shfl_xor_sync(0xffffffffu, sb, 2);
        la = la * ra + sa;
        lb = lb * rb + sb;
        ma = na;
        mb = nb;
#pragma unroll
        for (int n = 0; n < 16; ++n) {
            o[n][0] *= ra;
            o[n][1] *= ra;
            o[n][2] *= rb;
            o[n][3] *= rb;
        }
        // O += P · V: P's fragments repacked as the A operand, two k-steps of
        // 16 keys; V is the tile's first rank dims, read transposed.
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
            u32 pf[4] = {pack_h2(s[2 * kk][0], s[2 * kk][1]), pack_h2(s[2 * kk][2], s[2 * kk][3]),
                         pack_h2(s[2 * kk + 1][0], s[2 * kk + 1][1]), pack_h2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int n = 0; n < 16; ++n) {
                if (n >= nvt) break;
                u32 b0, b1;
                ldsm_x2_trans(b0, b1, kt + (16 * kk + (lane & 15)) * KS + v0 + 8 * n);
                mma_f16(o[n], pf, b0, b1);
            }
        }
    }
    if (!t_valid) return;
    if (n_split > 1) {
        // A split's state for mla_merge: unnormalised sums, then the max in
        // natural units (these are log2 units) and the sum of weights.
#pragma unroll
        for (int n = 0; n < 16; ++n) {
            if (n >= nvt) break;
            int c = v0 + 8 * n + 2 * tig;
            if (va) {
                float* d = part + (((u64)t * n_head + ha) * n_split + sp) * (rank + 4) + c;
                d[0] = o[n][0];
                d[1] = o[n][1];
            }
            if (vb) {
                float* d = part + (((u64)t * n_head + hb) * n_split + sp) * (rank + 4) + c;
                d[0] = o[n][2];
                d[1] = o[n][3];
            }
        }
        if (u == 0 && tig == 0) {
            const float ln2 = 0.6931471805599453f;
            if (va) {
                float* d = part + (((u64)t * n_head + ha) * n_split + sp) * (rank + 4) + rank;
                d[0] = ma * ln2;
                d[1] = la;
            }
            if (vb) {
                float* d = part + (((u64)t * n_head + hb) * n_split + sp) * (rank + 4) + rank;
                d[0] = mb * ln2;
                d[1] = lb;
            }
        }
        return;
    }
    float ia = la > 0.0f ? 1.0f / la : 0.0f, ib = lb > 0.0f ? 1.0f / lb : 0.0f;
#pragma unroll
    for (int n = 0; n < 16; ++n) {
        if (n >= nvt) break;
        int c = v0 + 8 * n + 2 * tig;
        if (va) {
            float* d = out + ((u64)t * n_head + ha) * rank + c;
            d[0] = o[n][0] * ia;
            d[1] = o[n][1] * ia;
        }
        if (vb) {
            float* d = out + ((u64)t * n_head + hb) * rank + c;
            d[0] = o[n][2] * ib;
            d[1] = o[n][3] * ib;
        }
    }
}
