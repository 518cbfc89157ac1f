//! Placement planning without loading: which backend each weight and node
//! gets, the splits, and how much memory every device needs. `--devices
//! CUDA0=80GiB` plans for a machine this one need not be (the CUDA backend's
//! capabilities and weight sizes are plain functions), so the whole planner
//! runs and is tested in CPU-only CI; a real load checks the fit first too.

use tern_backend::{Backend, BackendId, WeightDesc};
use tern_cpu::{CpuBackend, Rates};
use tern_cuda::CudaBackend;
use tern_gguf::{File, GgmlType};
use tern_graph::Op;
use tern_models::{Batch, Built, KvSpec, Model};
use tern_sched::{Backends, CopyKind, CostModel, NodeReason, Placement, PlacementRules, Schedule, VirtualBackend};

use crate::error::{Error, Result};
use crate::session::LoadOptions;

/// A device of the planned machine and its memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceSpec {
    pub id: BackendId,
    pub bytes: u64,
}

/// Parses `CUDA0=80GiB,CUDA1=24GB` (units B, KB/KiB, MB/MiB, GB/GiB, TB/TiB).
pub fn parse_devices(s: &str) -> std::result::Result<Vec<DeviceSpec>, String> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|part| {
            let (name, size) =
                part.split_once('=').ok_or_else(|| format!("device {part:?} is not of the form NAME=SIZE"))?;
            let id: BackendId = name.parse()?;
            if id.is_host() {
                return Err(format!("device {name:?}: only GPUs (CUDA0, CUDA1, ...) are planned"));
            }
            Ok(DeviceSpec { id, bytes: parse_size(size).ok_or_else(|| format!("device {name}: bad size {size:?}"))? })
        })
        .collect()
}

fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().ok()?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" => 1e3,
        "kib" | "k" => 1024.0,
        "mb" => 1e6,
        "mib" | "m" => 1024.0 * 1024.0,
        "gb" => 1e9,
        "gib" | "g" => 1024.0 * 1024.0 * 1024.0,
        "tb" => 1e12,
        "tib" | "t" => 1024f64.powi(4),
        _ => return None,
    };
    (n >= 0.0).then_some((n * scale) as u64)
}

/// Memory one backend needs for a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryUse {
    pub backend: BackendId,
    /// Weights as this backend stores them (repacked layouts included).
    pub weights: u64,
    pub kv: u64,
    /// Per-step tensors of the largest micro-batch.
    pub arena: u64,
    /// Staged copies of host weights, kept in pinned host memory in this
    /// device's layout for offloaded ops (`-op`); not device memory.
    pub staged: u64,
    /// The device's memory, when known.
    pub capacity: Option<u64>,
}

impl MemoryUse {
    pub fn need(&self) -> u64 {
        self.weights + self.kv + self.arena
    }
}

/// The placement a load uses: `-ot` rules over the CPU instances and `gpus`,
/// then `-ngl` on the first GPU.
pub(crate) fn place(model: &Model, opts: &LoadOptions, gpus: &[BackendId]) -> Result<(Vec<BackendId>, Placement)> {
    let mut ids: Vec<BackendId> = (0..opts.cpu_instances.max(1)).map(BackendId::cpu).collect();
    ids.extend(gpus);
    let mut rules = PlacementRules::parse_overrides(&opts.overrides, &ids)?;
    if let (n @ 1.., Some(&gpu)) = (opts.n_gpu_layers, gpus.first()) {
        rules = rules.with_gpu_layers(n, gpu);
    }
    rules.offload = opts.offload.clone();
    let mut placement = Placement::new(model.weights.table.names(), model.config.n_layer, &rules);
    // Offloaded ops stream host weights to the first GPU; without one, a
    // second CPU instance stands in for it (how tests exercise streaming).
    let device = gpus.first().copied().or((opts.cpu_instances > 1).then(|| BackendId::cpu(1)));
    let entries = &model.weights.table.entries;
    let matmul_weights = matmul_operands(model, opts);
    placement.stage(device, |i| {
        let (d, device) = (desc(&entries[i]), device?);
        if matmul_weights.contains(&i) {
            (device.is_host() || tern_cuda::streams(d)).then_some(CopyKind::Staged)
        } else {
            // Vectors (norm weights): a few KiB each, worth keeping on both sides.
            (d.ne[1] == 1 && d.ty == GgmlType::F32).then_some(CopyKind::Resident)
        }
    });
    let on_gpu = placement.kv_homes.iter().any(|b| !b.is_host());
    if on_gpu && [opts.k_type, opts.v_type].iter().any(|t| !matches!(t, GgmlType::F32 | GgmlType::F16)) {
        return Err(Error::KvType("the CUDA backend keeps f16 or f32 caches (use -ctk f16 -ctv f16)".into()));
    }
    Ok((ids, placement))
}

