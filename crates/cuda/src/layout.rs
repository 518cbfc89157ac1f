//! The GPU layout of ternary matrices, built on the host at load time from
//! any of the five ternary file formats.
//!
//! Each row holds `k_pad / 4` bytes of 2-bit codes `c = t + 1` (k padded to
//! a multiple of 256). Chunk `c` (256 weights, 64 bytes) is four 16-byte lane
//! blocks `tig`; in word `w` of lane block `tig`, byte `b` bits `2j..2j+1` hold
//! weight `c*256 + 32*(2w + j/2) + 16*(j%2) + 4*tig + b`. One shift and mask
//! give four consecutive weights that pair with one activation word of the
//! same permutation (kernels/quantize.cu), and that are exactly one
//! m16n8k32 A-fragment register of thread `tig` (kernels/ternary.cu).
//! Rows are padded to a multiple of [`ROW_ALIGN`] with zero codes, so
//! decoding's 16-row tensor-core tiles read whole tiles without bounds checks
//! (the prompt GEMM's tiles of up to 256 rows check their rows).
//!
//! Activations are quantized per token (the CPU's `Q8_Row`) into the same
//! permutation, so one 16-byte load per lane feeds the W2A8 GEMV's `dp4a` and
//! the same words are the A fragments of the int8 GEMM. With one scale per
//! row, the GPU's integer sums and float operations equal the CPU's: the
//! ternary matmul tests require bit-identical outputs.

use tern_quant::ternary::rows::{self, Packing};
use tern_quant::{GgmlType, TensorScale};

/// Rows are padded to a multiple of this.
pub const ROW_ALIGN: usize = 128;
/// Weights per chunk.
pub const CHUNK: usize = 256;

/// The logical element of (chunk, lane block, word, bit pair, byte).
pub fn element(c: usize, tig: usize, w: usize, j: usize, b: usize) -> usize {
    c * CHUNK + 32 * (2 * w + j / 2) + 16 * (j % 2) + 4 * tig + b
}

/// A ternary matrix in the GPU layout.
#[derive(Clone, Debug)]
pub struct GpuTernary {
    pub k: usize,
    pub k_pad: usize,
    pub rows: usize,
    pub rows_pad: usize,
    /// Scales per row: 1, or one per 256-chunk.
    pub groups: usize,
    /// `rows_pad * k_pad / 4` bytes.
    pub codes: Vec<u8>,
    /// `rows * groups`.
    pub scales: Vec<f32>,
}

impl GpuTernary {
    pub fn row_bytes(&self) -> usize {
        self.k_pad / 4
    }

    /// Repacks a ternary tensor `[k, rows]` of type `ty` from its file bytes.
    pub fn pack(ty: GgmlType, bytes: &[u8], k: usize, rows: usize) -> GpuTernary {
        let scale = TensorScale::of(ty, bytes, k * rows);
        let (layout, packed, scales) = rows::repack(ty, bytes, scale, k, rows, Packing::Bits2);
        let k_pad = layout.k_pad;
        debug_assert_eq!(k_pad % CHUNK, 0);
        let rows_pad = rows.next_multiple_of(ROW_ALIGN);
        let row_bytes = k_pad / 4;
        let mut codes = vec![0u8; rows_pad * row_bytes];
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let per = rows.div_ceil(threads).max(1);
        std::thread::scope(|sc| {
            for (i, out) in codes[..rows * row_bytes].chunks_mut(per * row_bytes).enumerate() {
                let packed = &packed;
                sc.spawn(move || {
                    let mut values = vec![0i8; k_pad];
                    for (r, o) in out.chunks_exact_mut(row_bytes).enumerate() {
                        let row = i * per + r;
                        rows::unpack_row(&layout, &packed[row * layout.row_bytes..][..layout.row_bytes], &mut values);
                        pack_row(&values, o);
                    }
                });
            }
        });
        GpuTernary { k, k_pad, rows, rows_pad, groups: layout.groups, codes, scales }
    }
}

/// Packs `k_pad` values in {−1, 0, 1} into one GPU row.
pub fn pack_row(values: &[i8], out: &mut [u8]) {
    for (c, chunk) in out.chunks_exact_mut(64).enumerate() {
        for tig in 0..4 {
            for w in 0..4 {
                for b in 0..4 {
                    let mut byte = 0u8;
                    for j in 0..4 {
                        byte |= ((values[element(c, tig, w, j, b)] + 1) as u8) << (2 * j);
                    }
                    chunk[tig * 16 + w * 4 + b] = byte;
                }
            }
        }
    }
}

