//! The `tern` binary end to end: quantization against the peers' files,
//! the eval contract, and one clean `error:` line for every bad input.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use tern_gguf::File;

fn tern(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tern")).args(args).output().expect("run tern")
}

fn models() -> PathBuf {
    tern_testutil::compact_dir().join("models")
}

fn model(name: &str) -> String {
    models().join(name).display().to_string()
}

/// A test's own directory, removed with everything in it when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("tern-cli-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn ok(out: &Output) -> String {
    assert!(out.status.success(), "tern failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// The process failed with exit code 1 and exactly one stderr line, `error: ...`.
fn fails_cleanly(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "expected exit 1, got {:?}; stderr: {err}", out.status.code());
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one error line, got: {err}");
    assert!(lines[0].starts_with("error: "), "{err}");
    err
}

/// Every ternary tensor of `ours` is byte-identical to the peer-made `theirs`.
fn same_ternary_tensors(ours: &Path, theirs: &Path) -> usize {
    let (a, b) = (File::open(ours).unwrap(), File::open(theirs).unwrap());
    let mut n = 0;
    for t in b.tensors.iter().filter(|t| t.ty.is_ternary() || t.name == "token_embd.weight") {
        let o = a.tensor(&t.name).unwrap_or_else(|| panic!("{} missing", t.name));
        assert_eq!(o.ty, t.ty, "{}", t.name);
        assert!(a.tensor_data(o) == b.tensor_data(t), "{}: bytes differ from {}", t.name, theirs.display());
        n += 1;
    }
    n
}

#[test]
fn quantize_reproduces_the_peers_ternary_files() {
    let dir = Scratch::new("quantize_reproduces_the_peers_ternary_files");
    let cases = [
        ("b158-e512-f16.gguf", "IQ2_BN", "b158-e512-iq2_bn.gguf"),
        ("b158-e512-f16.gguf", "IQ1_BN", "b158-e512-iq1_bn.gguf"),
        ("b158-e512-f16.gguf", "TQ2_0", "b158-e512-tq2_0.gguf"),
        ("bitnet-e256-f16.gguf", "TQ2_0", "bitnet-e256-tq2_0.gguf"),
        ("bitnet-e256-f16.gguf", "TQ1_0", "bitnet-e256-tq1_0.gguf"),
    ];
    for (src, ty, peer) in cases {
        let out = dir.file(&format!("{ty}-{src}"));
        ok(&tern(&["quantize", &model(src), out.to_str().unwrap(), ty, "--token-embedding-type", "q4_0"]));
        let n = same_ternary_tensors(&out, &models().join(peer));
        assert_eq!(n, 15, "{peer}: 14 ternary tensors + token_embd");
    }
}

/// Quantizes the b1.58 F16 model's matrices to `ty` (the embedding to Q4_0)
/// in `dir` and runs it: its greedy ids must stay as close to the F16
/// golden as the other ternary formats (class q: top-1 ≥ 85%). Returns the
/// file.
fn runs_within_the_quantized_bounds(dir: &Scratch, ty: &str) -> PathBuf {
    let out = dir.file(&format!("b158-{ty}.gguf"));
    ok(&tern(&["quantize", &model("b158-e512-f16.gguf"), out.to_str().unwrap(), ty, "--token-embedding-type", "q4_0"]));
    let f = File::open(&out).unwrap();
    assert_eq!(f.tensor("blk.0.attn_q.weight").unwrap().ty.name(), ty);
    let npy = dir.file(&format!("{ty}.npy"));
    let ids = "510,296,387,388,44,322,361,380,295,301,440";
    let stdout = ok(&tern(&[
        "eval",
        "-m",
        out.to_str().unwrap(),
        "--tokens",
        ids,
        "--gen",
        "16",
        "--logits-out",
        npy.to_str().unwrap(),
        "-c",
        "64",
    ]));
    let golden = "456,456,456,456,456,456,456,456,456,456,456,456,456,240,360,99";
    let same = stdout.trim().split(',').zip(golden.split(',')).filter(|(a, b)| a == b).count();
    assert!(same >= 14, "{ty} greedy ids {stdout} vs F16 golden {golden}");
    let (shape, _) = tern_engine::npy::read_f32(&npy).unwrap();
    assert_eq!(shape, [27, 512]);
    out
}

