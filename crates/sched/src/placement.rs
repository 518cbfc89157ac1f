//! Weight placement: which backend every weight tensor lives on, and why.
//! This is plain data, printable by `tern info --plan` and asserted by tests.

use std::fmt;

use regex::Regex;
use tern_backend::BackendId;

use crate::offload::{Mode, OffloadOp, OffloadPolicy, Work};

/// Why a weight lives where it does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WeightReason {
    /// No rule matched: weights stay on the host.
    Default,
    /// A `-ot PATTERN=BACKEND` rule matched (the first matching rule wins).
    Override { pattern: String },
    /// The weight's layer is among the last `-ngl` layers.
    GpuLayers { n_gpu_layers: usize },
    /// `-ngl` exceeds the layer count, so the output layer is offloaded too.
    OutputLayer,
}

impl fmt::Display for WeightReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WeightReason::Default => f.write_str("default"),
            WeightReason::Override { pattern } => write!(f, "override {pattern:?}"),
            WeightReason::GpuLayers { n_gpu_layers } => write!(f, "-ngl {n_gpu_layers}"),
            WeightReason::OutputLayer => f.write_str("output layer offloaded"),
        }
    }
}

/// One `-ot` rule: an unanchored regex search on the tensor name.
#[derive(Clone, Debug)]
pub struct Override {
    pub pattern: Regex,
    pub backend: BackendId,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RuleError {
    #[error("override {spec:?} is not of the form REGEX=BACKEND")]
    Syntax { spec: String },
    #[error("override {spec:?}: bad regex: {reason}")]
    Regex { spec: String, reason: String },
    #[error("override {spec:?}: unknown backend {name:?}; valid backends: {valid}")]
    UnknownBackend { spec: String, name: String, valid: String },
}

/// The user's placement rules.
#[derive(Clone, Debug, Default)]
pub struct PlacementRules {
    pub overrides: Vec<Override>,
    /// `-ngl N`: the last N layers (and, past the layer count, the output)
    /// go to `gpu`.
    pub n_gpu_layers: usize,
    pub gpu: Option<BackendId>,
    /// `-op`: which ops on host weights may run on `gpu`.
    pub offload: OffloadPolicy,
}

impl PlacementRules {
    /// Parses `-ot` values. Each value may hold a comma list of `REGEX=BACKEND`
    /// (split at the first `=`); `available` names the backends that exist.
    pub fn parse_overrides(values: &[String], available: &[BackendId]) -> Result<PlacementRules, RuleError> {
        let mut overrides = Vec::new();
        for value in values {
            for spec in value.split(',').filter(|s| !s.is_empty()) {
                let (pat, name) = spec.split_once('=').ok_or_else(|| RuleError::Syntax { spec: spec.to_string() })?;
                let pattern = Regex::new(pat)
                    .map_err(|e| RuleError::Regex { spec: spec.to_string(), reason: regex_reason(&e) })?;
                let valid = || available.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(", ");
                let backend = name.parse::<BackendId>().ok().filter(|b| available.contains(b)).ok_or_else(|| {
                    RuleError::UnknownBackend { spec: spec.to_string(), name: name.to_string(), valid: valid() }
                })?;
                overrides.push(Override { pattern, backend });
            }
        }
        Ok(PlacementRules { overrides, n_gpu_layers: 0, gpu: None, offload: OffloadPolicy::default() })
    }

    /// Adds `-ngl n` offloading to `gpu`.
    pub fn with_gpu_layers(mut self, n: usize, gpu: BackendId) -> PlacementRules {
        self.n_gpu_layers = n;
        self.gpu = Some(gpu);
        self
    }

