//! The planner without a GPU: `--devices` stands in for the machine, so
//! `-ngl` boundaries, `-ot` precedence, the tied-output rule, the memory fit
//! and the errors are all checked in CPU-only CI.

use std::path::PathBuf;

use tern_backend::BackendId;
use tern_engine::planning::{parse_devices, plan_for, DevicePlan};
use tern_engine::LoadOptions;
use tern_graph::Op;
use tern_sched::{layer_of, NodeReason, OffloadPolicy, OffloadWhy, WeightReason};

fn fixture(name: &str) -> PathBuf {
    tern_testutil::compact_model(name)
}

fn opts(ngl: usize, ot: &[&str]) -> LoadOptions {
    LoadOptions {
        n_ctx: 256,
        n_threads: 1,
        n_gpu_layers: ngl,
        overrides: ot.iter().map(|s| s.to_string()).collect(),
        ..LoadOptions::default()
    }
}

fn plan(ngl: usize, ot: &[&str], devices: &str) -> tern_engine::Result<DevicePlan> {
    plan_for(fixture("b158-e512-tq2_0.gguf"), &opts(ngl, ot), &parse_devices(devices).unwrap())
}

fn on(p: &DevicePlan, name: &str) -> (BackendId, WeightReason) {
    let w = p.placement.weights.iter().find(|w| w.name == name).unwrap_or_else(|| panic!("no tensor {name}"));
    (w.backend, w.reason.clone())
}

const GPU: &str = "CUDA0=8GiB";

#[test]
fn gpu_layers_take_the_last_layers_then_the_output() {
    let n_layer = plan(0, &[], GPU).unwrap().model.config.n_layer;
    assert!(n_layer >= 2);
    for ngl in 0..=n_layer + 1 {
        let p = plan(ngl, &[], GPU).unwrap();
        for w in &p.placement.weights {
            let want_gpu = match layer_of(&w.name) {
                Some(l) => l + ngl >= n_layer,
                // The tied embedding stays on the host for the row lookup.
                None if w.name.starts_with("token_embd.") => false,
                // The output layer, only past the layer count.
                None => ngl > n_layer,
            };
            assert_eq!(!w.backend.is_host(), want_gpu, "-ngl {ngl}: {} on {}", w.name, w.backend);
        }
        // Each offloaded layer keeps its KV cache with it.
        for (l, home) in p.placement.kv_homes.iter().enumerate() {
            assert_eq!(!home.is_host(), l + ngl >= n_layer, "-ngl {ngl}: cache of layer {l}");
        }
    }
    let p = plan(n_layer + 1, &[], GPU).unwrap();
    assert!(!p.placement.weights.iter().any(|w| w.name == "output.weight"), "this fixture has a tied head");
    assert_eq!(on(&p, "token_embd.weight"), (BackendId::CPU, WeightReason::Default));
    assert_eq!(on(&p, "output_norm.weight"), (BackendId::cuda(0), WeightReason::OutputLayer));
    // The head's matmul reads a device copy of token_embd, and so does a
    // decoding step's lookup, since the first layer runs there: no host split
    // before the layers.
    let g = &p.step.graph;
    let head = g.outputs[0];
    let head_w = g.node(head).srcs[0];
    assert_eq!(p.schedule.assigned[head.index()].backend, BackendId::cuda(0));
    assert_eq!(p.schedule.assigned[head_w.index()].reason, NodeReason::HeadCopy);
    let lookup = g.nodes.iter().position(|n| matches!(n.op, tern_graph::Op::GetRows)).unwrap();
    assert_eq!(p.schedule.assigned[lookup].backend, BackendId::cuda(0));
    let table = g.nodes[lookup].srcs[0];
    assert_eq!(p.schedule.assigned[table.index()].reason, NodeReason::HeadCopyFirstLayer);
    // With the first layer on the host, a decoding lookup stays there.
    let first_on_host = plan(n_layer + 1, &["blk\\.0\\.=CPU"], GPU).unwrap();
    let g = &first_on_host.step.graph;
    let lookup = g.nodes.iter().position(|n| matches!(n.op, tern_graph::Op::GetRows)).unwrap();
    assert_eq!(first_on_host.schedule.assigned[lookup].backend, BackendId::CPU);
    // A prompt-sized lookup reads the device copy as well (batch ≥ 32).
    let kv = tern_models::KvSpec { k_type: tern_gguf::GgmlType::F16, v_type: tern_gguf::GgmlType::F16, n_ctx: 256 };
    let big = p.model.build_graph(&tern_models::Batch { n_tokens: 64, kv_pos: 0, n_outputs: 1, multi_seq: false }, &kv);
    let backends = tern_sched::Backends::new(vec![
        Box::new(tern_cpu::CpuBackend::new(BackendId::CPU, 1)),
        Box::new(tern_sched::VirtualBackend::new(BackendId::cuda(0), tern_cuda::supports)),
    ]);
    let s = tern_sched::Schedule::new(&big.graph, &p.placement, &backends);
    let lookup = big.graph.nodes.iter().position(|n| matches!(n.op, tern_graph::Op::GetRows)).unwrap();
    assert_eq!(s.assigned[lookup].backend, BackendId::cuda(0));
    let table = big.graph.nodes[lookup].srcs[0];
    assert_eq!(s.assigned[table.index()].reason, NodeReason::HeadCopyBatch);
    // The copy is counted in the GPU's memory.
    let with_copy = p.memory.iter().find(|m| m.backend == BackendId::cuda(0)).unwrap().weights;
    let without =
        plan(n_layer, &[], GPU).unwrap().memory.iter().find(|m| m.backend == BackendId::cuda(0)).unwrap().weights;
    assert!(with_copy > without);
    // With token_embd pinned to the GPU there is no copy and a step is one GPU
    // split, then the readback: a host split of no nodes that copies in the logits.
    let p = plan(n_layer + 1, &["token_embd=CUDA0"], GPU).unwrap();
    assert_eq!(p.placement.head_copy, None);
    assert_eq!(p.schedule.splits.len(), 2);
    let readback = &p.schedule.splits[1];
    assert!(readback.backend.is_host() && readback.nodes.is_empty());
    assert_eq!(readback.copies.iter().map(|c| c.src).collect::<Vec<_>>(), p.step.graph.outputs);
    assert!(p.schedule.assigned.iter().all(|a| a.backend == BackendId::cuda(0) || a.reason == NodeReason::StepInput));
}