/// No peer computes with I2_S.
#[test]
fn i2s_model_runs_within_the_quantized_bounds() {
    let dir = Scratch::new("i2s_model_runs_within_the_quantized_bounds");
    runs_within_the_quantized_bounds(&dir, "I2_S");
}

/// Q2_0 holds the ternary matrices exactly (a block's largest magnitude is
/// the ternary scale) and multiplies them with Q8_0 activations; `tern info`
/// names the type.
#[test]
fn q2_0_model_runs_within_the_quantized_bounds() {
    let dir = Scratch::new("q2_0_model_runs_within_the_quantized_bounds");
    let out = runs_within_the_quantized_bounds(&dir, "Q2_0");
    let info = ok(&tern(&["info", "-m", out.to_str().unwrap()]));
    assert!(info.lines().any(|l| l.contains("blk.0.attn_q.weight") && l.contains("Q2_0")), "{info}");
}

/// Q1_0 keeps one sign a weight (a ternary model's zeros become ±d), so
/// no accuracy bound holds: the model quantizes, runs, and `tern info` names
/// the type.
#[test]
fn q1_0_model_quantizes_and_runs() {
    let dir = Scratch::new("q1_0_model_quantizes_and_runs");
    let out = dir.file("b158-q1_0.gguf");
    let out = out.to_str().unwrap();
    ok(&tern(&["quantize", &model("b158-e512-f16.gguf"), out, "Q1_0"]));
    let info = ok(&tern(&["info", "-m", out]));
    assert!(info.lines().any(|l| l.contains("blk.0.attn_q.weight") && l.contains("Q1_0")), "{info}");
    let npy = dir.file("q1_0.npy");
    let args = ["eval", "-m", out, "--tokens", "510,296,387", "--gen", "4", "-c", "64", "--logits-out"];
    let stdout = ok(&tern(&[&args[..], &[npy.to_str().unwrap()]].concat()));
    assert_eq!(stdout.trim().split(',').count(), 4, "{stdout}");
    assert_eq!(tern_engine::npy::read_f32(&npy).unwrap().0, [7, 512]);
}

/// `tern quantize` takes Q4_1, Q5_0 and Q5_1 by name (as users type them),
/// writes every matrix of the llama model in the type with `--pure`, and the
/// result runs. Their accuracy is checked in the engine's `block_formats.rs`.
#[test]
fn q4_1_q5_0_q5_1_models_quantize_and_run() {
    let dir = Scratch::new("q4_1_q5_0_q5_1_models_quantize_and_run");
    for ty in ["q4_1", "q5_0", "q5_1"] {
        let out = dir.file(&format!("llama-{ty}.gguf"));
        let out = out.to_str().unwrap();
        ok(&tern(&["quantize", &model("llama-e256-f16.gguf"), out, ty, "--pure"]));
        let f = File::open(out).unwrap();
        let matrices: Vec<_> = f.tensors.iter().filter(|t| t.n_dims >= 2).collect();
        assert_eq!(matrices.len(), 15);
        assert!(matrices.iter().all(|t| t.ty.name().eq_ignore_ascii_case(ty)), "{ty}");
        let info = ok(&tern(&["info", "-m", out]));
        let name = ty.to_uppercase();
        assert!(info.lines().any(|l| l.contains("blk.0.ffn_up.weight") && l.contains(&name)), "{info}");
        let npy = dir.file(&format!("{ty}.npy"));
        let args = ["eval", "-m", out, "--tokens", "510,296,387", "--gen", "4", "-c", "64", "--logits-out"];
        let stdout = ok(&tern(&[&args[..], &[npy.to_str().unwrap()]].concat()));
        assert_eq!(stdout.trim().split(',').count(), 4, "{stdout}");
        assert_eq!(tern_engine::npy::read_f32(&npy).unwrap().0, [7, 512]);
    }
}

