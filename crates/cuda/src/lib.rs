//! The CUDA backend. Only this crate knows cudarc.
//!
//! * The driver and NVRTC are loaded at run time (cudarc's dynamic loading),
//!   so tern builds and runs without a CUDA toolkit; with no driver or GPU,
//!   [`CudaBackend::new`] says why and the engine stays on the CPU.
//! * Kernels are `.cu` sources embedded in the binary (`kernels/`), compiled
//!   by NVRTC for the device's architecture at first use and cached on disk
//!   (`CudaOptions::kernel_cache`).
//! * Ternary weights are repacked at load into the GPU layout (`layout.rs`);
//!   other weights are uploaded as stored.
//! * `compute` lowers a split's nodes to kernel launches (`lower.rs`, where
//!   fusions happen). A launch list seen before is captured once into a CUDA
//!   graph and replayed from then on; per-step values (positions) are read
//!   from device memory, so a decoding step replays the same graph.

mod args;
mod buffers;
mod decode;
mod driver;
mod error;
mod host_io;
pub mod kernels;
pub mod launch;
pub mod layout;
mod lower;
#[cfg(test)]
mod lower_tests;
pub mod nvrtc;
mod options;
mod plan_key;
mod profile;
pub mod qlayout;
mod supports;
mod tma;
mod weights;

use std::collections::HashMap;

use tern_backend::{
    Backend, BackendId, BufferId, Error, HostBytes, HostIo, HostSpan, LoadedWeight, OpProfile, Result, TensorLoc,
    WeightDesc,
};
use tern_graph::{Graph, Node, NodeId};

use buffers::{Backing, Buffers, DevBuf};
use driver::Gpu;
pub use driver::{devices, DeviceInfo, Unavailable};
pub use error::{CudaError, CudaResult};
use host_io::{Dir, PinnedHost};
use kernels::Kernels;
use launch::{Launch, Step};
use layout::GpuTernary;
use lower::{lower, Need, Scratch};
pub use options::{kernel_cache_dir, CudaOptions};
use profile::Profile;
pub use supports::supports;
pub(crate) use weights::Weight;
pub use weights::{streams, weight_bytes};
use weights::{Image, TernaryShape};

/// Counts for `CudaOptions::stats` and the benchmarks.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    pub computes: u64,
    pub launches: u64,
    pub captures: u64,
    pub replays: u64,
    /// Launches in the most recent compute.
    pub last_launches: usize,
}

/// Plans kept at most; past this the cache starts over.
const MAX_PLANS: usize = 64;

struct Plan {
    steps: Vec<Step>,
    graph: Option<driver::Graph>,
    /// For `--profile`: the launches with an event node after each.
    profiled: Option<driver::Graph>,
    /// `profiled` has run (a failure after that is not retried another way,
    /// which would run the split twice).
    profiled_ran: bool,
    /// Device memory of the plan's `decode_run` tables, freed with the plan.
    tables: Vec<u64>,
    /// `CudaOptions::fuse_trace`: each table's trace buffer and phases.
    traces: Vec<(u64, Vec<decode::Phase>)>,
}

pub struct CudaBackend {
    id: BackendId,
    kernels: Kernels,
    buffers: Buffers,
    scratch: Scratch,
    scratch_buf: Option<u64>,
    counters_buf: Option<u64>,
    /// Ring of device memory that staged weights are streamed into.
    staging_buf: Option<u64>,
    /// Lowered launch lists by the fingerprint of (nodes, locations), with
    /// their captured graph once one exists.
    plans: HashMap<u64, Plan>,
    /// What this backend was opened with.
    opts: CudaOptions,
    use_graphs: bool,
    pdl: bool,
    /// Prompt GEMMs on wgmma (`ternary_gemm_wg`): sm_90, unless
    /// `CudaOptions::wgmma` is off.
    wgmma: bool,
    /// Runs of one-token launches become one persistent kernel
    /// (on by default on sm_90, `CudaOptions::fused_decode`; `decode.rs`).
    fuse: Option<decode::Config>,
    pub stats: Stats,
    /// `--profile` or `CudaOptions::profile`: every launch timed with events.
    profile: Option<Profile>,
    /// Host memory page-locked through `pin_host`.
    pinned: Vec<PinnedHost>,
    /// A `write` from pinned memory, or a `compute_io` copy, may still be running.
    io_in_flight: std::cell::Cell<bool>,
    /// Last, because fields drop in order: modules, graphs, events and pinned
    /// memory above are released while the context is still alive (profile
    /// events destroyed after it crashed the process at exit).
    gpu: Gpu,
}

