//! `tern`: run, inspect and convert GGUF models. Subcommands are thin: they
//! parse flags, call the engine, and print. Errors are reported once, here,
//! as a single `error: ...` line with a non-zero exit.

mod bench;
mod chat;
mod env;
mod eval;
mod info;
mod info_plan;
mod json;
mod perplexity;
mod profile;

mod quantize;
mod quantize_presets;
mod run;
mod serve;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "tern",
    version,
    about = "Fast GGUF inference for ternary (BitNet b1.58) and llama-family models",
    after_long_help = env::help()
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt.
    Run(run::Args),
    /// Talk to a model interactively (chat template if it has one, else line continuation).
    Chat(chat::Args),
    /// Evaluate token ids and write their logits to a .npy file.
    Eval(eval::Args),
    /// Print a model's metadata, tensors and placement plan.
    Info(info::Args),
    /// Convert a GGUF model to another tensor type.
    Quantize(quantize::Args),
    /// Measure perplexity on a text file (llama.cpp's method), or KL divergence against a base.
    Perplexity(perplexity::Args),
    /// Measure prompt and generation speed (llama-bench's tests and output), a depth sweep, or memory bandwidth.
    Bench(bench::Args),
    /// Serve the model over HTTP with OpenAI's API (chat, completions, models, metrics).
    Serve(serve::Args),
}

/// The error a subcommand reports: already a full sentence.
pub struct CliError(pub String);

impl<E: std::fmt::Display> From<E> for CliError {
    fn from(e: E) -> CliError {
        CliError(e.to_string())
    }
}

/// llama.cpp spells some long options with one dash (`-ot`, `-ctk`); clap's
/// short flags are one letter, so those spellings are rewritten first.
const SINGLE_DASH_LONG: [(&str, &str); 9] = [
    ("-ot", "--override-tensor"),
    ("-op", "--offload-policy"),
    ("-ngl", "--n-gpu-layers"),
    ("-fa", "--flash-attn"),
    ("-ctk", "--cache-type-k"),
    ("-ctv", "--cache-type-v"),
    ("-pg", "--pg"),
    ("-ub", "--ubatch-size"),
    ("-np", "--parallel"),
];

fn args() -> Vec<String> {
    std::env::args()
        .map(|a| match SINGLE_DASH_LONG.iter().find(|(short, _)| a == *short) {
            Some((_, long)) => long.to_string(),
            None => a,
        })
        .collect()
}

/// Restores the default SIGPIPE action, so `tern info | head` ends quietly like
/// any Unix tool instead of failing a write (Rust ignores SIGPIPE by default).
#[cfg(unix)]
fn default_sigpipe() {
    extern "C" {
        fn signal(signum: i32, handler: usize) -> usize;
    }
    const SIGPIPE: i32 = 13;
    const SIG_DFL: usize = 0;
    // SAFETY: called first thing in main, before any thread exists.
    unsafe { signal(SIGPIPE, SIG_DFL) };
}

fn main() -> ExitCode {
    #[cfg(unix)]
    default_sigpipe();
    let cli = Cli::parse_from(args());
    let result = match cli.command {
        Command::Run(a) => run::main(a),
        Command::Chat(a) => chat::main(a),
        Command::Eval(a) => eval::main(a),
        Command::Info(a) => info::main(a),
        Command::Quantize(a) => quantize::main(a),
        Command::Perplexity(a) => perplexity::main(a),
        Command::Bench(a) => bench::main(a),
        Command::Serve(a) => serve::main(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(CliError(msg)) => {
            // One line, whatever the message: multi-line library errors are joined.
            let msg: Vec<&str> = msg.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
            eprintln!("error: {}", msg.join(" "));
            ExitCode::FAILURE
        }
    }
}