/// llama-quantize's presets on the MoE fixtures: `q4_k_m` (any case) writes
/// the preset's mix (rows of 128 cannot take 256-blocks, so the k-quants fall
/// back to Q5_0, Q5_1 and Q8_0, and the 8-expert model's V and K projections
/// take Q8_0), records file type 15, `tern info` shows the mix with the
/// preset's name, and the models run. Each tensor's choice is checked against
/// llama-quantize's in `quantize_presets`.
#[test]
fn moe_presets_quantize_show_their_mix_and_run() {
    let dir = Scratch::new("moe_presets_quantize_show_their_mix_and_run");
    for src in ["q3moe-e128-f16", "ds3-e128-f16"] {
        let out = dir.file(&format!("{src}-q4_k_m.gguf"));
        let out = out.to_str().unwrap();
        ok(&tern(&["quantize", &model(&format!("{src}.gguf")), out, "q4_k_m"]));
        let f = File::open(out).unwrap();
        assert_eq!(f.metadata.get("general.file_type").and_then(|v| v.as_i64()), Some(15));
        let ty = |name: &str| f.tensor(name).unwrap_or_else(|| panic!("{name}")).ty.name();
        assert_eq!(ty("output.weight"), "Q8_0");
        assert_eq!(ty("token_embd.weight"), "Q5_0");
        assert_eq!(ty("blk.1.ffn_down_exps.weight"), "Q5_0");
        assert_eq!(ty("blk.1.ffn_gate_inp.weight"), "F32");
        let info = ok(&tern(&["info", "-m", out]));
        assert!(info.contains("totals (file type Q4_K_M (15)):"), "{info}");
        for t in ["Q5_0", "Q8_0", "F32"] {
            assert!(info.lines().any(|l| l.starts_with(&format!("  {t} ")) && l.contains("bpw")), "{t}: {info}");
        }
        let npy = dir.file(&format!("{src}.npy"));
        let args = ["eval", "-m", out, "--tokens", "510,296,387", "--gen", "4", "-c", "64", "--logits-out"];
        let stdout = ok(&tern(&[&args[..], &[npy.to_str().unwrap()]].concat()));
        assert_eq!(stdout.trim().split(',').count(), 4, "{stdout}");
    }
    let f = File::open(dir.file("q3moe-e128-f16-q4_k_m.gguf")).unwrap();
    // 8 experts: V and K at Q8_0; attn_output Q5_K, falling back to Q5_1 on rows of 192.
    assert_eq!(f.tensor("blk.0.attn_v.weight").unwrap().ty.name(), "Q8_0");
    assert_eq!(f.tensor("blk.0.attn_k.weight").unwrap().ty.name(), "Q8_0");
    assert_eq!(f.tensor("blk.0.attn_output.weight").unwrap().ty.name(), "Q5_1");
}

/// `tern quantize` writes Q2_K, Q3_K and IQ4_XS (ggml's reference
/// quantizers) for every 256-wide matrix with `--pure`, and the result runs.
/// Their accuracy is checked in the engine's `block_formats.rs`.
#[test]
fn q2_k_q3_k_iq4_xs_models_quantize_and_run() {
    let dir = Scratch::new("q2_k_q3_k_iq4_xs_models_quantize_and_run");
    for ty in ["q2_k", "q3_k", "iq4_xs"] {
        let out = dir.file(&format!("llama-{ty}.gguf"));
        let out = out.to_str().unwrap();
        ok(&tern(&["quantize", &model("llama-e256-f16.gguf"), out, ty, "--pure"]));
        let f = File::open(out).unwrap();
        let matrices: Vec<_> = f.tensors.iter().filter(|t| t.n_dims >= 2).collect();
        assert_eq!(matrices.len(), 15);
        assert!(matrices.iter().all(|t| t.ty.name().eq_ignore_ascii_case(ty)), "{ty}");
        let npy = dir.file(&format!("{ty}.npy"));
        let args = ["eval", "-m", out, "--tokens", "510,296,387", "--gen", "4", "-c", "64", "--logits-out"];
        let stdout = ok(&tern(&[&args[..], &[npy.to_str().unwrap()]].concat()));
        assert_eq!(stdout.trim().split(',').count(), 4, "{stdout}");
        assert_eq!(tern_engine::npy::read_f32(&npy).unwrap().0, [7, 512]);
    }
}

