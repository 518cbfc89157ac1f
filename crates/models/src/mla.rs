//! Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434 §2.1), in the
//! absorbed form for prompts and decoding alike: the key up-projection is
//! folded into the queries and the value up-projection applied after the
//! attention, so the cache holds one `[latent | roped key]` row per token
//! and layer and is never expanded per head.

use tern_graph::{KvKind, LatentAttentionParams, NodeId};

use crate::blocks::Ctx;
use crate::weights::{HeadProj, Mla, MlaQuery};

impl Ctx<'_> {
    /// Layer `il`'s MLA on the normalised input `h [n_embd, n]` → `[n_embd, n]`.
    pub(crate) fn mla(&mut self, il: usize, a: &Mla, h: NodeId) -> NodeId {
        let c = self.c;
        let m = c.mla.expect("an MLA architecture");
        let dk = m.nope + m.rope;
        let q = match a.q {
            MlaQuery::Direct(w) => self.linear(w, h, 1.0),
            MlaQuery::LowRank { a, norm, b } => {
                let qa = self.linear(a, h, 1.0); // [q_lora, n]
                let qa = self.norm(qa, norm);
                self.linear(b, qa, 1.0)
            }
        }; // [dk · n_head, n]
        let q_nope = self.g.columns(q, dk, 0, m.nope); // [nope · n_head, n]
        let q_pe = self.g.columns(q, dk, m.nope, m.rope); // [rope · n_head, n]
        let kv = self.linear(a.kv_a, h, 1.0); // [rank + rope, n]
        let latent = self.g.columns(kv, m.rank + m.rope, 0, m.rank); // [rank, n]
        let k_pe = self.g.columns(kv, m.rank + m.rope, m.rank, m.rope); // [rope, n]
        let latent = self.norm(latent, a.kv_a_norm);
        // DeepSeek's YaRN keeps the rotated values' magnitude and corrects the
        // attention scale instead (below).
        let mut rope = self.rope_params(m.rope);
        if let Some(y) = rope.yarn.as_mut() {
            y.magnitude = 1.0;
        }
        let q_pe = self.g.rope(q_pe, self.inputs.positions, None, rope);
        let k_pe = self.g.rope(k_pe, self.inputs.positions, None, rope);
        let q_lat = self.head_proj(a.k_b, q_nope); // [rank · n_head, n]
        let cache = self.g.kv_cache(il, KvKind::K, self.kv.k_type, [m.rank + m.rope, self.kv.n_ctx, 1, 1]);
        let mscale = c.yarn.map_or(1.0, |y| 1.0 + y.log_mul * (1.0 / c.rope_freq_scale).ln());
        let p = LatentAttentionParams {
            layer: il,
            n_head: c.n_head,
            rank: m.rank,
            rope: m.rope,
            scale: mscale * mscale / (dk as f32).sqrt(),
            kv_pos: self.batch.kv_pos,
        };
        let pos = self.inputs.positions;
        let o = match self.inputs.seq_starts {
            Some(starts) => self.g.seq_latent_attention(q_lat, q_pe, latent, k_pe, cache, pos, starts, p),
            None => self.g.latent_attention(q_lat, q_pe, latent, k_pe, cache, pos, p),
        }; // [rank · n_head, n]
        let o = self.head_proj(a.v_b, o); // [v · n_head, n]
        self.linear(a.wo, o, 1.0)
    }

    fn head_proj(&mut self, p: HeadProj, x: NodeId) -> NodeId {
        let w = self.weight(p.w);
        self.g.mul_mat_heads(w, x, p.mm, self.precision)
    }
}
