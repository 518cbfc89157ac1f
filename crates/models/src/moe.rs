//! A mixture-of-experts FFN (Shazeer et al. 2017; DeepSeekMoE): a router
//! picks `k` experts per token, each runs its own gated FFN, and their
//! outputs are summed by the router's weights; shared experts, when the
//! model has them, run on every token as one dense FFN.

use tern_graph::NodeId;

use crate::blocks::Ctx;
use crate::weights::MoeFfn;

impl Ctx<'_> {
    /// `h [n_embd, n]` → `[n_embd, n]`.
    pub(crate) fn moe_ffn(&mut self, f: &MoeFfn, h: NodeId) -> NodeId {
        let logits = self.linear(f.router, h, 1.0); // [n_expert, n]
        let bias = f.bias.map(|b| self.weight(b));
        let experts = self.g.route(logits, bias, f.route); // i32 [k, n]
        let weights = self.g.route_weights(logits, experts, f.route); // [k, n]
        let (gate, up, down) = (self.weight(f.gate), self.weight(f.up), self.weight(f.down));
        let act = self.g.moe_up_gate(gate, up, h, experts, self.c.activation, self.precision); // [n_ff_exp, k, n]
        let y = self.g.mul_mat_id(down, act, experts, self.precision); // [n_embd, k, n]
        let routed = self.g.expert_sum(y, weights); // [n_embd, n]
        match &f.shared {
            Some(s) => {
                let shared = self.dense_ffn(s, h);
                self.g.add(routed, shared)
            }
            None => routed,
        }
    }
}
