//! Lowering multi-head latent attention (DeepSeek-V2/V3, absorbed form;
//! `crates/models/src/mla.rs`) to `kernels/mla.cu`: a head's slice of a row
//! (`Op::Columns`), the per-head products with the key and value
//! up-projections (`Op::MulMatHeads`), and the attention over the latent
//! cache (`Op::LatentAttention`); and YaRN's ramp for the rope kernel.
//!
//! The attention stores the batch's `[c | k_pe]` rows (`mla_store`), then a
//! block takes 16 heads of one token over a range of cache rows, so each
//! row it loads serves all 16. Up to `GEMV_MAX_TOKENS` tokens (decoding)
//! the cache is cut into splits whose softmax states `mla_merge` combines
//! (flash-decoding); prompts have a block per (token, 16 heads) already, and
//! take one split. The launches depend on the cache's size, not the
//! positions, which the kernels read from the device: a captured decoding
//! step replays at any position.

use tern_graph::{DType, LatentAttentionParams, Node, NodeId, Op, Precision, RopeParams};
use tern_quant::GgmlType;

use super::fmat::act_shift;
use super::{fail, grid1, Lower, Need, GEMV_MAX_TOKENS, MMA_COLS, MMA_K, MMA_ROWS, MMA_SMEM};
use crate::args::{ColumnsArgs, MlaAttentionArgs, MlaMergeArgs, MlaMmaArgs, MlaStoreArgs, MmaArgs, MulMatHeadsArgs};
use crate::kernels::Kernel;
use crate::launch::Launch;
use crate::qlayout::QLayout;
use crate::weights::Held;

/// Tokens a block of the per-head products takes (`HEADS_MAXT`).
const HEADS_TOKENS: usize = 8;
/// The most shared memory a one-token paired head product takes for its
/// slice's levels and scales (the default limit without opting in).
const HEADS_X_SMEM: usize = 48 << 10;
/// Keys a tile of the tensor-core prompt attention, and the widest cache row
/// its warps' query fragments hold (mla_mma.cu `MLA_MMA_KEYS`, 9 k-steps of
/// 16 a warp).
const MLA_MMA_KEYS: usize = 32;
const MLA_MMA_MAX_WIDTH: usize = 576;
/// The longest head slice a transposed product stages (8 tokens' worth,
/// 64 KiB of shared memory).
const HEADS_MAX_STAGED: usize = 2048;
/// Heads and cache rows an attention block holds (`MLA_HEADS`, `MLA_ROWS`,
/// `MLA_PAD` in mla.cu).
const MLA_HEADS: usize = 16;
const MLA_ROWS: usize = 16;
const MLA_PAD: usize = 4;
/// The widest cache row (`rank + rope`) whose tile and q rows fit the
/// shared memory of every targeted device (99 KiB on sm_89).
const MLA_MAX_WIDTH: usize = 768;
/// A decoding split's rows, at least; at most MLA_MAX_SPLITS splits, and
/// their states within MLA_PART_BYTES of workspace.
const MLA_MIN_SPLIT: usize = 64;
const MLA_MAX_SPLITS: usize = 128;
const MLA_PART_BYTES: usize = 32 << 20;

/// YaRN's arguments of the rope kernel: the ramp's ends in pair indices (as
/// llama.cpp's `ggml_rope_yarn_corr_dims` bounds them, and tern_cpu's
/// `pair_freqs`), how much of it applies, and the magnitude. Without YaRN,
/// (0, 0, 0, 1): the kernel takes its plain angle.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct YarnRamp {
    pub low: f32,
    pub high: f32,
    pub ext: f32,
    pub mag: f32,
}

