//! Scratch (not committed): which op moves a legacy/YaRN MoE row off the CPU's logits.
use tern_engine::{LoadOptions, Logits, Session};
use tern_gguf::GgmlType;
#[test]
fn where_it_differs() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/compact/models");
    let ids: Vec<u32> =
        "510,296,387,388,44,322,361,380,295,301,440,128,46,121,301,56,256,56,256,56,183,378,128,341,46,56,429"
            .split(',')
            .map(|s| s.parse().unwrap())
            .collect();
    let opts = |ngl: usize, ot: &str| LoadOptions {
        n_ctx: 64,
        n_threads: 2,
        k_type: GgmlType::F32,
        v_type: GgmlType::F32,
        n_gpu_layers: ngl,
        overrides: if ot.is_empty() { vec![] } else { vec![ot.to_string()] },
        ..LoadOptions::default()
    };
    for m in ["ds2-e128-qlora-legacy-q8_0.gguf", "ds2y-e128-q8_0.gguf", "ds3-e128-qlora-legacy-q8_0.gguf"] {
        let p = dir.join(m);
        let cpu = Session::load(&p, &opts(0, "")).unwrap().eval(&ids, Logits::All).unwrap();
        for ot in [
            "",
            "attn_q_a\\.=CPU",
            "attn_q_a_norm=CPU",
            "attn_q_b=CPU",
            "attn_q\\.=CPU",
            "attn_kv_a_mqa=CPU",
            "attn_kv_a_norm=CPU",
            "attn_kv_b=CPU",
            "attn_k_b|attn_v_b=CPU",
            "attn_output=CPU",
            "attn_norm=CPU",
            "ffn_gate_inp=CPU",
            "exp_probs_b=CPU",
            "exps=CPU",
            "shexp=CPU",
            "ffn_norm=CPU",
            "output=CPU",
            "attn=CPU",
            "blk\\.0\\.=CPU",
            "blk\\.[12]\\.=CPU",
        ] {
            let mut s = match Session::load(&p, &opts(99, ot)) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("{m} {ot}: {e}");
                    continue;
                }
            };
            let n_vocab = s.n_vocab();
            let got = s.eval(&ids, Logits::All).unwrap();
            let d = tern_testutil::logits::distance(&cpu, &got, n_vocab);
            eprintln!("{m:<34} {ot:<24} KL {:.2e} max|Δ| {:.4}", d.mean_kl, d.max_abs);
        }
    }
}
