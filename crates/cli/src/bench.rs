//! `tern bench`: llama-bench's tests (pp, tg, pp+tg) and output (md, csv,
//! json), plus `--sweep` (ik_llama.cpp's sweep-bench: speed against depth)
//! and `--mem-bw` (the machine's streaming-read bandwidth, what tg is bound by).
//! stdout carries only the results; the machine line goes to stderr.

use std::path::PathBuf;
use std::time::Instant;

use tern_engine::{parse_kv_type, LoadOptions, Session};
use tern_gguf::{File, GgmlType};

use crate::json;
use crate::run::ModelArgs;
use crate::CliError;

#[path = "bench_membw.rs"]
mod membw;
#[path = "bench_out.rs"]
mod out;
#[path = "bench_sweep.rs"]
mod sweep;

pub use out::{csv_row, emit, fmt_params, fmt_size, md_header, md_row, mean_sd, utc_now, Col, Format, JsonArray};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model file (GGUF); repeatable. Default: $TERN_MODEL, else the demo model.
    #[arg(short = 'm', long = "model")]
    pub model: Vec<PathBuf>,
    /// Prompt sizes of the pp tests (comma list; 0 = none) [default: 512].
    #[arg(short = 'p', long = "n-prompt", value_name = "N,...")]
    pub n_prompt: Vec<String>,
    /// Token counts of the tg tests (comma list; 0 = none) [default: 128; with --sweep: tg tokens per step, default ub/4].
    #[arg(short = 'n', long = "n-gen", value_name = "N,...")]
    pub n_gen: Vec<String>,
    /// A combined test: PP prompt tokens then TG generated ones (`-pg`; repeatable).
    #[arg(long = "pg", value_name = "PP,TG")]
    pub pg: Vec<String>,
    /// Times each test is run [default: 5].
    #[arg(short = 'r', long = "repetitions", value_name = "N")]
    pub repetitions: Option<String>,
    /// Thread counts (comma list) [default: all cores].
    #[arg(short = 't', long = "threads", value_name = "N,...")]
    pub threads: Vec<String>,
    /// Logical batch sizes: tokens handed to one eval call (comma list) [default: 2048].
    #[arg(short = 'b', long = "batch-size", value_name = "N,...")]
    pub batch_size: Vec<String>,
    /// Micro-batch sizes: tokens per graph (`-ub`; comma list) [default: 512].
    #[arg(long = "ubatch-size", value_name = "N,...")]
    pub ubatch_size: Vec<String>,
    /// K cache types: f16, f32, q8_0 (`-ctk`; comma list) [default: f16].
    #[arg(long = "cache-type-k", value_name = "TYPE,...")]
    pub cache_type_k: Vec<String>,
    /// V cache types: f16, f32, q8_0 (`-ctv`; comma list) [default: f16].
    #[arg(long = "cache-type-v", value_name = "TYPE,...")]
    pub cache_type_v: Vec<String>,
    /// Layers offloaded to the GPU (`-ngl`; comma list) [default: 0].
    #[arg(long = "n-gpu-layers", value_name = "N,...")]
    pub n_gpu_layers: Vec<String>,
    /// Pin tensors to a backend (`-ot REGEX=BACKEND`; repeatable, comma lists allowed).
    #[arg(long = "override-tensor", value_name = "REGEX=BACKEND")]
    pub override_tensor: Vec<String>,
    #[command(flatten)]
    pub offload: crate::run::OffloadArgs,
    /// Flash attention (`-fa`): accepted for llama-bench compatibility; tern's
    /// attention is always the fused flash-style kernel.
    #[arg(long = "flash-attn", value_name = "0|1")]
    pub flash_attn: Vec<String>,
    /// Output format: md, csv or json [default: md].
    #[arg(short = 'o', long = "output", value_name = "FORMAT")]
    pub output: Option<String>,
    /// One untimed run of each test first (the default).
    #[arg(long = "warmup", overrides_with = "no_warmup")]
    pub warmup: bool,
    /// Skip the untimed warm-up runs.
    #[arg(long = "no-warmup", overrides_with = "warmup")]
    pub no_warmup: bool,
    /// Sweep: pp ub and tg n at depths 0, ub, 2ub, ... up to the context (-c).
    #[arg(long = "sweep")]
    pub sweep: bool,
    /// Context of --sweep [default: 4096].
    #[arg(short = 'c', long = "ctx-size", value_name = "N")]
    pub ctx_size: Option<String>,
    /// Print where each test's time went (by backend, op and matmul; copies, sync).
    #[arg(long = "profile")]
    pub profile: bool,
    /// Measure the machine's memory read bandwidth (1 thread and -t threads) instead.
    #[arg(long = "mem-bw")]
    pub mem_bw: bool,
}

