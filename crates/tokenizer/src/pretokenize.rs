//! Pre-tokenizers: split text into the pieces that BPE merges within.
//!
//! Byte-level BPE never merges across piece boundaries, and the boundaries
//! are defined by a regex per model family. Rather than run a backtracking
//! regex engine (the patterns need a lookahead), each supported pattern is
//! implemented as a hand-written scanner that decides, at every position,
//! which alternative the regex would pick under leftmost-first semantics.
//! The unit tests compare every scanner with `fancy-regex` running the
//! original pattern on many random strings.

use crate::error::Error;
use crate::unicode::{class, Class};

/// The regex of GPT-2 (`tokenizer.ggml.pre` = `default` / `gpt-2`, or absent).
pub const GPT2_PATTERN: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// The regex of Llama 3 (`tokenizer.ggml.pre` = `llama-bpe` / `llama3` / `llama-v3`).
pub const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The regex of Qwen2, Qwen2.5 and Qwen3 (`tokenizer.ggml.pre` = `qwen2`):
/// Llama 3's, except that digits are split one by one.
pub const QWEN2_PATTERN: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// `tokenizer.ggml.pre` values accepted, for error messages.
pub const SUPPORTED: &str = "llama-bpe, llama3, llama-v3 (Llama 3 regex); qwen2, deepseek-r1-qwen (Qwen2 regex); \
                             default, gpt-2 or absent (GPT-2 regex)";

/// A supported pre-tokenizer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizer {
    /// [`GPT2_PATTERN`].
    Gpt2,
    /// [`LLAMA3_PATTERN`].
    Llama3,
    /// [`QWEN2_PATTERN`].
    Qwen2,
}

impl PreTokenizer {
    /// Maps a `tokenizer.ggml.pre` value. Unknown names are an error rather
    /// than a silent fallback: a wrong split gives plausible but wrong ids.
    pub fn from_name(name: Option<&str>) -> Result<PreTokenizer, Error> {
        match name {
            None | Some("default") | Some("gpt-2") | Some("gpt2") => Ok(PreTokenizer::Gpt2),
            Some("llama-bpe") | Some("llama3") | Some("llama-v3") => Ok(PreTokenizer::Llama3),
            // DeepSeek-R1's Qwen distills keep the Qwen tokenizer under their own name.
            Some("qwen2") | Some("deepseek-r1-qwen") => Ok(PreTokenizer::Qwen2),
            Some(other) => Err(Error::UnknownPreTokenizer { pre: other.to_string(), supported: SUPPORTED }),
        }
    }

    /// The regex this pre-tokenizer implements.
    pub fn pattern(self) -> &'static str {
        match self {
            PreTokenizer::Gpt2 => GPT2_PATTERN,
            PreTokenizer::Llama3 => LLAMA3_PATTERN,
            PreTokenizer::Qwen2 => QWEN2_PATTERN,
        }
    }

    /// Whether BPE should first look the whole piece up in the vocabulary
    /// (Llama 3 tokenizers are configured with `ignore_merges`). Qwen2's
    /// tokenizer.json leaves it off and llama.cpp sets it for the Llama 3
    /// family only; Qwen2's merges rebuild every whole-piece token, so the
    /// choice does not change its ids (`qwen2_tokens_encode_to_themselves`).
    pub fn ignore_merges(self) -> bool {
        matches!(self, PreTokenizer::Llama3)
    }

    /// Appends the pieces of `text` to `out`, in order; they cover `text` exactly.
    pub fn split<'a>(self, text: &'a str, out: &mut Vec<&'a str>) {
        if text.is_empty() {
            return;
        }
        let chars = Chars::new(text);
        let mut i = 0;
        while i < chars.len() {
            let end = match self {
                PreTokenizer::Gpt2 => chars.gpt2_at(i),
                PreTokenizer::Llama3 => chars.llama3_at(i, 3),
                PreTokenizer::Qwen2 => chars.llama3_at(i, 1),
            };
            debug_assert!(end > i);
            out.push(&text[chars.offset(i)..chars.offset(end)]);
            i = end;
        }
    }
}

/// Decoded characters of a text with their classes and byte offsets.
struct Chars {
    cs: Vec<char>,
    cl: Vec<Class>,
    /// Byte offset of each character, plus the text length at the end.
    off: Vec<usize>,
}

impl Chars {
    fn new(text: &str) -> Chars {
        let n = text.len();
        let mut cs = Vec::with_capacity(n);
        let mut cl = Vec::with_capacity(n);
        let mut off = Vec::with_capacity(n + 1);
        for (o, c) in text.char_indices() {
            cs.push(c);
            cl.push(class(c));
            off.push(o);
        }
        off.push(n);
        Chars { cs, cl, off }
    }

