//! BitNet b1.58 (Ma et al. 2024, "The Era of 1-bit LLMs"; 2B-4T technical
//! report 2025). A llama block whose projections are ternary BitLinear layers,
//! with an extra RMSNorm ("sub-norm") on the input of `attn_output` and of
//! `ffn_down`. 2B-4T uses GQA and a relu² gate; the 1bitLLM models use MHA
//! and SiLU (see `Config::activation`).

use crate::blocks::{Built, Ctx};

pub fn build(mut cx: Ctx) -> Built {
    let w = cx.w;
    let mut x = cx.embed(); // [n_embd, n_tokens]
    for (il, l) in w.layers.iter().enumerate() {
        let h = cx.norm(x, l.attn_norm);
        let mut a = cx.attention(il, l, h); // [n_head * head_dim, n_tokens]
        if let Some(sub) = l.attn_sub_norm {
            a = cx.norm(a, sub);
        }
        let o = cx.linear(l.wo, a, l.scales.o);
        x = cx.g.add(x, o);
        let h = cx.norm(x, l.ffn_norm);
        let f = cx.ffn(l, h); // ffn_sub_norm applied inside, before ffn_down
        x = cx.g.add(x, f);
    }
    cx.head(x)
}