/// A comma list of counts, all flag occurrences together; `default` when absent.
pub fn counts(vals: &[String], flag: &str, default: &[usize], min: usize) -> Result<Vec<usize>, CliError> {
    if vals.is_empty() {
        return Ok(default.to_vec());
    }
    let mut out = Vec::new();
    for v in vals.iter().flat_map(|v| v.split(',')).map(str::trim) {
        match v.parse::<usize>() {
            Ok(n) if n >= min => out.push(n),
            _ => return Err(CliError(format!("bad value {v:?} for {flag} (expected an integer >= {min})"))),
        }
    }
    Ok(out)
}

/// The cache types of `-ctk`/`-ctv` (comma lists), checked; f16 when absent.
fn cache_types(vals: &[String], flag: &str) -> Result<Vec<String>, CliError> {
    let mut out = Vec::new();
    for t in vals.iter().flat_map(|v| v.split(',')).map(str::trim) {
        if parse_kv_type(t).is_none() {
            return Err(CliError(format!("unknown cache type {t:?} for {flag} (use f16, f32 or q8_0)")));
        }
        out.push(t.to_lowercase());
    }
    if out.is_empty() {
        out.push("f16".to_string());
    }
    Ok(out)
}

fn one_count(v: &Option<String>, flag: &str, default: usize, min: usize) -> Result<usize, CliError> {
    match v {
        None => Ok(default),
        Some(s) => match s.trim().parse::<usize>() {
            Ok(n) if n >= min => Ok(n),
            _ => Err(CliError(format!("bad value {s:?} for {flag} (expected an integer >= {min})"))),
        },
    }
}

/// What llama-bench prints about a model.
pub struct ModelInfo {
    pub path: PathBuf,
    /// `arch size type`, e.g. "bitnet-b1.58 2B TQ2_0".
    pub desc: String,
    pub size: u64,
    pub n_params: u64,
}

impl ModelInfo {
    fn of(path: PathBuf) -> Result<ModelInfo, CliError> {
        let file = File::open(&path).map_err(|e| CliError(format!("{}: {e}", path.display())))?;
        let size = file.tensors.iter().map(|t| t.nbytes).sum();
        let n_params: u64 = file.tensors.iter().map(|t| t.n_elements()).sum();
        let arch = file.architecture().unwrap_or("unknown").to_string();
        let label = match file.metadata.opt_str("general.size_label") {
            Ok(Some(l)) => l.to_string(),
            _ => size_label(n_params),
        };
        // The type holding most of the matrix weights names the file, as its ftype would.
        let mut by_type: Vec<(GgmlType, u64)> = Vec::new();
        for t in file.tensors.iter().filter(|t| t.n_dims >= 2) {
            match by_type.iter_mut().find(|(ty, _)| *ty == t.ty) {
                Some((_, n)) => *n += t.n_elements(),
                None => by_type.push((t.ty, t.n_elements())),
            }
        }
        let ty = by_type.iter().max_by_key(|(_, n)| *n).map_or("?", |(ty, _)| ty.name());
        Ok(ModelInfo { path, desc: format!("{arch} {label} {ty}"), size, n_params })
    }
}

fn size_label(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.0}B", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.0}M", n / 1e6)
    } else {
        format!("{:.0}K", n / 1e3)
    }
}

/// The CPU's name and the cores tern can use, for the stderr header.
pub fn cpu_info() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name") || l.starts_with("Model") || l.starts_with("Hardware"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

pub fn n_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Seeded random token ids below `n_vocab` (xorshift64*).
pub fn random_tokens(n: usize, n_vocab: usize, seed: u64) -> Vec<u32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            (s.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as u32 % n_vocab.max(1) as u32
        })
        .collect()
}

/// The token tg feeds at every step: BOS when the model has one, else 1.
pub fn gen_token(session: &Session) -> u32 {
    let bos = session.tokenizer().ok().and_then(|t| t.bos()).unwrap_or(1);
    bos.min(session.n_vocab().saturating_sub(1) as u32)
}

/// One combination of the per-run parameters (llama-bench's "instance").
#[derive(Clone, PartialEq, Eq)]
pub struct Instance {
    pub model: usize,
    pub n_batch: usize,
    pub n_ubatch: usize,
    pub type_k: String,
    pub type_v: String,
    pub threads: usize,
    pub ngl: usize,
    pub overrides: Vec<String>,
    pub offload: crate::run::OffloadArgs,
}

