//! A session: one model loaded onto its backends with a KV cache, evaluating
//! batches of tokens. Load → place → upload weights → per micro-batch: build
//! the graph, schedule it, run it.

use std::collections::HashMap;
use std::sync::Arc;

use tern_backend::{Backend, BackendId, HostBytes, TensorLoc, WeightDesc};
use tern_cpu::{CpuBackend, CpuOptions, Isa};
use tern_cuda::{CudaBackend, CudaOptions};
use tern_gguf::{File, GgmlType};
use tern_graph::Op;
use tern_models::{Batch, Built, Model};
use tern_sched::{Backends, CopyKind, Homes, Mode, OffloadOp, OffloadPolicy, Placement, Schedule};
use tern_tokenizer::Tokenizer;

use crate::error::{Error, Result};
use crate::kv::KvCache;
use crate::planning;

mod seqs;

pub use seqs::SeqInput;

#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Context size in tokens; 0 means the model's training context.
    pub n_ctx: usize,
    pub n_threads: usize,
    /// KV cache types (`-ctk`, `-ctv`): F32, F16 or Q8_0.
    pub k_type: GgmlType,
    pub v_type: GgmlType,
    /// Largest number of tokens evaluated in one graph.
    pub n_batch: usize,
    /// Sequences the KV cache holds at once, each in a region of `n_ctx`
    /// rows of its own (`Session::eval_seqs`); the single-sequence calls
    /// (`eval`, `truncate`, `reset`) work on sequence 0.
    pub n_seqs: usize,
    /// `-ot REGEX=BACKEND` rules.
    pub overrides: Vec<String>,
    /// Number of CPU backend instances (`CPU`, `CPU1`, ...). More than one is
    /// how graph splits and copies are exercised without a GPU.
    pub cpu_instances: u8,
    /// `-ngl`: layers offloaded to the first GPU (past the layer count, the
    /// output layer too). Without a usable GPU the model stays on the CPU
    /// and the session says why in `notices`.
    pub n_gpu_layers: usize,
    /// `-op` and `--offload-batch`: which ops on host-resident weights run on
    /// the GPU, streaming the weight in (prompts, by default).
    pub offload: OffloadPolicy,
    /// The highest ISA level CPU kernels may use (`None`: the best there is).
    pub cpu_isa: Option<Isa>,
    /// How CUDA backends run (graphs, the fused decode, the kernel cache).
    pub cuda: CudaOptions,
}

impl LoadOptions {
    /// The CPU backends' options: `n_threads` and `cpu_isa`.
    pub fn cpu_options(&self) -> CpuOptions {
        CpuOptions { threads: self.n_threads, isa: self.cpu_isa }
    }

    /// Whether these options ask for a GPU (`-ngl`, or `-ot` to a CUDA device).
    pub fn wants_gpu(&self) -> bool {
        self.n_gpu_layers > 0 || self.overrides.iter().any(|o| o.to_ascii_uppercase().contains("=CUDA"))
    }
}

impl Default for LoadOptions {
    fn default() -> LoadOptions {
        let n_threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        LoadOptions {
            n_ctx: 0,
            n_threads,
            k_type: GgmlType::F16,
            v_type: GgmlType::F16,
            n_batch: 512,
            n_seqs: 1,
            overrides: Vec::new(),
            cpu_instances: 1,
            n_gpu_layers: 0,
            offload: OffloadPolicy::default(),
            cpu_isa: None,
            cuda: CudaOptions::default(),
        }
    }
}

/// Which rows of logits `eval` returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last token's row: `[n_vocab]`.
    Last,
    /// Every token's row: `[n_tokens * n_vocab]`.
    All,
}

/// The mmapped file, as the owner of weight bytes that host backends alias.
struct FileBytes(File);

impl AsRef<[u8]> for FileBytes {
    fn as_ref(&self) -> &[u8] {
        self.0.bytes()
    }
}

