//! Byte-level BPE: the merge table and the merge loop for one piece.
//!
//! Merges are resolved to token ids at load time, so the loop never builds
//! strings: a piece starts as one symbol per byte (the id of that byte's
//! stand-in character) and adjacent pairs are merged lowest rank first,
//! leftmost first among equal ranks. Symbols form a linked list over a
//! vector and candidate pairs wait in a binary heap; a popped candidate is
//! skipped if either side has changed since it was pushed. That makes a
//! piece of n bytes cost O(n log n) instead of the O(n²) of rescanning.

use crate::bytes;
use crate::error::Error;
use crate::vocab::Vocab;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use tern_gguf::Metadata;

pub(crate) const KEY_MERGES: &str = "tokenizer.ggml.merges";

/// Marks "no token" for a byte whose stand-in is missing from the vocabulary.
const NONE: u32 = u32::MAX;

/// Multiplicative hasher for the `(left, right)` id pairs; the std SipHash
/// would dominate the merge loop.
#[derive(Default)]
struct PairHasher(u64);

impl Hasher for PairHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ b as u64).wrapping_mul(0x51_7C_C1_B7_27_22_0A_95);
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0 ^ x).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 ^= self.0 >> 29;
    }
}

/// The merge rules, by id pair.
pub(crate) struct Merges {
    /// `(left << 32 | right)` → `(rank, merged id)`.
    map: HashMap<u64, (u32, u32), BuildHasherDefault<PairHasher>>,
    /// Token id of each byte's stand-in character, `NONE` if absent.
    byte_ids: [u32; 256],
}

fn pair(l: u32, r: u32) -> u64 {
    (l as u64) << 32 | r as u64
}

impl Merges {
    pub fn from_metadata(md: &Metadata, vocab: &Vocab) -> Result<Merges, Error> {
        let merges = md.strings(KEY_MERGES)?;
        let mut map = HashMap::with_capacity_and_hasher(merges.len(), Default::default());
        let unknown = |index: usize, text: &str, part: &str| Error::MergeUnknownToken {
            key: KEY_MERGES,
            index,
            text: text.to_string(),
            part: part.to_string(),
        };
        for (rank, m) in merges.iter().enumerate() {
            let (l, r) = m
                .split_once(' ')
                .filter(|(l, r)| !l.is_empty() && !r.is_empty())
                .ok_or_else(|| Error::BadMerge { key: KEY_MERGES, index: rank, text: m.clone() })?;
            let lid = vocab.id(l).ok_or_else(|| unknown(rank, m, l))?;
            let rid = vocab.id(r).ok_or_else(|| unknown(rank, m, r))?;
            // The result must be a token too (HF tokenizers refuses such
            // files as well): a merge producing a non-token could only be
            // undone again by byte fallback.
            let merged = vocab.id_concat(l, r).ok_or_else(|| unknown(rank, m, &format!("{l}{r}")))?;
            // A repeated pair keeps its first (best) rank.
            map.entry(pair(lid, rid)).or_insert((rank as u32, merged));
        }
        let mut byte_ids = [NONE; 256];
        let mut buf = [0u8; 4];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            *slot = vocab.id(bytes::byte_to_char(b as u8).encode_utf8(&mut buf)).unwrap_or(NONE);
        }
        Ok(Merges { map, byte_ids })
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    fn get(&self, l: u32, r: u32) -> Option<(u32, u32)> {
        self.map.get(&pair(l, r)).copied()
    }
}

#[derive(Clone, Copy)]
struct Sym {
    id: u32,
    prev: u32,
    next: u32,
    live: bool,
}

/// A merge waiting in the heap: `(rank, left index, left id, right id,
/// merged id)`. Ordering by the first two fields gives lowest rank first,
/// leftmost first among equal ranks.
type Candidate = (u32, u32, u32, u32, u32);

/// Buffers reused across pieces of one `encode` call.
#[derive(Default)]
pub(crate) struct Scratch {
    syms: Vec<Sym>,
    heap: BinaryHeap<Reverse<Candidate>>,
    text: String,
}

/// Encodes one pre-tokenized piece, appending ids to `out`.
///
/// `ignore_merges`: if the whole piece is a token, emit it as is (Llama 3
/// tokenizers are configured this way; tiktoken-derived merge lists do not
/// always rebuild every token by rank order).
/// `unk`: emitted for a byte whose stand-in is not in the vocabulary
/// (nothing is emitted when there is no unknown token).
pub(crate) fn encode_piece(
    vocab: &Vocab,
    merges: &Merges,
    piece: &[u8],
    ignore_merges: bool,
    unk: Option<u32>,
    scratch: &mut Scratch,
    out: &mut Vec<u32>,
) {
    if piece.is_empty() {
        return;
    }
    if ignore_merges && piece.len() > 1 {
        scratch.text.clear();
        bytes::encode_into(piece, &mut scratch.text);
        if let Some(id) = vocab.id(&scratch.text) {
            out.push(id);
            return;
        }
    }

    let syms = &mut scratch.syms;
    syms.clear();
    let n = piece.len() as u32;
    syms.extend(piece.iter().enumerate().map(|(i, &b)| Sym {
        id: merges.byte_ids[b as usize],
        prev: if i == 0 { NONE } else { i as u32 - 1 },
        next: if i as u32 + 1 == n { NONE } else { i as u32 + 1 },
        live: true,
    }));

    let heap = &mut scratch.heap;
    heap.clear();
    let push = |heap: &mut BinaryHeap<_>, syms: &[Sym], l: u32| {
        let r = syms[l as usize].next;
        if r == NONE {
            return;
        }
        let (lid, rid) = (syms[l as usize].id, syms[r as usize].id);
        if let Some((rank, merged)) = merges.get(lid, rid) {
            heap.push(Reverse((rank, l, lid, rid, merged)));
        }
    };
    for l in 0..n.saturating_sub(1) {
        push(heap, syms, l);
    }

    while let Some(Reverse((_, l, lid, rid, merged))) = heap.pop() {
        let left = syms[l as usize];
        let r = left.next;
        // Stale: the left symbol was absorbed, or either side has merged
        // with something else since this candidate was pushed.
        if !left.live || r == NONE || left.id != lid || syms[r as usize].id != rid {
            continue;
        }
        let after = syms[r as usize].next;
        syms[r as usize].live = false;
        syms[l as usize].id = merged;
        syms[l as usize].next = after;
        if after != NONE {
            syms[after as usize].prev = l;
        }
        if left.prev != NONE {
            push(heap, syms, left.prev);
        }
        push(heap, syms, l);
    }

    // Symbol 0 only ever absorbs its right neighbours, so the list starts there.
    let mut i = 0u32;
    while i != NONE {
        let s = syms[i as usize];
        match s.id {
            NONE => out.extend(unk),
            id => out.push(id),
        }
        i = s.next;
    }
}
