//! The fuzz targets' bodies. Each takes arbitrary bytes and must return
//! without a panic, a hang or an allocation out of proportion to its input:
//! errors are the expected outcome for almost every input.

use std::sync::OnceLock;

use tern_gguf::{File, Metadata, Value};
use tern_tokenizer::{ChatTemplate, Message, Tokenizer};

/// A GGUF file from bytes: header, metadata, tensor table, then what a load
/// reads from it (the model's config and weight table, the tokenizer, the
/// chat template).
pub fn gguf(data: &[u8]) {
    let Ok(file) = File::from_bytes(data.to_vec()) else { return };
    let _ = file.architecture();
    for t in &file.tensors {
        let _ = file.tensor_data(t).len();
    }
    let _ = tern_models::Model::load(&file);
    if let Ok(tok) = Tokenizer::from_metadata(&file.metadata) {
        let ids = tok.encode("And God said, Let there be light", true, true);
        let _ = tok.decode(&ids);
    }
    let _ = ChatTemplate::from_metadata(&file.metadata, "<s>", "</s>")
        .map(|t| t.map(|t| t.render(&[Message::new("user", "hi")], true)));
}

/// The compact fixtures' 512-token vocabulary under each pre-tokenizer.
fn tokenizers() -> &'static [Tokenizer] {
    static TOKS: OnceLock<Vec<Tokenizer>> = OnceLock::new();
    TOKS.get_or_init(|| {
        let vocab = include_bytes!("../../../testdata/compact/models/small-bpe-512-vocab.gguf");
        let file = File::from_bytes(vocab.to_vec()).expect("the shipped vocabulary parses");
        ["gpt2", "llama-bpe", "qwen2"]
            .iter()
            .map(|pre| {
                let mut md = Metadata::new();
                for (k, v) in file.metadata.entries() {
                    md.set(k.clone(), v.clone());
                }
                md.set("tokenizer.ggml.pre", Value::String(pre.to_string()));
                Tokenizer::from_metadata(&md).expect("the shipped vocabulary loads")
            })
            .collect()
    })
}

/// Text in and out of the tokenizer: the first byte picks the pre-tokenizer
/// and the special-token flags; the rest is encoded as text (lossily made
/// UTF-8), decoded again, streamed, and read as raw token ids (in range and
/// not) to decode.
pub fn tokenizer(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else { return };
    let toks = tokenizers();
    let tok = &toks[flags as usize % toks.len()];
    let (add, parse, render) = (flags & 4 != 0, flags & 8 != 0, flags & 16 != 0);
    let text = String::from_utf8_lossy(rest);
    let ids = tok.encode(&text, add, parse);
    let _ = tok.decode_with(&ids, render);
    let raw: Vec<u32> = rest.chunks(2).map(|c| c.iter().fold(0u32, |a, &b| a << 8 | b as u32)).collect();
    let _ = tok.decode_bytes(&raw, render);
    let mut stream = tok.stream_decoder(render);
    for &id in raw.iter().chain(&ids) {
        let _ = stream.push(tok, id);
    }
}

/// A chat template and a conversation from bytes: NUL-separated fields, the
/// first the template source, then (role, content) pairs; the first byte
/// says whether to add the generation prompt.
pub fn chat_template(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else { return };
    let text = String::from_utf8_lossy(rest);
    let mut fields = text.split('\0');
    let src = fields.next().unwrap_or_default();
    let rest: Vec<&str> = fields.collect();
    let messages: Vec<Message> = rest.chunks(2).map(|p| Message::new(p[0], p.get(1).copied().unwrap_or(""))).collect();
    if let Ok(t) = ChatTemplate::new(src, "<s>", "</s>") {
        let _ = t.render(&messages, flags & 1 != 0);
    }
}
