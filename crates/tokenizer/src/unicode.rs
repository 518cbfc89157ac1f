//! Character classes used by the pre-tokenizer regexes: `\p{L}`, `\p{N}`,
//! `\p{M}`, `\p{P}`, `\p{S}`, `\s`.
//!
//! Most patterns name only letters, numbers and whitespace ([`Class`]);
//! DeepSeek V3's also names marks, punctuation and symbols ([`Category`]).
//! The general categories come from a range table generated from the
//! `regex` crate's Unicode data (see `regenerate_tables` below), so the
//! splitters agree with the regex engine they are tested against; whitespace
//! is Rust's `char::is_whitespace`, which is the same `White_Space` property
//! the regex `\s` uses. Both facts are checked over every code point by
//! `categories_match_regex`. No whitespace character is a letter, number,
//! mark, punctuation or symbol, so the categories do not overlap.

use crate::unicode_tables::{Cls, RANGES};

/// The class of a character as far as the pre-tokenizer regexes care.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// `\p{L}`.
    Letter,
    /// `\p{N}`.
    Number,
    /// `\s`.
    Space,
    /// Everything else: `[^\s\p{L}\p{N}]`.
    Other,
}

/// The finer split DeepSeek V3's pattern needs: [`Class::Other`] divided
/// into marks, punctuation, symbols and the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Category {
    /// `\p{L}`.
    Letter,
    /// `\p{N}`.
    Number,
    /// `\p{M}`.
    Mark,
    /// `\p{P}`.
    Punct,
    /// `\p{S}`.
    Symbol,
    /// `\s`.
    Space,
    /// Controls, format characters, private use, unassigned.
    Other,
}

impl Category {
    #[inline]
    pub fn class(self) -> Class {
        match self {
            Category::Letter => Class::Letter,
            Category::Number => Class::Number,
            Category::Space => Class::Space,
            _ => Class::Other,
        }
    }
}

/// ASCII is by far the most common input; a direct table skips the search.
const ASCII: [Category; 128] = {
    let mut t = [Category::Other; 128];
    let mut i = 0;
    while i < 128 {
        let b = i as u8;
        t[i] = if b.is_ascii_alphabetic() {
            Category::Letter
        } else if b.is_ascii_digit() {
            Category::Number
        } else if matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0B | 0x0C) {
            Category::Space
        } else if matches!(b, b'$' | b'+' | b'<' | b'=' | b'>' | b'^' | b'`' | b'|' | b'~') {
            // Sc, Sm and Sk; the rest of ASCII's graphic characters are P*.
            Category::Symbol
        } else if b.is_ascii_graphic() {
            Category::Punct
        } else {
            Category::Other
        };
        i += 1;
    }
    t
};

/// Categorizes `c`.
#[inline]
pub fn category(c: char) -> Category {
    let u = c as u32;
    if u < 128 {
        return ASCII[u as usize];
    }
    // RANGES is sorted and disjoint: find the first range ending at or after u.
    let i = RANGES.partition_point(|&(_, end, _)| end < u);
    if let Some(&(start, _, cls)) = RANGES.get(i) {
        if start <= u {
            return match cls {
                Cls::L => Category::Letter,
                Cls::N => Category::Number,
                Cls::M => Category::Mark,
                Cls::P => Category::Punct,
                Cls::S => Category::Symbol,
            };
        }
    }
    if c.is_whitespace() {
        Category::Space
    } else {
        Category::Other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_chars() -> impl Iterator<Item = char> {
        (0..=0x10FFFFu32).filter_map(char::from_u32)
    }

    /// The general-category groups of the table, in the order they are tried.
    const GROUPS: [(&str, &str); 5] =
        [("L", r"^\p{L}$"), ("N", r"^\p{N}$"), ("M", r"^\p{M}$"), ("P", r"^\p{P}$"), ("S", r"^\p{S}$")];

    /// Exhaustive: the table and `is_whitespace` agree with the regex engine.
    #[test]
    fn categories_match_regex() {
        let groups: Vec<fancy_regex::Regex> =
            GROUPS.iter().map(|(_, re)| fancy_regex::Regex::new(re).unwrap()).collect();
        let s = fancy_regex::Regex::new(r"^\s$").unwrap();
        let order = [Category::Letter, Category::Number, Category::Mark, Category::Punct, Category::Symbol];
        let mut buf = [0u8; 4];
        for c in all_chars() {
            let t = &*c.encode_utf8(&mut buf);
            let hits: Vec<Category> =
                groups.iter().zip(order).filter(|(re, _)| re.is_match(t).unwrap()).map(|(_, cat)| cat).collect();
            let space = s.is_match(t).unwrap();
            assert!(hits.len() + space as usize <= 1, "U+{:04X} is in several groups", c as u32);
            let want = hits.first().copied().unwrap_or(if space { Category::Space } else { Category::Other });
            assert_eq!(category(c), want, "U+{:04X}", c as u32);
        }
    }

    /// Rewrites `src/unicode_tables.rs` from the regex crate's Unicode data.
    /// Run after a regex upgrade: `cargo test -p tern-tokenizer regenerate_tables -- --ignored`.
    #[test]
    #[ignore]
    fn regenerate_tables() {
        let groups: Vec<(&str, fancy_regex::Regex)> =
            GROUPS.iter().map(|&(name, re)| (name, fancy_regex::Regex::new(re).unwrap())).collect();
        let mut ranges: Vec<(u32, u32, &str)> = Vec::new();
        let mut buf = [0u8; 4];
        for c in all_chars().filter(|&c| c as u32 >= 128) {
            let t = &*c.encode_utf8(&mut buf);
            let Some(&(cls, _)) = groups.iter().find(|(_, re)| re.is_match(t).unwrap()) else { continue };
            let u = c as u32;
            match ranges.last_mut() {
                Some(last) if last.2 == cls && last.1 + 1 == u => last.1 = u,
                _ => ranges.push((u, u, cls)),
            }
        }
        let mut src = String::from(
            "//! Generated by `unicode::tests::regenerate_tables` from the regex crate's\n\
             //! Unicode data: non-ASCII ranges of `\\p{L}` (L), `\\p{N}` (N), `\\p{M}` (M),\n\
             //! `\\p{P}` (P) and `\\p{S}` (S). Do not edit.\n\n\
             #[derive(Clone, Copy, Debug, PartialEq, Eq)]\n\
             pub enum Cls {\n    L,\n    N,\n    M,\n    P,\n    S,\n}\n\n\
             use Cls::{L, M, N, P, S};\n\n\
             #[rustfmt::skip]\n\
             pub static RANGES: &[(u32, u32, Cls)] = &[\n",
        );
        for chunk in ranges.chunks(6) {
            src.push_str("   ");
            for (a, b, c) in chunk {
                src.push_str(&format!(" (0x{a:05X}, 0x{b:05X}, {c}),"));
            }
            src.push('\n');
        }
        src.push_str("];\n");
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/unicode_tables.rs");
        std::fs::write(path, src).unwrap();
        eprintln!("wrote {} ranges to {path}", ranges.len());
    }
}
