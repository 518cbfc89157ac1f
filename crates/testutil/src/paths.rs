//! The repository's fixtures, found from this crate's source path, so that a
//! test binary finds them from wherever it runs (the GPU machine links the
//! path it was built at to its copy of the repo).

use std::path::{Path, PathBuf};

/// The repository's root (this crate is `crates/testutil`).
pub fn repo_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.parent().and_then(Path::parent).expect("crates/testutil sits two levels below the root").to_path_buf()
}

/// `testdata/<rel>`.
pub fn testdata(rel: &str) -> PathBuf {
    repo_root().join("testdata").join(rel)
}

/// `testdata/compact`: the compact fixtures, their manifest and goldens.
pub fn compact_dir() -> PathBuf {
    testdata("compact")
}

/// `testdata/compact/models/<name>`.
pub fn compact_model(name: &str) -> PathBuf {
    compact_dir().join("models").join(name)
}

/// `models/tern-demo-kjv.gguf`, the model the repo ships.
pub fn demo_model() -> PathBuf {
    repo_root().join("models/tern-demo-kjv.gguf")
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_fixtures_are_there() {
        assert!(super::compact_dir().join("manifest.tsv").is_file());
        assert!(super::compact_model("b158-e512-tq2_0.gguf").is_file());
        assert!(super::demo_model().is_file());
    }
}
