//! Lowering attention: the ropes of q and k (alone, or with the cache store
//! when only an attention reads them), the one-token attention (flash-
//! decoding splits, rope inside), and the prompt attention on tensor cores
//! (`flash_attn*`).
//!
//! Decoding is flash-decoding: splits of 32 keys (up to 128) and a last-block
//! merge in one launch, each lane scoring a whole key row in one batch of
//! loads. At one token it does rope_store's work too (`AttRope`): q is rotated
//! as it is staged, and the split holding the token's position rotates and
//! stores its k and v rows before reading them. Prompt attention on f16 caches
//! (`flash_attn`) is FlashAttention-2 on `mma.m16n8k16` (q and P rounded to
//! f16, f32 accumulation), a block per KV head and 16 query tokens, K/V tiles
//! double-buffered with `cp.async` and V loaded by `ldmatrix.trans`; while its
//! grid is at most 2 SMs' worth of blocks, a second set of warps takes every
//! other key tile (`flash_attn_split`). head_dim 128 has its own entry points.

use tern_graph::{AttentionParams, DType, Node, NodeId, Op};
use tern_quant::GgmlType;

use super::mla::YarnRamp;
use super::{fail, grid1, Lower, Need, GEMV_MAX_TOKENS};
use crate::args::{AttentionArgs, FlashAttnArgs, KvStoreArgs, RopeArgs, RopeMode, RopeStoreArgs};
use crate::kernels::Kernel;
use crate::launch::{AttRope, Launch};

/// Keys per attention split, at least; long caches use larger splits so that
/// a token never has more than this many splits.
const ATT_SPLIT: usize = 256;
const ATT_MAX_SPLITS: usize = 16;
/// Decoding splits finely: fewer keys a block is fewer dependent loads in
/// the block's chain, and the merge reads the splits four at a time.
const ATT_SPLIT_DECODE: usize = 32;
const ATT_MAX_SPLITS_DECODE: usize = 128;
/// Keys a tile of the prompt attention on tensor cores, and query tokens a
/// block (`FA_BK` and `FA_BQ` in flash_attn.cu).
const FA_KEYS: usize = 32;
const FA_TOKENS: usize = 16;
/// Warp sets a prompt attention block splits its key tiles over, for groups
/// of at most this many query heads (a block holds at most 8 warps), while
/// the unsplit grid is at most FA_SPLIT_BLOCKS_PER_SM blocks an SM. A split
/// block halves the longest causal chain but takes a whole SM (170
/// registers a thread at head_dim 128), where two unsplit ones share one:
/// splitting pays while the unsplit grid leaves SMs idle, and not beyond.
const FA_SETS: usize = 2;
const FA_SETS_MAX_GROUP: usize = 4;
const FA_SPLIT_BLOCKS_PER_SM: usize = 2;