impl YarnRamp {
    pub(super) fn of(p: &RopeParams) -> YarnRamp {
        let Some(y) = p.yarn else { return YarnRamp { low: 0.0, high: 0.0, ext: 0.0, mag: 1.0 } };
        let (n_rot, base) = (p.n_rot as f64, p.freq_base as f64);
        // The pair index at which a pair turns `turns` times over the original context.
        let corr = |turns: f32| {
            n_rot * (y.n_ctx_orig as f64 / (turns as f64 * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln())
        };
        // Whole numbers, exact in f32.
        let low = corr(y.beta_fast).floor().max(0.0);
        let high = corr(y.beta_slow).ceil().min(n_rot - 1.0);
        YarnRamp { low: low as f32, high: high as f32, ext: y.ext_factor, mag: y.magnitude }
    }
}

/// What `tern_cuda::supports` accepts of the MLA ops: per-head products of
/// weights held as int8 levels (with or without offsets) or stored floats,
/// rows a multiple of 4 wide (the transposed product's words of 4
/// columns), transposed slices up to HEADS_MAX_STAGED; attention over F32 or F16 caches of rows the kernels' tiles
/// hold.
pub(crate) fn supports(node: &Node, srcs: &[&Node]) -> bool {
    let f32 = |n: &Node| n.dtype == DType::F32;
    match &node.op {
        Op::Columns { .. } => f32(srcs[0]),
        Op::MulMatHeads { mm, .. } => {
            let held = match srcs[0].dtype {
                DType::Ggml(t) => Held::of(t, srcs[0].ne),
                DType::I32 => None,
            };
            let read = matches!(held, Some(Held::Quant(QLayout::Levels | QLayout::LevelsOffset) | Held::Stored));
            // A transposed block stages its tokens' inputs in shared memory.
            let staged = !mm.transposed || mm.len <= HEADS_MAX_STAGED;
            read && staged && srcs[0].ne[0].is_multiple_of(4) && f32(srcs[1])
        }
        Op::LatentAttention(p) => {
            let cache = matches!(srcs[4].dtype, DType::Ggml(GgmlType::F32 | GgmlType::F16));
            let width = p.rank + p.rope;
            // One sequence, as `Attention` (see `supports`).
            srcs.len() == 6
                && srcs[..4].iter().all(|n| f32(n))
                && cache
                && srcs[5].dtype == DType::I32
                && p.rank.is_multiple_of(4)
                && p.rank <= 512
                && width.is_multiple_of(8)
                && width <= MLA_MAX_WIDTH
        }
        _ => false,
    }
}

impl Lower<'_> {
    pub(super) fn columns(&mut self, id: NodeId, width: usize, start: usize, len: usize) -> Result<(), Need> {
        let node = self.node_ref(id);
        let n = node.n_elements();
        let args = ColumnsArgs {
            x: self.ptr(node.srcs[0])?,
            out: self.ptr(id)?,
            n: n as u64,
            width: width as i32,
            start: start as i32,
            len: len as i32,
        };
        self.out.push(Launch::new(Kernel::Columns, grid1(n, 256), 256, args));
        Ok(())
    }

