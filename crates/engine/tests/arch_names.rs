//! Architecture names and the hidden-activation key, which no peer golden
//! covers: the compact float weights are rewritten (with tern's own GGUF
//! writer) under each name and checked against the float64 reference.
//!
//! Bound: max |Δlogit| ≤ 1e-3 against float64 (as for class f).

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use tern_engine::{npy, LoadOptions, Logits, Session};
use tern_gguf::{File, GgmlType, Value, Writer, WriterTensor};

const PROMPT: [u32; 11] = [510, 296, 387, 388, 44, 322, 361, 380, 295, 301, 440];

fn compact() -> PathBuf {
    tern_testutil::compact_dir()
}

/// Rewrites `src` with architecture `arch` (every `old.` key renamed) and an
/// optional `{arch}.hidden_activation`.
fn rewrite(src: &str, arch: &str, activation: Option<&str>, out: &Path) {
    let file = File::open(compact().join("models").join(src)).unwrap();
    let old = file.architecture().unwrap().to_string();
    let mut md = tern_gguf::Metadata::new();
    for (k, v) in file.metadata.entries() {
        let key = match k.strip_prefix(&format!("{old}.")) {
            Some(rest) => format!("{arch}.{rest}"),
            None => k.clone(),
        };
        md.set(key, v.clone());
    }
    md.set("general.architecture", Value::String(arch.into()));
    if let Some(a) = activation {
        md.set(format!("{arch}.hidden_activation"), Value::String(a.into()));
    }
    let mut w = Writer::new(md);
    w.tensors =
        file.tensors.iter().map(|t| WriterTensor { name: t.name.clone(), ty: t.ty, dims: t.dims().to_vec() }).collect();
    w.write_to_path(out, |i| Ok(Cow::Borrowed(file.tensor_data(&file.tensors[i])))).unwrap();
}

/// Max |Δ| of the first `PROMPT.len()` rows against the float64 reference.
fn max_diff_vs_ref64(model: &Path, golden: &str) -> f64 {
    let opts =
        LoadOptions { n_ctx: 32, n_threads: 2, k_type: GgmlType::F32, v_type: GgmlType::F32, ..LoadOptions::default() };
    let mut s = Session::load(model, &opts).unwrap_or_else(|e| panic!("{}: {e}", model.display()));
    let ours = s.eval(&PROMPT, Logits::All).unwrap();
    // ref64 rows are teacher-forced on the peer's ids, whose prompt is PROMPT.
    let (_, ref64) = npy::read_f32(&compact().join(format!("ref64/{golden}.npy"))).unwrap();
    tern_testutil::logits::max_abs_diff(&ours, &ref64[..ours.len()])
}

fn check(src: &str, arch: &str, activation: Option<&str>, golden: &str) -> f64 {
    let name = format!("tern-arch-{}-{arch}-{}-{src}", std::process::id(), activation.unwrap_or("none"));
    let out = std::env::temp_dir().join(name);
    rewrite(src, arch, activation, &out);
    let d = max_diff_vs_ref64(&out, golden);
    std::fs::remove_file(&out).unwrap();
    eprintln!("{src} as {arch:<13} hidden_activation={:<6} vs {golden}: max|Δ| {d:.2e}", activation.unwrap_or("-"));
    d
}

#[test]
fn every_2b4t_arch_name_runs_relu2() {
    // GQA weights: the 2B-4T graph (relu²) under each name, with or without the key.
    for arch in ["bitnet-b1.58", "bitnet-25", "bitnet"] {
        assert!(check("b158-e512-f16.gguf", arch, None, "ik_b158-e512-f16") <= 1e-3, "{arch}");
    }
    assert!(check("b158-e512-f16.gguf", "bitnet", Some("relu2"), "ik_b158-e512-f16") <= 1e-3);
}

#[test]
fn mha_bitnet_runs_silu_under_every_name() {
    for arch in ["bitnet", "bitnet-b1.58", "bitnet-25"] {
        assert!(check("bitnet-e256-f16.gguf", arch, None, "ml_bitnet-e256-f16") <= 1e-3, "{arch}");
    }
    assert!(check("bitnet-e256-f16.gguf", "bitnet-b1.58", Some("silu"), "ml_bitnet-e256-f16") <= 1e-3);
}

#[test]
fn hidden_activation_key_is_obeyed() {
    // The key overrides the shape rule: the same weights with the other
    // activation must leave the reference far behind.
    assert!(check("b158-e512-f16.gguf", "bitnet-b1.58", Some("silu"), "ik_b158-e512-f16") > 0.1);
    assert!(check("bitnet-e256-f16.gguf", "bitnet", Some("relu2"), "ml_bitnet-e256-f16") > 0.1);
}