impl Lower<'_> {
    /// A rope whose only reader is an attention in this split, as its q or k.
    /// A YaRN rope runs alone: the fused ropes (`rope_store`, the one-token
    /// attention's `AttRope`) have no ramp.
    pub(super) fn rope_feeds_attention(&self, id: NodeId) -> bool {
        if matches!(self.node_ref(id).op, Op::Rope(p) if p.yarn.is_some()) {
            return false;
        }
        let readers = &self.readers[id.index()];
        if self.uses[id.index()] != 1 || readers.len() != 1 || !self.in_split[readers[0].index()] {
            return false;
        }
        let a = self.node_ref(readers[0]);
        matches!(a.op, Op::Attention(_))
            && (a.srcs[0] == id || a.srcs[1] == id)
            && a.srcs[5] == self.node_ref(id).srcs[1]
    }

    pub(super) fn rope(&mut self, id: NodeId) -> Result<(), Need> {
        let node = self.node_ref(id).clone();
        let Op::Rope(p) = node.op else { return fail("not a rope") };
        let n_tok = node.ne[1];
        let n_head = node.ne[0] / p.head_dim;
        let factors = match node.srcs.get(2) {
            Some(&f) => self.ptr(f)?,
            None => 0,
        };
        let pairs = n_tok * n_head * (p.head_dim / 2);
        let yarn = YarnRamp::of(&p);
        let args = RopeArgs {
            x: self.ptr(node.srcs[0])?,
            out: self.ptr(id)?,
            pos: self.ptr(node.srcs[1])?,
            factors,
            head_dim: p.head_dim as i32,
            n_head: n_head as i32,
            n_tok: n_tok as i32,
            n_rot: p.n_rot as i32,
            mode: RopeMode::of(p.mode),
            base: p.freq_base,
            fscale: p.freq_scale,
            y_low: yarn.low,
            y_high: yarn.high,
            y_ext: yarn.ext,
            y_mag: yarn.mag,
        };
        let l = Launch::new(Kernel::Rope, grid1(pairs, 256), 256, args);
        self.out.push(l);
        Ok(())
    }

    pub(super) fn attention(&mut self, id: NodeId, node: &Node, p: &AttentionParams) -> Result<(), Need> {
        let s = &node.srcs;
        self.span = self.span.max(crate::decode::cache_span(p, node.ne[1]));
        let (kc, vc) = (self.node_ref(s[3]), self.node_ref(s[4]));
        let type_id = |n: &Node| match n.dtype {
            DType::Ggml(t) => t.id() as i32,
            DType::I32 => -1,
        };
        let (k_type, v_type) = (type_id(kc), type_id(vc));
        let n_ctx = kc.ne[1];
        let n_tok = node.ne[1];
        let row = p.head_dim * p.n_head_kv;
        let pos = self.ptr(s[5])?;
        let (kcp, vcp) = (self.ptr(s[3])?, self.ptr(s[4])?);
        let deferred_list = self.deferred_rope.clone();
        let deferred = |n: NodeId| deferred_list.contains(&n);
        let (rq, rk) = (s[0], s[1]);
        let fusable = deferred(rq) && deferred(rk) && {
            let (nq, nk) = (self.node_ref(rq), self.node_ref(rk));
            nq.op == nk.op
                && nq.srcs.get(2) == nk.srcs.get(2)
                && !self.overlaps(rq, nk.srcs[0])
                && !self.overlaps(rq, s[2])
        };
        // One token: the attention rotates q and k and fills the caches itself,
        // reading the unrotated rows, which the output must not overwrite.
        let in_attention = fusable && n_tok == 1 && {
            let (nq, nk) = (self.node_ref(rq), self.node_ref(rk));
            [nq.srcs[0], nk.srcs[0], s[2]].iter().all(|&src| !self.overlaps(id, src))
        };
        let mut rope = AttRope::default();
        if in_attention {
            let (nq, nk) = (self.node_ref(rq).clone(), self.node_ref(rk).clone());
            let Op::Rope(r) = nq.op else { return fail("deferred node is not a rope") };
            rope = AttRope {
                k: self.ptr(nk.srcs[0])?,
                v: self.ptr(s[2])?,
                factors: match nq.srcs.get(2) {
                    Some(&f) => self.ptr(f)?,
                    None => 0,
                },
                n_rot: r.n_rot as i32,
                mode: RopeMode::of(r.mode),
                base: r.freq_base.to_bits(),
                fscale: r.freq_scale.to_bits(),
                on: 1,
                pad: 0,
            };
        } else if fusable {
            let (nq, nk) = (self.node_ref(rq).clone(), self.node_ref(rk).clone());
            let Op::Rope(r) = nq.op else { return fail("deferred node is not a rope") };
            let factors = match nq.srcs.get(2) {
                Some(&f) => self.ptr(f)?,
                None => 0,
            };
            let args = RopeStoreArgs {
                q: self.ptr(nq.srcs[0])?,
                q_out: self.ptr(rq)?,
                k: self.ptr(nk.srcs[0])?,
                v: self.ptr(s[2])?,
                kc: kcp,
                vc: vcp,
                pos,
                factors,
                head_dim: p.head_dim as i32,
                n_head: p.n_head as i32,
                n_head_kv: p.n_head_kv as i32,
                n_rot: r.n_rot as i32,
                mode: RopeMode::of(r.mode),
                base: r.freq_base,
                fscale: r.freq_scale,
                k_type,
                v_type,
            };
            let l = Launch::new(Kernel::RopeStore, (n_tok as u32, 1, 1), 256, args);
            self.out.push(l);
        } else {
            for n in [rq, rk] {
                if deferred(n) {
                    self.rope(n)?;
                }
            }
            let args = KvStoreArgs {
                k: self.ptr(s[1])?,
                v: self.ptr(s[2])?,
                kc: kcp,
                vc: vcp,
                pos,
                row: row as i32,
                k_type,
                v_type,
            };
            let store = Launch::new(Kernel::KvStore, (n_tok as u32, 1, 1), 256, args);
            self.out.push(store);
        }
        let group = p.n_head / p.n_head_kv;
        let tensor_cores = n_tok > GEMV_MAX_TOKENS
            && k_type == GgmlType::F16.id() as i32
            && v_type == GgmlType::F16.id() as i32
            && p.head_dim.is_multiple_of(16)
            && p.head_dim <= 128
            && group <= 8;
        if tensor_cores {
            let tiles_y = n_tok.div_ceil(FA_TOKENS);
            let split = group <= FA_SETS_MAX_GROUP && p.n_head_kv * tiles_y <= FA_SPLIT_BLOCKS_PER_SM * self.sms;
            let sets = if split { FA_SETS } else { 1 };
            // Two buffers of a round's K and V tiles (a tile a set), rows
            // padded by 8 halves; after the last round the same memory holds
            // the later sets' rows for the merge (head_dim / 2 + 4 floats a lane).
            let tiles = 2 * 2 * sets * FA_KEYS * (p.head_dim + 8) * 2;
            let merge = (sets - 1) * group * (p.head_dim / 2 + 4) * 32 * 4;
            let block = (32 * group * sets) as u32;
            let kernel = match (split, p.head_dim) {
                (false, 128) => Kernel::FlashAttn128,
                (true, 128) => Kernel::FlashAttnSplit128,
                (false, _) => Kernel::FlashAttn,
                (true, _) => Kernel::FlashAttnSplit,
            };
            let args = FlashAttnArgs {
                q: self.ptr(s[0])?,
                kc: kcp,
                vc: vcp,
                pos,
                out: self.ptr(id)?,
                n_tok: n_tok as i32,
                n_head: p.n_head as i32,
                n_head_kv: p.n_head_kv as i32,
                head_dim: p.head_dim as i32,
                scale: p.scale,
            };
            let l = Launch::new(kernel, (p.n_head_kv as u32, tiles_y as u32, 1), block, args).smem(tiles.max(merge));
            self.out.push(l);
            return Ok(());
        }
        // Decoding has one query per head, so it splits the keys finely to
        // fill the GPU; prompts have parallelism across tokens already.
        let (min_split, max_splits) = if n_tok <= GEMV_MAX_TOKENS {
            (ATT_SPLIT_DECODE, ATT_MAX_SPLITS_DECODE)
        } else {
            (ATT_SPLIT, ATT_MAX_SPLITS)
        };
        let split = min_split.max(n_ctx.div_ceil(max_splits).next_multiple_of(min_split));
        let n_split = n_ctx.div_ceil(split);
        let part = if n_split > 1 { self.take(n_tok * p.n_head * n_split * (p.head_dim + 2) * 4) } else { 0 };
        let counters = self.scratch.counters + (self.counters_used * 4) as u64;
        self.counters_used += n_tok * p.n_head_kv;
        let q = if in_attention { self.node_ref(rq).srcs[0] } else { s[0] };
        let args = AttentionArgs {
            q: self.ptr(q)?,
            kc: kcp,
            vc: vcp,
            pos,
            out: self.ptr(id)?,
            part,
            counters,
            n_head: p.n_head as i32,
            n_head_kv: p.n_head_kv as i32,
            head_dim: p.head_dim as i32,
            scale: p.scale,
            split: split as i32,
            n_split: n_split as i32,
            k_type,
            v_type,
            r: rope,
        };
        let grid = (p.n_head_kv as u32, n_tok as u32, n_split as u32);
        let l = Launch::new(Kernel::Attention, grid, 32 * group as u32, args).smem(group * p.head_dim * 4);
        self.out.push(l);
        Ok(())
    }
}
