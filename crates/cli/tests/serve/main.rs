//! `tern serve` end to end: real server processes on the demo model, real
//! HTTP on 127.0.0.1 (an ephemeral port each). `api`: the endpoints, errors,
//! streams, disconnects and SIGTERM; `batching`: many streams decoded
//! together, prompt reuse, and the soak (ignored by default: two minutes).

mod api;
mod batching;
mod harness;
