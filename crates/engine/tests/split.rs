//! A graph split across backends gives one CPU's logits. Each body runs on
//! every backend (`tern_testutil::test_device!`): the CPU itself (no split:
//! the baseline), a second CPU instance (splits and copies with the host's
//! arithmetic, so the logits must be identical), and the first GPU when
//! there is one (mean KL(cpu ‖ gpu) ≤ 1e-3 nat and the same top-1 on ≥ 95%
//! of rows: an int8 activation can round the other way at a tie when a norm
//! sums in another order).

mod common;

use common::with_device;
use tern_engine::{LoadOptions, Logits, Session};
use tern_graph::Op;
use tern_sched::{NodeReason, OffloadPolicy};
use tern_testutil::logits::distance;
use tern_testutil::{compact_model, demo_model, test_device, Device};

/// f32 caches, two threads.
fn opts() -> LoadOptions {
    LoadOptions {
        n_ctx: 64,
        n_threads: 2,
        k_type: tern_gguf::GgmlType::F32,
        v_type: tern_gguf::GgmlType::F32,
        ..LoadOptions::default()
    }
}

fn load(model: &std::path::Path, o: &LoadOptions) -> Session {
    let s = Session::load(model, o).unwrap_or_else(|e| panic!("{}: {e}", model.display()));
    assert!(s.notices.is_empty(), "{:?}", s.notices);
    s
}

/// `got` on `dev` against one CPU's `want`: identical where `dev` computes
/// as the host does, else within the GPU bounds.
fn assert_like_cpu(dev: Device, what: &str, want: &[f32], got: &[f32], n_vocab: usize) {
    if dev.exact() {
        assert!(want == got, "{what} on {dev}: the logits changed");
        return;
    }
    let d = distance(want, got, n_vocab);
    eprintln!("{what} on {dev}: KL {:.2e} max|Δ| {:.4} top1 {:.1}%", d.mean_kl, d.max_abs, d.top1 * 100.0);
    assert!(d.mean_kl <= 1e-3 && d.top1 >= 0.95, "{what} on {dev}: {d:?}");
}

/// Layer 1 on `dev`, so that every layer boundary copies activations.
fn split_execution(dev: Device) {
    let model = compact_model("b158-e512-tq2_0.gguf");
    let ids = [510, 296, 387, 388, 44, 322, 361, 380];
    let mut one = load(&model, &opts());
    let want = one.eval(&ids, Logits::All).unwrap();
    let mut s = load(&model, &with_device(dev, LoadOptions { overrides: vec![format!("blk\\.1\\.={dev}")], ..opts() }));
    let (built, schedule) = s.plan(ids.len(), ids.len());
    if dev != Device::Cpu {
        assert!(schedule.splits.len() >= 3, "expected CPU → {dev} → CPU splits, got {}", schedule.splits.len());
        assert!(schedule.copy_bytes(&built.graph) > 0);
    }
    let got = s.eval(&ids, Logits::All).unwrap();
    assert_like_cpu(dev, "layer 1 split off", &want, &got, one.n_vocab());
}
test_device!(split_execution);

/// Offloaded matmuls: attention and the output norm on `dev`, the FFN
/// weights on the host; a 40-token prompt streams the FFN weights' staged
/// copies to `dev` (the offload policy's default), and with offloading off
/// (`-op mul_mat,0`) they stay on the host. Both against one CPU (f16 caches).
fn offloaded_prompt_matmuls(dev: Device) {
    let model = compact_model("b158-e512-tq2_0.gguf");
    let ids: Vec<u32> = (0..40).map(|i| (i * 37 + 11) % 500).collect();
    let base = LoadOptions { n_ctx: 256, n_threads: 1, ..LoadOptions::default() };
    let mut one = load(&model, &base);
    let want = one.eval(&ids, Logits::All).unwrap();
    let overrides = vec![format!("attn_.*={dev}"), format!("output_norm={dev}")];
    let mut o = with_device(dev, LoadOptions { overrides, ..base });
    let mut s = load(&model, &o);
    let (built, schedule) = s.plan(ids.len(), ids.len());
    let offloaded = built
        .graph
        .nodes
        .iter()
        .zip(&schedule.assigned)
        .filter(|(n, a)| matches!(n.op, Op::MulMat { .. }) && matches!(a.reason, NodeReason::Offload(_)))
        .count();
    match dev {
        Device::Cpu => assert_eq!(offloaded, 0, "nothing to offload to"),
        _ => assert!(offloaded >= 3, "the FFN matmuls of every layer: {offloaded}"),
    }
    let got = s.eval(&ids, Logits::All).unwrap();
    assert_like_cpu(dev, "FFN matmuls offloaded", &want, &got, one.n_vocab());
    o.offload = OffloadPolicy::parse(&["mul_mat,0".to_string()]).unwrap();
    let kept = load(&model, &o).eval(&ids, Logits::All).unwrap();
    assert_like_cpu(dev, "FFN matmuls kept on the host", &want, &kept, one.n_vocab());
}
test_device!(offloaded_prompt_matmuls);

