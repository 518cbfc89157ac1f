//! The vocabulary: token texts, types, their byte forms, a text → id index,
//! and the special-token ids and flags read from GGUF metadata.

use crate::bytes;
use crate::error::Error;
use tern_gguf::Metadata;

pub(crate) const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
pub(crate) const KEY_TYPES: &str = "tokenizer.ggml.token_type";

/// `tokenizer.ggml.token_type` values (llama.cpp's numbering).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokenType {
    /// 0: written by some converters for tokens they could not classify;
    /// treated like `Normal`.
    Undefined,
    Normal,
    Unknown,
    /// Structural markers (`<|begin_of_text|>`, `<|eot_id|>`): matched in text
    /// only with `parse_special`, rendered only with `render_special`.
    Control,
    /// Added tokens that are always matched in text and always rendered.
    UserDefined,
    Unused,
    /// `<0xHH>` byte tokens.
    Byte,
}

impl TokenType {
    fn from_i64(v: i64) -> Option<TokenType> {
        Some(match v {
            0 => TokenType::Undefined,
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => return None,
        })
    }

    /// Whether decoding without `render_special` shows this token.
    pub fn renders_by_default(self) -> bool {
        matches!(self, TokenType::Undefined | TokenType::Normal | TokenType::UserDefined | TokenType::Byte)
    }
}

/// Token texts that end a turn or the text, used to find EOT when
/// `eot_token_id` is absent and to build the end-of-generation set.
const EOT_TEXTS: &[&str] =
    &["<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<EOT>", "<｜end▁of▁sentence｜>"];
const EOG_EXTRA_TEXTS: &[&str] = &["<|end_of_text|>", "<|eom_id|>", "<|return|>", "<|call|>", "<end_of_utterance>"];

/// Token texts and everything derived from them.
pub(crate) struct Vocab {
    /// All token texts back to back; token `i` is `text[text_off[i]..text_off[i + 1]]`.
    text: String,
    text_off: Vec<usize>,
    /// The bytes each token stands for (byte-decoded for normal tokens, the
    /// raw text for control tokens), laid out like `text`.
    bytes: Vec<u8>,
    bytes_off: Vec<usize>,
    types: Vec<TokenType>,
    index: StrIndex,
}

impl Vocab {
    pub fn from_metadata(md: &Metadata) -> Result<Vocab, Error> {
        let tokens = md.strings(KEY_TOKENS)?;
        if tokens.is_empty() {
            return Err(Error::Empty { key: KEY_TOKENS });
        }
        if u32::try_from(tokens.len()).is_err() {
            return Err(Error::TooLarge { key: KEY_TOKENS, len: tokens.len() });
        }
        let types = read_types(md, tokens.len())?;

        let total: usize = tokens.iter().map(|t| t.len()).sum();
        let mut v = Vocab {
            text: String::with_capacity(total),
            text_off: Vec::with_capacity(tokens.len() + 1),
            bytes: Vec::with_capacity(total),
            bytes_off: Vec::with_capacity(tokens.len() + 1),
            types,
            index: StrIndex::with_capacity(tokens.len()),
        };
        v.text_off.push(0);
        v.bytes_off.push(0);
        for (i, t) in tokens.iter().enumerate() {
            v.text.push_str(t);
            v.text_off.push(v.text.len());
            token_bytes(t, v.types[i], &mut v.bytes);
            v.bytes_off.push(v.bytes.len());
        }
        for i in 0..tokens.len() {
            v.index.insert(&v.text, &v.text_off, i as u32);
        }
        Ok(v)
    }

    pub fn len(&self) -> usize {
        self.types.len()
    }

    pub fn text(&self, id: u32) -> Option<&str> {
        let i = id as usize;
        (i < self.len()).then(|| &self.text[self.text_off[i]..self.text_off[i + 1]])
    }

    pub fn bytes(&self, id: u32) -> &[u8] {
        let i = id as usize;
        if i < self.len() {
            &self.bytes[self.bytes_off[i]..self.bytes_off[i + 1]]
        } else {
            &[]
        }
    }

    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    /// The id of the token whose text is `text`.
    pub fn id(&self, text: &str) -> Option<u32> {
        self.index.get(&self.text, &self.text_off, &[text.as_bytes()])
    }

    /// The id of the token whose text is `a` followed by `b` (no allocation).
    pub fn id_concat(&self, a: &str, b: &str) -> Option<u32> {
        self.index.get(&self.text, &self.text_off, &[a.as_bytes(), b.as_bytes()])
    }
}

fn read_types(md: &Metadata, n: usize) -> Result<Vec<TokenType>, Error> {
    // Absent means "all normal", as in llama.cpp.
    if md.get(KEY_TYPES).is_none() {
        return Ok(vec![TokenType::Normal; n]);
    }
    let arr = md.array(KEY_TYPES)?;
    let raw = arr.as_i64s().ok_or_else(|| tern_gguf::Error::WrongKeyType {
        key: KEY_TYPES.to_string(),
        expected: "array of integers",
        found: arr.elem_type(),
    })?;
    if raw.len() != n {
        return Err(Error::LengthMismatch { key: KEY_TYPES, found: raw.len(), expected: n });
    }
    raw.iter()
        .enumerate()
        .map(|(index, &value)| TokenType::from_i64(value).ok_or(Error::BadTokenType { key: KEY_TYPES, index, value }))
        .collect()
}

