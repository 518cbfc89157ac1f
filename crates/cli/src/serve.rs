//! `tern serve`: an OpenAI-compatible HTTP server (`tern_server`) with
//! llama-server's flags. The context `-c` is the total, shared by the `-np`
//! slots; a slot's share above the model's trained context is refused.

use tern_server::{Config, Server};

use crate::run::ModelArgs;
use crate::CliError;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model, context (total over the slots; 0 = the trained context per slot,
    /// default 4096 capped at that), threads, cache types and placement, as `tern run`.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on.
    #[arg(long = "host", default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long = "port", default_value_t = 8080)]
    pub port: u16,
    /// Slots (`-np`): requests decoded together, each with `-c / N` tokens of
    /// context. Each step evaluates at most `-b` tokens: a token of every
    /// decoding slot, then chunks of new prompts.
    #[arg(long = "parallel", default_value_t = 1)]
    pub parallel: usize,
    /// Requests that may wait for a slot; past them a request gets 503 with Retry-After.
    #[arg(long = "max-queue", default_value_t = 64)]
    pub max_queue: usize,
    /// Require `Authorization: Bearer KEY` on every endpoint but /health.
    #[arg(long = "api-key")]
    pub api_key: Option<String>,
    /// The model's name in answers and /v1/models (default: the file's name).
    #[arg(long = "alias")]
    pub alias: Option<String>,
    /// Largest request body in bytes (413 past it).
    #[arg(long = "max-body", default_value_t = 8 << 20)]
    pub max_body: usize,
}

/// The slot's context for a total of `ctx` (`None`: not given) over `n_slots`.
fn slot_ctx(ctx: Option<usize>, n_slots: usize, n_ctx_train: usize) -> Result<usize, CliError> {
    let slot = match ctx {
        None => (4096 / n_slots).min(n_ctx_train),
        Some(0) => n_ctx_train,
        Some(c) => c / n_slots,
    };
    if slot == 0 {
        return Err(CliError(format!("-c {} leaves no context for each of {n_slots} slots", ctx.unwrap_or(0))));
    }
    if slot > n_ctx_train {
        return Err(CliError(format!(
            "each of {n_slots} slots would get {slot} tokens of context (-c {} / -np {n_slots}), more than the model's \
             trained context of {n_ctx_train}: lower -c or raise -np",
            ctx.unwrap_or(0)
        )));
    }
    Ok(slot)
}

pub fn main(a: Args) -> Result<(), CliError> {
    if a.parallel == 0 {
        return Err(CliError("-np: expected at least 1 slot".into()));
    }
    let path = a.model.path()?;
    // The trained context, from the metadata alone (nothing is loaded yet).
    let n_ctx_train = {
        let file = tern_gguf::File::open(&path).map_err(|e| CliError(format!("{}: {e}", path.display())))?;
        tern_models::Model::load(&file).map_err(|e| CliError(format!("{}: {e}", path.display())))?.config.n_ctx_train
    };
    let slot = slot_ctx(a.model.ctx_size, a.parallel, n_ctx_train)?;
    let mut opts = a.model.options()?;
    // A cache region of a slot's context per slot, decoded together.
    (opts.n_ctx, opts.n_seqs) = (slot, a.parallel);
    let model_id = a.alias.clone().unwrap_or_else(|| {
        path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned())
    });
    let cfg = Config {
        host: a.host.clone(),
        port: a.port,
        n_slots: a.parallel,
        max_queue: a.max_queue,
        api_key: a.api_key.clone(),
        model_id,
        body_limit: a.max_body,
    };
    let load_path = path.clone();
    let server = Server::bind(&cfg, move || {
        let s = tern_engine::Session::load(&load_path, &opts).map_err(|e| format!("{}: {e}", load_path.display()))?;
        for n in &s.notices {
            eprintln!("warning: {n}");
        }
        Ok(s)
    })?;
    let addr = server.local_addr()?;
    eprintln!(
        "tern serve: {} on http://{addr} ({} slot(s) of {slot} tokens; Ctrl-C or SIGTERM stops)",
        path.display(),
        a.parallel
    );
    server.run()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_context_is_shared_by_the_slots() {
        assert_eq!(slot_ctx(None, 1, 512).ok(), Some(512));
        assert_eq!(slot_ctx(None, 4, 32768).ok(), Some(1024));
        assert_eq!(slot_ctx(Some(0), 4, 512).ok(), Some(512));
        assert_eq!(slot_ctx(Some(1024), 4, 512).ok(), Some(256));
        let e = slot_ctx(Some(2048), 2, 512).err().unwrap().0;
        assert!(e.contains("more than the model's trained context of 512"), "{e}");
        assert!(slot_ctx(Some(3), 4, 512).is_err());
    }
}