/// Decoding token by token across splits both ways: the demo model with
/// everything but the FFN weights on `dev` (`-ngl 99 -ot ffn_.*=CPU` on a
/// GPU; on CPU1 the same by `-ot` rules, its KV caches on the host), every
/// step's logits against one CPU stepping the same tokens. An upload racing
/// the host's next write into its (page-locked) arena would garble them.
fn hybrid_decoding_steps(dev: Device) {
    let model = demo_model();
    let ids: Vec<u32> = (0..24).map(|i| (i * 53 + 7) % 4000).collect();
    let mut cpu = load(&model, &opts());
    let mut o = with_device(dev, LoadOptions { overrides: vec!["ffn_.*=CPU".into()], ..opts() });
    match dev {
        Device::Cuda0 => o.n_gpu_layers = 99,
        _ => o.overrides.extend(["token_embd=CPU".to_string(), format!(".*={dev}")]),
    }
    let mut hybrid = load(&model, &o);
    if dev != Device::Cpu {
        let (_, schedule) = hybrid.plan(1, 1);
        assert!(schedule.splits.len() >= 3, "a step alternates between CPU and {dev}: {}", schedule.splits.len());
    }
    let (mut got, mut want) = (Vec::new(), Vec::new());
    for &t in &ids {
        got.extend(hybrid.eval(&[t], Logits::Last).unwrap());
        want.extend(cpu.eval(&[t], Logits::Last).unwrap());
    }
    assert_like_cpu(dev, &format!("{} decoding steps, FFN on the host", ids.len()), &want, &got, cpu.n_vocab());
}
test_device!(hybrid_decoding_steps);

/// Issue 36's placement: a MoE model's routed experts on the host
/// (`-ot exps=CPU`), everything else on `dev` (`-ngl 99` on a GPU; on CPU1
/// the same by `-ot` rules): the router's ids and weights and the
/// activations cross to the host and the experts' outputs back, every
/// layer. A prompt, then decoding steps (the latent cache of DeepSeek's MLA
/// stays on `dev`), against one CPU.
fn host_experts(dev: Device) {
    for name in ["q3moe-e128-q8_0.gguf", "ds2-e128-q8_0.gguf"] {
        let model = compact_model(name);
        let (prompt, steps) = ([510u32, 296, 387, 388, 44, 322, 361, 380], [295u32, 301, 440, 24, 199, 87]);
        let mut cpu = load(&model, &opts());
        let mut o = with_device(dev, LoadOptions { overrides: vec!["exps=CPU".into()], ..opts() });
        match dev {
            Device::Cuda0 => o.n_gpu_layers = 99,
            _ => o.overrides.extend(["token_embd=CPU".to_string(), format!(".*={dev}")]),
        }
        let mut split = load(&model, &o);
        if dev != Device::Cpu {
            let (built, schedule) = split.plan(1, 1);
            let host_experts = built
                .graph
                .nodes
                .iter()
                .zip(&schedule.assigned)
                .filter(|(n, a)| matches!(n.op, Op::MulMatId { .. } | Op::MoeUpGate { .. }) && a.backend.is_host())
                .count();
            assert!(host_experts >= 2, "{name}: {host_experts} expert products on the host");
            assert!(schedule.splits.len() >= 5, "{name}: the layers alternate: {}", schedule.splits.len());
        }
        let (mut want, mut got) = (cpu.eval(&prompt, Logits::All).unwrap(), split.eval(&prompt, Logits::All).unwrap());
        for &t in &steps {
            want.extend(cpu.eval(&[t], Logits::Last).unwrap());
            got.extend(split.eval(&[t], Logits::Last).unwrap());
        }
        assert_like_cpu(dev, &format!("{name}, experts on the host"), &want, &got, cpu.n_vocab());
    }
}
test_device!(host_experts);