/// The weights that matmuls read (the only ones worth staging).
fn matmul_operands(model: &Model, opts: &LoadOptions) -> std::collections::BTreeSet<usize> {
    let step =
        model.build_graph(&Batch { n_tokens: 1, kv_pos: 0, n_outputs: 1, multi_seq: false }, &kv_spec(model, opts));
    let g = &step.graph;
    g.nodes
        .iter()
        .filter(|n| matches!(n.op, Op::MulMat { .. }))
        .filter_map(|n| match g.node(n.srcs[0]).op {
            Op::Weight(i) => Some(i),
            _ => None,
        })
        .collect()
}

/// The cache: `n_ctx` rows (the trained context when 0) per sequence.
pub(crate) fn kv_spec(model: &Model, opts: &LoadOptions) -> KvSpec {
    let n_ctx = if opts.n_ctx == 0 { model.config.n_ctx_train } else { opts.n_ctx };
    KvSpec { k_type: opts.k_type, v_type: opts.v_type, n_ctx: n_ctx * opts.n_seqs.max(1) }
}

fn desc(info: &tern_gguf::TensorInfo) -> WeightDesc {
    let mut ne = [1usize; 4];
    for (d, &n) in ne.iter_mut().zip(&info.ne) {
        *d = n as usize;
    }
    WeightDesc { ty: info.ty, ne }
}

/// Memory per backend for `placement`, with `schedule` the plan of the
/// largest micro-batch.
fn memory_use(model: &Model, placement: &Placement, kv: &KvSpec, schedule: &Schedule) -> Vec<MemoryUse> {
    let c = &model.config;
    let (k_row, v_row) = c.kv_widths();
    let cache = |ty: GgmlType, row: usize| ty.tensor_bytes(&[row as u64, kv.n_ctx as u64]).unwrap_or(0);
    placement
        .backends()
        .into_iter()
        .map(|b| {
            let weights: u64 = model
                .weights
                .table
                .entries
                .iter()
                .zip(&placement.weights)
                .filter(|(_, p)| p.backend == b)
                .map(|(info, _)| {
                    if b.is_host() {
                        info.nbytes
                    } else {
                        tern_cuda::weight_bytes(desc(info), info.nbytes as usize) as u64
                    }
                })
                .sum();
            let head_copy: u64 = placement
                .head_copy
                .filter(|c| c.backend == b)
                .map(|c| {
                    let info = &model.weights.table.entries[c.weight];
                    if b.is_host() {
                        info.nbytes
                    } else {
                        tern_cuda::weight_bytes(desc(info), info.nbytes as usize) as u64
                    }
                })
                .unwrap_or(0);
            let copies = |kind: CopyKind| -> u64 {
                placement
                    .staged
                    .iter()
                    .filter(|c| c.backend == b && c.kind == kind)
                    .map(|c| {
                        let info = &model.weights.table.entries[c.weight];
                        tern_cuda::weight_bytes(desc(info), info.nbytes as usize) as u64
                    })
                    .sum()
            };
            let (staged, resident) = (copies(CopyKind::Staged), copies(CopyKind::Resident));
            let weights = weights + head_copy + resident;
            // A host backend standing in for a device keeps staged copies as weights.
            let (weights, staged) = if b.is_host() { (weights + staged, 0) } else { (weights, staged) };
            let layers = placement.kv_homes.iter().filter(|h| **h == b).count() as u64;
            let arena = schedule.memory.arena_bytes.get(&b).copied().unwrap_or(0) as u64;
            let kv = layers * (cache(kv.k_type, k_row) + cache(kv.v_type, v_row));
            MemoryUse { backend: b, weights, kv, arena, staged, capacity: None }
        })
        .collect()
}

