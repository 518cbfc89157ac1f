//! Splitting text around special tokens written literally in it.
//!
//! Tokens are tried one at a time, longest text first, and each one splits
//! every remaining plain-text fragment at all its occurrences. Trying longer
//! tokens first means `<|eot_id|>` is never cut short by a shorter token that
//! is its prefix. Control (and unknown) tokens are matched only when the
//! caller asks for `parse_special`; user-defined tokens are always matched,
//! because they were added to the vocabulary to be recognised in text.

use crate::vocab::{TokenType, Vocab};

/// A piece of input: plain text to tokenize, or a special token found in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

/// Splits `text` around the `matchable` tokens (longest first).
pub(crate) fn partition<'a>(text: &'a str, vocab: &Vocab, matchable: &[u32], parse_special: bool) -> Vec<Fragment<'a>> {
    let mut frags = vec![Fragment::Text(text)];
    if text.is_empty() {
        return frags;
    }
    let mut next = Vec::new();
    for &id in matchable {
        if !parse_special && vocab.token_type(id) != Some(TokenType::UserDefined) {
            continue;
        }
        let Some(tok) = vocab.text(id) else { continue };
        // Cheap rejection: a token absent from the whole text is absent from
        // every fragment of it.
        if tok.is_empty() || !text.contains(tok) {
            continue;
        }
        next.clear();
        for &f in &frags {
            let Fragment::Text(mut rest) = f else {
                next.push(f);
                continue;
            };
            while let Some(at) = rest.find(tok) {
                if at > 0 {
                    next.push(Fragment::Text(&rest[..at]));
                }
                next.push(Fragment::Token(id));
                rest = &rest[at + tok.len()..];
            }
            if !rest.is_empty() {
                next.push(Fragment::Text(rest));
            }
        }
        std::mem::swap(&mut frags, &mut next);
    }
    frags
}