/// With no checkout around (another working directory) and no `-m`, `tern
/// run` writes the demo model it carries into its cache and generates from it.
#[test]
fn the_binary_carries_the_demo_model() {
    let dir = Scratch::new("embedded");
    let run = || {
        Command::new(env!("CARGO_BIN_EXE_tern"))
            .args(["run", "-p", "And God said", "-n", "8", "--temp", "0"])
            .current_dir(&dir.0)
            .env("XDG_CACHE_HOME", dir.file("cache"))
            .env_remove("TERN_MODEL")
            .output()
            .expect("run tern")
    };
    let first = ok(&run());
    let copy = dir.file("cache/tern/tern-demo-kjv.gguf");
    let shipped = tern_testutil::demo_model();
    assert_eq!(std::fs::read(&copy).unwrap(), std::fs::read(shipped).unwrap());
    assert!(first.starts_with("And God said"), "{first}");
    // A damaged copy is replaced, and the text is the same.
    std::fs::write(&copy, b"GGUF").unwrap();
    assert_eq!(ok(&run()), first);
}

#[test]
fn eval_writes_the_contract_shape_and_ids() {
    let dir = Scratch::new("eval_writes_the_contract_shape_and_ids");
    let npy = dir.file("eval.npy");
    let stdout = ok(&tern(&[
        "eval",
        "-m",
        &model("llama-e256-q8_0.gguf"),
        "--tokens",
        "510,296,387",
        "--gen",
        "4",
        "--logits-out",
        npy.to_str().unwrap(),
    ]));
    assert_eq!(stdout.trim().split(',').count(), 4);
    assert_eq!(tern_engine::npy::read_f32(&npy).unwrap().0, [7, 512]);
}

#[test]
fn info_lists_tensors_and_the_plan() {
    let out = ok(&tern(&["info", "-m", &model("b158-e512-tq2_0.gguf"), "--plan"]));
    assert!(out.contains("blk.1.ffn_down.weight") && out.contains("TQ2_0"));
    assert!(out.contains("default") && out.contains("splits"));
    let json = ok(&tern(&["info", "-m", &model("b158-e512-tq2_0.gguf"), "--json", "--plan", "-ot", "ffn=CPU"]));
    assert!(json.starts_with('{') && json.contains("\"n_tensors\": 24") && json.contains("\"plan\": {"));
}

#[test]
fn bad_inputs_give_one_error_line() {
    let dir = Scratch::new("bad_inputs_give_one_error_line");
    let m = model("llama-e256-q8_0.gguf");
    let npy = dir.file("bad.npy");
    let npy = npy.to_str().unwrap();
    fails_cleanly(&tern(&["info", "-m", "/nonexistent/model.gguf"]));
    fails_cleanly(&tern(&["run", "-m", &model("MD5SUMS"), "-p", "x"]));
    let err = fails_cleanly(&tern(&["eval", "-m", &m, "--tokens", "1,99999", "--logits-out", npy]));
    assert!(err.contains("99999"));
    fails_cleanly(&tern(&["eval", "-m", &m, "--tokens", "1,x", "--logits-out", npy]));
    let err = fails_cleanly(&tern(&["run", "-m", &m, "-p", &"light ".repeat(100), "-c", "16"]));
    assert!(err.contains("context"), "{err}");
    fails_cleanly(&tern(&["run", "-m", &m, "-p", "x", "-ot", "ffn(=CPU"]));
    let err = fails_cleanly(&tern(&["run", "-m", &m, "-p", "x", "-ot", "ffn=CUDA0"]));
    assert!(err.contains("valid backends: CPU"), "{err}");
    let out = dir.file("never.gguf");
    let err = fails_cleanly(&tern(&["quantize", &m, out.to_str().unwrap(), "Q3_XYZ"]));
    assert!(err.contains("valid presets") && err.contains("Q4_K_M") && err.contains("valid types"), "{err}");
    assert!(!out.exists());
    // A truncated model: no panic, no output left behind.
    let cut = dir.file("cut.gguf");
    let bytes = std::fs::read(&m).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    fails_cleanly(&tern(&["eval", "-m", cut.to_str().unwrap(), "--tokens", "1", "--logits-out", npy]));
    fails_cleanly(&tern(&["quantize", cut.to_str().unwrap(), out.to_str().unwrap(), "Q8_0"]));
    assert!(!out.exists());
}

