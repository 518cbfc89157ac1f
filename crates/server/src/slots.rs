//! The slots: each one a region of the session's KV cache (sequence `s` of
//! `Session::eval_seqs`), the token ids that region holds, and the request
//! it serves. A new request takes the free slot whose cached tokens share
//! the longest prefix with its prompt (`cache_prompt`), so only the rest is
//! evaluated; ties, and requests that turn caching off, take the slot used
//! least recently, which keeps recent prefixes for their followers.

use crate::sequence::Sequence;

pub struct Slot {
    /// The token ids whose keys and values the slot's cache region holds.
    pub cached: Vec<u32>,
    /// When it last took a request (a counter).
    pub used: u64,
    pub seq: Option<Sequence>,
}

/// Length of the common prefix of `a` and `b`.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The free slot for `prompt` and how many of its tokens that slot's cache
/// holds already (0 without `cache_prompt`); none when every slot is busy.
/// At least the prompt's last token is evaluated again, for its logits.
pub fn pick(slots: &[Slot], prompt: &[u32], cache_prompt: bool) -> Option<(usize, usize)> {
    let reuse = |s: &Slot| if cache_prompt { common_prefix(&s.cached, prompt).min(prompt.len() - 1) } else { 0 };
    slots
        .iter()
        .enumerate()
        .filter(|(_, s)| s.seq.is_none())
        .max_by_key(|(_, s)| (reuse(s), std::cmp::Reverse(s.used)))
        .map(|(i, s)| (i, reuse(s)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(cached: &[u32], used: u64) -> Slot {
        Slot { cached: cached.to_vec(), used, seq: None }
    }

    #[test]
    fn the_longest_prefix_wins_then_the_least_recent_slot() {
        let slots = [slot(&[1, 2, 3], 5), slot(&[1, 2, 3, 4, 5], 7), slot(&[], 1), slot(&[1, 9], 0)];
        assert_eq!(pick(&slots, &[1, 2, 3, 4, 6], true), Some((1, 4)));
        // A whole cached prompt still evaluates its last token (then a tie: the older slot).
        assert_eq!(pick(&slots, &[1, 2, 3], true), Some((0, 2)));
        // No common prefix: the least recently used slot.
        assert_eq!(pick(&slots, &[7, 7], true), Some((3, 0)));
        assert_eq!(pick(&slots, &[1, 2, 3, 4, 6], false), Some((3, 0)));
        assert_eq!(common_prefix(&[1, 2], &[1, 2, 3]), 2);
        assert_eq!(pick(&[], &[1], true), None);
    }
}