/// The private row of `decode_run` (`decode::Config::private`): an
/// attention output of up to 64 Ki floats.
const FUSE_PRIVATE_BYTES: usize = 256 << 10;

/// How `decode_run` runs on this device (when `fuse_wanted`), or `None` to
/// keep launches. On by default on sm_90 (`CudaOptions::fused_decode` off
/// keeps the launches): one launch for a token's many, with the weights
/// streamed ahead of their phase, decodes faster than the launches on every
/// ternary format. Its blocks wait for each other, so all of
/// them must be resident at once: a GPU shared through MPS with an SM limit
/// can starve one, and the kernel then traps after two seconds (an error,
/// not a hang); turning it off is the way out. One block per SM, three
/// descriptors ahead; attention takes a block per q head where it fits
/// (`decode::block_attention`), (KV head, split) units elsewhere.
fn fuse_config(gpu: &Gpu, kernels: &Kernels, opts: &CudaOptions) -> CudaResult<Option<decode::Config>> {
    // Static shared memory (descriptor scratch, reductions) is well under 4 KiB.
    let smem_max = (gpu.info.smem_optin as usize).saturating_sub(4096);
    for k in kernels::DECODE_RUNS {
        if gpu.occupancy(kernels.get(k), decode::THREADS, smem_max)? < 1 {
            return Ok(None);
        }
    }
    let private = gpu.alloc(FUSE_PRIVATE_BYTES)?;
    Ok(Some(decode::Config {
        blocks: gpu.info.sm_count as u32,
        look: 3,
        smem_max,
        private,
        private_cap: FUSE_PRIVATE_BYTES,
        ring_max: opts.ring_max,
        span: decode::CacheSpan::Short,
    }))
}

/// Whether this device decodes through `decode_run`: not turned off, and
/// sm_90 (the weight ring needs the bulk copy engine).
fn fuse_wanted(gpu: &Gpu, opts: &CudaOptions) -> bool {
    opts.fused_decode && gpu.info.arch.0 >= 9
}

impl CudaBackend {
    /// Opens device `index` with the default options (no kernel cache).
    pub fn new(index: u8) -> CudaResult<CudaBackend> {
        CudaBackend::with_options(index, &CudaOptions::default())
    }

    /// Opens device `index` and compiles (or loads from `opts.kernel_cache`)
    /// every kernel.
    pub fn with_options(index: u8, opts: &CudaOptions) -> CudaResult<CudaBackend> {
        let gpu = Gpu::open(index as usize)?;
        let want_fuse = fuse_wanted(&gpu, opts);
        let kernels = Kernels::load(&gpu, opts.kernel_cache.as_deref(), want_fuse)?;
        let pdl = gpu.info.arch.0 >= 9 && opts.pdl;
        // `wgmma` off keeps the mma.sync prompt GEMM on sm_90 (its tests).
        let wgmma = kernels::has_wgmma(gpu.info.arch) && opts.wgmma;
        let fuse = if want_fuse { fuse_config(&gpu, &kernels, opts)? } else { None };
        Ok(CudaBackend {
            id: BackendId::cuda(index),
            gpu,
            kernels,
            buffers: Buffers::default(),
            scratch: Scratch::default(),
            scratch_buf: None,
            counters_buf: None,
            staging_buf: None,
            plans: HashMap::new(),
            opts: opts.clone(),
            use_graphs: opts.graphs,
            pdl,
            wgmma,
            fuse,
            stats: Stats::default(),
            profile: opts.profile.then(Profile::default),
            pinned: Vec::new(),
            io_in_flight: std::cell::Cell::new(false),
        })
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.gpu.info
    }