#[test]
fn run_is_reproducible_for_a_seed() {
    let m = model("b158-e512-tq2_0.gguf");
    let args = ["run", "-m", &m, "-p", "And God said", "-n", "12", "--temp", "1.0", "-c", "64"];
    let with_seed = |s: &str| {
        let mut a = args.to_vec();
        a.extend(["--seed", s]);
        ok(&tern(&a))
    };
    let (a, b, c) = (with_seed("7"), with_seed("7"), with_seed("8"));
    assert_eq!(a, b);
    assert!(a.starts_with("And God said"));
    assert_ne!(a, c, "different seeds gave the same 12 sampled tokens");
}

#[test]
fn profile_shows_where_the_time_went() {
    let out =
        tern(&["run", "-m", &model("b158-e512-tq2_0.gguf"), "-p", "hello", "-n", "6", "--seed", "1", "--profile"]);
    ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    for what in ["profile:", "graph build", "copies", "CPU compute", "sync + readback", "mul_mat", "slowest matmuls"] {
        assert!(err.contains(what), "{what} missing:\n{err}");
    }
}

#[test]
fn gpu_flags_without_a_gpu_run_on_the_cpu_and_say_so() {
    if tern_cuda::devices().is_ok() {
        eprintln!("skipped: this machine has a GPU");
        return;
    }
    let out = tern(&["run", "-m", &model("b158-e512-tq2_0.gguf"), "-p", "hello", "-n", "4", "-ngl", "99"]);
    ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("warning:") && err.contains("running on the CPU"), "{err}");
    // Planning needs no GPU at all; bad device lists are one clear error.
    let m = model("b158-e512-tq2_0.gguf");
    let plan = ok(&tern(&["info", "-m", &m, "--plan", "-ngl", "99", "--devices", "CUDA0=1GiB"]));
    assert!(plan.contains("CUDA0") && plan.contains("of 1.00 GiB"), "{plan}");
    for bad in ["CUDA0", "CUDA0=lots", "GPU0=1GiB"] {
        let e = fails_cleanly(&tern(&["info", "-m", &m, "--plan", "--devices", bad]));
        assert!(e.contains("--devices"), "{e}");
    }
    let e = fails_cleanly(&tern(&["info", "-m", &m, "--plan", "-ngl", "99", "--devices", "CUDA0=1KiB"]));
    assert!(e.contains("does not fit"), "{e}");
}

/// The offload policy from the command line: the plan's prompt section and
/// JSON keys (README's schema), and clear errors for bad `-op` values.
#[test]
fn offload_policy_flags_reach_the_plan() {
    let m = model("b158-e512-tq2_0.gguf");
    let base = ["info", "-m", &m, "--plan", "-ngl", "99", "-ot", "ffn_.*=CPU", "--devices", "CUDA0=1GiB", "-c", "256"];
    let on = ok(&tern(&base));
    assert!(on.contains("prompt micro-batch (256 tokens)") && on.contains("offloaded: batch >= 32"), "{on}");
    assert!(on.contains("staged in pinned host memory"), "{on}");
    let off = ok(&tern(&[&base[..], &["-op", "mul_mat,0"]].concat()));
    assert!(!off.contains("offloaded:") && !off.contains("staged in pinned"), "{off}");
    let json = ok(&tern(&[&base[..], &["--json", "-op", "27,1", "--offload-batch", "64"]].concat()));
    for key in ["\"prompt\": {", "\"offloaded_matmuls\"", "\"streamed_bytes\"", "\"cpu_ms\"", "\"staged_bytes\""] {
        assert!(json.contains(key), "{key} missing");
    }
    assert!(json.contains("batch >= 64"), "--offload-batch reaches the policy");
    let e = fails_cleanly(&tern(&["info", "-m", &m, "--plan", "--offload-batch", "0"]));
    assert!(e.contains("--offload-batch"), "{e}");
    for (bad, says) in [("mul_mat", "OP,0|1|auto"), ("softmax,1", "valid: mul_mat"), ("mul_mat,2", "0, 1 or auto")] {
        let e = fails_cleanly(&tern(&["info", "-m", &m, "--plan", "-op", bad]));
        assert!(e.contains(says), "{bad}: {e}");
    }
}