    fn len(&self) -> usize {
        self.cs.len()
    }

    fn offset(&self, i: usize) -> usize {
        self.off[i]
    }

    fn is(&self, i: usize, want: Class) -> bool {
        self.cl.get(i) == Some(&want)
    }

    fn is_newline(&self, i: usize) -> bool {
        matches!(self.cs.get(i), Some('\r' | '\n'))
    }

    /// End of the run of `want` characters starting at `i`.
    fn run(&self, mut i: usize, want: Class) -> usize {
        while self.is(i, want) {
            i += 1;
        }
        i
    }

    /// Length of a contraction (`'s 't 're 've 'm 'll 'd`) at `i`, if any.
    /// `fold` decides case-insensitivity.
    fn contraction(&self, i: usize, fold: fn(char) -> char) -> Option<usize> {
        if self.cs[i] != '\'' {
            return None;
        }
        let a = self.cs.get(i + 1).map(|&c| fold(c))?;
        if matches!(a, 's' | 't' | 'm' | 'd') {
            return Some(2);
        }
        let b = self.cs.get(i + 2).map(|&c| fold(c))?;
        match (a, b) {
            ('r', 'e') | ('v', 'e') | ('l', 'l') => Some(3),
            _ => None,
        }
    }

    /// Whitespace alternatives shared by all the patterns, entered only when
    /// nothing before them matched (so `cs[i]` is whitespace):
    /// `\s+(?!\S)` — a whitespace run, minus its last character if a
    /// non-space follows and the run has more than one character (the
    /// lookahead makes the regex back off so that character can prefix the
    /// next word) — else `\s+`.
    fn trailing_space(&self, i: usize) -> usize {
        let j = self.run(i, Class::Space);
        if j == self.len() || j - i < 2 {
            j
        } else {
            j - 1
        }
    }

    /// End of the GPT-2 match starting at `i`.
    fn gpt2_at(&self, i: usize) -> usize {
        if let Some(n) = self.contraction(i, |c| c) {
            return i + n;
        }
        // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: the optional space is
        // taken only when the class run follows it.
        let start = if self.cs[i] == ' ' { i + 1 } else { i };
        for cls in [Class::Letter, Class::Number, Class::Other] {
            if self.is(start, cls) {
                return self.run(start, cls);
            }
        }
        self.trailing_space(i)
    }

