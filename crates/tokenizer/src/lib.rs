//! Tokenizers for GGUF models, built from the `tokenizer.ggml.*` metadata.
//!
//! Supported: byte-level BPE (`tokenizer.ggml.model = "gpt2"`) with the
//! GPT-2, Llama 3, Qwen2, DeepSeek LLM (V2) and DeepSeek-V3 pre-tokenizers.
//! SentencePiece (`"llama"`) and the other families are reported as
//! [`Error::Unsupported`].
//!
//! ```no_run
//! let tok = tern_tokenizer::Tokenizer::from_file("model.gguf")?;
//! let ids = tok.encode("Hello world", true, false);
//! assert_eq!(tok.decode(&ids), "Hello world");
//! # Ok::<(), tern_tokenizer::Error>(())
//! ```
//!
//! Layout: `vocab` (texts, types, special ids), `bytes` (GPT-2 byte table),
//! `pretokenize` + `unicode` (regex splitting), `special` (special tokens in
//! text), `bpe` (merging), `decode` (streaming), `chat` + `jinja` (chat
//! templates).

mod bpe;
mod bytes;
mod chat;
mod decode;
mod error;
mod jinja;
mod pretokenize;
mod special;
mod unicode;
mod unicode_tables;
mod vocab;

pub use chat::{ChatTemplate, Message, TemplateError};
pub use decode::StreamDecoder;
pub use error::Error;
pub use jinja::json_string;
pub use pretokenize::{
    PreTokenizer, DEEPSEEK_LLM_PATTERNS, DEEPSEEK_V3_PATTERNS, GPT2_PATTERN, LLAMA3_PATTERN, QWEN2_PATTERN,
};
pub use vocab::TokenType;

use special::Fragment;
use std::path::Path;
use tern_gguf::Metadata;
use vocab::{Specials, Vocab};

const KEY_MODEL: &str = "tokenizer.ggml.model";
const KEY_PRE: &str = "tokenizer.ggml.pre";

/// A loaded tokenizer. Immutable and `Send + Sync`: share it behind an `Arc`.
pub struct Tokenizer {
    vocab: Vocab,
    merges: bpe::Merges,
    pre: PreTokenizer,
    ignore_merges: bool,
    special: Specials,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("n_vocab", &self.n_vocab())
            .field("n_merges", &self.merges.len())
            .field("pre", &self.pre)
            .field("bos", &self.special.bos)
            .field("eos", &self.special.eos)
            .finish()
    }
}

impl Tokenizer {
    /// Builds the tokenizer described by a GGUF file's metadata.
    pub fn from_metadata(md: &Metadata) -> Result<Tokenizer, Error> {
        let model = md.str(KEY_MODEL)?;
        match model {
            "gpt2" => {}
            "llama" => {
                return Err(Error::Unsupported {
                    model: model.into(),
                    reason: "SentencePiece tokenizers are not implemented yet (comes later)",
                })
            }
            _ => {
                return Err(Error::Unsupported {
                    model: model.into(),
                    reason: "only byte-level BPE (\"gpt2\") is implemented",
                })
            }
        }
        let pre = PreTokenizer::from_name(md.opt_str(KEY_PRE)?)?;
        let vocab = Vocab::from_metadata(md)?;
        let merges = bpe::Merges::from_metadata(md, &vocab)?;
        // llama.cpp adds BOS by default for Llama 3, and not for plain GPT-2.
        let special = Specials::from_metadata(md, &vocab, pre == PreTokenizer::Llama3)?;
        Ok(Tokenizer { vocab, merges, pre, ignore_merges: pre.ignore_merges(), special })
    }