    /// Milliseconds per `compute` of `nodes`, the median of `reps` runs timed
    /// with device events (after one warm-up run and one captured run).
    pub fn time_compute(
        &mut self,
        graph: &Graph,
        nodes: &[NodeId],
        locs: &[Option<TensorLoc>],
        reps: usize,
    ) -> Result<f64> {
        for _ in 0..2 {
            self.compute(graph, nodes, locs)?;
        }
        let (start, end) =
            (self.gpu.event().map_err(|e| self.cuda_err(e))?, self.gpu.event().map_err(|e| self.cuda_err(e))?);
        let mut times = Vec::with_capacity(reps);
        for _ in 0..reps.max(1) {
            self.gpu.record(&start).map_err(|e| self.cuda_err(e))?;
            self.compute(graph, nodes, locs)?;
            self.gpu.record(&end).map_err(|e| self.cuda_err(e))?;
            times.push(start.elapsed_ms(&end).map_err(|e| self.cuda_err(e))? as f64);
        }
        times.sort_by(f64::total_cmp);
        Ok(times[times.len() / 2])
    }

    /// The rate at which staged weights stream in (the copy kernel reading
    /// mapped host memory), bytes per second: the best of three 64 MiB copies
    /// after a warm-up. The offload policy's `auto` mode weighs it.
    pub fn measure_h2d(&mut self) -> Result<f64> {
        let bytes = 64 << 20;
        let (host, src) = self.gpu.alloc_mapped(bytes).map_err(|e| self.cuda_err(e))?;
        let dst = match self.alloc_raw(bytes) {
            Ok(d) => d,
            Err(e) => {
                self.gpu.free_mapped(host);
                return Err(e);
            }
        };
        let args = args::CopyInArgs { src, dst, n16: bytes as u64 / 16 };
        let copy = Launch::new(kernels::Kernel::CopyIn, (1024, 1, 1), 256, args);
        let timed = (|| -> CudaResult<f64> {
            let (start, end) = (self.gpu.event()?, self.gpu.event()?);
            let mut best = f64::INFINITY;
            for rep in 0..4 {
                self.gpu.record(&start)?;
                copy.run(&self.gpu, &self.kernels, false)?;
                self.gpu.record(&end)?;
                let s = start.elapsed_ms(&end)? as f64 / 1e3;
                if rep > 0 {
                    best = best.min(s);
                }
            }
            Ok(bytes as f64 / best.max(1e-9))
        })();
        self.gpu.free(dst);
        self.gpu.free_mapped(host);
        timed.map_err(|e| self.cuda_err(e))
    }

    /// Modules NVRTC compiled while opening (0 when all came from the cache).
    pub fn kernels_compiled(&self) -> usize {
        self.kernels.compiled
    }

    /// `message` (a `CudaError`, or tern's own words) as the backend's
    /// error: one line, and out-of-memory as its own kind.
    fn dev_err(&self, message: impl std::fmt::Display) -> Error {
        Error::Device { backend: self.id, message: message.to_string() }
    }

    /// A CUDA failure as the backend's error, out-of-memory as its own kind.
    fn cuda_err(&self, e: CudaError) -> Error {
        match e.out_of_memory() {
            Some(bytes) => Error::OutOfMemory { backend: self.id, bytes },
            None => self.dev_err(e),
        }
    }

    fn alloc_raw(&mut self, bytes: usize) -> Result<u64> {
        self.gpu.alloc(bytes).map_err(|e| match e {
            CudaError::OutOfMemory { bytes } => Error::OutOfMemory { backend: self.id, bytes },
            e => self.cuda_err(e),
        })
    }

