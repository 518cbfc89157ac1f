//! Weights as this backend holds them: which layout each GGUF type takes on
//! the GPU ([`Held::of`]: `layout.rs` for ternary matrices, `qlayout.rs` for
//! block-quantized ones, the file's bytes otherwise), the byte image that is
//! uploaded, and the sizes the planner reads before anything is loaded.
//! [`Held::of`] is the one table of types: `supports` derives what the
//! backend accepts from it.

use tern_backend::WeightDesc;
use tern_quant::GgmlType;

use crate::layout::{self, GpuTernary};
use crate::qlayout::{self, QLayout};

/// How this backend holds a weight of a given type and shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Held {
    /// Repacked to 2-bit codes (`layout.rs`), which the ternary GEMV and
    /// GEMM read; no row lookup reads them.
    Ternary,
    /// Converted at load to a block layout (`qlayout.rs`), which its GEMVs
    /// (`q8_gemv*`, `q6k_gemv*`) and row lookups (`get_rows_q8`,
    /// `get_rows_q6k`) read.
    Quant(QLayout),
    /// The file's bytes, read element by element by `dq` (prelude.cuh) in
    /// `fmat_gemv` and `get_rows` (F16 matrices by `f16_gemv`).
    Stored,
}

impl Held {
    /// How a weight of `ty` with dims `ne` is held, or `None` where no GPU
    /// kernel reads the type (in that shape).
    pub(crate) fn of(ty: GgmlType, ne: [usize; 4]) -> Option<Held> {
        let matrix = ne[2] == 1 && ne[3] == 1;
        let quant = |layout| Some(if matrix { Held::Quant(layout) } else { Held::Stored });
        match ty {
            GgmlType::TQ1_0 | GgmlType::TQ2_0 | GgmlType::IQ1_BN | GgmlType::IQ2_BN | GgmlType::I2_S => {
                matrix.then_some(Held::Ternary)
            }
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => Some(Held::Stored),
            GgmlType::Q8_0 | GgmlType::Q4_0 => quant(QLayout::Levels),
            GgmlType::Q6_K => quant(QLayout::Q6K),
            // Levels −1..=2 (Q2_0), ±1 (Q1_0) or −16..=15 (Q5_0) times the block
            // scale, −4..=3 (Q3_K) or IQ4_NL's table (IQ4_XS) times the group's
            // d·(code − 32): exact as int8 levels with a scale per 16.
            GgmlType::Q2_0 | GgmlType::Q1_0 | GgmlType::Q5_0 | GgmlType::Q3_K | GgmlType::IQ4_XS => {
                matrix.then_some(Held::Quant(QLayout::Levels))
            }
            // Q4_1, Q5_1 and Q2_K add a minimum per block or group, which the
            // int8 levels with a scale per 16 cannot hold, and `dq` does not
            // read them: their weights are planned on the CPU.
            GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::IQ4_NL | GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q2_K => {
                None
            }
        }
    }

    /// Whether a row lookup (`GetRows`) can read a weight held this way.
    pub(crate) fn has_rows(self) -> bool {
        self != Held::Ternary
    }
}

/// The shape of a ternary weight in the GPU layout.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TernaryShape {
    pub k_pad: usize,
    pub rows: usize,
    pub groups: usize,
}

/// A weight as this backend holds it.
#[derive(Clone, Debug)]
pub(crate) struct Weight {
    pub ty: GgmlType,
    /// The weight's bytes (codes, for ternary weights).
    pub ptr_codes: u64,
    pub ptr_scales: u64,
    pub ternary: Option<TernaryShape>,
    /// How a block-quantized matrix is stored (`qlayout.rs`).
    pub quant: Option<QLayout>,
    /// For a staged copy kept in mapped host memory: the bytes (codes, then
    /// scales) that a launch list streams into device memory before reading.
    pub staged: Option<usize>,
}

/// A repacked matrix as one byte image: its codes or levels, zeros to the
/// next 256 bytes, then its f32 scales (which start at `scale_off`; Q6_K's
/// planes carry their own scales and the kernels find them from k and rows).
pub(crate) struct Image {
    pub bytes: Vec<u8>,
    pub scale_off: usize,
}

impl Image {
    fn new(levels: &[u8], scales: &[f32]) -> Image {
        let scale_off = levels.len().next_multiple_of(256);
        let mut bytes = Vec::with_capacity(scale_off + scales.len() * 4);
        bytes.extend_from_slice(levels);
        bytes.resize(scale_off, 0);
        bytes.extend(scales.iter().flat_map(|s| s.to_le_bytes()));
        Image { bytes, scale_off }
    }

    pub fn ternary(t: &GpuTernary) -> Image {
        Image::new(&t.codes, &t.scales)
    }
}

/// A matrix repacked for upload, and what its `Weight` records of the layout.
pub(crate) struct Repacked {
    pub image: Image,
    pub ternary: Option<TernaryShape>,
    pub quant: Option<QLayout>,
}

