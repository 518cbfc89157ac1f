//! What tern's tests share, so that no test file carries its own copy: a
//! seeded generator ([`Rng`]), the repository's fixture paths ([`testdata`],
//! [`compact_model`], [`demo_model`], ...), distances between rows of logits
//! ([`logits`]), and one test body run on every backend ([`test_device!`]).
//!
//! A dev-dependency only (`publish = false`). It depends on nothing unless its
//! `cuda` feature asks for `tern-cuda`, with which [`Device::cuda`] finds a GPU.

mod device;
pub mod logits;
mod paths;
mod rng;

pub use device::Device;
pub use paths::{compact_dir, compact_model, demo_model, repo_root, testdata};
pub use rng::Rng;
