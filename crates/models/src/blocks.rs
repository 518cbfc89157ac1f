//! The pieces every transformer here is built from: the step inputs, a
//! normalised weight, one attention block and one gated FFN. Architectures
//! compose these; they never call kernels.

use tern_graph::{AttentionParams, Graph, InputKind, KvKind, NodeId, Precision, RopeParams};

use crate::weights::{LayerWeights, WeightRef, Weights};
use crate::{Batch, Config, KvSpec};

/// The step inputs the engine fills in.
#[derive(Clone, Copy, Debug)]
pub struct StepInputs {
    pub tokens: NodeId,    // [n_tokens] i32
    pub positions: NodeId, // [n_tokens] i32
    /// [n_outputs] i32; none when every row is wanted in order
    /// (`n_outputs == n_tokens`, all of decoding): nothing to gather.
    pub output_rows: Option<NodeId>,
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
        };
        // A model whose projections are float is evaluated in float throughout
        // (head included); a quantized one pairs int8 activations everywhere.
        let precision =
            if w.layers.first().is_none_or(|l| l.wq.ty.is_float()) { Precision::Float } else { Precision::Paired };
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

    /// Self-attention of layer `il` on the normalised input `h`; returns the
    /// concatenated heads `[n_head * head_dim, n_tokens]` before `attn_output`.
    pub fn attention(&mut self, il: usize, l: &LayerWeights, h: NodeId) -> NodeId {
        let c = self.c;
        let q = self.linear(l.wq, h, l.scales.q); // [head_dim * n_head, n_tokens]
        let k = self.linear(l.wk, h, l.scales.k); // [head_dim * n_head_kv, n_tokens]
        let v = self.linear(l.wv, h, l.scales.v); // [head_dim * n_head_kv, n_tokens]
        let rope = RopeParams {
            mode: c.rope_mode,
            n_rot: c.n_rot,
            head_dim: c.head_dim,
            freq_base: c.rope_freq_base,
            freq_scale: c.rope_freq_scale,
        };
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
        self.g.attention(q, k, v, kc, vc, self.inputs.positions, p)
    }

    /// `down(act(gate·h) * up·h)`, with BitNet's sub-norm before `down`.
    pub fn ffn(&mut self, l: &LayerWeights, h: NodeId) -> NodeId {
        let gate = self.linear(l.w_gate, h, l.scales.gate); // [n_ff, n_tokens]
        let up = self.linear(l.w_up, h, l.scales.up); // [n_ff, n_tokens]
        let mut f = self.g.gated_act(gate, up, self.c.activation);
        if let Some(sub) = l.ffn_sub_norm {
            f = self.norm(f, sub);
        }
        self.linear(l.w_down, f, l.scales.down) // [n_embd, n_tokens]
    }

    /// Keeps the wanted rows, applies the final norm and the head.
    pub fn head(mut self, x: NodeId) -> Built {
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