    fn loc_ptr(&self, loc: TensorLoc) -> Result<u64> {
        match self.buffers.get(loc.buffer) {
            Some(b) if loc.offset + loc.nbytes <= b.bytes => Ok(b.ptr + loc.offset as u64),
            _ => Err(self.dev_err(format!("invalid tensor location {loc:?}"))),
        }
    }

    /// Allocates device memory for `img` and uploads it.
    fn upload_image(&mut self, img: Image) -> Result<(u64, Image)> {
        let ptr = self.alloc_raw(img.bytes.len())?;
        self.gpu.upload(ptr, &img.bytes).map_err(|e| self.cuda_err(e))?;
        Ok((ptr, img))
    }

    /// Frees `old` (a scratch buffer being outgrown) and allocates `bytes`.
    /// Plans hold the old pointers, so they go too.
    fn regrow(&mut self, old: Option<u64>, bytes: usize) -> Result<u64> {
        self.clear_plans();
        if let Some(p) = old {
            self.gpu.free(p);
        }
        self.alloc_raw(bytes)
    }

    fn free_buf(&self, b: &DevBuf) {
        match b.backing {
            Backing::Device => self.gpu.free(b.ptr),
            Backing::Mapped(host) => self.gpu.free_mapped(host as *mut u8),
            Backing::Borrowed => {}
        }
    }

    fn grow_staging(&mut self, bytes: usize) -> Result<()> {
        let old = self.staging_buf.take();
        let p = self.regrow(old, bytes)?;
        self.staging_buf = Some(p);
        self.scratch.stage_base = p;
        self.scratch.stage_cap = bytes;
        Ok(())
    }

    fn grow_scratch(&mut self, bytes: usize) -> Result<()> {
        let cap = bytes + bytes / 4;
        let old = self.scratch_buf.take();
        let p = self.regrow(old, cap)?;
        self.scratch_buf = Some(p);
        self.scratch.base = p;
        self.scratch.cap = cap;
        Ok(())
    }

    fn grow_counters(&mut self, n: usize) -> Result<()> {
        let cap = n.max(1024);
        let old = self.counters_buf.take();
        let p = self.regrow(old, cap * 4)?;
        self.counters_buf = Some(p);
        self.scratch.counters = p;
        self.scratch.counters_cap = cap;
        Ok(())
    }

    /// `CudaOptions::fuse_trace`: where the last run of each traced table went.
    fn report_traces(&self) {
        let Some(cfg) = self.fuse else { return };
        for (ptr, phases) in self.plans.values().flat_map(|p| &p.traces) {
            let mut raw = vec![0u8; phases.len() * cfg.blocks as usize * decode::TRACE_SLOTS * 8];
            if self.gpu.sync().and_then(|_| self.gpu.download(*ptr, &mut raw)).is_ok() {
                let t: Vec<u64> = raw.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect();
                if t.iter().all(|&v| v == 0) {
                    continue;
                }
                eprintln!("{}: decode_run trace, {} phases (the last run)", self.id, phases.len());
                decode::trace_summary(phases, cfg.blocks as usize, &t).iter().for_each(|l| eprintln!("{l}"));
            }
        }
    }

    /// Drops every plan and the device memory its tables hold.
    fn clear_plans(&mut self) {
        self.report_traces();
        for (_, p) in self.plans.drain() {
            for t in p.tables {
                self.gpu.free(t);
            }
        }
    }