pub struct Session {
    pub file: File,
    pub model: Model,
    pub placement: Placement,
    backends: Backends,
    weight_locs: Vec<TensorLoc>,
    /// Second copies of weights, by (weight, backend): the tied head's copy
    /// of `token_embd` and the staged copies of host weights.
    copies: HashMap<(usize, BackendId), TensorLoc>,
    kv: KvCache,
    /// Tokens cached per sequence.
    pos: Vec<usize>,
    /// Each sequence's context: its region of the cache.
    n_ctx: usize,
    /// Why batches of several sequences cannot run, when they cannot
    /// (an attention on a backend that takes one sequence at a time).
    multi_seq: std::result::Result<(), String>,
    n_batch: usize,
    tokenizer: std::result::Result<Arc<Tokenizer>, String>,
    /// Things the user should know about the load (no GPU found, ...).
    pub notices: Vec<String>,
    /// Graphs and schedules by shape, with where their nodes live: a graph
    /// depends on the cache position only through the attention parameters,
    /// which are patched per step, so decoding builds and places its graph
    /// once.
    plans: HashMap<PlanKey, Plan>,
    profile: Option<StepProfile>,
    /// The last step's logits where its output could not be read in place.
    logits: Vec<f32>,
}

/// A graph's shape: tokens, logits rows, and whether it is a multi-sequence batch.
type PlanKey = (usize, usize, bool);

/// A batch shape's graph, schedule and node locations
/// (`Backends::run`): the leaves (weights, their copies, the caches)
/// are fixed once the session is loaded, so the locations hold for as long
/// as the arenas do, which `run` checks.
struct Plan {
    built: Built,
    schedule: Schedule,
    homes: Option<Homes>,
}

/// Where evaluation time went since profiling started (`--profile`).
#[derive(Clone, Debug, Default)]
pub struct Profile {
    pub evals: u64,
    /// Wall time of the evaluation steps.
    pub total_ns: u64,
    /// Building graphs and schedules (once per batch shape).
    pub graph_ns: u64,
    pub run: tern_sched::RunProfile,
    pub backends: Vec<(BackendId, tern_backend::OpProfile)>,
}

#[derive(Clone, Copy, Debug, Default)]
struct StepProfile {
    evals: u64,
    total_ns: u64,
    graph_ns: u64,
}

