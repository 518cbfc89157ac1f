//! `tern serve`'s library: an OpenAI-compatible HTTP server (axum on tokio)
//! around one engine thread that owns the model (`engine`). The engine
//! crates stay free of HTTP; the CLI parses flags and calls `Server::bind`
//! then `Server::run`.

mod api;
mod batch;
mod engine;
mod error;
mod generate;
mod metrics;
mod prompt;
mod routes;
mod sequence;
mod slots;
mod stop;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use tern_engine::Session;
use tern_tokenizer::ChatTemplate;

pub use error::Error;
pub use prompt::TRANSCRIPT_STOP;

/// How the server runs (the CLI's flags).
#[derive(Clone, Debug)]
pub struct Config {
    pub host: String,
    /// 0: any free port (`Server::local_addr` says which).
    pub port: u16,
    /// Slots (`-np`): requests held at once.
    pub n_slots: usize,
    /// Requests that may wait for a slot before new ones get 503.
    pub max_queue: usize,
    pub api_key: Option<String>,
    /// The model's name in answers and `/v1/models`.
    pub model_id: String,
    /// Largest request body in bytes (413 past it).
    pub body_limit: usize,
}

/// A bound server with its model loaded, not yet serving.
pub struct Server {
    rt: tokio::runtime::Runtime,
    listener: tokio::net::TcpListener,
    state: Arc<routes::AppState>,
    engine: std::thread::JoinHandle<()>,
    body_limit: usize,
}

impl Server {
    /// Loads the model (on the engine thread, by `load`) and binds the address.
    pub fn bind<F>(cfg: &Config, load: F) -> Result<Server, Error>
    where
        F: FnOnce() -> Result<Session, String> + Send + 'static,
    {
        // HTTP work is light; the engine's own threads do the computing.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("tern-http")
            .enable_all()
            .build()
            .map_err(Error::Runtime)?;
        let (engine, thread, loaded) = engine::start(load, cfg.n_slots.max(1), cfg.max_queue).map_err(Error::Load)?;
        let tok = loaded.tokenizer.clone();
        let text = |id: Option<u32>| id.and_then(|i| tok.token_text(i)).unwrap_or_default().to_string();
        let format = match &loaded.session_info.chat_template {
            Some(src) => {
                prompt::ChatFormat::Template(Box::new(ChatTemplate::new(src, &text(tok.bos()), &text(tok.eos()))?))
            }
            None => prompt::ChatFormat::Transcript,
        };
        let addr = format!("{}:{}", cfg.host, cfg.port);
        let listener = rt
            .block_on(tokio::net::TcpListener::bind(&addr))
            .map_err(|source| Error::Bind { addr: addr.clone(), source })?;
        let state = Arc::new(routes::AppState {
            engine,
            tokenizer: loaded.tokenizer,
            format,
            model_id: cfg.model_id.clone(),
            info: loaded.session_info,
            n_ctx: loaded.n_ctx,
            api_key: cfg.api_key.clone().filter(|k| !k.is_empty()),
            created: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        });
        Ok(Server { rt, listener, state, engine: thread, body_limit: cfg.body_limit })
    }

    pub fn local_addr(&self) -> Result<SocketAddr, Error> {
        self.listener.local_addr().map_err(Error::Runtime)
    }

    /// Serves until SIGTERM or SIGINT: then stops accepting, cancels queued
    /// requests, lets running ones finish, and returns.
    pub fn run(self) -> Result<(), Error> {
        let Server { rt, listener, state, engine, body_limit } = self;
        let app = routes::router(state.clone(), body_limit);
        let handle = state.engine.clone();
        let shutdown = async move {
            signal().await;
            handle.shut_down();
        };
        rt.block_on(async { axum::serve(listener, app).with_graceful_shutdown(shutdown).await })
            .map_err(Error::Runtime)?;
        // The last handle goes with the state: the engine thread then ends.
        drop(state);
        drop(rt);
        engine.join().map_err(|_| Error::Engine("the engine thread panicked".into()))
    }
}

/// SIGTERM or Ctrl-C.
async fn signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
