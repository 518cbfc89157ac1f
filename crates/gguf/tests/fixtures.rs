//! Every shipped fixture opens and validates.

use std::path::PathBuf;

fn compact_models() -> PathBuf {
    tern_testutil::compact_dir().join("models")
}

#[test]
fn every_compact_fixture_opens() {
    let mut n = 0;
    for entry in std::fs::read_dir(compact_models()).expect("testdata/compact/models is missing") {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "gguf") {
            let f = tern_gguf::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(f.metadata.str("general.architecture").is_ok(), "{}", path.display());
            // Every shipped file comes from ggml or gguf-py, which both lay tensors out strictly.
            assert!(f.strict_layout, "{}", path.display());
            n += 1;
        }
    }
    assert!(n >= 17, "expected the 17 compact .gguf fixtures, found {n}");
}
