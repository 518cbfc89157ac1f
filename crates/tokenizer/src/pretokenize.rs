//! Pre-tokenizers: split text into the pieces that BPE merges within.
//!
//! Byte-level BPE never merges across piece boundaries, and the boundaries
//! are defined by a regex per model family, or by a sequence of regexes.
//! Rather than run a backtracking regex engine (the patterns need a
//! lookahead), each supported pattern is implemented as a hand-written
//! scanner that decides, at every position, which alternative the regex
//! would pick under leftmost-first semantics. The unit tests compare every
//! scanner with `fancy-regex` running the original patterns on many random
//! strings.
//!
//! A sequence (DeepSeek's tokenizers) is applied the way Hugging Face's
//! `Sequence` of `Split` pre-tokenizers with the `Isolated` behaviour and
//! llama.cpp's `unicode_regex_split` apply it: each regex runs over every
//! piece the previous ones left, and splits it into its matches and the
//! stretches of text between them, both kept as pieces.

use crate::error::Error;
use crate::unicode::{category, Category, Class};

/// The regex of GPT-2 (`tokenizer.ggml.pre` = `default` / `gpt-2`, or absent).
pub const GPT2_PATTERN: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// The regex of Llama 3 (`tokenizer.ggml.pre` = `llama-bpe` / `llama3` / `llama-v3`).
pub const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The regex of Qwen2, Qwen2.5 and Qwen3 (`tokenizer.ggml.pre` = `qwen2`):
/// Llama 3's, except that digits are split one by one.
pub const QWEN2_PATTERN: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The regexes of DeepSeek LLM and DeepSeek-V2 / V2-Lite
/// (`tokenizer.ggml.pre` = `deepseek-llm`), applied in sequence: newlines
/// alone; a run of cased letters (an explicit list of ranges, not `\p{L}`)
/// with one optional whitespace before it; a run of ASCII and full-width
/// punctuation (ASCII letters included: the first split has already
/// isolated them), likewise; the whitespace that ends a piece; a run of
/// CJK, Hangul and the other scripts in U+0800..U+4E00; a run of numbers.
///
/// Six code points of the letter list are written as escapes: Unicode
/// normalization (NFC) would turn them into other characters.
pub const DEEPSEEK_LLM_PATTERNS: [&str; 6] = [
    r"[\r\n]",
    "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\u{1F7D}ᾀ-ᾴᾶ-ᾼ\u{1FBE}ῂ-ῄῆ-ῌῐ-\u{1FD3}ῖ-\u{1FDB}ῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\u{2126}ℨ\u{212A}-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
    r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
    r"\s+$",
    r"[一-龥ࠀ-一가-퟿]+",
    r"\p{N}+",
];

/// The regexes of DeepSeek-V3, V3.1 and R1 (`tokenizer.ggml.pre` =
/// `deepseek-v3`), applied in sequence: numbers in groups of at most three;
/// runs of CJK ideographs and kana; then a Llama 3-like pattern over
/// letters with their combining marks, punctuation and symbols.
pub const DEEPSEEK_V3_PATTERNS: [&str; 3] = [
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];

/// `tokenizer.ggml.pre` values accepted, for error messages.
pub const SUPPORTED: &str = "llama-bpe, llama3, llama-v3 (Llama 3 regex); qwen2, deepseek-r1-qwen (Qwen2 regex); \
                             deepseek-llm (DeepSeek LLM / V2); deepseek-v3 (DeepSeek-V3 / R1); \
                             default, gpt-2 or absent (GPT-2 regex)";