/// Batches of several sequences run where every attention runs on the CPU;
/// the CUDA backend takes one sequence at a time, and the plan says which
/// layer's attention is the first on it.
#[test]
fn multi_sequence_batches_need_every_attention_on_the_cpu() {
    assert_eq!(plan(0, &[], GPU).unwrap().multi_seq, Ok(()));
    let one = plan(1, &[], GPU).unwrap();
    let last = one.model.config.n_layer - 1;
    let e = one.multi_seq.unwrap_err();
    assert!(e.contains(&format!("CUDA0 runs the attention of layer {last} ")), "{e}");
    let e = plan(99, &[], GPU).unwrap().multi_seq.unwrap_err();
    assert!(e.contains("CUDA0 runs the attention of layer 0"), "{e}");
}

/// The tied head on a second CPU instance (standing in for a GPU): the
/// lookup reads token_embd on CPU, the head matmul its copy on CPU1, and the
/// logits are those of one CPU.
#[test]
fn tied_head_copy_runs_and_matches() {
    let path = fixture("b158-e512-tq2_0.gguf");
    let ids = [510, 296, 387, 388, 44, 322, 361, 380];
    let mut o = opts(0, &["output_norm=CPU1"]);
    o.cpu_instances = 2;
    let mut split = tern_engine::Session::load(&path, &o).unwrap();
    assert_eq!(split.placement.head_copy.map(|c| c.backend), Some(BackendId::cpu(1)));
    let (built, schedule) = split.plan(1, 1);
    assert_eq!(schedule.assigned[built.logits.index()].backend, BackendId::cpu(1));
    let got = split.eval(&ids, tern_engine::Logits::All).unwrap();
    let want = tern_engine::Session::load(&path, &opts(0, &[])).unwrap().eval(&ids, tern_engine::Logits::All).unwrap();
    assert_eq!(got, want);
}

