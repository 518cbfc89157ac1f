//! The placement plan as `tern info --plan` shows it: every weight's backend
//! and reason, how a one-token decode step is assigned and split, and the
//! memory each backend needs. Nothing is loaded: `--devices CUDA0=80GiB`
//! plans for GPUs this machine need not have; without it, the GPUs found.

use std::collections::BTreeMap;

use tern_backend::{BackendId, BackendKind};
use tern_engine::planning::{measure_costs, parse_devices, plan_for, DeviceSpec, MemoryUse, OffloadEstimate};
use tern_graph::Op;

use crate::json;
use crate::run::ModelArgs;
use crate::CliError;

pub struct Plan {
    /// What the model's blocks are made of (attention, FFN, routing, cache).
    model: Vec<String>,
    memory: Vec<MemoryUse>,
    weights: Vec<(String, String, String, u64)>, // name, backend, reason, bytes
    /// Per backend: weight bytes read per token.
    bytes_per_token: BTreeMap<String, u64>,
    nodes: NodeCounts,
    splits: Vec<(String, usize, usize)>, // backend, nodes, copies
    copy_bytes: usize,
    policy: String,
    prompt_tokens: usize,
    prompt_nodes: NodeCounts,
    prompt_copy_bytes: usize,
    offload: OffloadEstimate,
}

/// How many computed nodes each (backend, reason) got in one schedule.
struct NodeCounts(BTreeMap<(String, String), usize>);

impl NodeCounts {
    fn of(graph: &tern_graph::Graph, schedule: &tern_sched::Schedule) -> NodeCounts {
        let mut counts = BTreeMap::new();
        for (node, a) in graph.nodes.iter().zip(&schedule.assigned) {
            if !node.op.is_leaf() {
                *counts.entry((a.backend.to_string(), a.reason.to_string())).or_insert(0) += 1;
            }
        }
        NodeCounts(counts)
    }

    fn print(&self) {
        for ((backend, reason), n) in &self.0 {
            println!("  {backend:<7} {n:>5} nodes  ({reason})");
        }
    }

    fn json(&self) -> String {
        let rows: Vec<String> = self
            .0
            .iter()
            .map(|((b, r), n)| {
                json::object(&[("backend", json::string(b)), ("reason", json::string(r)), ("nodes", n.to_string())])
            })
            .collect();
        json::array(&rows)
    }
}

impl Plan {
    pub fn of(args: &ModelArgs, devices: Option<&str>) -> Result<Plan, CliError> {
        let path = args.path()?;
        let mut opts = args.options()?;
        let devices: Vec<DeviceSpec> = match devices {
            Some(d) => parse_devices(d).map_err(|e| CliError(format!("--devices: {e}")))?,
            None if opts.wants_gpu() => {
                match tern_cuda::devices() {
                    Ok(list) => {
                        // Planning for this machine: the cost model gets its real rates.
                        if let Err(e) = measure_costs(&mut opts) {
                            eprintln!("warning: {e}; the offload cost model keeps its assumed rates");
                        }
                        list.iter()
                            .map(|d| DeviceSpec { id: BackendId::cuda(d.index as u8), bytes: d.total_mem as u64 })
                            .collect()
                    }
                    Err(why) => {
                        eprintln!("warning: {why}; planning for the CPU (use --devices to plan for GPUs)");
                        Vec::new()
                    }
                }
            }
            None => Vec::new(),
        };
        let plan = plan_for(&path, &opts, &devices).map_err(|e| CliError(format!("{}: {e}", path.display())))?;
        let (model, built, schedule) = (&plan.model, &plan.step, &plan.schedule);
        let entries = &model.weights.table.entries;
        let mut weights = Vec::new();
        let mut bytes_per_token = BTreeMap::new();
        for (info, place) in entries.iter().zip(&plan.placement.weights) {
            weights.push((info.name.clone(), place.backend.to_string(), place.reason.to_string(), info.nbytes));
        }
        let mut counted = vec![false; entries.len()];
        let expert_share = model.config.moe.map(|m| (m.n_expert_used, m.n_expert));
        let graph = &built.graph;
        let by_experts: Vec<bool> = {
            let mut read = vec![false; graph.nodes.len()];
            for n in &graph.nodes {
                if let Op::MulMatId { .. } | Op::MoeUpGate { .. } = n.op {
                    n.srcs.iter().for_each(|s| read[s.index()] = true);
                }
            }
            read
        };
        for (id, (node, a)) in graph.nodes.iter().zip(&schedule.assigned).enumerate() {
            if let Op::Weight(i) = node.op {
                // A tied embedding is both the lookup table and the head: read once.
                if std::mem::replace(&mut counted[i], true) {
                    continue;
                }
                // The embedding is read one row per token, a token's experts
                // k of n_expert, every other weight whole.
                // Bytes as the backend holds them: a CPU's repacked ternary
                // layout, a GPU's (ternary codes, int8 levels, Q6_K planes).
                let e = &entries[i];
                let ne = e.ne.map(|v| v as usize);
                let held = match a.backend.kind {
                    BackendKind::Cpu => tern_engine::cpu_weight_read_bytes(e.ty, ne, e.nbytes, opts.cpu_isa),
                    BackendKind::Cuda => {
                        let desc = tern_backend::WeightDesc { ty: e.ty, ne };
                        tern_cuda::weight_bytes(desc, e.nbytes as usize) as u64
                    }
                };
                let bytes = if i == model.weights.token_embd.index && i != model.weights.output.index {
                    e.nbytes / e.ne[1].max(1)
                } else if let (true, Some((k, n))) = (by_experts[id], expert_share) {
                    held * k as u64 / n as u64
                } else {
                    held
                };
                *bytes_per_token.entry(a.backend.to_string()).or_insert(0) += bytes;
            }
        }
        let nodes = NodeCounts::of(&built.graph, schedule);
        let splits = schedule.splits.iter().map(|s| (s.backend.to_string(), s.nodes.len(), s.copies.len())).collect();
        let copy_bytes = schedule.copy_bytes(&built.graph);
        let prompt_nodes = NodeCounts::of(&plan.prompt.graph, &plan.prompt_schedule);
        let p = &plan.placement.offload;
        let rates = if p.cost.measured { "measured" } else { "assumed" };
        let policy = format!(
            "{p}; cost model ({rates}): host link {:.0} GB/s, CPU {:.2} TMAC/s and {:.0} GB/s, GPU {:.0} TMAC/s",
            p.cost.h2d_bytes_per_s / 1e9,
            p.cost.cpu_macs_per_s / 1e12,
            p.cost.cpu_bytes_per_s / 1e9,
            p.cost.gpu_macs_per_s / 1e12
        );
        Ok(Plan {
            model: model_summary(model, graph),
            memory: plan.memory,
            weights,
            bytes_per_token,
            nodes,
            splits,
            copy_bytes,
            policy,
            prompt_tokens: plan.prompt.graph.node(plan.prompt.inputs.tokens).ne[0],
            prompt_nodes,
            prompt_copy_bytes: plan.prompt_schedule.copy_bytes(&plan.prompt.graph),
            offload: plan.offload,
        })
    }

