//! Broken or unusual metadata: typed errors naming the key, never a panic;
//! and the flags and token types that change encoding.

mod common;
use common::*;
use tern_gguf::{Array, Metadata, Value};
use tern_tokenizer::{Error, PreTokenizer, Tokenizer};

/// The small vocabulary's metadata, to be edited by each test.
fn small_md() -> Metadata {
    tern_gguf::File::open(testdata(SMALL_VOCAB)).unwrap().metadata
}

fn strings(v: &[&str]) -> Value {
    Value::Array(Array::String(v.iter().map(|s| s.to_string()).collect()))
}

fn merges(md: &Metadata) -> Vec<String> {
    md.strings("tokenizer.ggml.merges").unwrap().to_vec()
}

fn err(md: &Metadata) -> (Error, String) {
    let e = Tokenizer::from_metadata(md).expect_err("must fail");
    let msg = e.to_string();
    (e, msg)
}

#[test]
fn missing_keys_are_named() {
    for key in ["tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.model"] {
        let mut md = small_md();
        md.remove(key);
        let (e, msg) = err(&md);
        assert!(matches!(e, Error::Gguf(tern_gguf::Error::MissingKey { .. })), "{key}: {e:?}");
        assert!(msg.contains(key), "{msg}");
    }
}

#[test]
fn wrong_types_are_named() {
    let mut md = small_md();
    md.set("tokenizer.ggml.tokens", Value::Array(Array::I32(vec![1, 2, 3])));
    assert!(err(&md).1.contains("tokenizer.ggml.tokens"));

    let mut md = small_md();
    md.set("tokenizer.ggml.token_type", strings(&["a"]));
    assert!(err(&md).1.contains("tokenizer.ggml.token_type"));

    let mut md = small_md();
    md.set("tokenizer.ggml.add_bos_token", Value::U32(1));
    assert!(err(&md).1.contains("tokenizer.ggml.add_bos_token"));
}

#[test]
fn empty_vocabulary() {
    let mut md = small_md();
    md.set("tokenizer.ggml.tokens", strings(&[]));
    md.remove("tokenizer.ggml.token_type");
    assert!(matches!(err(&md).0, Error::Empty { key: "tokenizer.ggml.tokens" }));
}

#[test]
fn token_type_length_mismatch() {
    let mut md = small_md();
    md.set("tokenizer.ggml.token_type", Value::Array(Array::I32(vec![1; 100])));
    let (e, msg) = err(&md);
    assert!(matches!(e, Error::LengthMismatch { found: 100, expected: 512, .. }), "{e:?}");
    assert!(msg.contains("tokenizer.ggml.token_type"), "{msg}");
}

#[test]
fn bad_token_type_value() {
    let mut md = small_md();
    let mut types = vec![1i32; 512];
    types[7] = 9;
    md.set("tokenizer.ggml.token_type", Value::Array(Array::I32(types)));
    assert!(matches!(err(&md).0, Error::BadTokenType { index: 7, value: 9, .. }));
}

#[test]
fn merge_with_unknown_symbol() {
    let mut md = small_md();
    let mut m = merges(&md);
    m[3] = "Ġ zzzz".into();
    md.set("tokenizer.ggml.merges", Value::Array(Array::String(m)));
    let (e, msg) = err(&md);
    assert!(matches!(&e, Error::MergeUnknownToken { index: 3, part, .. } if part == "zzzz"), "{e:?}");
    assert!(msg.contains("tokenizer.ggml.merges"), "{msg}");
}

#[test]
fn merge_whose_result_is_not_a_token() {
    let mut md = small_md();
    let mut m = merges(&md);
    m.push("Ā ā".into());
    md.set("tokenizer.ggml.merges", Value::Array(Array::String(m)));
    assert!(matches!(err(&md).0, Error::MergeUnknownToken { .. }));
}

#[test]
fn malformed_merge() {
    for bad in ["th", " t", "t ", ""] {
        let mut md = small_md();
        let mut m = merges(&md);
        m[0] = bad.into();
        md.set("tokenizer.ggml.merges", Value::Array(Array::String(m)));
        assert!(matches!(err(&md).0, Error::BadMerge { index: 0, .. }), "{bad:?}");
    }
}

#[test]
fn special_id_out_of_range() {
    for key in ["tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id"] {
        let mut md = small_md();
        md.set(key, Value::U32(512));
        let (e, msg) = err(&md);
        assert!(matches!(e, Error::IdOutOfRange { id: 512, n_vocab: 512, .. }), "{e:?}");
        assert!(msg.contains(key), "{msg}");
    }
}

