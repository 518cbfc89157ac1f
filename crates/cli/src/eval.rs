//! `tern eval`: a stable contract for logit checks. The ids are used as
//! given (no BOS added); the output is `[n_ids + gen, n_vocab]` f32 logits:
//! one row per given position, then one per greedy step. EOS does not stop it.

use std::path::PathBuf;

use tern_engine::Logits;

use crate::run::ModelArgs;
use crate::CliError;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Comma-separated token ids.
    #[arg(long = "tokens")]
    pub tokens: String,
    /// Greedy steps after the given ids.
    #[arg(long = "gen", default_value_t = 0)]
    pub gen: usize,
    /// Where to write the logits (.npy, <f4).
    #[arg(long = "logits-out")]
    pub logits_out: PathBuf,
}

pub fn parse_ids(s: &str) -> Result<Vec<u32>, CliError> {
    s.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| t.parse::<u32>().map_err(|_| CliError(format!("bad token id {t:?} in --tokens"))))
        .collect()
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

pub fn main(a: Args) -> Result<(), CliError> {
    let ids = parse_ids(&a.tokens)?;
    if ids.is_empty() {
        return Err(CliError("--tokens is empty".into()));
    }
    let mut session = a.model.load()?;
    let n_vocab = session.n_vocab();
    if ids.len() + a.gen > session.n_ctx() {
        return Err(CliError(format!("{} ids + {} steps exceed the context of {}", ids.len(), a.gen, session.n_ctx())));
    }
    let mut logits = session.eval(&ids, Logits::All)?;
    let mut generated = Vec::with_capacity(a.gen);
    for _ in 0..a.gen {
        let next = argmax(&logits[logits.len() - n_vocab..]);
        generated.push(next);
        logits.extend(session.eval(&[next], Logits::Last)?);
    }
    let rows = logits.len() / n_vocab;
    tern_engine::npy::write_f32(&a.logits_out, &[rows, n_vocab], &logits)
        .map_err(|e| CliError(format!("{}: {e}", a.logits_out.display())))?;
    println!("{}", generated.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(","));
    eprintln!("wrote {rows} x {n_vocab} logits to {}", a.logits_out.display());
    Ok(())
}