    pub fn print(&self) {
        println!("\nmodel:");
        for line in &self.model {
            println!("  {line}");
        }
        println!("\nplacement (weights):");
        println!("  {:<36} {:<7} {:>12}  reason", "tensor", "backend", "bytes");
        for (name, backend, reason, bytes) in &self.weights {
            println!("  {name:<36} {backend:<7} {bytes:>12}  {reason}");
        }
        println!("\ndecode step (1 token):");
        for (backend, bytes) in &self.bytes_per_token {
            println!("  {backend:<7} reads {bytes} weight bytes per token");
        }
        self.nodes.print();
        println!("  {} splits, {} bytes copied per token", self.splits.len(), self.copy_bytes);
        for (i, (backend, n, copies)) in self.splits.iter().enumerate() {
            let what = if *n == 0 { " (the outputs, read back)" } else { "" };
            println!("    split {i}: {backend:<7} {n:>4} nodes, {copies} inputs copied in{what}");
        }
        let o = &self.offload;
        println!("\nprompt micro-batch ({} tokens), offload policy {}:", self.prompt_tokens, self.policy);
        self.prompt_nodes.print();
        println!("  {} bytes copied between backends per micro-batch", self.prompt_copy_bytes);
        if o.matmuls > 0 {
            println!(
                "  {} of {} matmuls on staged host weights offloaded, streaming {} bytes per micro-batch",
                o.offloaded, o.matmuls, o.streamed_bytes
            );
            println!(
                "  cost model for those matmuls: {:.2} ms on the CPU, {:.2} ms offloaded (streaming included)",
                o.cpu_s * 1e3,
                o.offload_s * 1e3
            );
        }
        println!("\nmemory (weights as stored on the backend, KV cache, per-step arena):");
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        for m in &self.memory {
            let cap = m.capacity.map_or(String::new(), |c| format!(" of {:.2} GiB", gib(c)));
            let staged = if m.staged > 0 {
                format!(" (+ {:.3} GiB staged in pinned host memory)", gib(m.staged))
            } else {
                String::new()
            };
            println!(
                "  {:<7} weights {:.3} GiB, KV {:.3} GiB, arena {:.3} GiB: {:.3} GiB{cap}{staged}",
                m.backend.to_string(),
                gib(m.weights),
                gib(m.kv),
                gib(m.arena),
                gib(m.need())
            );
        }
    }