/// Reads one GPU row back into `k_pad` values (the reference decode).
pub fn unpack_row(row: &[u8], values: &mut [i8]) {
    for (c, chunk) in row.chunks_exact(64).enumerate() {
        for tig in 0..4 {
            for w in 0..4 {
                for b in 0..4 {
                    let byte = chunk[tig * 16 + w * 4 + b];
                    for j in 0..4 {
                        values[element(c, tig, w, j, b)] = ((byte >> (2 * j)) & 3) as i8 - 1;
                    }
                }
            }
        }
    }
}

/// Activations in the kernels' permuted order: byte `tig*64 + (w*4 + j)*4 + b`
/// of each 256-byte chunk holds value `element(c, tig, w, j, b)`.
pub fn permute_acts(q: &[i8]) -> Vec<i8> {
    let mut out = vec![0i8; q.len()];
    for c in 0..q.len() / CHUNK {
        for tig in 0..4 {
            for w in 0..4 {
                for j in 0..4 {
                    for b in 0..4 {
                        out[c * CHUNK + tig * 64 + (w * 4 + j) * 4 + b] = q[element(c, tig, w, j, b)];
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rng(seed: u64) -> impl FnMut() -> u64 {
        let mut s = seed;
        move || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            s >> 33
        }
    }

    #[test]
    fn rows_round_trip() {
        let mut r = rng(1);
        let values: Vec<i8> = (0..512).map(|_| (r() % 3) as i8 - 1).collect();
        let mut row = vec![0u8; 128];
        pack_row(&values, &mut row);
        let mut back = vec![0i8; 512];
        unpack_row(&row, &mut back);
        assert_eq!(values, back);
    }

    /// The GEMV lanes' arithmetic, as the kernel does it: codes masked out of
    /// weight words, dotted with permuted activation words, minus lane sums.
    #[test]
    fn lane_arithmetic_matches_plain_dot() {
        let mut r = rng(7);
        let k_pad = 768;
        let values: Vec<i8> = (0..k_pad).map(|_| (r() % 3) as i8 - 1).collect();
        let q: Vec<i8> = (0..k_pad).map(|_| (r() % 256) as u8 as i8).collect();
        let mut row = vec![0u8; k_pad / 4];
        pack_row(&values, &mut row);
        let p = permute_acts(&q);
        let mut total = 0i32;
        for c in 0..k_pad / CHUNK {
            for tig in 0..4 {
                let acts = &p[c * CHUNK + tig * 64..][..64];
                let lsum: i32 = acts.iter().map(|&v| v as i32).sum();
                let mut s = 0i32;
                for w in 0..4 {
                    let word = u32::from_le_bytes(row[c * 64 + tig * 16 + w * 4..][..4].try_into().unwrap());
                    for j in 0..4 {
                        let codes = (word >> (2 * j)) & 0x0303_0303;
                        for b in 0..4 {
                            s += ((codes >> (8 * b)) & 0xff) as i32 * acts[(w * 4 + j) * 4 + b] as i32;
                        }
                    }
                }
                total += s - lsum;
            }
        }
        let want: i32 = values.iter().zip(&q).map(|(&t, &q)| t as i32 * q as i32).sum();
        assert_eq!(total, want);
    }

    /// The m16n8k32 fragments: thread (g, tig) of k-step s takes A registers
    /// (word s/2 >> 2·(2(s%2)+h)) and B words 2s + h of its lane block; both
    /// must name the same logical k.
    #[test]
    fn mma_fragments_pair_the_same_k() {
        for s in 0..8 {
            for h in 0..2 {
                for tig in 0..4 {
                    for b in 0..4 {
                        // Fragment element of the PTX layout: k = 32s + 16h + 4·tig + b.
                        let want = 32 * s + 16 * h + 4 * tig + b;
                        let (w, j) = (s / 2, (s % 2) * 2 + h);
                        assert_eq!(element(0, tig, w, j, b), want);
                        assert_eq!(w * 4 + j, 2 * s + h);
                    }
                }
            }
        }
    }
}