#[test]
fn unsupported_models_and_pre_tokenizers() {
    let mut md = small_md();
    md.set("tokenizer.ggml.model", Value::String("llama".into()));
    let (e, msg) = err(&md);
    assert!(matches!(e, Error::Unsupported { .. }) && msg.contains("SentencePiece"), "{msg}");

    md.set("tokenizer.ggml.model", Value::String("bert".into()));
    assert!(matches!(err(&md).0, Error::Unsupported { .. }));

    let mut md = small_md();
    md.set("tokenizer.ggml.pre", Value::String("qwen35".into()));
    let (e, msg) = err(&md);
    assert!(matches!(e, Error::UnknownPreTokenizer { .. }), "{e:?}");
    assert!(msg.contains("qwen35") && msg.contains("llama-bpe"), "{msg}");
}

#[test]
fn gpt2_pre_tokenizer_when_absent() {
    let mut md = small_md();
    md.remove("tokenizer.ggml.pre");
    md.remove("tokenizer.ggml.add_bos_token");
    let t = Tokenizer::from_metadata(&md).unwrap();
    assert_eq!(t.pre_tokenizer(), PreTokenizer::Gpt2);
    // GPT-2 does not add BOS unless the file says so.
    assert!(!t.add_bos());
    let text = "It's 12345 o'clock!\n\n  ok";
    let ids = t.encode(text, true, false);
    assert_eq!(t.decode(&ids), text);
    assert_ne!(ids.first(), Some(&510));
}

#[test]
fn add_eos_and_no_bos() {
    let mut md = small_md();
    md.set("tokenizer.ggml.add_bos_token", Value::Bool(false));
    md.set("tokenizer.ggml.add_eos_token", Value::Bool(true));
    let t = Tokenizer::from_metadata(&md).unwrap();
    let ids = t.encode("light", true, false);
    assert_eq!(ids.last(), Some(&511));
    assert_ne!(ids.first(), Some(&510));
    assert_eq!(t.encode("light", false, false), ids[..ids.len() - 1]);
}

#[test]
fn missing_token_types_mean_normal() {
    let mut md = small_md();
    md.remove("tokenizer.ggml.token_type");
    let t = Tokenizer::from_metadata(&md).unwrap();
    // Now nothing is special: the markers are ordinary text.
    assert!(!t.encode("<|end_of_text|>", false, true).contains(&511));
}

#[test]
fn user_defined_tokens_always_match() {
    let mut md = small_md();
    let mut types = vec![1i32; 512];
    types[510] = 3; // <|begin_of_text|>: control
    types[511] = 4; // <|end_of_text|>: user-defined
    md.set("tokenizer.ggml.token_type", Value::Array(Array::I32(types)));
    let t = Tokenizer::from_metadata(&md).unwrap();
    let text = "a<|begin_of_text|>b<|end_of_text|>c";
    let plain = t.encode(text, false, false);
    assert!(plain.contains(&511) && !plain.contains(&510), "{plain:?}");
    let parsed = t.encode(text, false, true);
    assert!(parsed.contains(&511) && parsed.contains(&510), "{parsed:?}");
    // User-defined tokens render by default; control tokens do not.
    assert_eq!(t.decode(&parsed), "ab<|end_of_text|>c");
}

#[test]
fn longest_special_token_wins() {
    let mut md = small_md();
    let mut tokens = md.strings("tokenizer.ggml.tokens").unwrap().to_vec();
    tokens.push("<|end".into()); // 512, a prefix of <|end_of_text|>
    md.set("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)));
    let mut types = vec![1i32; 513];
    types[510..].fill(3);
    md.set("tokenizer.ggml.token_type", Value::Array(Array::I32(types)));
    let t = Tokenizer::from_metadata(&md).unwrap();
    assert_eq!(t.encode("<|end_of_text|><|end", false, true), [511, 512]);
}

#[test]
fn truncated_file_is_an_error() {
    let bytes = std::fs::read(testdata(SMALL_VOCAB)).unwrap();
    let dir = std::env::temp_dir().join(format!("tern-tok-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("truncated.gguf");
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    assert!(matches!(Tokenizer::from_file(&path), Err(Error::Gguf(_))));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn missing_byte_token_becomes_unknown() {
    // Turn the stand-in of byte 0 ("Ā", id 0; no merge uses it) into <unk>.
    let mut md = small_md();
    let mut tokens = md.strings("tokenizer.ggml.tokens").unwrap().to_vec();
    tokens[0] = "<unk>".into();
    md.set("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)));
    let mut types = vec![1i32; 512];
    types[0] = 2;
    types[510..].fill(3);
    md.set("tokenizer.ggml.token_type", Value::Array(Array::I32(types.clone())));
    let without_unk = Tokenizer::from_metadata(&md).unwrap();
    let a = without_unk.encode("a", false, false);
    let b = without_unk.encode("b", false, false);
    // No unknown token declared: the byte is dropped.
    assert_eq!(without_unk.encode("a\0b", false, false), [a.clone(), b.clone()].concat());

    md.set("tokenizer.ggml.unknown_token_id", Value::U32(0));
    let with_unk = Tokenizer::from_metadata(&md).unwrap();
    assert_eq!(with_unk.unk(), Some(0));
    assert_eq!(with_unk.encode("a\0b", false, false), [a, vec![0], b].concat());
}