impl Instance {
    /// Loads the instance's model with a context of `n_ctx`.
    pub fn load(&self, models: &[ModelInfo], n_ctx: usize) -> Result<Session, CliError> {
        let kv = |s: &str| parse_kv_type(s).ok_or_else(|| CliError(format!("unknown cache type {s:?}")));
        let (k_type, v_type) = (kv(&self.type_k)?, kv(&self.type_v)?);
        let mut opts = LoadOptions {
            n_ctx,
            n_threads: self.threads,
            k_type,
            v_type,
            n_batch: self.n_ubatch,
            n_gpu_layers: self.ngl,
            overrides: self.overrides.clone(),
            ..LoadOptions::default()
        };
        self.offload.apply(&mut opts)?;
        crate::env::apply(&mut opts)?;
        let path = &models[self.model].path;
        Session::load(path, &opts).map_err(|e| CliError(format!("{}: {e}", path.display())))
    }
}

/// The parsed command line, shared by the three modes.
pub struct Plan {
    pub models: Vec<ModelInfo>,
    pub instances: Vec<Instance>,
    pub threads: Vec<usize>,
    pub format: Format,
    pub warmup: bool,
    pub profile: bool,
}

fn plan(a: &Args) -> Result<Plan, CliError> {
    let format = match a.output.as_deref().unwrap_or("md") {
        "md" => Format::Md,
        "csv" => Format::Csv,
        "json" => Format::Json,
        o => return Err(CliError(format!("unknown output format {o:?} for -o (use md, csv or json)"))),
    };
    let threads = counts(&a.threads, "-t", &[n_cores()], 1)?;
    let ngls = counts(&a.n_gpu_layers, "-ngl", &[0], 0)?;
    for fa in counts(&a.flash_attn, "-fa", &[1], 0)? {
        if fa > 1 {
            return Err(CliError(format!("bad value {fa} for -fa (use 0 or 1)")));
        }
    }
    let batches = counts(&a.batch_size, "-b", &[2048], 1)?;
    let ubatches = counts(&a.ubatch_size, "-ub", &[512], 1)?;
    let (types_k, types_v) = (cache_types(&a.cache_type_k, "-ctk")?, cache_types(&a.cache_type_v, "-ctv")?);
    let mut models = Vec::new();
    if !a.mem_bw {
        let paths = if a.model.is_empty() {
            // `run`'s default model ($TERN_MODEL, else the demo model).
            #[derive(clap::Parser)]
            struct Defaults {
                #[command(flatten)]
                model: ModelArgs,
            }
            vec![<Defaults as clap::Parser>::parse_from(["tern"]).model.path()?]
        } else {
            a.model.clone()
        };
        for p in paths {
            models.push(ModelInfo::of(p)?);
        }
    }
    let mut instances = Vec::new();
    for model in 0..models.len() {
        for &n_batch in &batches {
            for &ub in &ubatches {
                for (type_k, type_v) in types_k.iter().flat_map(|k| types_v.iter().map(move |v| (k, v))) {
                    for (&t, &ngl) in threads.iter().flat_map(|t| ngls.iter().map(move |n| (t, n))) {
                        // As in llama.cpp, a micro-batch never exceeds the batch.
                        let n_ubatch = ub.min(n_batch);
                        let (type_k, type_v) = (type_k.clone(), type_v.clone());
                        let overrides = a.override_tensor.clone();
                        let offload = a.offload.clone();
                        let inst =
                            Instance { model, n_batch, n_ubatch, type_k, type_v, threads: t, ngl, overrides, offload };
                        if !instances.contains(&inst) {
                            instances.push(inst);
                        }
                    }
                }
            }
        }
    }
    Ok(Plan { models, instances, threads, format, warmup: !a.no_warmup, profile: a.profile })
}

/// A pp, tg or pp+tg test.
#[derive(Clone, Copy)]
struct Test {
    n_prompt: usize,
    n_gen: usize,
}

impl Test {
    fn name(&self) -> String {
        match (self.n_prompt, self.n_gen) {
            (p, 0) => format!("pp{p}"),
            (0, n) => format!("tg{n}"),
            (p, n) => format!("pp{p}+tg{n}"),
        }
    }

    /// One timed run from an empty context, in nanoseconds.
    fn run(&self, session: &mut Session, prompt: &[u32], tok: u32, n_batch: usize) -> Result<u64, CliError> {
        session.reset();
        let t0 = Instant::now();
        for chunk in prompt[..self.n_prompt].chunks(n_batch) {
            session.eval_last(chunk)?;
        }
        for _ in 0..self.n_gen {
            session.eval_last(&[tok])?;
        }
        Ok((t0.elapsed().as_nanos() as u64).max(1))
    }
}