    /// Fuses the decoding runs of `launches` (`decode.rs`) and uploads each
    /// run's table, behind its barrier words; returns the launches and the
    /// tables' memory.
    #[allow(clippy::type_complexity)]
    fn fuse_launches(
        &mut self,
        launches: Vec<Launch>,
        span: decode::CacheSpan,
    ) -> Result<(Vec<Launch>, Vec<u64>, Vec<(u64, Vec<decode::Phase>)>)> {
        let Some(cfg) = self.fuse.map(|c| decode::Config { span, ..c }) else {
            return Ok((launches, Vec::new(), Vec::new()));
        };
        let mut fused = decode::fuse(launches, &cfg);
        let mut tables = Vec::with_capacity(fused.tables.len());
        let mut traces = Vec::new();
        let tracing = self.opts.fuse_trace;
        for (at, phases) in &fused.tables {
            if tracing {
                for w in phases.windows(3).filter(|w| w[1].kind == decode::PhaseKind::NormQuant).take(1) {
                    eprintln!(
                        "decode_run: unfolded norm_quant {:x?} after {:?} (out {:x}), before {:x?}",
                        w[1].g.nq, w[0].kind, w[0].a.out, w[2].g.b
                    );
                }
            }
            let mut bytes = vec![0u8; decode::HEADER_BYTES];
            bytes.extend_from_slice(&decode::table_bytes(phases));
            let trace_at = bytes.len();
            if tracing {
                bytes.resize(trace_at + phases.len() * cfg.blocks as usize * decode::TRACE_SLOTS * 8, 0);
            }
            let ptr = match self.alloc_raw(bytes.len()) {
                Ok(p) => p,
                Err(e) => {
                    tables.into_iter().for_each(|t| self.gpu.free(t));
                    return Err(e);
                }
            };
            tables.push(ptr);
            self.gpu.upload(ptr, &bytes).map_err(|e| self.cuda_err(e))?;
            let trace = tracing.then_some(ptr + trace_at as u64);
            decode::bind(&mut fused.launches[*at], ptr, trace);
            if let Some(t) = trace {
                traces.push((t, phases.clone()));
            }
        }
        Ok((fused.launches, tables, traces))
    }

    fn run_steps(&self, steps: &[Step]) -> CudaResult<()> {
        for s in steps {
            s.run(&self.gpu, &self.kernels, self.pdl)?;
        }
        Ok(())
    }

    fn capture(&self, steps: &[Step]) -> CudaResult<driver::Graph> {
        self.gpu.begin_capture()?;
        let run = self.run_steps(steps);
        let graph = self.gpu.end_capture();
        run?;
        graph
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        if self.opts.stats {
            let s = self.stats;
            eprintln!(
                "{}: {} computes, {} launches ({} in the last), {} graphs captured, {} replays",
                self.id, s.computes, s.launches, s.last_launches, s.captures, s.replays
            );
        }
        if let Some(p) = self.profile.as_ref().filter(|_| self.opts.profile) {
            p.report(self.id);
        }
        self.clear_plans();
        for b in self.buffers.iter() {
            self.free_buf(b);
        }
        let private = self.fuse.map(|c| c.private).filter(|&p| p != 0);
        for p in [self.scratch_buf, self.counters_buf, self.staging_buf, private].into_iter().flatten() {
            self.gpu.free(p);
        }
        for p in self.pinned.drain(..) {
            self.gpu.unregister_host(p.host as *const u8);
        }
    }
}

impl Backend for CudaBackend {
    fn id(&self) -> BackendId {
        self.id
    }

    fn supports(&self, node: &Node, srcs: &[&Node]) -> bool {
        supports(node, srcs)
    }

    fn set_profiling(&mut self, on: bool) {
        if on == self.profile.is_some() {
            return;
        }
        // Profiled graphs record into the old profile's events: they go
        // first (replaying one after its events were destroyed crashed).
        for plan in self.plans.values_mut() {
            plan.profiled = None;
            plan.profiled_ran = false;
        }
        self.profile = on.then(Profile::default);
    }

