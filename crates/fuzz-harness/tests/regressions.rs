//! Every input a fuzz target ever failed on (`fuzz/regressions/<target>/`),
//! and the targets' seeds, run through the same bodies: each must return.

use std::path::PathBuf;

fn inputs(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = tern_testutil::repo_root().join("fuzz/regressions").join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().is_some_and(|n| n != "README.md"))
        .collect();
    files.sort();
    files.into_iter().map(|p| (p.clone(), std::fs::read(&p).unwrap())).collect()
}

#[test]
fn gguf_inputs_return() {
    for (path, data) in inputs("gguf") {
        eprintln!("{}", path.display());
        tern_fuzz_harness::gguf(&data);
    }
}

#[test]
fn tokenizer_inputs_return() {
    for (path, data) in inputs("tokenizer") {
        eprintln!("{}", path.display());
        tern_fuzz_harness::tokenizer(&data);
    }
}

#[test]
fn chat_template_inputs_return() {
    for (path, data) in inputs("chat_template") {
        eprintln!("{}", path.display());
        tern_fuzz_harness::chat_template(&data);
    }
}
