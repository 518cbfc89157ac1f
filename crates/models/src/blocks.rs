//! The one block-building path: the step inputs, a normalised weight, the
//! attention and FFN parts a layer is made of, and the decoder stack that
//! composes them. Architectures differ only in their parts and `Config`
//! (`arch/`); nothing here calls kernels.

use tern_graph::{AttentionParams, Graph, InputKind, KvKind, NodeId, Precision, RopeParams};

use crate::weights::{Attention, DenseFfn, Ffn, Gqa, Layer, WeightRef, Weights};
use crate::{Batch, Config, KvSpec};

/// The step inputs the engine fills in.
#[derive(Clone, Copy, Debug)]
pub struct StepInputs {
    pub tokens: NodeId,    // [n_tokens] i32
    pub positions: NodeId, // [n_tokens] i32
    /// [n_outputs] i32; none when every row is wanted in order
    /// (`n_outputs == n_tokens`, all of decoding): nothing to gather.
    pub output_rows: Option<NodeId>,
    /// [n_tokens] i32, a multi-sequence batch's cache regions (`Batch::multi_seq`).
    pub seq_starts: Option<NodeId>,
}

/// Graph plus the handles the engine needs to run it.
pub struct Built {
    pub graph: Graph,
    pub inputs: StepInputs,
    /// `[n_vocab, n_outputs]` logits.
    pub logits: NodeId,
}

pub struct Ctx<'a> {
    pub g: Graph,
    pub c: &'a Config,
    pub w: &'a Weights,
    pub batch: &'a Batch,
    pub kv: &'a KvSpec,
    pub inputs: StepInputs,
    /// Precision of the projections: float models keep float activations.
    pub precision: Precision,
}