    /// Kernel times by kernel (matmuls are fused per layer here, so there is no
    /// per-weight breakdown). Launches that read or write host memory (copies,
    /// and ops reading an import in place) count as copies.
    fn take_profile(&mut self) -> OpProfile {
        let mut out = OpProfile::default();
        if let Some(p) = self.profile.as_mut() {
            for (key, (ms, count)) in p.per_kernel.drain() {
                if key.1 {
                    out.io_ns += (ms * 1e6) as u64;
                }
                let name = profile::step_name(key);
                out.by_op.insert(name, ((ms * 1e6) as u64, count));
            }
        }
        out
    }

    fn alloc(&mut self, bytes: usize) -> Result<BufferId> {
        let ptr = self.alloc_raw(bytes)?;
        Ok(self.buffers.insert(DevBuf { ptr, bytes, weight: None, backing: Backing::Device }))
    }

    fn free(&mut self, buffer: BufferId) {
        if let Some(b) = self.buffers.take(buffer) {
            // Plans hold device pointers, and the buffer id may come back with another.
            self.clear_plans();
            self.free_buf(&b);
        }
    }

    fn load_weight(&mut self, bytes: HostBytes, desc: WeightDesc) -> Result<LoadedWeight> {
        let data = bytes.as_slice();
        // Converting a block layout reads the file once and writes ~2× its
        // bytes: on every core (a MoE file's experts are most of it).
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let (ptr, total, weight) = match weights::repack(desc, data, threads) {
            Some(r) => {
                let (ptr, img) = self.upload_image(r.image)?;
                let w = Weight {
                    ty: desc.ty,
                    ptr_codes: ptr,
                    ptr_scales: ptr + img.scale_off as u64,
                    ptr_offsets: if img.offset_off == 0 { 0 } else { ptr + img.offset_off as u64 },
                    ptr_native: if img.native_off == 0 { 0 } else { ptr + img.native_off as u64 },
                    ternary: r.ternary,
                    quant: r.quant,
                    staged: None,
                };
                (ptr, img.bytes.len(), w)
            }
            None => {
                let ptr = self.alloc_raw(data.len())?;
                self.gpu.upload(ptr, data).map_err(|e| self.cuda_err(e))?;
                let w = Weight {
                    ty: desc.ty,
                    ptr_codes: ptr,
                    ptr_scales: 0,
                    ptr_offsets: 0,
                    ptr_native: 0,
                    ternary: None,
                    quant: None,
                    staged: None,
                };
                (ptr, data.len(), w)
            }
        };
        // The location's size is the file's, which is what the graph's byte counts use.
        let buffer = self.buffers.insert(DevBuf {
            ptr,
            bytes: total.max(data.len()),
            weight: Some(weight),
            backing: Backing::Device,
        });
        Ok(LoadedWeight { loc: TensorLoc { buffer, offset: 0, nbytes: data.len() }, aliases_host: false })
    }

    /// Ternary matrices only ([`streams`]): repacked into the GPU layout in
    /// mapped host memory, which the matmul's launch list streams in.
    fn load_staged(&mut self, bytes: HostBytes, desc: WeightDesc) -> Result<LoadedWeight> {
        let data = bytes.as_slice();
        if !streams(desc) {
            let types = format!("{} {:?}", desc.ty, desc.ne);
            return Err(Error::Unsupported { backend: self.id, op: "staged weight", types });
        }
        let t = GpuTernary::pack(desc.ty, data, desc.ne[0], desc.ne[1]);
        let img = Image::ternary(&t);
        // Whole 16-byte words, which the copy kernel moves.
        let total = img.bytes.len().next_multiple_of(16);
        let (host, dev) = self.gpu.alloc_mapped(total).map_err(|e| self.cuda_err(e))?;
        // SAFETY: `alloc_mapped` returned `total` bytes of host memory that nothing else uses yet.
        let mem = unsafe { std::slice::from_raw_parts_mut(host, total) };
        mem[..img.bytes.len()].copy_from_slice(&img.bytes);
        mem[img.bytes.len()..].fill(0);
        let scale_off = img.scale_off;
        let w = Weight {
            ty: desc.ty,
            ptr_codes: dev,
            ptr_scales: dev + scale_off as u64,
            ptr_offsets: 0,
            ptr_native: 0,
            ternary: Some(TernaryShape { k_pad: t.k_pad, rows: t.rows, groups: t.groups }),
            quant: None,
            staged: Some(total),
        };
        let b =
            DevBuf { ptr: dev, bytes: total.max(data.len()), weight: Some(w), backing: Backing::Mapped(host as usize) };
        let buffer = self.buffers.insert(b);
        Ok(LoadedWeight { loc: TensorLoc { buffer, offset: 0, nbytes: data.len() }, aliases_host: false })
    }

