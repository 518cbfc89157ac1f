//! llama.cpp's tokenizer test vectors, on the Llama 3, Qwen2 and DeepSeek LLM
//! vocabularies and on the small 512-token vocabulary of the compact fixtures.

mod common;
use common::*;
use tern_tokenizer::{PreTokenizer, Tokenizer};

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
fn qwen2_vectors() {
    check(
        qwen2(),
        "tokenizer/ggml-vocab-qwen2-from-tiktoken.gguf.inp",
        "tokenizer/ggml-vocab-qwen2-from-tiktoken.gguf.out",
        46,
    );
}

#[test]
fn deepseek_llm_vectors() {
    check(
        deepseek_llm(),
        "tokenizer/ggml-vocab-deepseek-llm.gguf.inp",
        "tokenizer/ggml-vocab-deepseek-llm.gguf.out",
        46,
    );
}

/// A piece as `tools/tokenizer/pretokenizer_splits.py` writes it: `\\`,
/// `\s`, `\n`, `\r`, `\t` and `\u{HEX}` escapes.
fn unescape(piece: &str) -> String {
    let mut out = String::new();
    let mut cs = piece.chars();
    while let Some(c) = cs.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match cs.next() {
            Some('\\') => out.push('\\'),
            Some('s') => out.push(' '),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('t') => out.push('\t'),
            Some('u') => {
                let rest = cs.as_str();
                let end = rest.find('}').expect("\\u{HEX}");
                let hex = rest[..end].strip_prefix('{').expect("\\u{HEX}");
                out.push(char::from_u32(u32::from_str_radix(hex, 16).unwrap()).unwrap());
                cs = rest[end + 1..].chars();
            }
            other => panic!("bad escape {other:?} in {piece:?}"),
        }
    }
    out
}

/// The pre-tokenizer's pieces of every test string, against the pieces
/// Python's `regex` module gives for the same pattern list.
fn check_splits(pre: PreTokenizer, splits: &str) {
    let cases =
        load_vectors("tokenizer/ggml-vocab-deepseek-llm.gguf.inp", "tokenizer/ggml-vocab-deepseek-llm.gguf.out");
    let expected = std::fs::read_to_string(testdata(splits)).unwrap();
    let expected: Vec<Vec<String>> =
        expected.lines().map(|l| l.split(' ').filter(|p| !p.is_empty()).map(unescape).collect()).collect();
    assert_eq!(expected.len(), cases.len(), "{splits}: one line per case");
    let mut failures = Vec::new();
    for (i, ((text, _), want)) in cases.iter().zip(&expected).enumerate() {
        let mut got = Vec::new();
        pre.split(text, &mut got);
        if got != *want {
            failures.push(format!("case {i} {text:?}:\n  want {want:?}\n  got  {got:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases split differently:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn deepseek_llm_splits() {
    check_splits(PreTokenizer::DeepseekLlm, "tokenizer/deepseek-llm.splits");
}

/// No DeepSeek-V3 vocabulary with llama.cpp test vectors exists, so its
/// pre-tokenizer is checked on the pieces alone.
#[test]
fn deepseek_v3_splits() {
    check_splits(PreTokenizer::DeepseekV3, "tokenizer/deepseek-v3.splits");
}

/// Qwen2 runs BPE without `ignore_merges` (as its tokenizer.json and
/// llama.cpp do); that is only right if the merges rebuild every token from
/// its own bytes, so a piece that is a whole token stays one token.
#[test]
fn qwen2_tokens_encode_to_themselves() {
    let t = qwen2();
    let mut checked = 0;
    let mut failures = Vec::new();
    for id in 0..151643u32 {
        // Tokens that are partial UTF-8 cannot be written as text, and those
        // the pre-tokenizer splits never reach BPE whole.
        let Ok(text) = std::str::from_utf8(t.token_bytes(id)) else { continue };
        let mut pieces = Vec::new();
        t.pre_tokenizer().split(text, &mut pieces);
        if pieces.len() != 1 {
            continue;
        }
        checked += 1;
        let ids = t.encode(text, false, false);
        if ids != [id] {
            failures.push(format!("{id} {text:?} -> {ids:?}"));
        }
    }
    assert!(checked > 140_000, "only {checked} tokens checked");
    assert!(failures.is_empty(), "{} tokens re-encode differently:\n{}", failures.len(), failures.join("\n"));
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

    let q = qwen2();
    assert_eq!(q.n_vocab(), 151936);
    assert_eq!(q.n_merges(), 151387);
    assert_eq!(q.pre_tokenizer(), tern_tokenizer::PreTokenizer::Qwen2);
    assert_eq!(q.token_text(151645), Some("<|im_end|>"));
    assert_eq!((q.bos(), q.eos(), q.eot()), (Some(151643), Some(151645), Some(151645)));
    // Qwen does not add BOS; `<|endoftext|>` and `<|im_end|>` both end generation.
    assert!(!q.add_bos());
    assert!(q.is_eog(151643) && q.is_eog(151645) && !q.is_eog(151644));

    let s = small();
    assert_eq!(s.n_vocab(), 512);
    assert_eq!((s.bos(), s.eos()), (Some(510), Some(511)));
}