/// A supported pre-tokenizer.
///
/// The DeepSeek scanners follow the patterns as written, which is also how
/// the Hugging Face tokenizers the models were trained with and Python's
/// `regex` read them. llama.cpp runs them through `std::regex` and departs
/// from that in corners no test vector reaches: for `deepseek-llm` it turns
/// every non-ASCII whitespace character into U+000B first, so U+3000 (in
/// the punctuation class) and the spaces inside U+0800..U+4E00 (U+1680,
/// U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000) count only as
/// `\s` there; for `deepseek-v3` its stand-in for `\p{S}` leaves out `~`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizer {
    /// [`GPT2_PATTERN`].
    Gpt2,
    /// [`LLAMA3_PATTERN`].
    Llama3,
    /// [`QWEN2_PATTERN`].
    Qwen2,
    /// [`DEEPSEEK_LLM_PATTERNS`].
    DeepseekLlm,
    /// [`DEEPSEEK_V3_PATTERNS`].
    DeepseekV3,
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
            Some("deepseek-llm") => Ok(PreTokenizer::DeepseekLlm),
            Some("deepseek-v3") => Ok(PreTokenizer::DeepseekV3),
            Some(other) => Err(Error::UnknownPreTokenizer { pre: other.to_string(), supported: SUPPORTED }),
        }
    }

    /// The regexes this pre-tokenizer implements, in the order they apply.
    pub fn patterns(self) -> &'static [&'static str] {
        match self {
            PreTokenizer::Gpt2 => &[GPT2_PATTERN],
            PreTokenizer::Llama3 => &[LLAMA3_PATTERN],
            PreTokenizer::Qwen2 => &[QWEN2_PATTERN],
            PreTokenizer::DeepseekLlm => &DEEPSEEK_LLM_PATTERNS,
            PreTokenizer::DeepseekV3 => &DEEPSEEK_V3_PATTERNS,
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
        let stages: &[Stage] = match self {
            PreTokenizer::DeepseekLlm => &DEEPSEEK_LLM_STAGES,
            PreTokenizer::DeepseekV3 => &DEEPSEEK_V3_STAGES,
            single => {
                let span = chars.span(0, chars.len());
                let mut i = 0;
                while i < span.len() {
                    let end = match single {
                        PreTokenizer::Gpt2 => span.gpt2_at(i),
                        PreTokenizer::Llama3 => span.llama3_at(i, 3),
                        _ => span.llama3_at(i, 1),
                    };
                    debug_assert!(end > i);
                    out.push(&text[chars.offset(i)..chars.offset(end)]);
                    i = end;
                }
                return;
            }
        };
        // Pieces as character ranges, refined by one regex after the other.
        let mut pieces = vec![(0, chars.len())];
        let mut next = Vec::new();
        for &stage in stages {
            next.clear();
            for &(lo, hi) in &pieces {
                let span = chars.span(lo, hi);
                let mut done = 0;
                while let Some((start, end)) = span.find(stage, done) {
                    debug_assert!(done <= start && start < end);
                    if start > done {
                        next.push((lo + done, lo + start));
                    }
                    next.push((lo + start, lo + end));
                    done = end;
                }
                if done < span.len() {
                    next.push((lo + done, hi));
                }
            }
            std::mem::swap(&mut pieces, &mut next);
        }
        out.extend(pieces.into_iter().map(|(a, b)| &text[chars.offset(a)..chars.offset(b)]));
    }
}

/// One regex of a sequence, as a scanner ([`Span::find`]).
#[derive(Clone, Copy, Debug)]
enum Stage {
    /// `[\r\n]`.
    Newline,
    /// `\s?[set]+`.
    SpaceThen(Set),
    /// `[set]+`.
    Run(Set),
    /// `\s+$`: the whitespace that ends the piece.
    TrailingSpace,
    /// `\p{N}{1,max}`; `\p{N}+` with `usize::MAX`.
    Numbers(usize),
    /// The last regex of [`DEEPSEEK_V3_PATTERNS`].
    V3Words,
}

const DEEPSEEK_LLM_STAGES: [Stage; 6] = [
    Stage::Newline,
    Stage::SpaceThen(Set::DsLetters),
    Stage::SpaceThen(Set::DsPunct),
    Stage::TrailingSpace,
    Stage::Run(Set::DsCjk),
    Stage::Numbers(usize::MAX),
];