    /// `Op::MulMatHeads`: one launch, a block row per (rows or columns,
    /// head, 8 tokens). The op's precision is not read: the GPU's
    /// block-quantized products all take f32 activations.
    pub(super) fn mul_mat_heads(&mut self, id: NodeId) -> Result<(), Need> {
        let node = self.node_ref(id).clone();
        let Op::MulMatHeads { mm, precision } = node.op else { return fail("not a mul_mat_heads") };
        let Some(w) = self.weight(node.srcs[0]).cloned() else {
            return fail("mul_mat_heads weight is not on this device");
        };
        let levels = match w.quant {
            Some(QLayout::Levels | QLayout::LevelsOffset) => true,
            None if w.ternary.is_none() => false,
            _ => return fail(format!("mul_mat_heads: no kernel reads a {} weight held as {:?}", w.ty, w.quant)),
        };
        let k = self.node_ref(node.srcs[0]).ne[0];
        let n_tok = node.ne[1];
        // A quantized model's rows-side products pair int8 activations, as
        // the CPU's do when a head's slice is whole activation blocks (its
        // transposed products stay in f32).
        let ab = act_shift(w.ty);
        let paired = levels && !mm.transposed && precision == Precision::Paired && k.is_multiple_of(1 << ab);
        // One token's blocks quantize their head's slice themselves.
        let in_block = paired && n_tok == 1 && k + 4 * (k >> ab) <= HEADS_X_SMEM;
        let (qa, da) = if paired && !in_block { self.acts_q8(node.srcs[1], k, ab)? } else { (0, 0) };
        if paired && n_tok > HEADS_TOKENS && k.is_multiple_of(MMA_K) {
            // A prompt's heads on the tensor cores: a block per 64 of a
            // head's rows and 64 tokens.
            let args = MmaArgs {
                n_tok: n_tok as i32,
                n_head: mm.n_head as i32,
                stride: mm.stride as i32,
                offset: mm.offset as i32,
                ..super::experts::mma_args(&w, None, mm.len, k, (qa, da), ab, self.ptr(id)?)
            };
            let grid = (mm.len.div_ceil(MMA_ROWS) as u32, (mm.n_head * n_tok.div_ceil(MMA_COLS)) as u32, 1);
            self.out.push(Launch::new(super::experts::mma_kernel(&w, None), grid, 128, args).smem(MMA_SMEM));
            return Ok(());
        }
        let args = MulMatHeadsArgs {
            q: w.ptr_codes,
            s: w.ptr_scales,
            o: w.ptr_offsets,
            row_bytes: w.ty.row_bytes(k as u64).unwrap_or(0),
            ty: w.ty.id() as i32,
            k: k as i32,
            stride: mm.stride as i32,
            offset: mm.offset as i32,
            len: mm.len as i32,
            n_head: mm.n_head as i32,
            x: self.ptr(node.srcs[1])?,
            qa,
            da,
            ab,
            n_tok: n_tok as i32,
            out: self.ptr(id)?,
        };
        let (z, h) = (n_tok.div_ceil(HEADS_TOKENS) as u32, mm.n_head as u32);
        let l = if mm.transposed {
            // A block's 128 threads own 4 output columns each; its tokens'
            // inputs are staged in shared memory.
            let kernel = if levels { Kernel::HeadsQ8T } else { Kernel::HeadsDqT };
            Launch::new(kernel, (k.div_ceil(512) as u32, h, z), 128, args).smem(HEADS_TOKENS * mm.len * 4)
        } else {
            let kernel = match (levels, paired, in_block) {
                (true, true, true) => Kernel::HeadsQ8pX,
                (true, true, false) => Kernel::HeadsQ8p,
                (true, false, _) => Kernel::HeadsQ8,
                (false, _, _) => Kernel::HeadsDq,
            };
            let l = Launch::new(kernel, (mm.len.div_ceil(8) as u32, h, z), 256, args);
            if in_block {
                l.smem(k + 4 * (k >> ab))
            } else {
                l
            }
        };
        self.out.push(l);
        Ok(())
    }

