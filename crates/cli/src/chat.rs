//! `tern chat`: an interactive session. With a chat template (instruct
//! models) each line is a user message and the model answers as the
//! assistant; without one (base models such as the demo) each line is text
//! that the model continues to the end of the line. The context is kept
//! between turns: only the new tokens are evaluated.

use std::io::{BufRead, Write};

use tern_engine::{generate, Session};
use tern_tokenizer::{ChatTemplate, Message, StreamDecoder, Tokenizer};

use crate::run::{print_timing, ModelArgs, SamplingArgs};
use crate::CliError;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Most tokens per answer.
    #[arg(short = 'n', long = "n-predict", default_value_t = 256)]
    pub n_predict: usize,
    /// A system message (template mode only).
    #[arg(long = "system")]
    pub system: Option<String>,
    /// Print timings after each answer.
    #[arg(long)]
    pub timings: bool,
}

/// How each typed line becomes tokens.
enum Mode {
    Template { template: Box<ChatTemplate>, messages: Vec<Message> },
    Continue,
}

pub fn main(a: Args) -> Result<(), CliError> {
    let mut session = a.model.load()?;
    let tok = session.tokenizer()?;
    let text = |id: Option<u32>| id.and_then(|i| tok.token_text(i)).unwrap_or_default().to_string();
    let template = ChatTemplate::from_metadata(&session.file.metadata, &text(tok.bos()), &text(tok.eos()))?;
    let mut mode = match template {
        Some(template) => {
            let messages = a.system.iter().map(|s| Message::new("system", s)).collect();
            Mode::Template { template: Box::new(template), messages }
        }
        None => Mode::Continue,
    };
    let mut sampler = a.sampling.sampler();
    let hint = match mode {
        Mode::Template { .. } => "chat template found: lines are user messages",
        Mode::Continue => "no chat template: the model continues each line you type",
    };
    eprintln!("{hint}; Ctrl-D ends, /reset clears the context");
    // Tokens in the KV cache, so a re-rendered conversation only evaluates its new suffix.
    let mut cached: Vec<u32> = Vec::new();
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    loop {
        let _ = write!(out, "> ");
        let _ = out.flush();
        let mut line = String::new();
        if stdin.lock().read_line(&mut line).map_err(|e| CliError(format!("stdin: {e}")))? == 0 {
            let _ = writeln!(out);
            return Ok(());
        }
        let line = line.trim_end_matches(['\n', '\r']);
        if line == "/reset" {
            session.reset();
            cached.clear();
            if let Mode::Template { messages, .. } = &mut mode {
                messages.retain(|m| m.role == "system");
            }
            continue;
        }
        let wanted = match &mut mode {
            Mode::Template { template, messages } => {
                messages.push(Message::new("user", line));
                tok.encode(&template.render(messages, true)?, false, true)
            }
            Mode::Continue if cached.is_empty() => tok.encode(line, true, false),
            Mode::Continue => [cached.clone(), tok.encode(&format!("\n{line}"), false, false)].concat(),
        };
        let answer = turn(&mut session, &tok, &mut cached, &wanted, &mut sampler, &a, &mode)?;
        if let Mode::Template { messages, .. } = &mut mode {
            messages.push(Message::new("assistant", &answer));
        }
    }
}

/// Evaluates what `wanted` adds to the cache, then generates one answer.
fn turn(
    session: &mut Session,
    tok: &Tokenizer,
    cached: &mut Vec<u32>,
    wanted: &[u32],
    sampler: &mut tern_sampling::Sampler,
    a: &Args,
    mode: &Mode,
) -> Result<String, CliError> {
    let shared = cached.iter().zip(wanted).take_while(|(x, y)| x == y).count().min(wanted.len().saturating_sub(1));
    if wanted.len() + 1 >= session.n_ctx() {
        return Err(CliError(format!(
            "the conversation has {} tokens; the context holds {} (raise -c)",
            wanted.len(),
            session.n_ctx()
        )));
    }
    session.truncate(shared);
    cached.truncate(shared);
    let new = &wanted[shared..];
    let budget = a.n_predict.min(session.n_ctx() - wanted.len() - 1);
    let mut decoder = StreamDecoder::new(false);
    let mut answer = String::new();
    let mut out = std::io::stdout().lock();
    let mut generated = Vec::new();
    let stats = generate(session, new, budget, sampler, |id| {
        generated.push(id);
        let piece = decoder.push(tok, id);
        // A base model's answer is the rest of the line.
        let stop = matches!(mode, Mode::Continue) && piece.contains('\n');
        let shown = if stop { piece.split('\n').next().unwrap_or_default().to_string() } else { piece };
        let _ = write!(out, "{shown}");
        let _ = out.flush();
        answer.push_str(&shown);
        !stop
    })?;
    let rest = decoder.finish();
    let _ = writeln!(out, "{rest}");
    answer.push_str(&rest);
    cached.extend_from_slice(new);
    // Everything generated is in the cache except a final token that was only sampled.
    let evaluated = generated.len() - stats.pending.is_some() as usize;
    cached.extend_from_slice(&generated[..evaluated]);
    if a.timings {
        print_timing(&stats);
    }
    Ok(answer)
}