/// Memory per backend for the largest micro-batch (`n_batch` tokens) with
/// each device's `capacity`; fails when a device cannot hold its share.
pub(crate) fn check_memory(
    model: &Model,
    placement: &Placement,
    kv: &KvSpec,
    backends: &Backends,
    n_batch: usize,
    capacity: impl Fn(BackendId) -> Option<u64>,
) -> Result<Vec<MemoryUse>> {
    let batch = Batch { n_tokens: n_batch.min(kv.n_ctx).max(1), kv_pos: 0, n_outputs: 1, multi_seq: false };
    let built = model.build_graph(&batch, kv);
    let schedule = Schedule::new(&built.graph, placement, backends);
    // Attention runs where its layer's cache lives; a fallback elsewhere would
    // update a copy of the cache and lose the new rows.
    for (node, a) in built.graph.nodes.iter().zip(&schedule.assigned) {
        let (layer, what) = match (&node.op, a.reason) {
            (Op::Attention(p), NodeReason::Fallback) => {
                (p.layer, format!("head_dim {}, {} heads over {} KV heads", p.head_dim, p.n_head, p.n_head_kv))
            }
            (Op::LatentAttention(p), NodeReason::Fallback) => {
                (p.layer, format!("latent rank {}, rope {}, {} heads", p.rank, p.rope, p.n_head))
            }
            _ => continue,
        };
        let home = placement.kv_homes[layer];
        return Err(Error::Device(format!(
            "{home} cannot run the attention of layer {layer} ({what}); keep that layer on the CPU (lower -ngl)"
        )));
    }
    let mut memory = memory_use(model, placement, kv, &schedule);
    for m in &mut memory {
        m.capacity = capacity(m.backend);
        if let Some(have) = m.capacity.filter(|&have| m.need() > have) {
            let hint = "lower -ngl or move tensors to the CPU with -ot".to_string();
            return Err(Error::DoesNotFit { backend: m.backend.to_string(), need: m.need(), have, hint });
        }
    }
    Ok(memory)
}

/// `e` with what would fit when it is a plan that does not (else `e`): for a
/// MoE model, the fewest first layers whose routed experts stay on the CPU
/// (`--n-cpu-moe N`), else the most layers on the device (`-ngl N`). Both
/// needs shrink as the count moves that way, so each is a binary search of
/// plans (placement, graph, schedule; no weight is read).
pub(crate) fn with_fit_hint(
    e: Error,
    model: &Model,
    opts: &LoadOptions,
    gpus: &[BackendId],
    capacity: &dyn Fn(BackendId) -> Option<u64>,
) -> Error {
    let Error::DoesNotFit { backend, need, have, .. } = e else { return e };
    let fits = |o: &LoadOptions| {
        let Ok((ids, placement)) = place(model, o, gpus) else { return false };
        check_memory(model, &placement, &kv_spec(model, o), &planning_backends(&ids), o.n_batch, capacity).is_ok()
    };
    // The smallest n in lo..=hi with ok(n), if ok(hi).
    let least = |lo: usize, hi: usize, ok: &dyn Fn(usize) -> bool| -> Option<usize> {
        if lo > hi || !ok(hi) {
            return None;
        }
        let (mut lo, mut hi) = (lo, hi);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if ok(mid) {
                hi = mid
            } else {
                lo = mid + 1
            }
        }
        Some(lo)
    };
    let n_layer = model.config.n_layer;
    let cpu_moe = |n: usize| {
        let mut o = opts.clone();
        o.overrides.extend(tern_sched::moe_overrides(Some(n)));
        fits(&o)
    };
    let hint = if let Some(n) = model.config.moe.and_then(|_| least(1, n_layer, &cpu_moe)) {
        format!("keep the routed experts of the first {n} layers on the CPU (--n-cpu-moe {n})")
    } else {
        // The most layers: the least number of layers left on the CPU.
        let top = opts.n_gpu_layers.min(n_layer + 1);
        let off = |cpu: usize| {
            let o = LoadOptions { n_gpu_layers: top - cpu, ..opts.clone() };
            top - cpu == 0 || fits(&o)
        };
        match least(1, top, &off).map(|cpu| top - cpu) {
            Some(ngl) if ngl > 0 => format!("lower -ngl to {ngl}"),
            _ => "move tensors to the CPU with -ot".to_string(),
        }
    };
    Error::DoesNotFit { backend, need, have, hint }
}