    pub fn json(&self) -> String {
        let weights: Vec<String> = self
            .weights
            .iter()
            .map(|(n, b, r, bytes)| {
                json::object(&[
                    ("name", json::string(n)),
                    ("backend", json::string(b)),
                    ("reason", json::string(r)),
                    ("bytes", bytes.to_string()),
                ])
            })
            .collect();
        let per_token: Vec<String> = self
            .bytes_per_token
            .iter()
            .map(|(b, n)| json::object(&[("backend", json::string(b)), ("weight_bytes", n.to_string())]))
            .collect();
        let splits: Vec<String> = self
            .splits
            .iter()
            .map(|(b, n, c)| {
                json::object(&[("backend", json::string(b)), ("nodes", n.to_string()), ("copies", c.to_string())])
            })
            .collect();
        let memory: Vec<String> = self
            .memory
            .iter()
            .map(|m| {
                json::object(&[
                    ("backend", json::string(&m.backend.to_string())),
                    ("weight_bytes", m.weights.to_string()),
                    ("kv_bytes", m.kv.to_string()),
                    ("arena_bytes", m.arena.to_string()),
                    ("staged_bytes", m.staged.to_string()),
                    ("capacity_bytes", m.capacity.map_or("null".to_string(), |c| c.to_string())),
                ])
            })
            .collect();
        let o = &self.offload;
        let prompt = json::object(&[
            ("tokens", self.prompt_tokens.to_string()),
            ("policy", json::string(&self.policy)),
            ("nodes", self.prompt_nodes.json()),
            ("copy_bytes", self.prompt_copy_bytes.to_string()),
            ("staged_matmuls", o.matmuls.to_string()),
            ("offloaded_matmuls", o.offloaded.to_string()),
            ("streamed_bytes", o.streamed_bytes.to_string()),
            ("cpu_ms", format!("{:.3}", o.cpu_s * 1e3)),
            ("offload_ms", format!("{:.3}", o.offload_s * 1e3)),
        ]);
        let model: Vec<String> = self.model.iter().map(|l| json::string(l)).collect();
        json::object(&[
            ("model", json::array(&model)),
            ("memory", json::array(&memory)),
            ("prompt", prompt),
            ("weights", json::array(&weights)),
            ("per_token", json::array(&per_token)),
            ("nodes", self.nodes.json()),
            ("splits", json::array(&splits)),
            ("copy_bytes_per_token", self.copy_bytes.to_string()),
        ])
    }
}

/// The model's parts as the graph builds them: attention and its cache, the
/// FFN per layer range, and the router as the decode step's `Route` op holds it.
fn model_summary(model: &tern_models::Model, graph: &tern_graph::Graph) -> Vec<String> {
    let c = &model.config;
    let alias = if c.arch_name == c.arch.name() { String::new() } else { format!(" (as {})", c.arch.name()) };
    let mut lines =
        vec![format!("{}{alias}, {} layers, n_embd {}, {} heads", c.arch_name, c.n_layer, c.n_embd, c.n_head)];
    let (k, v) = c.kv_widths();
    lines.push(match &c.mla {
        Some(m) => format!(
            "attention: MLA (absorbed), latent {} + rope {}, nope {}, v {}, q_lora {}; cache {} values a token and layer",
            m.rank,
            m.rope,
            m.nope,
            m.v_dim,
            m.q_lora.map_or("none".to_string(), |r| r.to_string()),
            k + v
        ),
        None => format!(
            "attention: GQA, {} KV heads of {}; cache {} values a token and layer",
            c.n_head_kv,
            c.head_dim,
            k + v
        ),
    });
    if let Some(y) = &c.yarn {
        lines.push(format!(
            "rope: YaRN, factor {:.3}, original context {}, log multiplier {}",
            1.0 / c.rope_freq_scale,
            y.rope.n_ctx_orig,
            y.log_mul
        ));
    }
    match &c.moe {
        Some(m) => {
            if m.n_dense_lead > 0 {
                lines.push(format!("ffn: dense (n_ff {}) in layers 0..{}", c.n_ff, m.n_dense_lead));
            }
            let shared = match m.n_shared {
                0 => String::new(),
                s => format!(", {s} shared"),
            };
            lines.push(format!(
                "ffn: {} experts of n_ff {} in layers {}..{}, {} used a token{shared}",
                m.n_expert, m.n_ff_exp, m.n_dense_lead, c.n_layer, m.n_expert_used
            ));
            if let Some(Op::Route(r)) = graph.nodes.iter().map(|n| &n.op).find(|op| matches!(op, Op::Route(_))) {
                let groups = r.groups.map_or(String::new(), |g| format!(", best {} of {} groups", g.used, g.count));
                lines.push(format!(
                    "route: {:?} gating{}{groups}, top {}, {}, scale {}",
                    r.gating,
                    if r.biased { ", selection bias" } else { "" },
                    r.k,
                    if r.norm { "renormalised" } else { "not renormalised" },
                    r.scale
                ));
            }
        }
        None => lines.push(format!("ffn: dense, n_ff {}", c.n_ff)),
    }
    lines
}