    /// The first layer that `-ngl` offloads (`n_layer` when none).
    pub fn first_gpu_layer(&self, n_layer: usize) -> usize {
        match self.gpu {
            Some(_) => n_layer.saturating_sub(self.n_gpu_layers),
            None => n_layer,
        }
    }
}

/// `--n-cpu-moe` from this many layers on means every layer.
const MANY_LAYERS: usize = 1000;

/// The `-ot` rules of `--cpu-moe` (`None`: every layer) and `--n-cpu-moe N`
/// (the first N layers): MoE expert tensors stay on the CPU.
pub fn moe_overrides(first_layers: Option<usize>) -> Vec<String> {
    const EXPERTS: &str = r"\.ffn_(up|down|gate)_exps";
    match first_layers {
        None => vec![format!("{EXPERTS}=CPU")],
        Some(0) => Vec::new(),
        // More layers than any model has: all of them (and no huge regex).
        Some(n) if n >= MANY_LAYERS => moe_overrides(None),
        Some(n) => {
            let layers: Vec<String> = (0..n).map(|l| l.to_string()).collect();
            vec![format!(r"^blk\.({})\.ffn_(up|down|gate)_exps=CPU", layers.join("|"))]
        }
    }
}

/// The layer a tensor name belongs to (`blk.N.`), if any.
pub fn layer_of(name: &str) -> Option<usize> {
    let rest = name.strip_prefix("blk.")?;
    rest[..rest.find('.')?].parse().ok()
}

/// Tensors of the output layer (the head and its norm).
fn is_output(name: &str) -> bool {
    name.starts_with("output.") || name.starts_with("output_norm.")
}

/// The regex crate's message draws a caret under the pattern over several
/// lines; its last line is the reason.
fn regex_reason(e: &regex::Error) -> String {
    let text = e.to_string();
    let last = text.lines().last().unwrap_or_default().trim();
    last.strip_prefix("error: ").unwrap_or(last).to_string()
}

/// Where one weight lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightPlace {
    pub name: String,
    pub backend: BackendId,
    pub reason: WeightReason,
}

/// A second, device-resident copy of a tied head (`token_embd` read by the
/// output matmul): the embedding lookup stays where `token_embd` lives, and
/// the head's matmul runs beside the offloaded output layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadCopy {
    /// Index of `token_embd` in the weight table.
    pub weight: usize,
    pub backend: BackendId,
}

/// A second copy of a host-resident weight on a device, for ops that the
/// offload policy moves there (`-op`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StagedCopy {
    pub weight: usize,
    pub backend: BackendId,
    pub kind: CopyKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyKind {
    /// A matmul weight, kept in host memory in the device's layout and
    /// streamed in by each offloaded matmul.
    Staged,
    /// A small weight (a norm's vector), resident on the device, so that the
    /// op reading it can follow its input there instead of the input
    /// bouncing back to the host.
    Resident,
}

/// The placement of every weight, plus the home of each layer's KV cache.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    /// Indexed like the model's weight table.
    pub weights: Vec<WeightPlace>,
    /// Backend holding each layer's KV cache.
    pub kv_homes: Vec<BackendId>,
    pub head_copy: Option<HeadCopy>,
    pub offload: OffloadPolicy,
    /// Weights that offloaded ops may stream (see [`Placement::stage`]).
    pub staged: Vec<StagedCopy>,
}