/// The GPU image of a ternary or block-quantized matrix, or `None` for a
/// weight uploaded as stored.
pub(crate) fn repack(desc: WeightDesc, data: &[u8]) -> Option<Repacked> {
    let (k, rows) = (desc.ne[0], desc.ne[1]);
    let layout = match Held::of(desc.ty, desc.ne)? {
        Held::Stored => return None,
        Held::Ternary => {
            let t = GpuTernary::pack(desc.ty, data, k, rows);
            let ternary = Some(TernaryShape { k_pad: t.k_pad, rows: t.rows, groups: t.groups });
            return Some(Repacked { image: Image::ternary(&t), ternary, quant: None });
        }
        Held::Quant(layout) => layout,
    };
    let image = match layout {
        QLayout::Levels => {
            let q = qlayout::pack(desc.ty, data, k, rows);
            // SAFETY: i8 and u8 have the same layout.
            let levels: &[u8] = unsafe { std::slice::from_raw_parts(q.values.as_ptr() as *const u8, q.values.len()) };
            Image::new(levels, &q.scales)
        }
        QLayout::Q6K => Image { bytes: qlayout::pack_q6k(data, k, rows), scale_off: 0 },
    };
    Some(Repacked { image, ternary: None, quant: Some(layout) })
}

/// Whether a host-resident weight can be staged for offloaded matmuls
/// (`Backend::load_staged`): ternary matrices, which the GEMM streams in.
pub fn streams(desc: WeightDesc) -> bool {
    Held::of(desc.ty, desc.ne) == Some(Held::Ternary)
}

/// Bytes a weight takes on the GPU once loaded (`load_weight`): ternary
/// matrices repacked to 2 bits plus scales, Q8_0/Q4_0/Q6_K (and Q2_0, Q1_0,
/// Q5_0, Q3_K, IQ4_XS) matrices in their `qlayout` layouts, others as stored.
pub fn weight_bytes(desc: WeightDesc, file_bytes: usize) -> usize {
    let (k, rows) = (desc.ne[0], desc.ne[1]);
    match Held::of(desc.ty, desc.ne) {
        Some(Held::Ternary) => {
            let k_pad = k.next_multiple_of(layout::CHUNK);
            let codes = rows.next_multiple_of(layout::ROW_ALIGN) * k_pad / 4;
            // One scale per row, or one per 256-chunk for files whose blocks disagree.
            codes.next_multiple_of(256) + rows * (k_pad / layout::CHUNK) * 4
        }
        Some(Held::Quant(layout)) => qlayout::bytes(layout, k, rows),
        Some(Held::Stored) | None => file_bytes,
    }
}

#[cfg(test)]
mod tests {
    use tern_graph::{Graph, InputKind, Precision};

    use super::*;

    /// What `supports` accepts follows [`Held::of`]: a row lookup reads every
    /// holding but the ternary codes, a matmul every holding of a matrix.
    #[test]
    fn supports_follows_how_weights_are_held() {
        // Q2_0, Q1_0, Q5_0, Q3_K and IQ4_XS matrices are converted to int8
        // levels; dq does not read their bytes.
        let rows_read = |ty: GgmlType, matrix: bool| {
            matches!(
                ty,
                GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q6_K
            ) || (matrix
                && matches!(ty, GgmlType::Q2_0 | GgmlType::Q1_0 | GgmlType::Q5_0 | GgmlType::Q3_K | GgmlType::IQ4_XS))
        };
        for ty in GgmlType::ALL {
            for ne in [[256, 4, 1, 1], [256, 4, 2, 1]] {
                let matrix = ne[2] == 1;
                let mut g = Graph::new();
                let w = g.weight(0, "w", ty, ne);
                let x = g.weight(1, "x", GgmlType::F32, [256, 1, 1, 1]);
                let ids = g.input(InputKind::Tokens, 2);
                let lookup = g.get_rows(w, ids);
                let product = g.mul_mat(w, x, Precision::Float);
                let accepts = |id| {
                    let n = g.node(id);
                    let srcs: Vec<_> = n.srcs.iter().map(|&s| g.node(s)).collect();
                    crate::supports(n, &srcs)
                };
                let gemv = matrix && (ty.is_ternary() || rows_read(ty, matrix));
                assert_eq!(accepts(lookup), rows_read(ty, matrix), "{ty} {ne:?} get_rows");
                assert_eq!(accepts(product), gemv, "{ty} {ne:?} mul_mat");
            }
        }
    }

    /// The planner's sizes bound what `load_weight` allocates.
    #[test]
    fn weight_bytes_cover_the_repacked_layouts() {
        let (k, rows) = (768, 130);
        let x: Vec<f32> = (0..k * rows).map(|i| ((i * 37) % 3) as f32 - 1.0).collect();
        let quantized = [
            GgmlType::Q6_K,
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::Q2_0,
            GgmlType::Q1_0,
            GgmlType::Q5_0,
            GgmlType::Q3_K,
            GgmlType::IQ4_XS,
        ];
        let types = [GgmlType::TQ2_0, GgmlType::IQ2_BN].into_iter().chain(quantized);
        for ty in types.chain([GgmlType::F16]) {
            let mut bytes = vec![0u8; ty.tensor_bytes(&[k as u64, rows as u64]).unwrap() as usize];
            tern_quant::quantize_tensor(ty, &x, k, &mut bytes);
            let desc = WeightDesc { ty, ne: [k, rows, 1, 1] };
            let repacked = repack(desc, &bytes);
            assert_eq!(repacked.is_some(), ty != GgmlType::F16, "{ty}");
            let actual = repacked.map_or(bytes.len(), |r| r.image.bytes.len());
            let planned = weight_bytes(desc, bytes.len());
            assert!(planned >= actual, "{ty}: {planned} < {actual}");
        }
    }
}