fn tests(a: &Args) -> Result<Vec<Test>, CliError> {
    let mut out: Vec<Test> = Vec::new();
    for p in counts(&a.n_prompt, "-p", &[512], 0)?.into_iter().filter(|&p| p > 0) {
        out.push(Test { n_prompt: p, n_gen: 0 });
    }
    for n in counts(&a.n_gen, "-n", &[128], 0)?.into_iter().filter(|&n| n > 0) {
        out.push(Test { n_prompt: 0, n_gen: n });
    }
    for pg in &a.pg {
        let v = counts(std::slice::from_ref(pg), "-pg", &[], 0)?;
        match v[..] {
            [p, n] if p + n > 0 => out.push(Test { n_prompt: p, n_gen: n }),
            _ => return Err(CliError(format!("bad value {pg:?} for -pg (expected PP,TG)"))),
        }
    }
    if out.is_empty() {
        return Err(CliError("no tests to run (all of -p, -n are 0 and there is no -pg)".into()));
    }
    Ok(out)
}

enum Mode {
    MemBw,
    Sweep { n_ctx: usize, n_gen: Option<usize> },
    Tests { tests: Vec<Test>, reps: usize },
}

pub fn main(a: Args) -> Result<(), CliError> {
    if a.sweep && a.mem_bw {
        return Err(CliError("--sweep and --mem-bw are separate modes; pick one".into()));
    }
    // Every flag is checked before anything is printed.
    let plan = plan(&a)?;
    let mode = if a.mem_bw {
        Mode::MemBw
    } else if a.sweep {
        let n_ctx = one_count(&a.ctx_size, "-c", 4096, 1)?;
        let n_gen = match counts(&a.n_gen, "-n", &[], 1)?[..] {
            [] => None,
            [n] => Some(n),
            _ => return Err(CliError("--sweep takes one -n value (tg tokens per step)".into())),
        };
        for inst in &plan.instances {
            let (ub, tg) = (inst.n_ubatch, sweep::tg_tokens(inst, n_gen));
            if ub.max(tg) > n_ctx {
                return Err(CliError(format!("-c {n_ctx} has no room for a step of ub {ub} / tg {tg} tokens")));
            }
        }
        Mode::Sweep { n_ctx, n_gen }
    } else {
        Mode::Tests { tests: tests(&a)?, reps: one_count(&a.repetitions, "-r", 5, 1)? }
    };
    eprintln!("tern bench: {}, {} cores, {}", cpu_info(), n_cores(), membw::isa());
    match mode {
        Mode::MemBw => membw::main(&plan),
        Mode::Sweep { n_ctx, n_gen } => sweep::main(&plan, n_ctx, n_gen),
        Mode::Tests { tests, reps } => run_tests(&plan, &tests, reps),
    }
}