impl Placement {
    /// Places weights by name under `rules`: `-ot` rules first, then `-ngl`,
    /// else the host. Each offloaded layer keeps its KV cache on the GPU.
    /// With a tied head (no `output.weight`), `token_embd` stays put for the
    /// row lookup, and when the output layer (`output_norm`) lives elsewhere
    /// the head gets a copy of it there ([`HeadCopy`]).
    pub fn new<'a>(names: impl IntoIterator<Item = &'a str>, n_layer: usize, rules: &PlacementRules) -> Placement {
        let names: Vec<&str> = names.into_iter().collect();
        let first_gpu = rules.first_gpu_layer(n_layer);
        let output_on_gpu = rules.gpu.is_some() && rules.n_gpu_layers > n_layer;
        let tied = !names.iter().any(|n| n.starts_with("output."));
        let weights: Vec<WeightPlace> = names
            .iter()
            .map(|&name| {
                let hit = rules.overrides.iter().find(|o| o.pattern.is_match(name));
                let by_layers = |gpu| match layer_of(name) {
                    Some(l) if l >= first_gpu => {
                        Some((gpu, WeightReason::GpuLayers { n_gpu_layers: rules.n_gpu_layers }))
                    }
                    None if output_on_gpu && is_output(name) => Some((gpu, WeightReason::OutputLayer)),
                    _ => None,
                };
                let (backend, reason) = match (hit, rules.gpu.and_then(by_layers)) {
                    (Some(o), _) => (o.backend, WeightReason::Override { pattern: o.pattern.as_str().to_string() }),
                    (None, Some(p)) => p,
                    (None, None) => (BackendId::CPU, WeightReason::Default),
                };
                WeightPlace { name: name.to_string(), backend, reason }
            })
            .collect();
        let kv_homes = (0..n_layer)
            .map(|l| match rules.gpu {
                Some(gpu) if l >= first_gpu => gpu,
                _ => BackendId::CPU,
            })
            .collect();
        let backend_of =
            |n: &str| weights.iter().position(|w: &WeightPlace| w.name.starts_with(n)).map(|i| (i, weights[i].backend));
        let head_copy = match (tied, backend_of("token_embd."), backend_of("output_norm.")) {
            (true, Some((weight, embd)), Some((_, head))) if embd != head => Some(HeadCopy { weight, backend: head }),
            _ => None,
        };
        Placement { weights, kv_homes, head_copy, offload: rules.offload.clone(), staged: Vec::new() }
    }

    /// Gives host-resident weights a copy on `gpu`, of the kind `kind_of`
    /// says (none for weights it skips), when the offload policy can move a
    /// matmul there. The tied head already has its copy.
    pub fn stage(&mut self, gpu: Option<BackendId>, kind_of: impl Fn(usize) -> Option<CopyKind>) {
        let Some(gpu) = gpu.filter(|_| self.offload.mode(OffloadOp::MulMat) != Mode::Off) else { return };
        let head = self.head_copy.map(|c| c.weight);
        self.staged = (0..self.weights.len())
            .filter(|&i| {
                let home = self.weights[i].backend;
                home.is_host() && home != gpu && Some(i) != head
            })
            .filter_map(|weight| Some(StagedCopy { weight, backend: gpu, kind: kind_of(weight)? }))
            .collect();
    }

    /// The offload policy's view of matmul `mm` when its weight has a staged
    /// copy: the weight's index and the work the policy weighs.
    pub fn staged_work(&self, graph: &tern_graph::Graph, mm: &tern_graph::Node) -> Option<(usize, Work)> {
        let w = graph.node(*mm.srcs.first()?);
        let tern_graph::Op::Weight(i) = w.op else { return None };
        self.staged_copy(i)?;
        let batch = mm.ne[1] * mm.ne[2] * mm.ne[3];
        let work = Work {
            op: OffloadOp::MulMat,
            batch,
            weight_bytes: w.nbytes() as u64,
            macs: (w.ne[0] * w.ne[1] * batch) as u64,
        };
        Some((i, work))
    }

    /// The staged copy of weight `i`, if it has one.
    pub fn staged_copy(&self, i: usize) -> Option<StagedCopy> {
        self.staged.iter().find(|c| c.weight == i).copied()
    }

    /// All backends that hold something.
    pub fn backends(&self) -> Vec<BackendId> {
        let mut b: Vec<BackendId> =
            self.weights.iter().map(|w| w.backend).chain(self.kv_homes.iter().copied()).collect();
        b.push(BackendId::CPU);
        b.sort();
        b.dedup();
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(specs: &[&str]) -> Result<PlacementRules, RuleError> {
        let v: Vec<String> = specs.iter().map(|s| s.to_string()).collect();
        PlacementRules::parse_overrides(&v, &[BackendId::CPU, BackendId::cpu(1), BackendId::cuda(0)])
    }

    #[test]
    fn moe_rules_pin_expert_tensors_of_the_chosen_layers() {
        let names = [
            "blk.0.ffn_up_exps.weight",
            "blk.1.ffn_gate_exps.weight",
            "blk.2.ffn_down_exps.weight",
            "blk.10.ffn_up_exps.weight",
            "blk.1.ffn_up.weight",
            "blk.1.ffn_up_shexp.weight",
        ];
        let on_cpu = |first: Option<usize>| -> Vec<bool> {
            let specs = moe_overrides(first);
            let r = PlacementRules::parse_overrides(&specs, &[BackendId::CPU, BackendId::cuda(0)])
                .unwrap()
                .with_gpu_layers(99, BackendId::cuda(0));
            Placement::new(names, 11, &r).weights.iter().map(|w| w.backend.is_host()).collect()
        };
        // --cpu-moe: every expert tensor, no dense or shared-expert one.
        assert_eq!(on_cpu(None), [true, true, true, true, false, false]);
        // --n-cpu-moe 2: layers 0 and 1 only (not 10).
        assert_eq!(on_cpu(Some(2)), [true, true, false, false, false, false]);
        assert_eq!(on_cpu(Some(0)), [false; 6]);
        assert_eq!(on_cpu(Some(5000)), on_cpu(None));
    }

    #[test]
    fn first_matching_override_wins() {
        let r = rules(&["ffn_up=CPU1,blk\\.1\\.=CPU", "ffn=CPU1"]).unwrap();
        let p = Placement::new(
            ["blk.0.ffn_up.weight", "blk.1.ffn_up.weight", "blk.1.ffn_down.weight", "output_norm.weight"],
            2,
            &r,
        );
        let got: Vec<String> = p.weights.iter().map(|w| w.backend.to_string()).collect();
        assert_eq!(got, ["CPU1", "CPU1", "CPU", "CPU"]);
        assert_eq!(p.weights[2].reason, WeightReason::Override { pattern: "blk\\.1\\.".into() });
        assert_eq!(p.weights[3].reason, WeightReason::Default);
    }

    #[test]
    fn gpu_layers_offload_the_last_layers_then_the_output() {
        let names = ["token_embd.weight", "blk.0.ffn_up.weight", "blk.1.ffn_up.weight", "output_norm.weight"];
        let gpu = BackendId::cuda(0);
        let place = |n| Placement::new(names, 2, &PlacementRules::default().with_gpu_layers(n, gpu));
        let on = |p: &Placement| p.weights.iter().map(|w| w.backend.to_string()).collect::<Vec<_>>();
        assert_eq!(on(&place(1)), ["CPU", "CPU", "CUDA0", "CPU"]);
        assert_eq!(place(1).kv_homes, [BackendId::CPU, gpu]);
        assert_eq!(on(&place(2)), ["CPU", "CUDA0", "CUDA0", "CPU"]);
        // Past the layer count the output layer follows; the tied token_embd
        // stays for the lookup and the head gets a copy on the GPU.
        assert_eq!(on(&place(3)), ["CPU", "CUDA0", "CUDA0", "CUDA0"]);
        assert_eq!(place(3).head_copy, Some(HeadCopy { weight: 0, backend: gpu }));
        assert_eq!(place(2).head_copy, None);
        // -ot wins over -ngl.
        let mut r = rules(&["ffn_up=CPU", "token_embd=CUDA0"]).unwrap();
        r = r.with_gpu_layers(99, gpu);
        let p = Placement::new(names, 2, &r);
        assert_eq!(on(&p), ["CUDA0", "CPU", "CPU", "CUDA0"]);
        assert_eq!(p.head_copy, None, "token_embd is on the GPU already");
        assert_eq!(layer_of("blk.12.attn_q.weight"), Some(12));
        assert_eq!(layer_of("token_embd.weight"), None);
    }

    /// The 2B-4T tensor list: 30 layers, tied head.
    #[test]
    fn gpu_layers_on_the_2b4t_tensor_list() {
        let per_layer = [
            "attn_norm",
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_sub_norm",
            "attn_output",
            "ffn_norm",
            "ffn_gate",
            "ffn_up",
            "ffn_sub_norm",
            "ffn_down",
        ];
        let mut names = vec!["token_embd.weight".to_string(), "output_norm.weight".to_string()];
        for l in 0..30 {
            names.extend(per_layer.iter().map(|t| format!("blk.{l}.{t}.weight")));
        }
        let gpu = BackendId::cuda(0);
        let place = |n| {
            Placement::new(names.iter().map(|s| s.as_str()), 30, &PlacementRules::default().with_gpu_layers(n, gpu))
        };
        let on_gpu = |p: &Placement| p.weights.iter().filter(|w| w.backend == gpu).count();
        assert_eq!(on_gpu(&place(15)), 15 * 11);
        assert!(place(15).weights.iter().filter(|w| w.backend == gpu).all(|w| layer_of(&w.name).unwrap() >= 15));
        assert_eq!(on_gpu(&place(30)), 30 * 11, "all layers, not the output layer");
        assert_eq!(on_gpu(&place(31)), 30 * 11 + 1, "past the layer count: output_norm");
        assert_eq!(place(31).head_copy, Some(HeadCopy { weight: 0, backend: gpu }), "and a copy of the tied head");
        assert_eq!(place(15).kv_homes.iter().filter(|h| **h == gpu).count(), 15);
    }

    #[test]
    fn bad_rules_are_clear_errors() {
        assert!(matches!(rules(&["ffn("]), Err(RuleError::Syntax { .. })));
        assert!(matches!(rules(&["ffn(=CPU"]), Err(RuleError::Regex { .. })));
        match rules(&["ffn=CUDA1"]) {
            Err(RuleError::UnknownBackend { valid, .. }) => assert_eq!(valid, "CPU, CPU1, CUDA0"),
            other => panic!("{other:?}"),
        }
    }
}