impl Session {
    pub fn load(path: impl AsRef<std::path::Path>, opts: &LoadOptions) -> Result<Session> {
        let file = File::open(path)?;
        let model = Model::load(&file)?;
        let c = &model.config;
        let mut notices = Vec::new();
        let gpu_info = match opts.wants_gpu().then(tern_cuda::devices) {
            Some(Ok(list)) => list,
            Some(Err(why)) => {
                notices.push(format!("{why}; running on the CPU"));
                Vec::new()
            }
            None => Vec::new(),
        };
        let gpus: Vec<BackendId> = gpu_info.iter().map(|d| BackendId::cuda(d.index as u8)).collect();
        let (ids, mut placement) = planning::place(&model, opts, &gpus)?;
        // `auto` offloading weighs rates measured here, by short passes at load.
        let measure = OffloadOp::ALL.iter().any(|op| placement.offload.mode(*op) == Mode::Auto);
        let mut list: Vec<Box<dyn Backend>> = Vec::new();
        let used = placement.backends();
        for id in ids.iter().filter(|id| id.is_host() || used.contains(id)) {
            list.push(if id.is_host() {
                let cpu = CpuBackend::with_options(*id, &opts.cpu_options());
                if measure && *id == BackendId::CPU {
                    planning::set_cpu_rates(&mut placement.offload.cost, cpu.measure_rates());
                }
                Box::new(cpu)
            } else {
                let mut gpu =
                    CudaBackend::with_options(id.index, &opts.cuda).map_err(|e| Error::Device(format!("{id}: {e}")))?;
                if measure && placement.staged.iter().any(|c| c.backend == *id) {
                    placement.offload.cost.h2d_bytes_per_s = gpu.measure_h2d()?;
                }
                Box::new(gpu)
            });
        }
        let mut backends = Backends::new(list);
        // Say so before loading anything if a device cannot hold its share.
        if placement.backends().iter().any(|b| !b.is_host()) {
            let kv = planning::kv_spec(&model, opts);
            let capacity = |b: BackendId| {
                gpu_info.iter().find(|d| BackendId::cuda(d.index as u8) == b).map(|d| d.total_mem as u64)
            };
            planning::check_memory(&model, &placement, &kv, &backends, opts.n_batch, capacity)
                .map_err(|e| planning::with_fit_hint(e, &model, opts, &gpus, &capacity))?;
        }

        let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new(FileBytes(file.clone()));
        let mut weight_locs = Vec::with_capacity(model.weights.table.entries.len());
        let mut copies = HashMap::new();
        for (info, place) in model.weights.table.entries.iter().zip(&placement.weights) {
            let range = info.offset as usize..(info.offset + info.nbytes) as usize;
            let mut ne = [1usize; 4];
            for (d, &n) in ne.iter_mut().zip(&info.ne) {
                *d = n as usize;
            }
            let desc = WeightDesc { ty: info.ty, ne };
            let loaded =
                backends.get_mut(place.backend)?.load_weight(HostBytes::new(owner.clone(), range.clone()), desc)?;
            let i = weight_locs.len();
            let mut copy_aliases = false;
            if let Some(c) = placement.head_copy.filter(|c| c.weight == i) {
                let l = backends.get_mut(c.backend)?.load_weight(HostBytes::new(owner.clone(), range.clone()), desc)?;
                copies.insert((i, c.backend), l.loc);
                copy_aliases |= l.aliases_host;
            }
            if let Some(c) = placement.staged_copy(i) {
                let (b, bytes) = (backends.get_mut(c.backend)?, HostBytes::new(owner.clone(), range));
                let l = match c.kind {
                    CopyKind::Staged => b.load_staged(bytes, desc)?,
                    CopyKind::Resident => b.load_weight(bytes, desc)?,
                };
                copies.insert((i, c.backend), l.loc);
                copy_aliases |= l.aliases_host;
            }
            if !loaded.aliases_host && !copy_aliases {
                file.release(info.offset, info.nbytes);
            }
            weight_locs.push(loaded.loc);
        }

        for ty in [opts.k_type, opts.v_type] {
            if !matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::Q8_0) {
                return Err(Error::KvType(format!("{ty} (use f32, f16 or q8_0)")));
            }
        }
        if opts.n_seqs == 0 {
            return Err(Error::NoSeqs);
        }
        let spec = planning::kv_spec(&model, opts);
        let kv = KvCache::new(c, spec, &placement.kv_homes, &mut backends)?;
        let tokenizer = Tokenizer::from_metadata(&file.metadata).map(Arc::new).map_err(|e| e.to_string());
        let multi_seq = match opts.n_seqs {
            1 => Ok(()),
            _ => planning::multi_seq_support(&model, &spec, &placement, &backends),
        };
        if let Err(why) = &multi_seq {
            notices.push(format!("{why}: batches of several sequences are refused"));
        }
        Ok(Session {
            file,
            model,
            placement,
            backends,
            weight_locs,
            copies,
            kv,
            pos: vec![0; opts.n_seqs],
            n_ctx: spec.n_ctx / opts.n_seqs,
            multi_seq,
            n_batch: opts.n_batch.max(1),
            tokenizer,
            notices,
            plans: HashMap::new(),
            profile: None,
            logits: Vec::new(),
        })
    }

    pub fn tokenizer(&self) -> Result<Arc<Tokenizer>> {
        self.tokenizer.clone().map_err(Error::Tokenizer)
    }

    /// Largest number of tokens one graph evaluates (`LoadOptions::n_batch`).
    pub fn n_batch(&self) -> usize {
        self.n_batch
    }

    /// A sequence's context (with one sequence, the whole cache).
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    pub fn n_vocab(&self) -> usize {
        self.model.config.n_vocab
    }

    /// Tokens currently in the cache (of sequence 0).
    pub fn pos(&self) -> usize {
        self.pos[0]
    }

    /// Forgets the cached context (the cache bytes are simply overwritten later).
    pub fn reset(&mut self) {
        self.pos[0] = 0;
    }

    /// Keeps only the first `n` cached tokens, so a new suffix can follow a shared prefix.
    pub fn truncate(&mut self, n: usize) {
        self.pos[0] = self.pos[0].min(n);
    }

    /// The backends that hold weights, as llama-bench prints them (`CPU`, `CUDA`, `CUDA,CPU`).
    pub fn backend_names(&self) -> String {
        let kinds: Vec<&str> =
            self.placement.weights.iter().map(|w| if w.backend.is_host() { "CPU" } else { "CUDA" }).rev().fold(
                Vec::new(),
                |mut v, k| {
                    if !v.contains(&k) {
                        v.push(k);
                    }
                    v
                },
            );
        kinds.join(",")
    }

    /// Starts or stops recording where evaluation time goes.
    pub fn set_profiling(&mut self, on: bool) {
        self.profile = on.then(StepProfile::default);
        self.backends.set_profiling(on);
    }

    /// The times recorded since the last call.
    pub fn take_profile(&mut self) -> Profile {
        let step = self.profile.as_mut().map(std::mem::take).unwrap_or_default();
        let (run, backends) = self.backends.take_profile();
        Profile { evals: step.evals, total_ns: step.total_ns, graph_ns: step.graph_ns, run, backends }
    }

    pub fn kv_bytes(&self) -> usize {
        self.kv.bytes()
    }

    /// The graph and schedule for a batch of `n_tokens` at the current position.
    pub fn plan(&self, n_tokens: usize, n_outputs: usize) -> (Built, Schedule) {
        self.plan_batch(&Batch { n_tokens, kv_pos: self.pos[0], n_outputs, multi_seq: false })
    }

    fn plan_batch(&self, batch: &Batch) -> (Built, Schedule) {
        let built = self.model.build_graph(batch, &self.kv.spec);
        let schedule = Schedule::new(&built.graph, &self.placement, &self.backends);
        (built, schedule)
    }

    /// Appends `tokens` to the context and returns logits.
    pub fn eval(&mut self, tokens: &[u32], want: Logits) -> Result<Vec<f32>> {
        if want == Logits::Last {
            return self.eval_last(tokens).map(<[f32]>::to_vec);
        }
        self.check(tokens)?;
        let mut logits = Vec::new();
        for chunk in tokens.chunks(self.n_batch) {
            let rows: Vec<i32> = (0..chunk.len() as i32).collect();
            logits.extend_from_slice(self.eval_chunk(chunk, &rows)?);
        }
        Ok(logits)
    }

    /// Appends `tokens` to the context and returns the last one's logits
    /// (`[n_vocab]`), read where the step left them (the host arena a
    /// device copied them to): decoding copies no logits on the host.
    pub fn eval_last(&mut self, tokens: &[u32]) -> Result<&[f32]> {
        self.check(tokens)?;
        let n_chunks = tokens.len().div_ceil(self.n_batch);
        let mut chunks = tokens.chunks(self.n_batch);
        for chunk in chunks.by_ref().take(n_chunks - 1) {
            self.eval_chunk(chunk, &[chunk.len() as i32 - 1])?;
        }
        let last = chunks.next().expect("tokens is not empty");
        self.eval_chunk(last, &[last.len() as i32 - 1])
    }

    fn check(&self, tokens: &[u32]) -> Result<()> {
        if tokens.is_empty() {
            return Err(Error::Empty);
        }
        let n_vocab = self.n_vocab();
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(Error::BadToken { id, n_vocab });
        }
        if self.pos[0] + tokens.len() > self.n_ctx {
            return Err(Error::ContextFull { pos: self.pos[0], n: tokens.len(), n_ctx: self.n_ctx });
        }
        Ok(())
    }

    /// Runs one chunk of sequence 0 and returns its logits rows.
    fn eval_chunk(&mut self, tokens: &[u32], rows: &[i32]) -> Result<&[f32]> {
        let p0 = self.pos[0];
        let positions: Vec<i32> = (p0..p0 + tokens.len()).map(|p| p as i32).collect();
        self.step(tokens, &positions, None, rows, &[(0, tokens.len())])
    }

    /// Runs one graph over `tokens` at `positions` (of sequence 0 from
    /// `positions[0]`, or of the sequences whose regions `starts` gives) and
    /// returns the logits `rows`, borrowed from the backend's output when
    /// its bytes are aligned f32s, else converted into `self.logits`. Once
    /// it ran, each `(sequence, n)` of `advance` has `n` more tokens cached.
    fn step(
        &mut self,
        tokens: &[u32],
        positions: &[i32],
        starts: Option<&[i32]>,
        rows: &[i32],
        advance: &[(usize, usize)],
    ) -> Result<&[f32]> {
        let start = std::time::Instant::now();
        let multi_seq = starts.is_some();
        let key = (tokens.len(), rows.len(), multi_seq);
        if !self.plans.contains_key(&key) {
            if self.plans.len() >= 16 {
                self.plans.clear();
            }
            let kv_pos = if multi_seq { 0 } else { positions[0] as usize };
            let batch = Batch { n_tokens: tokens.len(), kv_pos, n_outputs: rows.len(), multi_seq };
            let (built, schedule) = self.plan_batch(&batch);
            self.plans.insert(key, Plan { built, schedule, homes: None });
            if let Some(p) = self.profile.as_mut() {
                p.graph_ns += start.elapsed().as_nanos() as u64;
            }
        }
        let Session { plans, weight_locs, kv, backends, copies, profile, logits, pos, .. } = self;
        let Plan { built, schedule, homes } = plans.get_mut(&key).expect("inserted above");
        if !multi_seq {
            for node in &mut built.graph.nodes {
                match &mut node.op {
                    Op::Attention(p) => p.kv_pos = positions[0] as usize,
                    Op::LatentAttention(p) => p.kv_pos = positions[0] as usize,
                    _ => {}
                }
            }
        }
        let (built, schedule) = (&*built, &*schedule);
        let bytes = |v: &mut dyn Iterator<Item = i32>| -> Vec<u8> { v.flat_map(i32::to_le_bytes).collect() };
        let ids = bytes(&mut tokens.iter().map(|&t| t as i32));
        let positions = bytes(&mut positions.iter().copied());
        let rows = bytes(&mut rows.iter().copied());
        let starts = starts.map(|s| bytes(&mut s.iter().copied()));
        let mut inputs = vec![(built.inputs.tokens, ids.as_slice()), (built.inputs.positions, positions.as_slice())];
        inputs.extend(built.inputs.output_rows.map(|r| (r, rows.as_slice())));
        inputs.extend(built.inputs.seq_starts.zip(starts.as_deref()));
        let leaf = |op: &Op, on: BackendId| match *op {
            Op::Weight(i) => copies.get(&(i, on)).or(weight_locs.get(i)).copied(),
            Op::KvCache { layer, kind } => {
                kv.layers.get(layer).map(|(k, v)| if kind == tern_graph::KvKind::K { *k } else { *v })
            }
            _ => None,
        };
        let mut outputs = backends.run(&built.graph, schedule, &leaf, &inputs, homes)?;
        for &(seq, n) in advance {
            pos[seq] += n;
        }
        if let Some(p) = profile.as_mut() {
            p.evals += 1;
            p.total_ns += start.elapsed().as_nanos() as u64;
        }
        match outputs.swap_remove(0) {
            // SAFETY: the bytes are 4-aligned (checked) and every bit pattern
            // is an f32; the host is little-endian, as the bytes are.
            std::borrow::Cow::Borrowed(b) if cfg!(target_endian = "little") && b.as_ptr().align_offset(4) == 0 => {
                Ok(unsafe { std::slice::from_raw_parts(b.as_ptr().cast::<f32>(), b.len() / 4) })
            }
            b => {
                logits.clear();
                logits.extend(b.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])));
                Ok(logits.as_slice())
            }
        }
    }
}