/// A plan: the model's placement, the graph and schedule of a decoding step,
/// and the memory each backend needs.
pub struct DevicePlan {
    pub model: Model,
    pub placement: Placement,
    /// One token in, one row of logits out.
    pub step: Built,
    pub schedule: Schedule,
    /// A prompt micro-batch (`n_batch` tokens), where the offload policy acts.
    pub prompt: Built,
    pub prompt_schedule: Schedule,
    pub offload: OffloadEstimate,
    pub memory: Vec<MemoryUse>,
    /// Whether batches of several sequences can run (`Session::eval_seqs`);
    /// if not, which attention cannot.
    pub multi_seq: std::result::Result<(), String>,
}

/// What the offload policy does to a prompt micro-batch's matmuls on host
/// weights that have staged copies, with the cost model's times for both
/// choices (the prediction `-op mul_mat,0|1` can be checked against).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OffloadEstimate {
    pub matmuls: usize,
    pub offloaded: usize,
    /// Staged weight bytes streamed per micro-batch.
    pub streamed_bytes: u64,
    /// Seconds for all of them on the CPU, and all of them offloaded.
    pub cpu_s: f64,
    pub offload_s: f64,
}

fn offload_estimate(prompt: &Built, schedule: &Schedule, placement: &Placement) -> OffloadEstimate {
    let g = &prompt.graph;
    let mut e = OffloadEstimate::default();
    for (node, a) in g.nodes.iter().zip(&schedule.assigned) {
        let Op::MulMat { .. } = node.op else { continue };
        let Some((_, work)) = placement.staged_work(g, node) else { continue };
        e.matmuls += 1;
        e.cpu_s += placement.offload.cost.cpu_s(&work);
        e.offload_s += placement.offload.cost.gpu_s(&work);
        if matches!(a.reason, NodeReason::Offload(_)) {
            e.offloaded += 1;
            e.streamed_bytes += work.weight_bytes;
        }
    }
    e
}

/// Plans `path` for a machine with `devices`, loading no weights and needing
/// no GPU. Fails if a device's share does not fit in its memory.
pub fn plan_for(path: impl AsRef<std::path::Path>, opts: &LoadOptions, devices: &[DeviceSpec]) -> Result<DevicePlan> {
    let file = File::open(path)?;
    let model = Model::load(&file)?;
    let gpus: Vec<BackendId> = devices.iter().map(|d| d.id).collect();
    let (ids, placement) = place(&model, opts, &gpus)?;
    let backends = planning_backends(&ids);
    let kv = kv_spec(&model, opts);
    let capacity = |b: BackendId| devices.iter().find(|d| d.id == b).map(|d| d.bytes);
    let memory = check_memory(&model, &placement, &kv, &backends, opts.n_batch, capacity)
        .map_err(|e| with_fit_hint(e, &model, opts, &gpus, &capacity))?;
    let step = model.build_graph(&Batch { n_tokens: 1, kv_pos: 0, n_outputs: 1, multi_seq: false }, &kv);
    let schedule = Schedule::new(&step.graph, &placement, &backends);
    let prompt_tokens = opts.n_batch.min(kv.n_ctx).max(1);
    let prompt = model.build_graph(&Batch { n_tokens: prompt_tokens, kv_pos: 0, n_outputs: 1, multi_seq: false }, &kv);
    let prompt_schedule = Schedule::new(&prompt.graph, &placement, &backends);
    let offload = offload_estimate(&prompt, &prompt_schedule, &placement);
    let multi_seq = multi_seq_support(&model, &kv, &placement, &backends);
    Ok(DevicePlan { model, placement, step, schedule, prompt, prompt_schedule, offload, memory, multi_seq })
}