    /// From pinned memory the copy is asynchronous (`finish_io`).
    fn write(&mut self, dst: TensorLoc, data: &[u8]) -> Result<()> {
        let p = self.loc_ptr(dst)?;
        let data = &data[..dst.nbytes];
        if let Some(src) = self.pinned_addr(HostSpan::of(data)) {
            self.io_in_flight.set(true);
            let copy = self.copy_step(Dir::ToDevice, src, p, data.len());
            return copy.run(&self.gpu, &self.kernels, false).map_err(|e| self.cuda_err(e));
        }
        self.gpu.upload(p, data).map_err(|e| self.cuda_err(e))
    }

    /// Waits for the stream, so earlier writes are done too.
    /// A weight converted to a GPU layout has none of the file's bytes left:
    /// reading it (for a node another backend runs) is refused, never
    /// answered with the layout's bytes.
    fn read(&self, src: TensorLoc, out: &mut [u8]) -> Result<()> {
        let converted = self
            .buffers
            .get(src.buffer)
            .and_then(|b| b.weight.as_ref())
            .filter(|w| w.ternary.is_some() || w.quant.is_some());
        if let Some(w) = converted {
            return Err(Error::Unsupported {
                backend: self.id,
                op: "reading back a weight held in a GPU layout",
                types: w.ty.to_string(),
            });
        }
        let p = self.loc_ptr(src)?;
        let out = &mut out[..src.nbytes];
        match self.pinned_addr(HostSpan::of(out)) {
            Some(dst) => self
                .copy_step(Dir::ToHost, p, dst, out.len())
                .run(&self.gpu, &self.kernels, false)
                .and_then(|()| self.gpu.sync()),
            None => self.gpu.download(p, out),
        }
        .map_err(|e| self.cuda_err(e))?;
        self.io_in_flight.set(false);
        Ok(())
    }

    fn pin_host(&mut self, mem: &[u8]) -> Result<bool> {
        if mem.is_empty() || !self.opts.pin_host {
            return Ok(false);
        }
        let dev = self.gpu.register_host(mem.as_ptr(), mem.len()).map_err(|e| self.cuda_err(e))?;
        let buffer =
            self.buffers.insert(DevBuf { ptr: dev, bytes: mem.len(), weight: None, backing: Backing::Borrowed });
        self.pinned.push(PinnedHost { host: mem.as_ptr() as usize, len: mem.len(), dev, buffer });
        Ok(true)
    }

    fn unpin_host(&mut self, mem: &[u8]) {
        let at = mem.as_ptr() as usize;
        if let Some(i) = self.pinned.iter().position(|p| p.host == at) {
            let p = self.pinned.swap_remove(i);
            self.buffers.forget(p.buffer);
            // Plans may hold the device's address of this memory.
            self.clear_plans();
            self.gpu.unregister_host(mem.as_ptr());
            self.io_in_flight.set(false);
        }
    }

    fn reaches_host(&self, mem: &[u8]) -> bool {
        self.copies_inside(HostSpan::of(mem))
    }

    fn finish_io(&mut self) -> Result<()> {
        if self.io_in_flight.replace(false) {
            self.gpu.sync().map_err(|e| self.cuda_err(e))?;
        }
        Ok(())
    }

