//! Batches of several sequences: one forward pass over tokens of up to
//! `n_seqs` sequences, each with its own positions and its own region of the
//! KV cache (sequence `s` owns rows `s·n_ctx..(s + 1)·n_ctx` of every layer's
//! K and V), so that a server decodes one token of every live request in
//! one step. The graph's attention reads each token's region from the
//! `SeqStarts` input and attends only to its own sequence's rows.

use super::Session;
use crate::error::{Error, Result};

/// One sequence's part of a multi-sequence batch.
#[derive(Clone, Copy, Debug)]
pub struct SeqInput<'a> {
    pub seq: usize,
    /// Appended to the sequence's cached tokens.
    pub tokens: &'a [u32],
    /// Whether the logits after its last token are wanted.
    pub logits: bool,
}

impl Session {
    /// Sequences the cache holds (`LoadOptions::n_seqs`).
    pub fn n_seqs(&self) -> usize {
        self.pos.len()
    }

    /// Whether `eval_seqs` takes batches of several sequences here; the
    /// error says which backend cannot.
    pub fn multi_seq(&self) -> Result<()> {
        self.multi_seq.clone().map_err(Error::MultiSeq)
    }

    /// Tokens cached for sequence `seq`.
    pub fn seq_pos(&self, seq: usize) -> Result<usize> {
        self.pos.get(seq).copied().ok_or(Error::NoSeq { seq, n_seqs: self.n_seqs() })
    }

    /// Keeps only the first `n` cached tokens of sequence `seq`.
    pub fn truncate_seq(&mut self, seq: usize, n: usize) -> Result<()> {
        let n_seqs = self.n_seqs();
        let pos = self.pos.get_mut(seq).ok_or(Error::NoSeq { seq, n_seqs })?;
        *pos = (*pos).min(n);
        Ok(())
    }

    /// Appends each input's tokens to its sequence, all in one forward pass
    /// (at most `n_batch` tokens), and returns the logits after the last
    /// token of each input that asks for them: `[n_vocab]` rows in input
    /// order. A batch of sequence 0 alone is the single-sequence step
    /// (`eval`'s arithmetic); where `multi_seq` says no, that is the only
    /// batch taken.
    pub fn eval_seqs(&mut self, batch: &[SeqInput]) -> Result<&[f32]> {
        self.check_seqs(batch)?;
        let (n_ctx, n_vocab) = (self.n_ctx as i32, self.n_vocab());
        let (mut tokens, mut positions, mut starts, mut rows) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for b in batch {
            let p0 = self.pos[b.seq] as i32;
            tokens.extend_from_slice(b.tokens);
            positions.extend((0..b.tokens.len() as i32).map(|i| p0 + i));
            starts.resize(tokens.len(), b.seq as i32 * n_ctx);
            if b.logits {
                rows.push(tokens.len() as i32 - 1);
            }
        }
        let wanted = rows.len();
        // A graph has at least one row of logits: the last token's, unread.
        if rows.is_empty() {
            rows.push(tokens.len() as i32 - 1);
        }
        let advance: Vec<(usize, usize)> = batch.iter().map(|b| (b.seq, b.tokens.len())).collect();
        let single = matches!(batch, [b] if b.seq == 0);
        let starts = (!single).then_some(starts.as_slice());
        let logits = self.step(&tokens, &positions, starts, &rows, &advance)?;
        Ok(&logits[..wanted * n_vocab])
    }

    fn check_seqs(&self, batch: &[SeqInput]) -> Result<()> {
        if batch.is_empty() {
            return Err(Error::Empty);
        }
        let n_seqs = self.n_seqs();
        let mut seen = vec![false; n_seqs];
        for b in batch {
            let seq = b.seq;
            if seq >= n_seqs {
                return Err(Error::NoSeq { seq, n_seqs });
            }
            if std::mem::replace(&mut seen[seq], true) {
                return Err(Error::SeqTwice { seq });
            }
            if b.tokens.is_empty() {
                return Err(Error::Empty);
            }
            if let Some(&id) = b.tokens.iter().find(|&&t| t as usize >= self.n_vocab()) {
                return Err(Error::BadToken { id, n_vocab: self.n_vocab() });
            }
            if self.pos[seq] + b.tokens.len() > self.n_ctx {
                return Err(Error::ContextFull { pos: self.pos[seq], n: b.tokens.len(), n_ctx: self.n_ctx });
            }
        }
        let n: usize = batch.iter().map(|b| b.tokens.len()).sum();
        if n > self.n_batch {
            return Err(Error::BatchTooLarge { n, n_batch: self.n_batch });
        }
        match batch {
            [b] if b.seq == 0 => Ok(()),
            _ => self.multi_seq(),
        }
    }
}