    /// End of the Llama 3 match starting at `i`. Qwen2's regex differs only
    /// in the digit alternative, so `max_digits` selects it: 3 for Llama 3's
    /// `\p{N}{1,3}`, 1 for Qwen2's `\p{N}`.
    fn llama3_at(&self, i: usize, max_digits: usize) -> usize {
        // `(?i:'s|'t|'re|'ve|'m|'ll|'d)`; the regex's Unicode case folding
        // also lets the long s `ſ` match `s`.
        if let Some(n) = self.contraction(i, |c| if c == 'ſ' { 's' } else { c.to_ascii_lowercase() }) {
            return i + n;
        }
        let cl = self.cl[i];
        // `[^\r\n\p{L}\p{N}]?\p{L}+`: a letter run, optionally led by one
        // character that is neither a newline, a letter nor a digit.
        if cl == Class::Letter {
            return self.run(i, Class::Letter);
        }
        if cl != Class::Number && !self.is_newline(i) && self.is(i + 1, Class::Letter) {
            return self.run(i + 1, Class::Letter);
        }
        // `\p{N}{1,max_digits}`: digits in groups of at most `max_digits`.
        if cl == Class::Number {
            let mut j = i + 1;
            while j < i + max_digits && self.is(j, Class::Number) {
                j += 1;
            }
            return j;
        }
        // ` ?[^\s\p{L}\p{N}]+[\r\n]*`: punctuation, optionally led by a
        // space, swallowing the newlines that follow.
        let start = if self.cs[i] == ' ' && self.is(i + 1, Class::Other) { i + 1 } else { i };
        if self.is(start, Class::Other) {
            let mut j = self.run(start, Class::Other);
            while self.is_newline(j) {
                j += 1;
            }
            return j;
        }
        // `\s*[\r\n]+`: whitespace up to and including the last newline of
        // the run (the greedy `\s*` backs off to the last newline).
        let j = self.run(i, Class::Space);
        if let Some(k) = (i..j).rev().find(|&k| self.is_newline(k)) {
            return k + 1;
        }
        self.trailing_space(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tern_testutil::Rng;

    fn split(pre: PreTokenizer, text: &str) -> Vec<&str> {
        let mut out = Vec::new();
        pre.split(text, &mut out);
        out
    }

    fn regex_split(re: &fancy_regex::Regex, text: &str) -> Vec<String> {
        re.find_iter(text).map(|m| m.unwrap().as_str().to_string()).collect()
    }

    #[test]
    fn examples() {
        use PreTokenizer::*;
        assert_eq!(split(Llama3, "Hello world"), ["Hello", " world"]);
        assert_eq!(split(Llama3, "   Hello"), ["  ", " Hello"]);
        assert_eq!(split(Llama3, "1234567"), ["123", "456", "7"]);
        assert_eq!(split(Llama3, "I'LL go\n\n x"), ["I", "'LL", " go", "\n\n", " x"]);
        assert_eq!(split(Llama3, "a.\n\nb"), ["a", ".\n\n", "b"]);
        assert_eq!(split(Qwen2, "x 1234 ²"), ["x", " ", "1", "2", "3", "4", " ", "²"]);
        assert_eq!(split(Qwen2, "I'LL go\n\n x"), ["I", "'LL", " go", "\n\n", " x"]);
        assert_eq!(split(Gpt2, "I'LL 1234 go  !!"), ["I", "'", "LL", " 1234", " go", " ", " !!"]);
        assert_eq!(split(Gpt2, ""), Vec::<&str>::new());
    }

    /// Characters chosen to hit every class boundary the patterns care about:
    /// ASCII of each class, apostrophes and contraction letters in both cases,
    /// `ſ` and the Kelvin sign (case folding), every kind of newline and
    /// Unicode space, combining marks (neither letter nor number), non-decimal
    /// numbers, CJK, emoji with joiners and variation selectors.
    const POOL: &[char] = &[
        'a', 'b', 'S', 's', 't', 'T', 'r', 'R', 'e', 'E', 'v', 'V', 'm', 'M', 'l', 'L', 'd', 'D', 'k', 'K', 'ſ',
        '\u{212A}', '\'', '’', '0', '1', '9', '²', 'Ⅻ', '٣', '½', ' ', ' ', ' ', '\t', '\n', '\r', '\u{0B}', '\u{0C}',
        '\u{85}', '\u{A0}', '\u{2028}', '\u{3000}', '\u{200D}', '\u{FE0F}', '\u{0301}', '\u{17B6}', '.', ',', '!', '?',
        '-', '(', ')', '=', '_', '"', 'é', 'Ä', 'ж', 'Б', 'ក', '我', 'ー', '🦙', '😶', '🌫', 'ǅ', 'ʰ', '\u{0}',
        '\u{7F}',
    ];

    fn random_text(rng: &mut Rng) -> String {
        let n = rng.below(24);
        (0..n).map(|_| POOL[rng.below(POOL.len())]).collect()
    }

    fn differential(pre: PreTokenizer, seed: u64) {
        let re = fancy_regex::Regex::new(pre.pattern()).unwrap();
        let mut rng = Rng::new(seed);
        for _ in 0..30_000 {
            let text = random_text(&mut rng);
            let ours = split(pre, &text);
            assert_eq!(ours.concat(), text, "{pre:?} pieces must cover {text:?}");
            assert_eq!(ours, regex_split(&re, &text), "{pre:?} on {text:?}");
        }
        let vectors = include_str!("../../../testdata/tokenizer/ggml-vocab-llama-bpe.gguf.inp");
        for text in vectors.split("\n__ggml_vocab_test__\n") {
            assert_eq!(split(pre, text), regex_split(&re, text), "{pre:?} on {text:?}");
        }
    }

    #[test]
    fn llama3_matches_regex() {
        differential(PreTokenizer::Llama3, 0x9E37_79B9_7F4A_7C15);
    }

    #[test]
    fn qwen2_matches_regex() {
        differential(PreTokenizer::Qwen2, 0x2545_F491_4F6C_DD1D);
    }

    #[test]
    fn gpt2_matches_regex() {
        differential(PreTokenizer::Gpt2, 0xD1B5_4A32_D192_ED03);
    }

    #[test]
    fn names() {
        assert_eq!(PreTokenizer::from_name(Some("llama-bpe")).unwrap(), PreTokenizer::Llama3);
        assert_eq!(PreTokenizer::from_name(None).unwrap(), PreTokenizer::Gpt2);
        assert_eq!(PreTokenizer::from_name(Some("qwen2")).unwrap(), PreTokenizer::Qwen2);
        let err = PreTokenizer::from_name(Some("qwen35")).unwrap_err().to_string();
        assert!(err.contains("qwen35") && err.contains("llama-bpe"), "{err}");
    }
}