    /// Opens a GGUF file (only its metadata is read) and builds its tokenizer.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Tokenizer, Error> {
        Tokenizer::from_metadata(&tern_gguf::File::open(path)?.metadata)
    }

    /// Text → token ids.
    ///
    /// `add_special`: prepend BOS if the model adds it (`add_bos_token`) and
    /// append EOS if it adds that (`add_eos_token`).
    /// `parse_special`: recognise control tokens written in the text (e.g.
    /// `<|eot_id|>`); otherwise they are tokenized as the characters they
    /// are. User-defined tokens are recognised either way.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.special.add_bos {
            out.extend(self.special.bos);
        }
        let mut pieces = Vec::new();
        let mut scratch = bpe::Scratch::default();
        for frag in special::partition(text, &self.vocab, &self.special.matchable, parse_special) {
            match frag {
                Fragment::Token(id) => out.push(id),
                Fragment::Text(t) => {
                    pieces.clear();
                    self.pre.split(t, &mut pieces);
                    for p in &pieces {
                        bpe::encode_piece(
                            &self.vocab,
                            &self.merges,
                            p.as_bytes(),
                            self.ignore_merges,
                            self.special.unk,
                            &mut scratch,
                            &mut out,
                        );
                    }
                }
            }
        }
        if add_special && self.special.add_eos {
            out.extend(self.special.eos);
        }
        out
    }

    /// Token ids → text, hiding control tokens. Invalid UTF-8 (e.g. a
    /// sequence cut in half) becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        self.decode_with(ids, false)
    }

    /// Token ids → text; `render_special` shows control, unknown and unused
    /// tokens as their text instead of hiding them.
    pub fn decode_with(&self, ids: &[u32], render_special: bool) -> String {
        String::from_utf8_lossy(&self.decode_bytes(ids, render_special)).into_owned()
    }

    /// Token ids → the raw bytes they stand for.
    pub fn decode_bytes(&self, ids: &[u32], render_special: bool) -> Vec<u8> {
        let mut out = Vec::new();
        for &id in ids {
            out.extend_from_slice(self.token_piece(id, render_special));
        }
        out
    }

    /// What decoding `id` contributes: its bytes, or nothing for a hidden
    /// special token or an out-of-range id.
    pub fn token_piece(&self, id: u32, render_special: bool) -> &[u8] {
        match self.vocab.token_type(id) {
            Some(t) if render_special || t.renders_by_default() => self.vocab.bytes(id),
            _ => &[],
        }
    }

    /// The bytes token `id` stands for (control tokens: their text), empty
    /// if `id` is out of range. May be an incomplete UTF-8 sequence.
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.vocab.bytes(id)
    }

    /// A streaming decoder; see [`StreamDecoder`].
    pub fn stream_decoder(&self, render_special: bool) -> StreamDecoder {
        StreamDecoder::new(render_special)
    }

    /// The token's text as stored in the vocabulary (byte-level stand-ins
    /// such as `Ġ` included).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.vocab.text(id)
    }

    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.vocab.token_type(id)
    }

    /// The id of the token whose stored text is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.id(text)
    }

    pub fn n_vocab(&self) -> usize {
        self.vocab.len()
    }

    pub fn n_merges(&self) -> usize {
        self.merges.len()
    }

    pub fn pre_tokenizer(&self) -> PreTokenizer {
        self.pre
    }

    pub fn bos(&self) -> Option<u32> {
        self.special.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.special.eos
    }

    /// End of turn: `eot_token_id`, or else a token spelled like one
    /// (`<|eot_id|>`, `<|im_end|>`, …).
    pub fn eot(&self) -> Option<u32> {
        self.special.eot
    }

    pub fn eom(&self) -> Option<u32> {
        self.special.eom
    }

    pub fn unk(&self) -> Option<u32> {
        self.special.unk
    }

    pub fn pad(&self) -> Option<u32> {
        self.special.pad
    }

    /// Whether `encode(.., add_special = true, ..)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.special.add_bos && self.special.bos.is_some()
    }

    /// Whether `encode(.., add_special = true, ..)` appends EOS.
    pub fn add_eos(&self) -> bool {
        self.special.add_eos && self.special.eos.is_some()
    }

    /// Whether generation should stop at `id`: EOS, EOT, EOM, or a control
    /// token known to end generation (`<|eot_id|>`, `<|end_of_text|>`, …).
    pub fn is_eog(&self, id: u32) -> bool {
        self.special.eog.binary_search(&id).is_ok()
    }

    /// All end-of-generation ids, sorted.
    pub fn eog_ids(&self) -> &[u32] {
        &self.special.eog
    }
}