fn run_tests(plan: &Plan, tests: &[Test], reps: usize) -> Result<(), CliError> {
    // llama-bench adds a column for each parameter that differs from its default.
    let varies = |f: &dyn Fn(&Instance) -> bool| plan.instances.iter().any(f);
    let (show_b, show_ub) = (varies(&|i| i.n_batch != 2048), varies(&|i| i.n_ubatch != 512));
    let (show_k, show_v) = (varies(&|i| i.type_k != "f16"), varies(&|i| i.type_v != "f16"));
    let show_ngl = varies(&|i| i.ngl != 0);
    let model_w = plan.models.iter().map(|m| m.desc.chars().count()).max().unwrap_or(0).max(30);
    let mut cols = vec![
        Col::new("model", model_w, true),
        Col::new("size", 10, false),
        Col::new("params", 10, false),
        Col::new("backend", 10, true),
        Col::new("threads", 7, false),
    ];
    if show_ngl {
        cols.push(Col::new("ngl", 5, false));
    }
    let extra =
        [(show_b, "n_batch", false), (show_ub, "n_ubatch", false), (show_k, "type_k", true), (show_v, "type_v", true)];
    for (show, name, left) in extra {
        if show {
            cols.push(Col::new(name, 8, left));
        }
    }
    cols.push(Col::new("test", 15, false));
    cols.push(Col::new("t/s", 20, false));
    let mut json_out = None;
    // The markdown header waits for the first model to load, so a bad flag
    // gives one error line and no half table.
    let mut md_started = false;
    if let Format::Json = plan.format {
        json_out = Some(JsonArray::start());
    }
    let mut csv_rows = 0;
    let cpu = cpu_info();
    let n_ctx_need = tests.iter().map(|t| t.n_prompt + t.n_gen).max().unwrap_or(1);
    let n_ctx = n_ctx_need.div_ceil(256) * 256;
    for inst in &plan.instances {
        let m = &plan.models[inst.model];
        let mut session = inst.load(&plan.models, n_ctx)?;
        for n in &session.notices {
            eprintln!("warning: {n}");
        }
        let backend = session.backend_names();
        let tok = gen_token(&session);
        let prompt = random_tokens(n_ctx_need, session.n_vocab(), 0x7e4e_be4c);
        for test in tests {
            if plan.warmup {
                test.run(&mut session, &prompt, tok, inst.n_batch)?;
            }
            let test_time = utc_now();
            let mut samples_ns = Vec::with_capacity(reps);
            // The timed runs are profiled on their own; the numbers in the table include that cost.
            session.set_profiling(plan.profile);
            for _ in 0..reps {
                samples_ns.push(test.run(&mut session, &prompt, tok, inst.n_batch)?);
            }
            if plan.profile {
                eprintln!("\n{} {}:", plan.models[inst.model].desc, test.name());
                crate::profile::print(&session.take_profile());
                session.set_profiling(false);
            }
            let n_tok = (test.n_prompt + test.n_gen) as f64;
            let ns: Vec<f64> = samples_ns.iter().map(|&s| s as f64).collect();
            let ts: Vec<f64> = ns.iter().map(|&s| n_tok * 1e9 / s).collect();
            let ((avg_ns, sd_ns), (avg_ts, sd_ts)) = (mean_sd(&ns), mean_sd(&ts));
            // (field, value, is it a string)
            let common: Vec<(&str, String, bool)> = vec![
                ("cpu_info", cpu.clone(), true),
                ("backends", backend.clone(), true),
                ("model_filename", m.path.display().to_string(), true),
                ("model_type", m.desc.clone(), true),
                ("model_size", m.size.to_string(), false),
                ("model_n_params", m.n_params.to_string(), false),
                ("n_batch", inst.n_batch.to_string(), false),
                ("n_ubatch", inst.n_ubatch.to_string(), false),
                ("n_threads", inst.threads.to_string(), false),
                ("n_gpu_layers", inst.ngl.to_string(), false),
                ("type_k", inst.type_k.clone(), true),
                ("type_v", inst.type_v.clone(), true),
                ("n_prompt", test.n_prompt.to_string(), false),
                ("n_gen", test.n_gen.to_string(), false),
                ("n_depth", "0".to_string(), false),
                ("test_time", test_time, true),
                ("avg_ns", format!("{avg_ns:.0}"), false),
                ("stddev_ns", format!("{sd_ns:.0}"), false),
                ("avg_ts", format!("{avg_ts:.6}"), false),
                ("stddev_ts", format!("{sd_ts:.6}"), false),
            ];
            match plan.format {
                Format::Md => {
                    if !std::mem::replace(&mut md_started, true) {
                        emit(&md_header(&cols));
                    }
                    let mut cells = vec![
                        m.desc.clone(),
                        fmt_size(m.size),
                        fmt_params(m.n_params),
                        backend.clone(),
                        inst.threads.to_string(),
                    ];
                    if show_ngl {
                        cells.push(inst.ngl.to_string());
                    }
                    for (show, v) in [
                        (show_b, inst.n_batch.to_string()),
                        (show_ub, inst.n_ubatch.to_string()),
                        (show_k, inst.type_k.clone()),
                        (show_v, inst.type_v.clone()),
                    ] {
                        if show {
                            cells.push(v);
                        }
                    }
                    cells.push(test.name());
                    cells.push(format!("{avg_ts:.2} ± {sd_ts:.2}"));
                    emit(&md_row(&cols, &cells));
                }
                Format::Csv => {
                    if csv_rows == 0 {
                        emit(&common.iter().map(|(k, _, _)| *k).collect::<Vec<_>>().join(","));
                    }
                    csv_rows += 1;
                    emit(&csv_row(&common.into_iter().map(|(_, v, _)| v).collect::<Vec<_>>()));
                }
                Format::Json => {
                    let mut fields: Vec<(&str, String)> =
                        common.into_iter().map(|(k, v, q)| (k, if q { json::string(&v) } else { v })).collect();
                    let list = |v: &[String]| format!("[ {} ]", v.join(", "));
                    fields.push(("samples_ns", list(&samples_ns.iter().map(|s| s.to_string()).collect::<Vec<_>>())));
                    fields.push(("samples_ts", list(&ts.iter().map(|s| format!("{s:.3}")).collect::<Vec<_>>())));
                    json_out.as_mut().expect("json").push(&fields);
                }
            }
        }
    }
    if let Some(j) = json_out {
        j.finish();
    }
    Ok(())
}