impl<'a> Ctx<'a> {
    pub fn new(c: &'a Config, w: &'a Weights, batch: &'a Batch, kv: &'a KvSpec) -> Ctx<'a> {
        let mut g = Graph::new();
        let inputs = StepInputs {
            tokens: g.input(InputKind::Tokens, batch.n_tokens),
            positions: g.input(InputKind::Positions, batch.n_tokens),
            output_rows: (batch.n_outputs != batch.n_tokens).then(|| g.input(InputKind::OutputRows, batch.n_outputs)),
            seq_starts: batch.multi_seq.then(|| g.input(InputKind::SeqStarts, batch.n_tokens)),
        };
        // A model whose projections are float is evaluated in float throughout
        // (head included); a quantized one pairs int8 activations everywhere.
        let precision = if w.layers.first().is_none_or(|l| l.first_projection().ty.is_float()) {
            Precision::Float
        } else {
            Precision::Paired
        };
        Ctx { g, c, w, batch, kv, inputs, precision }
    }

    pub fn weight(&mut self, r: WeightRef) -> NodeId {
        let name = self.w.table.entries[r.index].name.clone();
        self.g.weight(r.index, &name, r.ty, r.ne)
    }

    /// `rms_norm(x) * w`.
    pub fn norm(&mut self, x: NodeId, w: WeightRef) -> NodeId {
        let n = self.g.rms_norm(x, self.c.rms_eps);
        let w = self.weight(w);
        self.g.mul(n, w)
    }

    /// `W·x`, then the weight's output scale if it has one.
    pub fn linear(&mut self, w: WeightRef, x: NodeId, scale: f32) -> NodeId {
        let w = self.weight(w);
        let y = self.g.mul_mat(w, x, self.precision);
        if scale == 1.0 {
            y
        } else {
            self.g.scale(y, scale)
        }
    }

    /// `x [n_embd, n_tokens]` → token embeddings.
    pub fn embed(&mut self) -> NodeId {
        let table = self.weight(self.w.token_embd);
        self.g.get_rows(table, self.inputs.tokens)
    }

    /// The decoder stack every architecture here builds: embed, then per
    /// layer a normed attention and a normed FFN added to the residual
    /// stream, then the head.
    pub fn decoder(mut self) -> Built {
        let w = self.w;
        let mut x = self.embed(); // [n_embd, n_tokens]
        for (il, l) in w.layers.iter().enumerate() {
            let h = self.norm(x, l.attn_norm);
            let a = self.attention(il, l, h); // [n_embd, n_tokens]
            x = self.g.add(x, a);
            let h = self.norm(x, l.ffn_norm);
            let f = self.ffn(l, h); // [n_embd, n_tokens]
            x = self.g.add(x, f);
        }
        self.head(x)
    }

    /// Layer `il`'s attention on the normalised input `h`, projected back to
    /// `[n_embd, n_tokens]`.
    fn attention(&mut self, il: usize, l: &Layer, h: NodeId) -> NodeId {
        match &l.attn {
            Attention::Gqa(a) => self.gqa(il, a, h),
            Attention::Mla(a) => self.mla(il, a, h),
        }
    }

    fn gqa(&mut self, il: usize, a: &Gqa, h: NodeId) -> NodeId {
        let c = self.c;
        let [sq, sk, sv, so] = a.scales;
        let mut q = self.linear(a.wq, h, sq); // [head_dim * n_head, n_tokens]
        let mut k = self.linear(a.wk, h, sk); // [head_dim * n_head_kv, n_tokens]
        let v = self.linear(a.wv, h, sv); // [head_dim * n_head_kv, n_tokens]
        if let Some(qn) = a.q_norm {
            let w = self.weight(qn);
            q = self.g.head_norm(q, w, c.rms_eps);
        }
        if let Some(kn) = a.k_norm {
            let w = self.weight(kn);
            k = self.g.head_norm(k, w, c.rms_eps);
        }
        let rope = self.rope_params(c.head_dim);
        let factors = self.w.rope_freqs.map(|f| self.weight(f));
        let q = self.g.rope(q, self.inputs.positions, factors, rope);
        let k = self.g.rope(k, self.inputs.positions, factors, rope);
        let cache_ne = [c.head_dim * c.n_head_kv, self.kv.n_ctx, 1, 1];
        let kc = self.g.kv_cache(il, KvKind::K, self.kv.k_type, cache_ne);
        let vc = self.g.kv_cache(il, KvKind::V, self.kv.v_type, cache_ne);
        let p = AttentionParams {
            layer: il,
            n_head: c.n_head,
            n_head_kv: c.n_head_kv,
            head_dim: c.head_dim,
            scale: 1.0 / (c.head_dim as f32).sqrt(),
            kv_pos: self.batch.kv_pos,
        };
        let pos = self.inputs.positions;
        let mut o = match self.inputs.seq_starts {
            Some(starts) => self.g.seq_attention(q, k, v, kc, vc, pos, starts, p),
            None => self.g.attention(q, k, v, kc, vc, pos, p),
        }; // [head_dim * n_head, n_tokens]
        if let Some(sub) = a.sub_norm {
            o = self.norm(o, sub);
        }
        self.linear(a.wo, o, so)
    }

    /// Rope over `n_rot` dims of heads of `head_dim`, with the file's scaling.
    pub fn rope_params(&self, head_dim: usize) -> RopeParams {
        let c = self.c;
        RopeParams {
            mode: c.rope_mode,
            n_rot: c.n_rot,
            head_dim,
            freq_base: c.rope_freq_base,
            freq_scale: c.rope_freq_scale,
            yarn: c.yarn.map(|y| y.rope),
        }
    }

    fn ffn(&mut self, l: &Layer, h: NodeId) -> NodeId {
        match &l.ffn {
            Ffn::Dense(f) => self.dense_ffn(f, h),
            Ffn::Moe(f) => self.moe_ffn(f, h),
        }
    }

    /// `down(act(gate·h) ⊙ up·h)`, with BitNet's sub-norm before `down`.
    pub fn dense_ffn(&mut self, f: &DenseFfn, h: NodeId) -> NodeId {
        let [sg, su, sd] = f.scales;
        let gate = self.linear(f.gate, h, sg); // [n_ff, n_tokens]
        let up = self.linear(f.up, h, su); // [n_ff, n_tokens]
        let mut y = self.g.gated_act(gate, up, self.c.activation);
        if let Some(sub) = f.sub_norm {
            y = self.norm(y, sub);
        }
        self.linear(f.down, y, sd) // [n_embd, n_tokens]
    }

    /// Keeps the wanted rows, applies the final norm and the head.
    fn head(mut self, x: NodeId) -> Built {
        // [n_embd, n_outputs]; all rows in order need no gather (one launch
        // and one input upload less a decoded token on a GPU).
        let x = match self.inputs.output_rows {
            Some(rows) => self.g.get_rows(x, rows),
            None => x,
        };
        let x = self.norm(x, self.w.output_norm);
        let logits = self.linear(self.w.output, x, 1.0); // [n_vocab, n_outputs]
        self.g.mark_output(logits);
        Built { graph: self.g, inputs: self.inputs, logits }
    }
}
