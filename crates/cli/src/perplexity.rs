//! `tern perplexity -m M -f TEXT [-c CTX] [--chunks N]`, with llama.cpp's
//! method and output, plus the KL-divergence comparison against a base model.

use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressStyle};
use tern_engine::perplexity::{chunk_log_probs, score_chunk, Chunking, KldReader, KldStats, KldWriter, NllStats};

use crate::run::ModelArgs;
use crate::CliError;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Text file to score.
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Score at most this many chunks (0 = all).
    #[arg(long = "chunks", default_value_t = 0)]
    pub chunks: usize,
    /// Save this model's log-probabilities as the base for a later --kl-divergence run.
    #[arg(long = "kl-divergence-base")]
    pub kld_base: Option<PathBuf>,
    /// Compare against the base saved with --kl-divergence-base FILE.
    #[arg(long = "kl-divergence", requires = "kld_base")]
    pub kld: bool,
}

/// llama.cpp's perplexity context when `-c` is not given.
const DEFAULT_PPL_CTX: usize = 512;

pub fn main(a: Args) -> Result<(), CliError> {
    let text = std::fs::read_to_string(&a.file).map_err(|e| CliError(format!("{}: {e}", a.file.display())))?;
    let n_ctx = a.model.ctx_or(DEFAULT_PPL_CTX);
    let mut args = a.model.clone();
    args.ctx_size = Some(n_ctx);
    let mut session = args.load()?;
    let tok = session.tokenizer()?;
    let tokens = tok.encode(&text, true, false);
    let bos = tok.bos().ok_or_else(|| CliError("the model has no BOS token to start chunks with".into()))?;
    let plan = Chunking::new(tokens.len(), n_ctx, a.chunks)?;
    let n_vocab = session.n_vocab();
    eprintln!(
        "perplexity: {} tokens, {} chunks of {n_ctx}, scoring the last {} tokens of each",
        tokens.len(),
        plan.n_chunks,
        plan.scored_per_chunk()
    );
    let (mut writer, mut reader) = match (&a.kld_base, a.kld) {
        (Some(p), false) => (Some(KldWriter::create(p, plan, n_vocab, &tokens)?), None),
        (Some(p), true) => (None, Some(KldReader::open(p, plan, n_vocab, &tokens)?)),
        _ => (None, None),
    };
    let bar = ProgressBar::new(plan.n_chunks as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} chunks {elapsed_precise} eta {eta} {msg}").unwrap(),
    );
    let mut stats = NllStats::default();
    let mut kld = KldStats::default();
    let mut running = Vec::with_capacity(plan.n_chunks);
    for c in 0..plan.n_chunks {
        let rows = chunk_log_probs(&mut session, &tokens, plan, c, bos)?;
        score_chunk(&mut stats, &rows, &tokens, plan, c);
        if let Some(w) = writer.as_mut() {
            w.push(&rows)?;
        }
        if let Some(r) = reader.as_mut() {
            let base = r.next_chunk(rows.len())?;
            for (i, (b, o)) in base.iter().zip(&rows).enumerate() {
                kld.push(b, o, tokens[c * n_ctx + plan.first() + i + 1] as usize);
            }
        }
        running.push(format!("[{}]{:.4}", c + 1, stats.ppl()));
        bar.set_message(format!("ppl {:.4}", stats.ppl()));
        bar.inc(1);
    }
    bar.finish_and_clear();
    println!("{}", running.join(","));
    println!("Final estimate: PPL = {:.4} +/- {:.5}", stats.ppl(), stats.ppl_error());
    if let Some(w) = writer {
        w.finish()?;
        eprintln!("saved base log-probabilities to {}", a.kld_base.as_ref().expect("set").display());
    }
    if reader.is_some() {
        let (kl, kl_err) = kld.mean_kl();
        let (top, top_err) = kld.same_top();
        println!("Mean PPL(Q)    : {:.4} +/- {:.5}", stats.ppl(), stats.ppl_error());
        println!("Mean PPL(base) : {:.4} +/- {:.5}", kld.base.ppl(), kld.base.ppl_error());
        println!("PPL ratio      : {:.6}", stats.ppl() / kld.base.ppl());
        println!("Mean KLD       : {kl:.6} +/- {kl_err:.6}");
        println!("Same top p     : {:.3} +/- {:.3} %", top * 100.0, top_err * 100.0);
    }
    Ok(())
}
