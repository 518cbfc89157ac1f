//! Llama (Touvron et al. 2023; Llama 3 2024): pre-norm decoder blocks with
//! rotary attention (grouped-query when n_head_kv < n_head) and a SwiGLU FFN.

use crate::blocks::{Built, Ctx};

pub fn build(mut cx: Ctx) -> Built {
    let w = cx.w;
    let mut x = cx.embed(); // [n_embd, n_tokens]
    for (il, l) in w.layers.iter().enumerate() {
        let h = cx.norm(x, l.attn_norm);
        let a = cx.attention(il, l, h); // [n_head * head_dim, n_tokens]
        let o = cx.linear(l.wo, a, l.scales.o);
        x = cx.g.add(x, o);
        let h = cx.norm(x, l.ffn_norm);
        let f = cx.ffn(l, h);
        x = cx.g.add(x, f);
    }
    cx.head(x)
}
