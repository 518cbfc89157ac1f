//! The launches before a latent attention, fused. `models::mla` slices q
//! into q_nope and q_pe and kv_a's row into the latent and k_pe
//! (`Op::Columns`), norms the latent, rotates both rope parts, and the
//! attention stores `[latent | k_pe]` in its cache: eight launches a layer
//! as written. Here they are two, each reading its source while it is
//! still live (the memory plan may reuse q's and kv's bytes once their
//! columns have read them):
//!
//! * at kv's first column, `mla_kv_store` writes the normed latent and the
//!   rotated k_pe straight into the cache rows; the chain's nodes get no
//!   launch and the attention no `mla_store`;
//! * at q's first column, `mla_q_split` writes q_nope and the rotated q_pe
//!   (the rope's own output), unless that output lies on q or q_nope.
//!
//! Both compute the floats of the launches they replace (`rope_rotate`,
//! `rms_norm`'s double sum).

use tern_graph::{DType, NodeId, Op, RopeParams};
use tern_quant::GgmlType;

use super::mla::YarnRamp;
use super::{grid1, Lower, Need};
use crate::args::{MlaKvStoreArgs, MlaQSplitArgs, RopeMode};
use crate::kernels::Kernel;
use crate::launch::Launch;

/// A rope's kernel parameters: its frequency factors (0: none), its
/// parameters and YaRN's ramp.
struct RopeSpec {
    factors: u64,
    p: RopeParams,
    ramp: YarnRamp,
}

/// What `mla_kv_store` replaces: the latent attention, kv, the nodes it
/// absorbs, the latent norm's weight row (if any) and eps, and the k_pe rope.
struct KvChain {
    la: NodeId,
    kv: NodeId,
    nodes: Vec<NodeId>,
    weight: Option<NodeId>,
    eps: f32,
    rope: NodeId,
}

