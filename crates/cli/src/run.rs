//! `tern run`: generate text, streaming it as it is sampled.

use std::io::Write;
use std::path::PathBuf;

use tern_engine::{generate, parse_kv_type, LoadOptions, Session};
use tern_sampling::{Sampler, SamplerConfig};
use tern_sched::OffloadPolicy;

use crate::CliError;

/// The model `run` and `chat` use when none is given.
pub const DEMO_MODEL: &str = "models/tern-demo-kjv.gguf";

/// The demo model inside the binary, so that an installed `tern` runs with
/// no checkout (feature `demo`, on by default).
#[cfg(feature = "demo")]
static DEMO_BYTES: &[u8] = include_bytes!("../../../models/tern-demo-kjv.gguf");
#[cfg(not(feature = "demo"))]
static DEMO_BYTES: &[u8] = &[];

/// The demo model as a file in `dir` (the engine maps files): written once,
/// atomically, and rewritten if it is not the carried bytes.
fn demo_copy(dir: &std::path::Path) -> Result<PathBuf, CliError> {
    if DEMO_BYTES.is_empty() {
        return Err(CliError("this tern was built without the demo model (feature `demo`): pass -m MODEL".into()));
    }
    let path = dir.join("tern-demo-kjv.gguf");
    if std::fs::read(&path).is_ok_and(|b| b == DEMO_BYTES) {
        return Ok(path);
    }
    let fail = |e: std::io::Error| CliError(format!("writing the demo model to {}: {e}", path.display()));
    std::fs::create_dir_all(dir).map_err(fail)?;
    let tmp = dir.join(format!("tern-demo-kjv.gguf.{}.tmp", std::process::id()));
    std::fs::write(&tmp, DEMO_BYTES).and_then(|_| std::fs::rename(&tmp, &path)).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        fail(e)
    })?;
    Ok(path)
}

/// The context of `run`, `eval` and `info` when `-c` is not given.
pub const DEFAULT_CTX: usize = 4096;

/// Options shared by every subcommand that loads a model for inference.
#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// Model file (GGUF). Default: $TERN_MODEL, else the demo model the repo ships.
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// Context size in tokens (0 = the model's training context; default 4096, perplexity 512).
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx_size: Option<usize>,
    /// Threads (default: all cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// K cache type: f16, f32 or q8_0.
    #[arg(long = "cache-type-k", default_value = "f16")]
    pub cache_type_k: String,
    /// V cache type: f16, f32 or q8_0.
    #[arg(long = "cache-type-v", default_value = "f16")]
    pub cache_type_v: String,
    /// Largest number of tokens evaluated at once.
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    pub batch_size: usize,
    /// Pin tensors to a backend: REGEX=BACKEND (repeatable, comma lists allowed).
    #[arg(long = "override-tensor")]
    pub override_tensor: Vec<String>,
    /// Layers to offload to the GPU (`-ngl`); past the layer count the output layer too.
    #[arg(long = "n-gpu-layers", default_value_t = 0)]
    pub n_gpu_layers: usize,
    #[command(flatten)]
    pub offload: OffloadArgs,
}

/// The offload policy and the MoE placement shortcuts (shared with `bench`).
#[derive(clap::Args, Clone, Debug, Default, PartialEq, Eq)]
pub struct OffloadArgs {
    /// Offload policy (`-op`): OP,0|1|auto pairs, OP a name (mul_mat, all) or an
    /// ik_llama.cpp op number (27, 30, -1). Ops on host weights run on
    /// the GPU, streaming the weight in, from --offload-batch tokens (1), when the
    /// cost model says it is faster (auto), or never (0). Default: all,1.
    #[arg(long = "offload-policy", value_name = "OP,MODE")]
    pub offload_policy: Vec<String>,
    /// Tokens per micro-batch from which ops on host weights are offloaded [default: 32].
    #[arg(long = "offload-batch", value_name = "N")]
    pub offload_batch: Option<usize>,
    /// Keep every MoE expert tensor on the CPU (`-ot` rules apply first).
    #[arg(long = "cpu-moe")]
    pub cpu_moe: bool,
    /// Keep the MoE expert tensors of the first N layers on the CPU.
    #[arg(long = "n-cpu-moe", value_name = "N")]
    pub n_cpu_moe: Option<usize>,
}

impl OffloadArgs {
    /// Sets the policy and appends the MoE rules after the `-ot` ones.
    pub fn apply(&self, opts: &mut LoadOptions) -> Result<(), CliError> {
        opts.offload = OffloadPolicy::parse(&self.offload_policy)?;
        if let Some(b) = self.offload_batch {
            if b == 0 {
                return Err(CliError("--offload-batch: expected a number of tokens of at least 1".into()));
            }
            opts.offload.min_batch = b;
        }
        let layers = match (self.cpu_moe, self.n_cpu_moe) {
            (true, _) => Some(None),
            (false, Some(n)) => Some(Some(n)),
            (false, None) => None,
        };
        if let Some(first) = layers {
            opts.overrides.extend(tern_sched::moe_overrides(first));
        }
        Ok(())
    }
}

