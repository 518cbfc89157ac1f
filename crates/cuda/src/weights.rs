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
    /// (`q8_gemv*`, `q6k_gemv*`, the experts' `moe_gemv*`) and row lookups
    /// (`get_rows_q8`, `get_rows_q6k`) read.
    Quant(QLayout),
    /// The file's bytes (F32, F16, BF16), read element by element by `dq`
    /// (prelude.cuh) in `fmat_gemv`, `get_rows` and the experts' `moe_dq*`
    /// (F16 and F32 matrices by `f16_gemv`, `f32_gemv`).
    Stored,
}

impl Held {
    /// How a weight of `ty` with dims `ne` is held, or `None` where no GPU
    /// kernel reads the type (in that shape). Every block-quantized type
    /// has an exact int8 layout (`qlayout::of`); a 3-D tensor's (the MoE
    /// experts', MLA's per-head projections) is its rows in order, so expert
    /// `e`'s row `r` is row `e·ne1 + r`.
    pub(crate) fn of(ty: GgmlType, ne: [usize; 4]) -> Option<Held> {
        let matrix = ne[2] == 1 && ne[3] == 1;
        match ty {
            _ if ty.is_ternary() => matrix.then_some(Held::Ternary),
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => Some(Held::Stored),
            _ => qlayout::of(ty, matrix).map(Held::Quant),
        }
    }

    /// Whether the expert GEMVs (`moe_*`, experts.cu) read a 3-D tensor
    /// held this way: int8 levels (with or without offsets), or floats.
    pub(crate) fn is_expert(self) -> bool {
        matches!(self, Held::Quant(QLayout::Levels | QLayout::LevelsOffset) | Held::Stored)
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
    /// [`QLayout::LevelsOffset`]'s offsets, else 0.
    pub ptr_offsets: u64,
    /// The file's own blocks beside the levels ([`keeps_native`]), else 0.
    pub ptr_native: u64,
    pub ternary: Option<TernaryShape>,
    /// How a block-quantized matrix is stored (`qlayout.rs`).
    pub quant: Option<QLayout>,
    /// For a staged copy kept in mapped host memory: the bytes (codes, then
    /// scales) that a launch list streams into device memory before reading.
    pub staged: Option<usize>,
}

/// A repacked matrix as one byte image: its codes or levels, zeros to the
/// next 256 bytes, then its f32 scales (which start at `scale_off`; Q6_K's
/// planes carry their own scales and the kernels find them from k and rows),
/// then any f32 offsets (at `offset_off`, 0 when none), then, 256-aligned at
/// `native_off` (0 when none), the file's blocks ([`keeps_native`]).
pub(crate) struct Image {
    pub bytes: Vec<u8>,
    pub scale_off: usize,
    pub offset_off: usize,
    pub native_off: usize,
}

/// Whether a weight keeps the file's blocks on the GPU beside its levels:
/// Q4_K matrices and experts of whole blocks, which one token's products
/// read at 4.5 bits a weight (`q4k.cu`) where the levels, scales and
/// offsets take 12; prompts' tensor-core products read the levels.
pub(crate) fn keeps_native(ty: GgmlType, k: usize) -> bool {
    ty == GgmlType::Q4_K && k.is_multiple_of(256)
}

impl Image {
    fn new(levels: &[u8], scales: &[f32], offsets: &[f32]) -> Image {
        let scale_off = levels.len().next_multiple_of(256);
        let offset_off = if offsets.is_empty() { 0 } else { scale_off + scales.len() * 4 };
        let mut bytes = Vec::with_capacity(scale_off + (scales.len() + offsets.len()) * 4);
        bytes.extend_from_slice(levels);
        bytes.resize(scale_off, 0);
        bytes.extend(scales.iter().chain(offsets).flat_map(|s| s.to_le_bytes()));
        Image { bytes, scale_off, offset_off, native_off: 0 }
    }

    /// Appends the file's blocks, 256-aligned.
    fn with_native(mut self, data: &[u8]) -> Image {
        self.native_off = self.bytes.len().next_multiple_of(256);
        self.bytes.resize(self.native_off, 0);
        self.bytes.extend_from_slice(data);
        self
    }

