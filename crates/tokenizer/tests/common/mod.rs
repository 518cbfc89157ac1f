//! Shared helpers for the integration tests (included with `mod common`).
#![allow(dead_code)]

use std::sync::OnceLock;
use tern_tokenizer::Tokenizer;

pub use tern_testutil::testdata;

pub const LLAMA3_VOCAB: &str = "tokenizer/ggml-vocab-llama-bpe-from-tiktoken.gguf";
pub const SMALL_VOCAB: &str = "compact/models/small-bpe-512-vocab.gguf";
pub const QWEN2_VOCAB: &str = "tokenizer/ggml-vocab-qwen2-from-tiktoken.gguf";
pub const DEEPSEEK_LLM_VOCAB: &str = "tokenizer/ggml-vocab-deepseek-llm.gguf";

/// The Llama 3 vocabulary, loaded once per test binary.
pub fn llama3() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| Tokenizer::from_file(testdata(LLAMA3_VOCAB)).unwrap())
}

/// The Qwen2/Qwen3 vocabulary, loaded once per test binary.
pub fn qwen2() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| Tokenizer::from_file(testdata(QWEN2_VOCAB)).unwrap())
}

/// The DeepSeek LLM / V2 vocabulary, loaded once per test binary.
pub fn deepseek_llm() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| Tokenizer::from_file(testdata(DEEPSEEK_LLM_VOCAB)).unwrap())
}

pub fn small() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| Tokenizer::from_file(testdata(SMALL_VOCAB)).unwrap())
}

/// llama.cpp's test-vector format: `.inp` holds the cases, each followed by
/// "\n__ggml_vocab_test__\n"; `.out` has one line of space-separated ids per case.
pub fn load_vectors(inp: &str, out: &str) -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read_to_string(testdata(inp)).unwrap();
    let out = std::fs::read_to_string(testdata(out)).unwrap();
    let sep = "\n__ggml_vocab_test__\n";
    let body = inp.strip_suffix(sep).expect("every case is followed by the separator");
    let cases: Vec<&str> = body.split(sep).collect();
    let ids: Vec<Vec<u32>> = out.lines().map(|l| l.split_whitespace().map(|x| x.parse().unwrap()).collect()).collect();
    assert_eq!(cases.len(), ids.len(), "{inp} / {out}: case counts differ");
    cases.into_iter().map(String::from).zip(ids).collect()
}