    /// `Op::LatentAttention`: the cache store, the attention, and for
    /// decoding the merge of its splits.
    pub(super) fn latent_attention(&mut self, id: NodeId, p: &LatentAttentionParams) -> Result<(), Need> {
        let node = self.node_ref(id).clone();
        let s = &node.srcs;
        let cache = self.node_ref(s[4]);
        let ty = match cache.dtype {
            DType::Ggml(t @ (GgmlType::F32 | GgmlType::F16)) => t.id() as i32,
            _ => return fail("latent_attention: the cache is neither F32 nor F16"),
        };
        let n_ctx = cache.ne[1];
        let n_tok = node.ne[1];
        let (cache, pos, out) = (self.ptr(s[4])?, self.ptr(s[5])?, self.ptr(id)?);
        let store = MlaStoreArgs {
            c: self.ptr(s[2])?,
            k_pe: self.ptr(s[3])?,
            cache,
            pos,
            rank: p.rank as i32,
            rope: p.rope as i32,
            ty,
        };
        if !self.stored.contains(&id) {
            self.out.push(Launch::new(Kernel::MlaStore, (n_tok as u32, 1, 1), 256, store));
        }
        // A split's states for every (token, head): rank + 4 floats each.
        let per_split = n_tok * p.n_head * (p.rank + 4) * 4;
        let width = p.rank + p.rope;
        // Over an F16 cache the attention runs on tensor cores (mla_mma.cu:
        // two tokens × 16 heads a block, q and P rounded to f16), else on
        // CUDA cores in f32 (mla.cu); decoding cuts the cache into splits.
        let tensor_cores = ty == GgmlType::F16.id() as i32
            && p.rank.is_multiple_of(64)
            && p.rank <= 512
            && p.rope.is_multiple_of(16)
            && width <= MLA_MMA_MAX_WIDTH;
        let tile = if tensor_cores { MLA_MMA_KEYS } else { MLA_ROWS };
        let (split, n_split) = if n_tok <= GEMV_MAX_TOKENS {
            let max_splits = (MLA_PART_BYTES / per_split).clamp(1, MLA_MAX_SPLITS);
            let split = MLA_MIN_SPLIT.max(n_ctx.div_ceil(max_splits).next_multiple_of(tile));
            (split, n_ctx.div_ceil(split))
        } else {
            (n_ctx, 1)
        };
        let part = if n_split > 1 { self.take(n_split * per_split) } else { 0 };
        if tensor_cores {
            let args = MlaMmaArgs {
                q_lat: self.ptr(s[0])?,
                q_pe: self.ptr(s[1])?,
                cache,
                pos,
                out,
                part,
                n_tok: n_tok as i32,
                n_head: p.n_head as i32,
                rank: p.rank as i32,
                rope: p.rope as i32,
                scale: p.scale,
                split: split as i32,
                n_split: n_split as i32,
            };
            // Two K tiles of 32 rows and the warps' partial scores.
            let smem = 2 * MLA_MMA_KEYS * (width + 8) * 2 + 8 * 16 * 32 * 4;
            let grid = (n_split as u32, n_tok.div_ceil(2) as u32, p.n_head.div_ceil(16) as u32);
            self.out.push(Launch::new(Kernel::MlaAttentionMma, grid, 256, args).smem(smem));
            self.mla_merge(part, pos, out, p, split, n_split, n_tok);
            return Ok(());
        }
        let args = MlaAttentionArgs {
            q_lat: self.ptr(s[0])?,
            q_pe: self.ptr(s[1])?,
            cache,
            pos,
            out,
            part,
            n_head: p.n_head as i32,
            rank: p.rank as i32,
            rope: p.rope as i32,
            ty,
            scale: p.scale,
            split: split as i32,
            n_split: n_split as i32,
        };
        let wp = p.rank + p.rope + MLA_PAD;
        let smem = ((MLA_ROWS + MLA_HEADS) * wp + MLA_HEADS * MLA_ROWS + 3 * MLA_HEADS) * 4;
        let grid = (n_split as u32, n_tok as u32, p.n_head.div_ceil(MLA_HEADS) as u32);
        self.out.push(Launch::new(Kernel::MlaAttention, grid, 256, args).smem(smem));
        self.mla_merge(part, pos, out, p, split, n_split, n_tok);
        Ok(())
    }

    /// The merge of a latent attention's splits, when there are several.
    #[allow(clippy::too_many_arguments)]
    fn mla_merge(
        &mut self,
        part: u64,
        pos: u64,
        out: u64,
        p: &LatentAttentionParams,
        split: usize,
        n_split: usize,
        n_tok: usize,
    ) {
        if n_split > 1 {
            let args = MlaMergeArgs {
                part,
                pos,
                out,
                n_head: p.n_head as i32,
                rank: p.rank as i32,
                split: split as i32,
                n_split: n_split as i32,
            };
            self.out.push(Launch::new(Kernel::MlaMerge, (p.n_head as u32, n_tok as u32, 1), 128, args));
        }
    }
}

#[cfg(test)]
mod tests {
    use tern_graph::{RopeMode, Yarn};

    use super::*;

    /// The ramp's ends are tern_cpu's (its YaRN test: n_rot 16, base 1e4,
    /// 4096 original positions ramp from pair 2 to pair 6), and a rope
    /// without YaRN gets the kernel's plain-angle arguments.
    #[test]
    fn yarn_ramp_matches_the_cpu_corr_dims() {
        let yarn = Yarn { n_ctx_orig: 4096, beta_fast: 32.0, beta_slow: 1.0, ext_factor: 1.0, magnitude: 1.25 };
        let mut p = RopeParams {
            mode: RopeMode::Norm,
            n_rot: 16,
            head_dim: 16,
            freq_base: 10000.0,
            freq_scale: 0.025,
            yarn: Some(yarn),
        };
        assert_eq!(YarnRamp::of(&p), YarnRamp { low: 2.0, high: 6.0, ext: 1.0, mag: 1.25 });
        p.yarn = None;
        assert_eq!(YarnRamp::of(&p), YarnRamp { low: 0.0, high: 0.0, ext: 0.0, mag: 1.0 });
    }
}