const DEEPSEEK_V3_STAGES: [Stage; 3] = [Stage::Numbers(3), Stage::Run(Set::V3CjkKana), Stage::V3Words];

/// The explicit character classes of the DeepSeek patterns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Set {
    /// The letter class of [`DEEPSEEK_LLM_PATTERNS`]: the cased letters
    /// (Lu, Ll, Lt) of the scripts that have case, by the pattern's list.
    DsLetters,
    /// `[!-/:-~！-／：-～‘-‟　-。]`.
    DsPunct,
    /// `[一-龥ࠀ-一가-퟿]`.
    DsCjk,
    /// `[一-龥぀-ゟ゠-ヿ]`.
    V3CjkKana,
}

/// [`Set::DsLetters`] as sorted, disjoint, inclusive code point ranges.
#[rustfmt::skip]
const DS_LETTERS: &[(u32, u32)] = &[
    (0x00041, 0x0005A), (0x00061, 0x0007A), (0x000B5, 0x000B5), (0x000C0, 0x000D6), (0x000D8, 0x000F6), (0x000F8, 0x001BA),
    (0x001BC, 0x001BF), (0x001C4, 0x00293), (0x00295, 0x002AF), (0x00370, 0x00373), (0x00376, 0x00377), (0x0037B, 0x0037D),
    (0x0037F, 0x0037F), (0x00386, 0x00386), (0x00388, 0x0038A), (0x0038C, 0x0038C), (0x0038E, 0x003A1), (0x003A3, 0x003F5),
    (0x003F7, 0x00481), (0x0048A, 0x0052F), (0x00531, 0x00556), (0x010A0, 0x010C5), (0x013A0, 0x013F5), (0x013F8, 0x013FD),
    (0x01C90, 0x01CBA), (0x01CBD, 0x01CBF), (0x01D00, 0x01D2B), (0x01D6B, 0x01D77), (0x01D79, 0x01D9A), (0x01E00, 0x01F15),
    (0x01F18, 0x01F1D), (0x01F20, 0x01F45), (0x01F48, 0x01F4D), (0x01F50, 0x01F57), (0x01F59, 0x01F59), (0x01F5B, 0x01F5B),
    (0x01F5D, 0x01F5D), (0x01F5F, 0x01F7D), (0x01F80, 0x01FB4), (0x01FB6, 0x01FBC), (0x01FBE, 0x01FBE), (0x01FC2, 0x01FC4),
    (0x01FC6, 0x01FCC), (0x01FD0, 0x01FD3), (0x01FD6, 0x01FDB), (0x01FE0, 0x01FEC), (0x01FF2, 0x01FF4), (0x01FF6, 0x01FFC),
    (0x02102, 0x02102), (0x02107, 0x02107), (0x0210A, 0x02113), (0x02115, 0x02115), (0x02119, 0x0211D), (0x02124, 0x02124),
    (0x02126, 0x02126), (0x02128, 0x02128), (0x0212A, 0x0212D), (0x0212F, 0x02134), (0x02139, 0x02139), (0x0213C, 0x0213F),
    (0x02145, 0x02149), (0x0214E, 0x0214E), (0x02183, 0x02184), (0x02C00, 0x02C7B), (0x02C7E, 0x02CE4), (0x02CEB, 0x02CEE),
    (0x02CF2, 0x02CF3), (0x0A640, 0x0A66D), (0x0A680, 0x0A69B), (0x0A722, 0x0A76F), (0x0A771, 0x0A787), (0x0A78B, 0x0A78E),
    (0x0AB70, 0x0ABBF), (0x0FB00, 0x0FB06), (0x0FB13, 0x0FB17), (0x0FF21, 0x0FF3A), (0x0FF41, 0x0FF5A), (0x10400, 0x1044F),
    (0x104B0, 0x104D3), (0x104D8, 0x104FB), (0x10C80, 0x10CB2), (0x10CC0, 0x10CF2), (0x118A0, 0x118DF), (0x1E900, 0x1E943),
];

