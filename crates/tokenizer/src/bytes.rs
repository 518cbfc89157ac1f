//! The GPT-2 byte ↔ unicode table used by byte-level BPE vocabularies.
//!
//! Byte-level BPE vocabularies cannot store raw bytes (control characters,
//! spaces, invalid UTF-8 halves) as printable strings, so every byte is given
//! a stand-in character: bytes that are already visible Latin-1 characters
//! (`!`..=`~`, `¡`..=`¬`, `®`..=`ÿ`) stand for themselves, and the remaining
//! 68 bytes are numbered in byte order onto U+0100, U+0101, … . A space is
//! therefore stored as `Ġ` (U+0120) and a newline as `Ċ` (U+010A).

/// Whether `b` is one of the bytes that stand for themselves.
const fn is_visible(b: u8) -> bool {
    matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// Byte → stand-in character (as a code point).
const BYTE_TO_CHAR: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut next = 0x100u32;
    let mut b = 0usize;
    while b < 256 {
        if is_visible(b as u8) {
            table[b] = b as u32;
        } else {
            table[b] = next;
            next += 1;
        }
        b += 1;
    }
    table
};

/// Highest stand-in code point plus one: 256 visible-or-shifted slots, 68 shifted.
const CHAR_LIMIT: usize = 0x100 + 68;

/// Stand-in code point → byte, `-1` where the code point stands for no byte.
const CHAR_TO_BYTE: [i16; CHAR_LIMIT] = {
    let mut table = [-1i16; CHAR_LIMIT];
    let mut b = 0usize;
    while b < 256 {
        table[BYTE_TO_CHAR[b] as usize] = b as i16;
        b += 1;
    }
    table
};

/// The stand-in character of byte `b`.
#[inline]
pub fn byte_to_char(b: u8) -> char {
    // Every entry is below U+0144, so always a valid scalar value.
    char::from_u32(BYTE_TO_CHAR[b as usize]).unwrap_or('\u{FFFD}')
}

/// The byte that `c` stands for, or `None` if `c` is not a stand-in character.
#[inline]
pub fn char_to_byte(c: char) -> Option<u8> {
    match CHAR_TO_BYTE.get(c as usize) {
        Some(&b) if b >= 0 => Some(b as u8),
        _ => None,
    }
}

/// Appends the stand-in form of `bytes` to `out`.
pub fn encode_into(bytes: &[u8], out: &mut String) {
    out.extend(bytes.iter().map(|&b| byte_to_char(b)));
}

/// Appends the bytes that `text` stands for to `out`. Characters that are not
/// stand-ins (e.g. in user-defined tokens stored verbatim) are kept as UTF-8.
pub fn decode_into(text: &str, out: &mut Vec<u8>) {
    for c in text.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_a_bijection() {
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let c = byte_to_char(b);
            assert!(seen.insert(c), "duplicate stand-in for byte {b}");
            assert_eq!(char_to_byte(c), Some(b));
        }
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(b'A'), 'A');
        assert_eq!(byte_to_char(0xAD), 'Ń');
        assert_eq!(char_to_byte('€'), None);
    }

    #[test]
    fn round_trip() {
        let text = "héllo wörld\n\t🦙";
        let mut enc = String::new();
        encode_into(text.as_bytes(), &mut enc);
        let mut dec = Vec::new();
        decode_into(&enc, &mut dec);
        assert_eq!(dec, text.as_bytes());
    }
}