    pub fn ternary(t: &GpuTernary) -> Image {
        Image::new(&t.codes, &t.scales, &[])
    }
}

/// A matrix repacked for upload, and what its `Weight` records of the layout.
pub(crate) struct Repacked {
    pub image: Image,
    pub ternary: Option<TernaryShape>,
    pub quant: Option<QLayout>,
}

/// The GPU image of a ternary or block-quantized weight, or `None` for a
/// weight uploaded as stored; block layouts are converted on up to
/// `threads` threads.
pub(crate) fn repack(desc: WeightDesc, data: &[u8], threads: usize) -> Option<Repacked> {
    let (k, rows) = (desc.ne[0], desc.ne[1] * desc.ne[2] * desc.ne[3]);
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
        QLayout::Levels | QLayout::LevelsOffset => {
            let q = qlayout::pack(desc.ty, data, k, rows, threads);
            // SAFETY: i8 and u8 have the same layout.
            let levels: &[u8] = unsafe { std::slice::from_raw_parts(q.values.as_ptr() as *const u8, q.values.len()) };
            let image = Image::new(levels, &q.scales, &q.offsets);
            if keeps_native(desc.ty, k) {
                image.with_native(data)
            } else {
                image
            }
        }
        QLayout::Q6K => Image { bytes: qlayout::pack_q6k(data, k, rows), scale_off: 0, offset_off: 0, native_off: 0 },
    };
    Some(Repacked { image, ternary: None, quant: Some(layout) })
}

/// Whether a host-resident weight can be staged for offloaded matmuls
/// (`Backend::load_staged`): ternary matrices, which the GEMM streams in.
pub fn streams(desc: WeightDesc) -> bool {
    Held::of(desc.ty, desc.ne) == Some(Held::Ternary)
}

/// Bytes a weight takes on the GPU once loaded (`load_weight`): ternary
/// matrices repacked to 2 bits plus scales, block-quantized weights in their
/// `qlayout` layouts, others as stored.
pub fn weight_bytes(desc: WeightDesc, file_bytes: usize) -> usize {
    let (k, rows) = (desc.ne[0], desc.ne[1] * desc.ne[2] * desc.ne[3]);
    match Held::of(desc.ty, desc.ne) {
        Some(Held::Ternary) => {
            let k_pad = k.next_multiple_of(layout::CHUNK);
            let codes = rows.next_multiple_of(layout::ROW_ALIGN) * k_pad / 4;
            // One scale per row, or one per 256-chunk for files whose blocks disagree.
            codes.next_multiple_of(256) + rows * (k_pad / layout::CHUNK) * 4
        }
        Some(Held::Quant(layout)) if keeps_native(desc.ty, k) => {
            qlayout::bytes(layout, k, rows).next_multiple_of(256) + file_bytes
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
    /// type but the ternary codes, a matmul every type of a matrix.
    #[test]
    fn supports_follows_how_weights_are_held() {
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
                assert_eq!(accepts(lookup), !ty.is_ternary(), "{ty} {ne:?} get_rows");
                assert_eq!(accepts(product), matrix, "{ty} {ne:?} mul_mat");
            }
        }
    }

    /// The planner's sizes bound what `load_weight` allocates.
    #[test]
    fn weight_bytes_cover_the_repacked_layouts() {
        let (k, rows) = (768, 130);
        let x: Vec<f32> = (0..k * rows).map(|i| ((i * 37) % 3) as f32 - 1.0).collect();
        for ty in GgmlType::ALL.into_iter().filter(|t| t.tensor_bytes(&[k as u64, 1]).is_some()) {
            let mut bytes = vec![0u8; ty.tensor_bytes(&[k as u64, rows as u64]).unwrap() as usize];
            tern_quant::quantize_tensor(ty, &x, k, &mut bytes);
            // A matrix, and the same rows as 2 experts of 65 (ternary: none).
            for ne in [[k, rows, 1, 1], [k, rows / 2, 2, 1]] {
                let desc = WeightDesc { ty, ne };
                let Some(held) = Held::of(ty, ne) else { continue };
                let repacked = repack(desc, &bytes, 2);
                assert_eq!(repacked.is_some(), held != Held::Stored, "{ty}");
                let actual = repacked.map_or(bytes.len(), |r| r.image.bytes.len());
                let planned = weight_bytes(desc, bytes.len());
                assert!(planned >= actual, "{ty} {ne:?}: {planned} < {actual}");
            }
        }
    }
}