impl Set {
    fn ranges(self) -> &'static [(u32, u32)] {
        match self {
            Set::DsLetters => DS_LETTERS,
            Set::DsPunct => {
                &[(0x21, 0x2F), (0x3A, 0x7E), (0x2018, 0x201F), (0x3000, 0x3002), (0xFF01, 0xFF0F), (0xFF1A, 0xFF5E)]
            }
            // The pattern's ranges U+0800..U+4E00 and U+4E00..U+9FA5 meet.
            Set::DsCjk => &[(0x0800, 0x9FA5), (0xAC00, 0xD7FF)],
            // Hiragana U+3040..U+309F and katakana U+30A0..U+30FF are adjacent.
            Set::V3CjkKana => &[(0x3040, 0x30FF), (0x4E00, 0x9FA5)],
        }
    }

    fn contains(self, c: char) -> bool {
        let ranges = self.ranges();
        let u = c as u32;
        let i = ranges.partition_point(|&(_, end)| end < u);
        ranges.get(i).is_some_and(|&(start, _)| start <= u)
    }
}

/// Decoded characters of a text with their categories and byte offsets.
struct Chars {
    cs: Vec<char>,
    cat: Vec<Category>,
    /// Byte offset of each character, plus the text length at the end.
    off: Vec<usize>,
}

impl Chars {
    fn new(text: &str) -> Chars {
        let n = text.len();
        let mut cs = Vec::with_capacity(n);
        let mut cat = Vec::with_capacity(n);
        let mut off = Vec::with_capacity(n + 1);
        for (o, c) in text.char_indices() {
            cs.push(c);
            cat.push(category(c));
            off.push(o);
        }
        off.push(n);
        Chars { cs, cat, off }
    }

    fn len(&self) -> usize {
        self.cs.len()
    }

    fn offset(&self, i: usize) -> usize {
        self.off[i]
    }

    /// Characters `lo..hi`, scanned as if they were the whole text.
    fn span(&self, lo: usize, hi: usize) -> Span<'_> {
        Span { cs: &self.cs[lo..hi], cat: &self.cat[lo..hi] }
    }
}

/// The characters one regex runs over: the text, or a piece of it. Indices
/// are relative to its start, and its end is the end of the input (`$`,
/// and the lookahead of `\s+(?!\S)`, see nothing past it).
#[derive(Clone, Copy)]
struct Span<'a> {
    cs: &'a [char],
    cat: &'a [Category],
}