#[test]
fn overrides_win_over_gpu_layers_and_errors_name_the_backends() {
    let p = plan(99, &["ffn_.*=CPU"], GPU).unwrap();
    let (b, reason) = on(&p, "blk.0.ffn_up.weight");
    assert_eq!(b, BackendId::CPU);
    assert_eq!(reason, WeightReason::Override { pattern: "ffn_.*".into() });
    assert_eq!(on(&p, "blk.0.attn_q.weight").0, BackendId::cuda(0));
    // The FFN matmuls then run where their weights are: splits alternate.
    assert!(p.schedule.splits.len() > 2, "{} splits", p.schedule.splits.len());
    // Each FFN takes the residual over and gives its output back: two copies
    // a layer, and the step inputs are written where they are read (the
    // positions on the GPU, not copied to it for every split).
    let n_layer = p.model.config.n_layer;
    let copies: Vec<_> = p.schedule.splits.iter().flat_map(|s| &s.copies).collect();
    let of_inputs = copies.iter().filter(|c| matches!(p.step.graph.node(c.src).op, Op::Input(_))).count();
    assert_eq!(of_inputs, 0, "copies of step inputs");
    // Plus the embedding row, and the logits read back.
    assert!(copies.len() <= 2 * n_layer + 3, "{} copies for {n_layer} layers", copies.len());

    let err = |ot: &str, devices: &str| plan(0, &[ot], devices).err().map(|e| e.to_string()).unwrap_or_default();
    let e = err("ffn(=CUDA0", GPU);
    assert!(e.contains("bad regex"), "{e}");
    let e = err("ffn=CUDA1", GPU);
    assert!(e.contains("unknown backend") && e.contains("CPU, CUDA0"), "{e}");
    // Without a planned GPU, CUDA0 is not a valid name.
    let e = plan_for(fixture("b158-e512-tq2_0.gguf"), &opts(0, &["ffn=CUDA0"]), &[]).err().unwrap().to_string();
    assert!(e.contains("valid backends: CPU"), "{e}");
}

#[test]
fn a_plan_that_does_not_fit_says_so_before_loading() {
    let e = plan(99, &[], "CUDA0=64KiB").err().expect("must not fit").to_string();
    assert!(e.contains("does not fit") && e.contains("CUDA0"), "{e}");
    let p = plan(99, &[], GPU).unwrap();
    let gpu = p.memory.iter().find(|m| m.backend == BackendId::cuda(0)).unwrap();
    assert!(gpu.weights > 0 && gpu.kv > 0 && gpu.arena > 0, "{gpu:?}");
    assert_eq!(gpu.capacity, Some(8 << 30));
}

#[test]
fn q8_caches_are_refused_on_the_gpu() {
    let mut o = opts(99, &[]);
    o.k_type = tern_gguf::GgmlType::Q8_0;
    let e = plan_for(fixture("b158-e512-tq2_0.gguf"), &o, &parse_devices(GPU).unwrap()).err().unwrap().to_string();
    assert!(e.contains("f16 or f32"), "{e}");
}

/// A split run's profile: both backends compute, copies carry bytes, and the
/// matmuls are named by their weights.
#[test]
fn profile_of_a_split_run() {
    let mut o = opts(0, &["blk\\.1\\.=CPU1"]);
    o.cpu_instances = 2;
    let mut s = tern_engine::Session::load(fixture("b158-e512-tq2_0.gguf"), &o).unwrap();
    s.set_profiling(true);
    s.eval(&[510, 296, 387, 388], tern_engine::Logits::Last).unwrap();
    s.eval(&[44], tern_engine::Logits::Last).unwrap();
    let p = s.take_profile();
    assert_eq!(p.evals, 2);
    assert!(p.run.copy_bytes() > 0 && p.run.compute_ns.len() == 2, "{:?}", p.run);
    let cpu1 = &p.backends.iter().find(|(b, _)| *b == BackendId::cpu(1)).unwrap().1;
    assert!(cpu1.by_label.keys().all(|k| k.starts_with("blk.1.")), "{:?}", cpu1.by_label.keys());
    assert!(cpu1.by_op.contains_key("mul_mat"), "{:?}", cpu1.by_op.keys());
    // Taking the profile starts a new one.
    assert_eq!(s.take_profile().evals, 0);
}