impl ModelArgs {
    /// The context size, or `default` when `-c` was not given.
    pub fn ctx_or(&self, default: usize) -> usize {
        self.ctx_size.unwrap_or(default)
    }

    /// The model to load: `-m`, else `$TERN_MODEL`, else the demo model: the
    /// repo's file when run from a checkout, else the copy the binary carries.
    pub fn path(&self) -> Result<PathBuf, CliError> {
        if let Some(p) = &self.model {
            return Ok(p.clone());
        }
        if let Some(p) = crate::env::model() {
            return Ok(p);
        }
        let beside = PathBuf::from(DEMO_MODEL);
        if beside.exists() {
            return Ok(beside);
        }
        demo_copy(&crate::env::cache_dir())
    }

    pub fn load(&self) -> Result<Session, CliError> {
        let path = self.path()?;
        let opts = self.options()?;
        let session = Session::load(&path, &opts).map_err(|e| CliError(format!("{}: {e}", path.display())))?;
        for n in &session.notices {
            eprintln!("warning: {n}");
        }
        Ok(session)
    }

    /// The load options these flags give.
    pub fn options(&self) -> Result<LoadOptions, CliError> {
        let n_ctx = self.ctx_or(DEFAULT_CTX);
        let mut opts = LoadOptions { n_ctx, n_batch: self.batch_size, ..LoadOptions::default() };
        if let Some(t) = self.threads {
            opts.n_threads = t.max(1);
        }
        let kv = |s: &str| {
            parse_kv_type(s).ok_or_else(|| CliError(format!("unknown cache type {s:?} (use f16, f32 or q8_0)")))
        };
        opts.k_type = kv(&self.cache_type_k)?;
        opts.v_type = kv(&self.cache_type_v)?;
        opts.overrides = self.override_tensor.clone();
        opts.n_gpu_layers = self.n_gpu_layers;
        self.offload.apply(&mut opts)?;
        crate::env::apply(&mut opts)?;
        Ok(opts)
    }
}

/// Sampling flags shared by `run` and `chat`.
#[derive(clap::Args, Debug)]
pub struct SamplingArgs {
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temp: f32,
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub repeat_last_n: usize,
    /// RNG seed (same seed, same text).
    #[arg(short = 's', long = "seed", default_value_t = 0)]
    pub seed: u64,
}

impl SamplingArgs {
    pub fn sampler(&self) -> Sampler {
        Sampler::new(SamplerConfig {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            seed: self.seed,
            ..SamplerConfig::default()
        })
    }
}

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Prompt text.
    #[arg(short = 'p', long = "prompt", default_value = "")]
    pub prompt: String,
    /// Tokens to generate.
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    pub n_predict: usize,
    /// Print where the time went (by backend, op and matmul; copies, sync, graph building).
    #[arg(long)]
    pub profile: bool,
}

/// Prints the timing line every generating command ends with.
pub fn print_timing(stats: &tern_engine::GenStats) {
    eprintln!(
        "prompt: {} tokens, {:.1} ms ({:.2} t/s) | generation: {} tokens, {:.1} ms ({:.2} t/s)",
        stats.n_prompt,
        stats.prompt_time.as_secs_f64() * 1e3,
        stats.prompt_tps(),
        stats.n_gen,
        stats.gen_time.as_secs_f64() * 1e3,
        stats.gen_tps()
    );
}

pub fn main(a: Args) -> Result<(), CliError> {
    let mut session = a.model.load()?;
    let tok = session.tokenizer()?;
    let prompt = tok.encode(&a.prompt, true, true);
    if prompt.is_empty() {
        return Err(CliError("the prompt is empty and the model adds no BOS token".into()));
    }
    if prompt.len() >= session.n_ctx() {
        return Err(CliError(format!(
            "the prompt has {} tokens; the context holds {} (raise -c)",
            prompt.len(),
            session.n_ctx()
        )));
    }
    let mut decoder = tok.stream_decoder(false);
    let mut sampler = a.sampling.sampler();
    session.set_profiling(a.profile);
    let mut out = std::io::stdout().lock();
    let _ = write!(out, "{}", a.prompt);
    let _ = out.flush();
    let stats = generate(&mut session, &prompt, a.n_predict, &mut sampler, |id| {
        let _ = write!(out, "{}", decoder.push(&tok, id));
        let _ = out.flush();
        true
    })?;
    let _ = writeln!(out, "{}", decoder.finish());
    print_timing(&stats);
    if a.profile {
        crate::profile::print(&session.take_profile());
    }
    Ok(())
}