impl Span<'_> {
    fn len(&self) -> usize {
        self.cs.len()
    }

    fn is(&self, i: usize, want: Class) -> bool {
        self.cat.get(i).is_some_and(|c| c.class() == want)
    }

    fn is_newline(&self, i: usize) -> bool {
        matches!(self.cs.get(i), Some('\r' | '\n'))
    }

    /// End of the run of `want` characters starting at `i`.
    fn run(&self, i: usize, want: Class) -> usize {
        self.run_while(i, |k| self.is(k, want))
    }

    /// End of the run of positions from `i` on that satisfy `f`, which is
    /// false past the end.
    fn run_while(&self, mut i: usize, f: impl Fn(usize) -> bool) -> usize {
        while f(i) {
            i += 1;
        }
        i
    }

    fn in_set(&self, i: usize, set: Set) -> bool {
        self.cs.get(i).is_some_and(|&c| set.contains(c))
    }

    fn is_cat(&self, i: usize, f: fn(Category) -> bool) -> bool {
        self.cat.get(i).is_some_and(|&c| f(c))
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

    /// `\s*[\r\n]+` at `i`: whitespace up to and including the last newline
    /// of the run (the greedy `\s*` backs off to the last newline), if the
    /// run has one.
    fn space_through_newline(&self, i: usize) -> Option<usize> {
        let j = self.run(i, Class::Space);
        (i..j).rev().find(|&k| self.is_newline(k)).map(|k| k + 1)
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
        let cl = self.cat[i].class();
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
            return self.run(i, Class::Number).min(i + max_digits);
        }
        // ` ?[^\s\p{L}\p{N}]+[\r\n]*`: punctuation, optionally led by a
        // space, swallowing the newlines that follow.
        let start = if self.cs[i] == ' ' && self.is(i + 1, Class::Other) { i + 1 } else { i };
        if self.is(start, Class::Other) {
            let j = self.run(start, Class::Other);
            return self.run_while(j, |k| self.is_newline(k));
        }
        if let Some(end) = self.space_through_newline(i) {
            return end;
        }
        self.trailing_space(i)
    }

    /// The leftmost match of `stage` that starts at `from` or later, as a
    /// range of characters.
    fn find(&self, stage: Stage, from: usize) -> Option<(usize, usize)> {
        if let Stage::TrailingSpace = stage {
            // `\s+$` can only match the whitespace run the span ends with.
            let mut start = self.len();
            while start > from && self.is(start - 1, Class::Space) {
                start -= 1;
            }
            return (start < self.len()).then_some((start, self.len()));
        }
        (from..self.len()).find_map(|i| self.stage_at(stage, i).map(|end| (i, end)))
    }

    /// End of the match of `stage` that starts at `i`, if one does. Every
    /// match is at least one character long.
    fn stage_at(&self, stage: Stage, i: usize) -> Option<usize> {
        match stage {
            Stage::Newline => self.is_newline(i).then_some(i + 1),
            Stage::SpaceThen(set) => {
                // `\s?` takes the whitespace only if the run follows it; a
                // whitespace character that is itself in the set (U+3000)
                // then starts the run.
                let start = if self.is(i, Class::Space) && self.in_set(i + 1, set) { i + 1 } else { i };
                self.in_set(start, set).then(|| self.run_while(start, |k| self.in_set(k, set)))
            }
            Stage::Run(set) => self.in_set(i, set).then(|| self.run_while(i, |k| self.in_set(k, set))),
            Stage::Numbers(max) => {
                self.is(i, Class::Number).then(|| self.run(i, Class::Number).min(i.saturating_add(max)))
            }
            Stage::V3Words => self.v3_words_at(i),
            // `find` goes straight to that run; here the same rule at one position.
            Stage::TrailingSpace => {
                (self.is(i, Class::Space) && self.run(i, Class::Space) == self.len()).then_some(self.len())
            }
        }
    }

    /// The last regex of [`DEEPSEEK_V3_PATTERNS`] at `i`.
    fn v3_words_at(&self, i: usize) -> Option<usize> {
        use Category::*;
        let word = |c: Category| matches!(c, Letter | Mark);
        let punct = |c: Category| matches!(c, Punct | Symbol);
        let c = self.cs[i];
        let ascii_letter = |k: usize| self.cs.get(k).is_some_and(char::is_ascii_alphabetic);
        // `[!"#...~][A-Za-z]+`: one ASCII punctuation character or symbol
        // (the class lists all 32), then ASCII letters only.
        if c.is_ascii_punctuation() && ascii_letter(i + 1) {
            return Some(self.run_while(i + 1, ascii_letter));
        }
        // `[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+`: letters and marks, led by
        // at most one character that is none of those (nor a newline). When
        // `cs[i]` is a letter or a mark, taking it as the leader or not ends
        // the match at the same place.
        let cat = self.cat[i];
        if word(cat) {
            return Some(self.run_while(i, |k| self.is_cat(k, word)));
        }
        if !self.is_newline(i) && !punct(cat) && self.is_cat(i + 1, word) {
            return Some(self.run_while(i + 1, |k| self.is_cat(k, word)));
        }
        // ` ?[\p{P}\p{S}]+[\r\n]*`.
        let start = if c == ' ' && self.is_cat(i + 1, punct) { i + 1 } else { i };
        if self.is_cat(start, punct) {
            let j = self.run_while(start, |k| self.is_cat(k, punct));
            return Some(self.run_while(j, |k| self.is_newline(k)));
        }
        // `\s*[\r\n]+|\s+(?!\S)|\s+`, as in Llama 3's pattern.
        if cat == Space {
            return Some(self.space_through_newline(i).unwrap_or_else(|| self.trailing_space(i)));
        }
        // Digits (split off by the first regex), controls, format characters.
        None
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

    fn compile(pre: PreTokenizer) -> Vec<fancy_regex::Regex> {
        pre.patterns().iter().map(|p| fancy_regex::Regex::new(p).unwrap()).collect()
    }

    /// The regexes applied one after the other, each splitting every piece
    /// into its matches and the text between them.
    fn regex_split(res: &[fancy_regex::Regex], text: &str) -> Vec<String> {
        let mut pieces = vec![text.to_string()];
        for re in res {
            let mut next = Vec::new();
            for p in &pieces {
                let mut done = 0;
                for m in re.find_iter(p) {
                    let m = m.unwrap();
                    if m.start() > done {
                        next.push(p[done..m.start()].to_string());
                    }
                    next.push(m.as_str().to_string());
                    done = m.end();
                }
                if done < p.len() {
                    next.push(p[done..].to_string());
                }
            }
            pieces = next;
        }
        pieces
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

    #[test]
    fn deepseek_examples() {
        use PreTokenizer::*;
        // Newlines stand alone; a letter run takes one whitespace before it;
        // the trailing whitespace of a piece is split off; numbers are runs.
        assert_eq!(split(DeepseekLlm, "Hello  world\n\n12345 "), ["Hello", " ", " world", "\n", "\n", "12345", " "]);
        // The punctuation split runs over the letter pieces too (its class
        // has the ASCII letters), so a non-ASCII letter between ASCII ones
        // becomes its own piece. 'ʔ' (U+0294) is not in the letter list:
        // it stays in the text between matches, with the space before it.
        assert_eq!(split(DeepseekLlm, "Héllo ʔ!"), ["H", "é", "llo", " ʔ", "!"]);
        assert_eq!(split(DeepseekLlm, "你好，世界"), ["你好", "，", "世界"]);
        // Digits in threes, CJK and kana runs, ASCII punctuation leading
        // ASCII letters, letters with their marks.
        assert_eq!(split(DeepseekV3, "1234567 abc"), ["123", "456", "7", " abc"]);
        assert_eq!(split(DeepseekV3, "日本語のテキスト"), ["日本語のテキスト"]);
        assert_eq!(split(DeepseekV3, "I'LL x.Hello é\u{301}!\n\n"), ["I", "'LL", " x", ".Hello", " é\u{301}", "!\n\n"]);
        assert_eq!(split(DeepseekV3, "a  \n  b"), ["a", "  \n", " ", " b"]);
        assert_eq!(split(DeepseekV3, ""), Vec::<&str>::new());
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

    /// More for the DeepSeek patterns: the edges of their explicit classes
    /// (CJK, Hangul, kana, full-width and curly punctuation, letters in and
    /// out of the cased-letter list), the whitespace inside those classes,
    /// ASCII symbols, and non-ASCII punctuation and symbols.
    const DEEPSEEK_POOL: &[char] = &[
        '\u{7FF}', '\u{800}', '\u{4DFF}', '\u{4E00}', '\u{9FA5}', '\u{9FA6}', '\u{ABFF}', '\u{AC00}', '한', '\u{D7FF}',
        '\u{303F}', '\u{3040}', 'の', 'ア', '\u{30FF}', '\u{3100}', '\u{FF01}', '\u{FF0F}', '\u{FF10}', '\u{FF1A}',
        '\u{FF21}', '\u{FF5E}', '\u{FF5F}', '\u{2017}', '\u{2018}', '\u{201F}', '\u{2020}', '\u{3001}', '\u{3002}',
        '\u{3003}', '\u{2003}', '\u{1680}', 'µ', 'ʔ', 'ʕ', '\u{561}', 'ა', '\u{1F7D}', '\u{1FBE}', '\u{2126}', 'ℵ',
        '~', '$', '+', '^', '`', '|', '#', '@', '[', '\\', '€', '©', '¬', '«', '¡', '\u{E000}', '\u{FFFF}', '/', ':',
    ];

    fn random_text(rng: &mut Rng, pool: &[char]) -> String {
        let n = rng.below(24);
        (0..n).map(|_| pool[rng.below(pool.len())]).collect()
    }

    fn differential(pre: PreTokenizer, seed: u64) {
        let res = compile(pre);
        let pool: Vec<char> = match pre {
            PreTokenizer::DeepseekLlm | PreTokenizer::DeepseekV3 => POOL.iter().chain(DEEPSEEK_POOL).copied().collect(),
            _ => POOL.to_vec(),
        };
        let mut rng = Rng::new(seed);
        for _ in 0..30_000 {
            let text = random_text(&mut rng, &pool);
            let ours = split(pre, &text);
            assert_eq!(ours.concat(), text, "{pre:?} pieces must cover {text:?}");
            assert_eq!(ours, regex_split(&res, &text), "{pre:?} on {text:?}");
        }
        let vectors = include_str!("../../../testdata/tokenizer/ggml-vocab-llama-bpe.gguf.inp");
        for text in vectors.split("\n__ggml_vocab_test__\n") {
            assert_eq!(split(pre, text), regex_split(&res, text), "{pre:?} on {text:?}");
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
    fn deepseek_llm_matches_regex() {
        differential(PreTokenizer::DeepseekLlm, 0x94D0_49BB_1331_11EB);
    }

    #[test]
    fn deepseek_v3_matches_regex() {
        differential(PreTokenizer::DeepseekV3, 0xBF58_476D_1CE4_E5B9);
    }

    /// Exhaustive: each explicit class agrees with the bracket expression of
    /// the pattern it comes from, on every code point.
    #[test]
    fn sets_match_patterns() {
        let class_of = |pattern: &str| {
            let (a, b) = (pattern.find('[').unwrap(), pattern.rfind(']').unwrap());
            fancy_regex::Regex::new(&format!("^{}$", &pattern[a..=b])).unwrap()
        };
        for (set, pattern) in [
            (Set::DsLetters, DEEPSEEK_LLM_PATTERNS[1]),
            (Set::DsPunct, DEEPSEEK_LLM_PATTERNS[2]),
            (Set::DsCjk, DEEPSEEK_LLM_PATTERNS[4]),
            (Set::V3CjkKana, DEEPSEEK_V3_PATTERNS[1]),
        ] {
            let ranges = set.ranges();
            assert!(ranges.windows(2).all(|w| w[0].1 < w[1].0), "{set:?} ranges must be sorted and disjoint");
            let re = class_of(pattern);
            let mut buf = [0u8; 4];
            for c in (0..=0x10FFFFu32).filter_map(char::from_u32) {
                let want = re.is_match(c.encode_utf8(&mut buf)).unwrap();
                assert_eq!(set.contains(c), want, "{set:?} U+{:04X}", c as u32);
            }
        }
    }

    #[test]
    fn names() {
        assert_eq!(PreTokenizer::from_name(Some("llama-bpe")).unwrap(), PreTokenizer::Llama3);
        assert_eq!(PreTokenizer::from_name(None).unwrap(), PreTokenizer::Gpt2);
        assert_eq!(PreTokenizer::from_name(Some("qwen2")).unwrap(), PreTokenizer::Qwen2);
        assert_eq!(PreTokenizer::from_name(Some("deepseek-llm")).unwrap(), PreTokenizer::DeepseekLlm);
        assert_eq!(PreTokenizer::from_name(Some("deepseek-v3")).unwrap(), PreTokenizer::DeepseekV3);
        let err = PreTokenizer::from_name(Some("qwen35")).unwrap_err().to_string();
        assert!(err.contains("qwen35") && err.contains("llama-bpe") && err.contains("deepseek-v3"), "{err}");
    }
}