/// The offload decision: a decode step keeps the FFN matmuls on their host
/// weights; a prompt micro-batch (256 tokens here) streams them to the GPU,
/// unless `-op mul_mat,0` or a larger `--offload-batch` says otherwise.
#[test]
fn offload_policy_moves_prompt_matmuls_not_decode_ones() {
    let with = |op: &[&str], min_batch: Option<usize>| {
        let mut o = opts(99, &["ffn_.*=CPU"]);
        o.offload = OffloadPolicy::parse(&op.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        if let Some(b) = min_batch {
            o.offload.min_batch = b;
        }
        plan_for(fixture("b158-e512-tq2_0.gguf"), &o, &parse_devices(GPU).unwrap()).unwrap()
    };
    let ffn_matmuls = |built: &tern_models::Built, s: &tern_sched::Schedule| -> Vec<(BackendId, NodeReason)> {
        let g = &built.graph;
        g.nodes
            .iter()
            .zip(&s.assigned)
            .filter(|(n, _)| matches!(n.op, Op::MulMat { .. }))
            .filter(|(n, _)| g.node(n.srcs[0]).label.as_deref().is_some_and(|l| l.contains("ffn_")))
            .map(|(_, a)| (a.backend, a.reason))
            .collect()
    };
    let p = with(&[], None);
    let decode = ffn_matmuls(&p.step, &p.schedule);
    assert!(!decode.is_empty() && decode.iter().all(|&(b, r)| b == BackendId::CPU && r == NodeReason::WeightLives));
    let prompt = ffn_matmuls(&p.prompt, &p.prompt_schedule);
    let why = NodeReason::Offload(OffloadWhy::Batch { min_batch: 32 });
    assert!(prompt.iter().all(|&(b, r)| b == BackendId::cuda(0) && r == why), "{prompt:?}");
    assert_eq!((p.offload.matmuls, p.offload.offloaded), (prompt.len(), prompt.len()));
    assert!(p.offload.streamed_bytes > 0 && p.offload.offload_s < p.offload.cpu_s);
    // The norms follow the residual stream onto the GPU (their vectors are
    // resident there too), so a prompt crosses to the host not at all.
    assert!(
        p.prompt_schedule.copy_bytes(&p.prompt.graph) < 64 << 10,
        "{}",
        p.prompt_schedule.copy_bytes(&p.prompt.graph)
    );
    let gpu = p.memory.iter().find(|m| m.backend == BackendId::cuda(0)).unwrap();
    assert!(gpu.staged > 0, "staged copies are accounted for: {gpu:?}");

    for off in [with(&["mul_mat,0"], None), with(&["27,0"], None), with(&[], Some(1024))] {
        let prompt = ffn_matmuls(&off.prompt, &off.prompt_schedule);
        assert!(prompt.iter().all(|&(b, _)| b == BackendId::CPU), "{prompt:?}");
        assert_eq!(off.offload.offloaded, 0);
    }
    assert_eq!(with(&["mul_mat,0"], None).memory.iter().map(|m| m.staged).sum::<u64>(), 0, "no copies when off");
    // auto, with the default (assumed) rates: 256 tokens of FFN belong on the GPU, one does not.
    let auto = with(&["mul_mat,auto"], None);
    assert!(ffn_matmuls(&auto.prompt, &auto.prompt_schedule).iter().all(|&(b, _)| b == BackendId::cuda(0)));
    assert!(ffn_matmuls(&auto.step, &auto.schedule).iter().all(|&(b, _)| b == BackendId::CPU));
}

/// `-ot exps=CPU`, `--cpu-moe` and `--n-cpu-moe N` put the routed experts
/// (and only them) on the host, everything else of `-ngl 99` on the GPU,
/// each with the rule that put it there; the expert ops then read them there.
#[test]
fn moe_experts_stay_on_the_host() {
    for model in ["q3moe-e128-q8_0.gguf", "ds3-e128-q8_0.gguf"] {
        let cases: [(Vec<String>, usize); 3] = [
            (vec!["exps=CPU".to_string()], 0),
            (tern_sched::moe_overrides(None), 0),
            (tern_sched::moe_overrides(Some(2)), 2),
        ];
        for (ot, first_layers) in cases {
            let ot: Vec<&str> = ot.iter().map(|s| s.as_str()).collect();
            let p = plan_for(fixture(model), &opts(99, &ot), &parse_devices(GPU).unwrap()).unwrap();
            let n_layer = p.model.config.n_layer;
            let mut experts = 0;
            for w in &p.placement.weights {
                let layer = layer_of(&w.name);
                let routed = w.name.contains("_exps.");
                let host = routed && (first_layers == 0 || layer.is_some_and(|l| l < first_layers));
                if host {
                    experts += 1;
                    assert_eq!(w.backend, BackendId::CPU, "{model} {ot:?}: {}", w.name);
                    assert!(matches!(w.reason, WeightReason::Override { .. }), "{model}: {} {:?}", w.name, w.reason);
                } else if layer.is_some() {
                    assert_eq!(w.backend, BackendId::cuda(0), "{model} {ot:?}: {}", w.name);
                }
            }
            assert!(experts >= 3, "{model} {ot:?}: {experts} expert tensors on the host");
            // Host experts are multiplied on the host, not copied to the GPU.
            let g = &p.step.graph;
            for (i, n) in g.nodes.iter().enumerate() {
                if let Op::MulMatId { .. } | Op::MoeUpGate { .. } = n.op {
                    let w = &g.nodes[n.srcs[0].index()];
                    let Op::Weight(wi) = w.op else { panic!("expert op without a weight") };
                    if p.placement.weights[wi].backend.is_host() {
                        assert_eq!(p.schedule.assigned[i].backend, BackendId::CPU, "{model}: {:?}", n.label);
                    }
                }
            }
            assert_eq!(p.placement.kv_homes.len(), n_layer);
        }
    }
}

/// The CUDA0 bytes a plan needs, with room for all of it.
fn need(model: &str, o: &LoadOptions) -> u64 {
    let p = plan_for(fixture(model), o, &parse_devices(GPU).unwrap()).unwrap();
    p.memory.iter().find(|m| m.backend == BackendId::cuda(0)).map_or(0, |m| m.need())
}

/// A plan that does not fit says what would: for a MoE model the fewest
/// first layers whose routed experts stay on the host (`--n-cpu-moe N`),
/// else the most layers on the device (`-ngl N`); each hint is the boundary
/// (it fits, one step less does not).
#[test]
fn a_plan_that_does_not_fit_says_what_would() {
    for model in ["q3moe-e128-q8_0.gguf", "ds3-e128-q8_0.gguf"] {
        let with_moe = |n: usize| {
            let ot = tern_sched::moe_overrides(Some(n));
            opts(99, &ot.iter().map(|s| s.as_str()).collect::<Vec<_>>())
        };
        let needs: Vec<u64> = (0..=2).map(|n| need(model, &with_moe(n))).collect();
        // (DeepSeek's first layer is dense: its experts start at layer 1.)
        assert!(needs[0] >= needs[1] && needs[1] > needs[2], "{model}: {needs:?}");
        let devices = parse_devices(&format!("CUDA0={}", needs[2])).unwrap();
        let e = plan_for(fixture(model), &opts(99, &[]), &devices).err().expect("must not fit").to_string();
        assert!(e.contains("--n-cpu-moe 2"), "{model}: {e}");
        assert!(plan_for(fixture(model), &with_moe(2), &devices).is_ok(), "{model}");
    }
    let model = "b158-e512-tq2_0.gguf";
    let n_layer = plan(0, &[], GPU).unwrap().model.config.n_layer;
    let ngl = n_layer - 1;
    let devices = parse_devices(&format!("CUDA0={}", need(model, &opts(ngl, &[])))).unwrap();
    let e = plan_for(fixture(model), &opts(99, &[]), &devices).err().expect("must not fit").to_string();
    assert!(e.contains(&format!("lower -ngl to {ngl}")), "{e}");
}