impl Lower<'_> {
    /// The one reader of `n`, in this split.
    fn sole_reader(&self, n: NodeId) -> Option<NodeId> {
        let r = &self.readers[n.index()];
        (self.uses[n.index()] == 1 && r.len() == 1 && self.in_split[r[0].index()]).then(|| r[0])
    }

    fn rope_spec(&self, rope: NodeId) -> Result<RopeSpec, Need> {
        let n = self.node_ref(rope);
        let Op::Rope(p) = n.op else { return super::fail("not a rope") };
        let factors = match n.srcs.get(2) {
            Some(&f) => self.ptr(f)?,
            None => 0,
        };
        Ok(RopeSpec { factors, p, ramp: YarnRamp::of(&p) })
    }

    /// The rope reading only `c` and read only by a latent attention as its
    /// `slot`th source, rotating one head of `len`: (rope, attention).
    fn rope_into_attention(&self, c: NodeId, len: usize, slot: usize) -> Option<(NodeId, NodeId)> {
        let r = self.sole_reader(c)?;
        let rn = self.node_ref(r);
        let la = self.sole_reader(r)?;
        let ok = matches!(rn.op, Op::Rope(p) if p.head_dim == len && rn.srcs[0] == c)
            && matches!(self.node_ref(la).op, Op::LatentAttention(_))
            && self.node_ref(la).srcs.get(slot) == Some(&r);
        ok.then_some((r, la))
    }

    /// The chain from kv's columns at `id` to a latent attention (its cache
    /// F32 or F16, one sequence), as `models::mla` builds it.
    fn kv_chain(&self, id: NodeId) -> Option<KvChain> {
        let kv = self.node_ref(id).srcs[0];
        let mut la = id;
        for _ in 0..4 {
            la = self.sole_reader(la)?;
            if matches!(self.node_ref(la).op, Op::LatentAttention(_)) {
                break;
            }
        }
        let ln = self.node_ref(la);
        let Op::LatentAttention(p) = ln.op else { return None };
        let s = &ln.srcs;
        let cache_ok = matches!(self.node_ref(s[4]).dtype, DType::Ggml(GgmlType::F32 | GgmlType::F16));
        if s.len() != 6 || !cache_ok {
            return None;
        }
        let cols = |n: NodeId, start: usize, len: usize| {
            let nn = self.node_ref(n);
            nn.srcs[0] == kv && nn.op == Op::Columns { width: p.rank + p.rope, start, len }
        };
        // The latent: rms_norm of its columns, times a weight row or not.
        let mut nodes = Vec::new();
        let mut top = s[2];
        let mut weight = None;
        if let Op::Mul = self.node_ref(top).op {
            let m = self.node_ref(top);
            let w = m.srcs[1];
            let row = self.node_ref(w);
            if row.dtype != DType::F32 || row.n_elements() != p.rank || self.sole_reader(m.srcs[0]) != Some(top) {
                return None;
            }
            weight = Some(w);
            nodes.push(top);
            top = m.srcs[0];
        }
        let Op::RmsNorm { eps } = self.node_ref(top).op else { return None };
        nodes.push(top);
        let c = self.node_ref(top).srcs[0];
        if self.sole_reader(c) != Some(top) || !cols(c, 0, p.rank) {
            return None;
        }
        nodes.push(c);
        // k_pe: its columns rotated, at the attention's positions.
        let rope = s[3];
        let c_pe = self.node_ref(rope).srcs[0];
        let rotated = self.rope_into_attention(c_pe, p.rope, 3) == Some((rope, la));
        if !cols(c_pe, p.rank, p.rope) || !rotated || self.node_ref(rope).srcs[1] != s[5] {
            return None;
        }
        nodes.extend([c_pe, rope]);
        (nodes.contains(&id) && nodes.iter().all(|n| self.in_split[n.index()])).then_some(KvChain {
            la,
            kv,
            nodes,
            weight,
            eps,
            rope,
        })
    }

    /// `mla_kv_store` at kv's first column, when the chain is there.
    pub(super) fn mla_kv_store(&mut self, id: NodeId) -> Result<bool, Need> {
        let Some(ch) = self.kv_chain(id) else { return Ok(false) };
        let ln = self.node_ref(ch.la).clone();
        let Op::LatentAttention(p) = ln.op else { return Ok(false) };
        let DType::Ggml(cache_ty) = self.node_ref(ln.srcs[4]).dtype else { return Ok(false) };
        let r = self.rope_spec(ch.rope)?;
        let w = match ch.weight {
            Some(w) => self.ptr(w)?,
            None => 0,
        };
        let n_tok = self.node_ref(ch.kv).ne[1];
        let args = MlaKvStoreArgs {
            kv: self.ptr(ch.kv)?,
            w,
            eps: ch.eps,
            cache: self.ptr(ln.srcs[4])?,
            pos: self.ptr(ln.srcs[5])?,
            rank: p.rank as i32,
            rope: p.rope as i32,
            ty: cache_ty.id() as i32,
            factors: r.factors,
            n_rot: r.p.n_rot as i32,
            mode: RopeMode::of(r.p.mode),
            base: r.p.freq_base,
            fscale: r.p.freq_scale,
            y_low: r.ramp.low,
            y_high: r.ramp.high,
            y_ext: r.ramp.ext,
            y_mag: r.ramp.mag,
        };
        self.out.push(Launch::new(Kernel::MlaKvStore, (n_tok as u32, 1, 1), 256, args));
        self.absorbed.extend(ch.nodes);
        self.stored.insert(ch.la);
        Ok(true)
    }

    /// `mla_q_split` at q's first column: q's two columns of one width,
    /// `[0, nope)` and `[nope, width)`, the second rotated for a latent
    /// attention's q_pe.
    pub(super) fn mla_q_split(&mut self, id: NodeId) -> Result<bool, Need> {
        let node = self.node_ref(id);
        let (q, Op::Columns { width, .. }) = (node.srcs[0], &node.op) else { return Ok(false) };
        let width = *width;
        let col = |start: usize, len: usize| {
            let want = Op::Columns { width, start, len };
            let mut it = self.readers[q.index()].iter().filter(|&&r| self.node_ref(r).op == want);
            it.next().copied().filter(|_| it.next().is_none())
        };
        let Some(nope) = (1..width).find(|&n| col(0, n).is_some() && col(n, width - n).is_some()) else {
            return Ok(false);
        };
        let rope_len = width - nope;
        let (c_nope, c_pe) = (col(0, nope).expect("found"), col(nope, rope_len).expect("found"));
        let Some((rope, _)) = self.rope_into_attention(c_pe, rope_len, 1) else { return Ok(false) };
        let fits = [c_nope, c_pe, rope].iter().all(|n| self.in_split[n.index()])
            && ![(rope, q), (rope, c_nope), (c_nope, q)].iter().any(|&(a, b)| self.overlaps(a, b));
        if !fits || !rope_len.is_multiple_of(2) || !self.node_ref(q).ne[0].is_multiple_of(width) {
            return Ok(false);
        }
        let qn = self.node_ref(q);
        let (n_tok, n_head) = (qn.ne[1], qn.ne[0] / width);
        let r = self.rope_spec(rope)?;
        let args = MlaQSplitArgs {
            q: self.ptr(q)?,
            q_nope: self.ptr(c_nope)?,
            q_pe: self.ptr(rope)?,
            pos: self.ptr(self.node_ref(rope).srcs[1])?,
            n_head: n_head as i32,
            n_tok: n_tok as i32,
            nope: nope as i32,
            rope: rope_len as i32,
            factors: r.factors,
            n_rot: r.p.n_rot as i32,
            mode: RopeMode::of(r.p.mode),
            base: r.p.freq_base,
            fscale: r.p.freq_scale,
            y_low: r.ramp.low,
            y_high: r.ramp.high,
            y_ext: r.ramp.ext,
            y_mag: r.ramp.mag,
        };
        let threads = n_tok * n_head * (nope + rope_len / 2);
        self.out.push(Launch::new(Kernel::MlaQSplit, grid1(threads, 256), 256, args));
        self.absorbed.extend([c_nope, c_pe, rope]);
        Ok(true)
    }
}