/// Appends the bytes token text `t` stands for.
fn token_bytes(t: &str, ty: TokenType, out: &mut Vec<u8>) {
    match ty {
        // Control and similar tokens are markers, not encoded bytes: when
        // rendered at all, they render as their literal text.
        TokenType::Control | TokenType::Unknown | TokenType::Unused => out.extend_from_slice(t.as_bytes()),
        TokenType::Byte => match parse_byte_token(t) {
            Some(b) => out.push(b),
            None => bytes::decode_into(t, out),
        },
        TokenType::Undefined | TokenType::Normal | TokenType::UserDefined => bytes::decode_into(t, out),
    }
}

/// `<0xHH>` → the byte.
fn parse_byte_token(t: &str) -> Option<u8> {
    let hex = t.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// Special-token ids and flags.
#[derive(Clone, Debug, Default)]
pub(crate) struct Specials {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    /// End-of-generation ids, sorted.
    pub eog: Vec<u32>,
    /// Tokens that may be matched inside text (control, user-defined,
    /// unknown), longest text first so a longer token wins over its prefix.
    pub matchable: Vec<u32>,
}

impl Specials {
    /// `add_bos_default`: whether BOS is added when the file does not say
    /// (llama.cpp's per-pre-tokenizer default: true for Llama 3).
    pub fn from_metadata(md: &Metadata, vocab: &Vocab, add_bos_default: bool) -> Result<Specials, Error> {
        let id = |key: &'static str| -> Result<Option<u32>, Error> {
            match md.opt_u64(key)? {
                None => Ok(None),
                Some(id) if (id as usize) < vocab.len() && id <= u32::MAX as u64 => Ok(Some(id as u32)),
                Some(id) => Err(Error::IdOutOfRange { key, id, n_vocab: vocab.len() }),
            }
        };
        let mut s = Specials {
            bos: id("tokenizer.ggml.bos_token_id")?,
            eos: id("tokenizer.ggml.eos_token_id")?,
            eot: id("tokenizer.ggml.eot_token_id")?,
            eom: id("tokenizer.ggml.eom_token_id")?,
            unk: id("tokenizer.ggml.unknown_token_id")?,
            pad: id("tokenizer.ggml.padding_token_id")?,
            add_bos: md.opt_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(add_bos_default),
            add_eos: md.opt_bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false),
            eog: Vec::new(),
            matchable: Vec::new(),
        };

        // Only marker-like tokens qualify for text-based detection: a normal
        // token spelled "<|end|>" would be ordinary text.
        let marker = |id: u32| matches!(vocab.token_type(id), Some(TokenType::Control | TokenType::UserDefined));
        let find =
            |texts: &[&str]| texts.iter().filter_map(|t| vocab.id(t)).filter(|&id| marker(id)).collect::<Vec<_>>();
        if s.eot.is_none() {
            s.eot = find(EOT_TEXTS).first().copied();
        }
        let mut eog: Vec<u32> = [s.eos, s.eot, s.eom].into_iter().flatten().collect();
        eog.extend(find(EOT_TEXTS));
        eog.extend(find(EOG_EXTRA_TEXTS));
        eog.sort_unstable();
        eog.dedup();
        s.eog = eog;

        s.matchable = (0..vocab.len() as u32)
            .filter(|&id| {
                matches!(vocab.token_type(id), Some(TokenType::Control | TokenType::UserDefined | TokenType::Unknown))
                    && vocab.text(id).is_some_and(|t| !t.is_empty())
            })
            .collect();
        s.matchable.sort_by_key(|&id| (std::cmp::Reverse(vocab.text(id).map_or(0, str::len)), id));
        Ok(s)
    }
}

/// Open-addressing hash index from token text to id, storing only ids (the
/// texts live in `Vocab::text`), so loading a large vocabulary does not
/// allocate a `String` per token.
struct StrIndex {
    slots: Vec<u32>,
    shift: u32,
}

const EMPTY: u32 = u32::MAX;

/// FNV-1a over the concatenation of `parts`, so `["ab", "c"]` and `["abc"]`
/// hash alike.
fn hash(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

fn eq_concat(t: &[u8], parts: &[&[u8]]) -> bool {
    let mut rest = t;
    for p in parts {
        match rest.strip_prefix(*p) {
            Some(r) => rest = r,
            None => return false,
        }
    }
    rest.is_empty()
}

impl StrIndex {
    fn with_capacity(n: usize) -> StrIndex {
        // Load factor at most 1/2 keeps probe sequences short.
        let cap = (n * 2).next_power_of_two().max(16);
        StrIndex { slots: vec![EMPTY; cap], shift: 64 - cap.trailing_zeros() }
    }

    fn slot(&self, h: u64) -> usize {
        // Fibonacci hashing spreads FNV's weak low bits over the table.
        (h.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    /// Inserts token `id`; a later token with the same text replaces an
    /// earlier one (llama.cpp's text → id map behaves the same way).
    fn insert(&mut self, text: &str, off: &[usize], id: u32) {
        let key = &text.as_bytes()[off[id as usize]..off[id as usize + 1]];
        let mask = self.slots.len() - 1;
        let mut s = self.slot(hash(&[key]));
        loop {
            let cur = self.slots[s];
            if cur == EMPTY || &text.as_bytes()[off[cur as usize]..off[cur as usize + 1]] == key {
                self.slots[s] = id;
                return;
            }
            s = (s + 1) & mask;
        }
    }

    fn get(&self, text: &str, off: &[usize], parts: &[&[u8]]) -> Option<u32> {
        let mask = self.slots.len() - 1;
        let mut s = self.slot(hash(parts));
        loop {
            let cur = self.slots[s];
            if cur == EMPTY {
                return None;
            }
            if eq_concat(&text.as_bytes()[off[cur as usize]..off[cur as usize + 1]], parts) {
                return Some(cur);
            }
            s = (s + 1) & mask;
        }
    }
}
