//! The sequences of an attention batch: runs of consecutive tokens of one
//! sequence, each attending over its own region of the cache.
//!
//! A single-sequence batch is one run from cache row `kv_pos`. A
//! multi-sequence batch (the op's `SeqStarts` source) is cut into runs where
//! the sequence changes or the positions stop being consecutive, so the
//! attention kernels split work per run exactly as they would split that
//! sequence alone: a sequence's results do not depend on what else is in
//! the batch.

use std::ops::Range;

use super::Tensor;

/// Tokens `tokens` of the batch, at positions `pos0..` of the sequence whose
/// position 0 is cache row `row0`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Run {
    pub tokens: Range<usize>,
    pub pos0: usize,
    pub row0: usize,
}

impl Run {
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Positions of its sequence that token `t` (a batch index) sees: `0..seen(t)`.
    pub fn seen(&self, t: usize) -> usize {
        self.pos0 + t - self.tokens.start + 1
    }

    /// Positions of its sequence the run's last token sees.
    pub fn end(&self) -> usize {
        self.pos0 + self.len()
    }

    /// The cache row of token `t`'s own keys and values.
    pub fn row(&self, t: usize) -> usize {
        self.row0 + self.seen(t) - 1
    }
}

/// The runs of a batch of `n_tokens` over a cache of `n_rows` rows: one from
/// `kv_pos` without sequence starts (`srcs[6]`), else one per stretch of
/// consecutive positions of one sequence.
///
/// Positions and starts come from the engine, which keeps every sequence
/// inside its region; a row past the cache is a bug there, and stops here
/// before any write.
pub(super) fn runs(srcs: &[Tensor], kv_pos: usize, n_tokens: usize, n_rows: usize) -> Vec<Run> {
    let Some(starts) = srcs.get(6) else {
        return vec![Run { tokens: 0..n_tokens, pos0: kv_pos, row0: 0 }];
    };
    let (pos, starts) = (srcs[5].i32(), starts.i32());
    let mut runs: Vec<Run> = Vec::new();
    for t in 0..n_tokens {
        let (p, s) = (usize::try_from(pos[t]), usize::try_from(starts[t]));
        let (Ok(p), Ok(s)) = (p, s) else { panic!("token {t}: position {} in region {}", pos[t], starts[t]) };
        assert!(s + p < n_rows, "token {t}: cache row {} past the cache's {n_rows}", s + p);
        match runs.last_mut() {
            Some(r) if r.row0 == s && r.end() == p => r.tokens.end = t + 1,
            _ => runs.push(Run { tokens: t..t + 1, pos0: p, row0: s }),
        }
    }
    runs
}
