//! Incremental decoding for streaming generation.
//!
//! A token may end in the middle of a UTF-8 sequence (byte-level BPE splits
//! emoji and CJK characters across tokens), so printing each token's bytes
//! as they come would show replacement characters. [`StreamDecoder`] holds
//! back an incomplete trailing sequence until the next token completes it.

use crate::Tokenizer;

/// Turns a stream of token ids into text, one complete character at a time.
#[derive(Clone, Debug, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
    render_special: bool,
}

impl StreamDecoder {
    /// `render_special`: whether control tokens appear as their text (see
    /// [`Tokenizer::decode_with`]).
    pub fn new(render_special: bool) -> StreamDecoder {
        StreamDecoder { pending: Vec::new(), render_special }
    }

    /// Adds one token and returns the text it completes (possibly empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> String {
        let piece = tokenizer.token_piece(id, self.render_special);
        self.push_bytes(piece)
    }

    /// Adds raw bytes and returns the text they complete (possibly empty).
    /// Invalid sequences become U+FFFD, exactly as a lossy decode of the
    /// whole stream would; only a possibly-incomplete tail is held back.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = start + e.valid_up_to();
                    // from_utf8 has just validated this prefix.
                    out.push_str(std::str::from_utf8(&self.pending[start..valid]).unwrap_or_default());
                    match e.error_len() {
                        // Invalid bytes: replace them and keep going.
                        Some(len) => {
                            out.push('\u{FFFD}');
                            start = valid + len;
                        }
                        // A sequence cut off by the end: wait for more.
                        None => {
                            start = valid;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
        out
    }

    /// Bytes held back because they may start a character.
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }

    /// Ends the stream: whatever is still held back, lossily decoded.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_back_partial_characters() {
        let mut d = StreamDecoder::new(false);
        let llama = "🦙".as_bytes();
        assert_eq!(d.push_bytes(b"a"), "a");
        assert_eq!(d.push_bytes(&llama[..1]), "");
        assert_eq!(d.push_bytes(&llama[1..3]), "");
        assert_eq!(d.push_bytes(&llama[3..]), "🦙");
        assert_eq!(d.push_bytes(&[0xFF, b'x']), "\u{FFFD}x");
        assert_eq!(d.push_bytes(&[0xE6]), "");
        assert_eq!(d.push_bytes(b"y"), "\u{FFFD}y");
        assert_eq!(d.push_bytes(&[0xF0, 0x9F]), "");
        assert_eq!(d.pending(), &[0xF0, 0x9F]);
        assert_eq!(d.finish(), "\u{FFFD}");
        assert_eq!(d.pending(), &[] as &[u8]);
    }

    #[test]
    fn matches_lossy_decode_of_whole_stream() {
        let stream: Vec<u8> = b"ok \xF0\x9F\xA6\x99 \xE2\x82 \xC3\xA4\xFF\xE2\x82\xAC!".to_vec();
        for chunk in 1..=5 {
            let mut d = StreamDecoder::new(false);
            let mut got = String::new();
            for c in stream.chunks(chunk) {
                got.push_str(&d.push_bytes(c));
            }
            got.push_str(&d.finish());
            assert_eq!(got, String::from_utf8_lossy(&stream), "chunk {chunk}");
        }
    }
}
