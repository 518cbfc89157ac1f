//! Special tokens, BOS/EOS flags, end-of-generation, decoding and streaming.

mod common;
use common::*;
use tern_tokenizer::{StreamDecoder, TokenType};

#[test]
fn parse_special_on_llama3() {
    let t = llama3();
    let text = "<|begin_of_text|>Hello<|eot_id|>";
    let ids = t.encode(text, false, true);
    assert_eq!(ids.first(), Some(&128000));
    assert_eq!(ids.last(), Some(&128009));
    assert_eq!(ids, [128000, t.encode("Hello", false, false)[0], 128009]);

    // Without parse_special the markers are just characters.
    let plain = t.encode(text, false, false);
    assert!(!plain.contains(&128000) && !plain.contains(&128009), "{plain:?}");
    assert!(plain.len() > 3);
    assert_eq!(t.decode(&plain), text);

    // Hidden by default, shown on request.
    assert_eq!(t.decode(&ids), "Hello");
    assert_eq!(t.decode_with(&ids, true), text);
}

#[test]
fn special_tokens_split_surrounding_text() {
    let t = llama3();
    let ids = t.encode("a<|eot_id|><|eot_id|> b<|start_header_id|>", false, true);
    let a = t.encode("a", false, false);
    let b = t.encode(" b", false, false);
    assert_eq!(ids, [a, vec![128009, 128009], b, vec![128006]].concat());
}

#[test]
fn bos_eos_flags() {
    let t = llama3();
    assert!(t.add_bos() && !t.add_eos());
    let with = t.encode("Hello", true, false);
    let without = t.encode("Hello", false, false);
    assert_eq!(with[0], 128000);
    assert_eq!(&with[1..], &without[..]);
    assert_eq!(t.encode("", true, false), [128000]);
    assert_eq!(t.encode("", false, false), Vec::<u32>::new());
}

#[test]
fn compact_prompt() {
    let s = small();
    let ids = s.encode("And God said, Let there be light", true, false);
    assert_eq!(ids, [510, 296, 387, 388, 44, 322, 361, 380, 295, 301, 440]);
    assert_eq!(s.decode(&ids), "And God said, Let there be light");
    assert_eq!(s.decode_with(&ids, true), "<|begin_of_text|>And God said, Let there be light");
}

#[test]
fn end_of_generation() {
    let t = llama3();
    assert_eq!(t.eos(), Some(128001));
    // No eot_token_id in this file: found by its spelling.
    assert_eq!(t.eot(), Some(128009));
    assert!(t.is_eog(128001) && t.is_eog(128009));
    assert!(!t.is_eog(128000) && !t.is_eog(9906));
    assert_eq!(t.token_type(128009), Some(TokenType::Control));
    assert_eq!(t.token_id("<|eot_id|>"), Some(128009));

    let s = small();
    assert!(s.is_eog(511) && !s.is_eog(510));
    assert_eq!(s.eot(), None);
}

/// Qwen chat models end a turn with `<|im_end|>`, base models with
/// `<|endoftext|>`; whichever one the file names as EOS, both must stop
/// generation, as in llama.cpp.
#[test]
fn qwen_end_of_generation() {
    let (im_end, endoftext) = (151645, 151643);
    let t = qwen2();
    assert_eq!((t.eos(), t.eot()), (Some(im_end), Some(im_end)));
    assert!(t.is_eog(im_end) && t.is_eog(endoftext));
    assert!(!t.is_eog(151644) && !t.is_eog(151667), "<|im_start|> and <think> do not stop");

    // llama.cpp's own qwen2 vocabulary (and base models) name <|endoftext|>
    // as EOS; <|im_end|> is then found by its spelling.
    let mut md = tern_gguf::File::open(testdata(QWEN2_VOCAB)).unwrap().metadata;
    md.set("tokenizer.ggml.eos_token_id", tern_gguf::Value::U32(endoftext));
    let base = tern_tokenizer::Tokenizer::from_metadata(&md).unwrap();
    assert_eq!((base.eos(), base.eot()), (Some(endoftext), Some(im_end)));
    assert!(base.is_eog(im_end) && base.is_eog(endoftext));

    // The chat markers a rendered template contains become single tokens.
    let ids = t.encode("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", false, true);
    assert_eq!(ids.first(), Some(&151644));
    assert_eq!(ids.iter().filter(|&&id| id == im_end).count(), 1);
    assert_eq!(t.decode_with(&ids, true), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    // <think> is user-defined: matched even in plain text and always shown.
    assert_eq!(t.encode("<think>", false, false), [151667]);
    assert_eq!(t.decode(&[151667]), "<think>");
}

/// " Việt" is a token that the merge list alone does not rebuild (merging
/// by rank stops at 11655, 26298, 83); `ignore_merges` emits it whole, as
/// llama.cpp does for Llama 3.
#[test]
fn ignore_merges_emits_whole_pieces() {
    let t = llama3();
    assert_eq!(t.encode("Cửa Việt", false, false), [34, 91163, 101798]);
    assert_eq!(t.encode(" Việt", false, false), [101798]);
}

#[test]
fn stream_decoding_matches_decode() {
    let t = llama3();
    let text = "Hello 🦙 wörld! 我想在apple工作 😶‍🌫️ <|eot_id|>";
    let ids = t.encode(text, true, true);
    for render in [false, true] {
        let mut d = StreamDecoder::new(render);
        let mut got = String::new();
        for &id in &ids {
            let piece = d.push(t, id);
            assert!(!piece.contains('\u{FFFD}'), "partial character leaked: {piece:?}");
            got.push_str(&piece);
        }
        got.push_str(&d.finish());
        assert_eq!(got, t.decode_with(&ids, render));
    }
    // The emoji is split over several tokens whose bytes are not UTF-8 alone.
    let llama = t.encode("🦙", false, false);
    assert!(llama.len() > 1);
    assert!(std::str::from_utf8(t.token_bytes(llama[0])).is_err());
}

/// A small deterministic generator: encode → decode must give the text back.
#[test]
fn random_round_trips() {
    let pool: Vec<char> = "aZ 09'\n\t\r.,!?éÄжក我🦙\u{200D}\u{FE0F}\u{0301}ſ<|>_eot_id".chars().collect();
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for tok in [llama3(), small()] {
        for _ in 0..2000 {
            let n = (next() % 40) as usize;
            let text: String = (0..n).map(|_| pool[(next() % pool.len() as u64) as usize]).collect();
            let ids = tok.encode(&text, false, false);
            assert_eq!(tok.decode(&ids), text);
            assert!(ids.iter().all(|&id| (id as usize) < tok.n_vocab()));
        }
    }
}

#[test]
fn long_inputs() {
    let t = llama3();
    // Long runs exercise the heap-driven merge loop on big pieces.
    let spaces = " ".repeat(10_000);
    let ids = t.encode(&spaces, false, false);
    assert_eq!(t.decode(&ids), spaces);
    let text = "The quick brown fox jumps over the lazy dog. ".repeat(2000);
    let ids = t.encode(&text, false, false);
    // 10 tokens per sentence, plus the final lone space.
    assert_eq!(ids.len(), 10 * 2000 + 1);
    assert_eq!(t.decode(&ids), text);
}

#[test]
fn tokenizer_is_shareable() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<tern_tokenizer::Tokenizer>();
    assert_send_sync::<StreamDecoder>();
}
