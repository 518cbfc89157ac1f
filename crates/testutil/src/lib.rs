//! What tern's tests share, so that no test file carries its own copy: a
//! seeded generator ([`Rng`]), the repository's fixture paths ([`testdata`],
//! [`compact_model`], [`demo_model`], ...), and distances between rows of logits
//! ([`logits`]).
//!
//! A dev-dependency only (`publish = false`), with no dependencies.

pub mod logits;
mod paths;
mod rng;

pub use paths::{compact_dir, compact_model, demo_model, repo_root, testdata};
pub use rng::Rng;