/// Whether every layer's attention may run a multi-sequence batch where its
/// cache lives (the CUDA backend takes one sequence at a time); if not,
/// which one cannot.
pub(crate) fn multi_seq_support(
    model: &Model,
    kv: &KvSpec,
    placement: &Placement,
    backends: &Backends,
) -> std::result::Result<(), String> {
    let batch = Batch { n_tokens: 2, kv_pos: 0, n_outputs: 2, multi_seq: true };
    let built = model.build_graph(&batch, kv);
    let schedule = Schedule::new(&built.graph, placement, backends);
    for (node, a) in built.graph.nodes.iter().zip(&schedule.assigned) {
        let layer = match &node.op {
            Op::Attention(p) => p.layer,
            Op::LatentAttention(p) => p.layer,
            _ => continue,
        };
        let home = placement.kv_homes[layer];
        if a.backend != home {
            return Err(format!("{home} runs the attention of layer {layer} one sequence at a time"));
        }
    }
    Ok(())
}

/// Sets the offload cost model's rates to this machine's: the CPU's (with
/// `opts.n_threads`) and the first GPU's host link (`tern info --plan` for
/// the machine it runs on; a session measures its own when it uses `auto`).
pub fn measure_costs(opts: &mut LoadOptions) -> std::result::Result<(), String> {
    let mut gpu = CudaBackend::with_options(0, &opts.cuda).map_err(|e| format!("CUDA0: {e}"))?;
    opts.offload.cost.h2d_bytes_per_s = gpu.measure_h2d().map_err(|e| e.to_string())?;
    let rates = CpuBackend::with_options(BackendId::CPU, &opts.cpu_options()).measure_rates();
    set_cpu_rates(&mut opts.offload.cost, rates);
    Ok(())
}

/// Puts a CPU backend's measured rates into the cost model.
pub(crate) fn set_cpu_rates(cost: &mut CostModel, r: Rates) {
    (cost.cpu_macs_per_s, cost.cpu_bytes_per_s, cost.measured) = (r.macs_per_s, r.bytes_per_s, true);
}

/// Stand-ins that answer `supports` like the real backends.
fn planning_backends(ids: &[BackendId]) -> Backends {
    let list = ids
        .iter()
        .map(|&id| -> Box<dyn Backend> {
            if id.is_host() {
                Box::new(CpuBackend::new(id, 1))
            } else {
                Box::new(VirtualBackend::new(id, tern_cuda::supports))
            }
        })
        .collect();
    Backends::new(list)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_lists_parse() {
        let d = parse_devices("CUDA0=80GiB,cuda1=24GB").unwrap();
        assert_eq!(d[0], DeviceSpec { id: BackendId::cuda(0), bytes: 80 << 30 });
        assert_eq!(d[1], DeviceSpec { id: BackendId::cuda(1), bytes: 24_000_000_000 });
        assert_eq!(parse_devices("CUDA0=512MiB").unwrap()[0].bytes, 512 << 20);
        for bad in ["CUDA0", "GPU0=1GiB", "CUDA0=lots", "CPU=1GiB", "CUDA0=1XB"] {
            assert!(parse_devices(bad).is_err(), "{bad}");
        }
    }
}