    fn compute(&mut self, graph: &Graph, nodes: &[NodeId], locs: &[Option<TensorLoc>]) -> Result<()> {
        self.compute_io(graph, nodes, locs, &HostIo::default())
    }

    /// The copies become launches around the split's own, captured with them.
    fn compute_io(&mut self, graph: &Graph, nodes: &[NodeId], locs: &[Option<TensorLoc>], io: &HostIo) -> Result<()> {
        self.gpu.bind().map_err(|e| self.cuda_err(e))?;
        let host_start = std::time::Instant::now();
        let key = plan_key::plan_key(graph, nodes, locs, io);
        if !io.is_empty() {
            self.io_in_flight.set(true);
        }
        self.stats.computes += 1;
        let Some(plan) = self.plans.get(&key) else {
            // First sight: lower, run directly, and keep the launches. Which
            // host bytes are read in place is part of the plan (the key
            // covers its inputs), so replays skip the scan.
            let (locs, io) = self.in_place(graph, nodes, locs, io);
            let (locs, io) = (&*locs, &*io);
            let lowered = loop {
                match lower(
                    graph,
                    nodes,
                    locs,
                    &self.buffers,
                    self.scratch,
                    self.gpu.info.sm_count as usize,
                    self.wgmma,
                ) {
                    Ok(l) => break l,
                    Err(Need::Workspace(n)) => self.grow_scratch(n)?,
                    Err(Need::Counters(n)) => self.grow_counters(n)?,
                    Err(Need::Staging(n)) => self.grow_staging(n)?,
                    Err(Need::Error(m)) => return Err(self.dev_err(m)),
                }
            };
            let (launches, tables, traces) = self.fuse_launches(lowered.launches, lowered.span)?;
            let (mut steps, exports) = match self.io_steps(io) {
                Ok(s) => s,
                Err(e) => {
                    tables.into_iter().for_each(|t| self.gpu.free(t));
                    return Err(e);
                }
            };
            steps.extend(launches.into_iter().map(Step::Kernel));
            steps.extend(exports);
            self.stats.last_launches = steps.len();
            self.stats.launches += steps.len() as u64;
            let ran = self.run_steps(&steps).map_err(|e| self.cuda_err(e));
            if self.plans.len() >= MAX_PLANS {
                self.clear_plans();
            }
            self.plans.insert(key, Plan { steps, graph: None, profiled: None, profiled_ran: false, tables, traces });
            ran?;
            return Ok(());
        };
        self.stats.last_launches = plan.steps.len();
        self.stats.launches += plan.steps.len() as u64;
        if self.profile.is_some() {
            self.run_profiled(key, host_start).map_err(|e| self.cuda_err(e))?;
            // The profiled replay waited for its last event, after every copy
            // on the stream: nothing is left for `finish_io` to wait for.
            self.io_in_flight.set(false);
            return Ok(());
        }
        if let Some(g) = &plan.graph {
            self.stats.replays += 1;
            return self.gpu.replay(g).map_err(|e| self.cuda_err(e));
        }
        if !self.use_graphs {
            return self.run_steps(&plan.steps).map_err(|e| self.cuda_err(e));
        }
        // Second sight: capture once, then replay from now on.
        match self.capture(&plan.steps) {
            Ok(g) => {
                self.stats.captures += 1;
                self.stats.replays += 1;
                self.gpu.replay(&g).map_err(|e| self.cuda_err(e))?;
                self.plans.get_mut(&key).expect("looked up above").graph = Some(g);
                Ok(())
            }
            Err(m) => {
                // Launch directly from now on; the launches themselves are fine.
                eprintln!("warning: {}: CUDA graph capture failed ({m}); launching kernels directly", self.id);
                self.use_graphs = false;
                let plan = &self.plans[&key];
                self.run_steps(&plan.steps).map_err(|e| self.cuda_err(e))
            }
        }
    }
}
