//! llama.cpp's tokenizer test vectors, on the Llama 3 vocabulary and on the
//! small 512-token vocabulary of the compact fixtures.

mod common;
use common::*;
use tern_tokenizer::Tokenizer;

fn check(tok: &Tokenizer, inp: &str, out: &str, expected_cases: usize) {
    let cases = load_vectors(inp, out);
    assert_eq!(cases.len(), expected_cases);
    let mut failures = Vec::new();
    for (i, (text, want)) in cases.iter().enumerate() {
        let got = tok.encode(text, false, false);
        if &got != want {
            failures.push(format!("case {i} {text:?}:\n  want {want:?}\n  got  {got:?}"));
        }
        let back = tok.decode(want);
        if &back != text {
            failures.push(format!("case {i} {text:?}: decode gave {back:?}"));
        }
    }
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

#[test]
fn llama3_vectors() {
    check(llama3(), "tokenizer/ggml-vocab-llama-bpe.gguf.inp", "tokenizer/ggml-vocab-llama-bpe.gguf.out", 46);
}

#[test]
fn small_bpe_vectors() {
    check(small(), "compact/models/small-bpe-512.tok-tests.inp", "compact/models/small-bpe-512.tok-tests.out", 46);
}

#[test]
fn vocab_facts() {
    let t = llama3();
    assert_eq!(t.n_vocab(), 128256);
    assert_eq!(t.n_merges(), 280147);
    assert_eq!(t.pre_tokenizer(), tern_tokenizer::PreTokenizer::Llama3);
    assert_eq!(t.token_text(128009), Some("<|eot_id|>"));
    assert_eq!(t.token_text(220), Some("Ġ"));
    assert_eq!(t.token_bytes(220), b" ");
    assert_eq!(t.token_text(1_000_000), None);
    assert_eq!(t.token_bytes(1_000_000), b"");

    let s = small();
    assert_eq!(s.n_vocab(), 512);
    assert_eq!((s.bos(), s.eos()), (Some(510), Some(511)));
}
