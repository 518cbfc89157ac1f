//! Lowering the matmuls of float and block-quantized weights (heads, and the
//! projections of non-ternary models), and the norms that one token's
//! products take into their own launches: the final norm into a Q6_K head,
//! a norm read only by paired products of int8 levels into each of them.

use tern_graph::{Node, NodeId, Op, Precision};
use tern_quant::{ActType, GgmlType};

use super::{grid1, Lower, Need, FMAT_TOKENS, MMA_COLS, MMA_K, MMA_ROWS, MMA_SMEM};
use crate::args::{
    Act, ActQ8Args, F16GemvArgs, FmatGemvArgs, GemvIo, MmaArgs, Q4kGemv1xArgs, Q4kGemv1xPairArgs, Q6KGemv1Q8Args,
    Q6KGemvArgs, Q8GemvArgs, Q8pGemv1xArgs, Q8pGemv1xPairArgs, Q8pGemvArgs,
};
use crate::kernels::Kernel;
use crate::launch::Launch;
use crate::qlayout::QLayout;
use crate::Weight;

/// `rms_norm(x) · w` of one row that no launch writes: the products reading
/// it norm `x` themselves.
#[derive(Clone, Copy, Debug)]
pub(super) struct HeadNorm {
    src: NodeId,
    x: u64,
    w: u64,
    eps: f32,
}

/// Whether matmul node `n` of weight `w` lowers to `q6k_gemv1_q8`: one token
/// of a Q6_K weight paired with int8 activations (a quantized model's head),
/// whose outputs go out as runs of up to 128 bytes.
pub(crate) fn is_q6k_q8(n: &Node, w: Option<&Weight>) -> bool {
    matches!(n.op, Op::MulMat { precision: Precision::Paired })
        && n.ne[1] == 1
        && w.is_some_and(|w| w.ternary.is_none() && w.quant == Some(QLayout::Q6K))
}

/// The most shared memory `q8p_gemv1x` takes for x's levels and scales (the
/// default limit without opting in; k up to 43k).
const PAIRED_X_SMEM: usize = 48 << 10;

/// The most rows of a float matrix whose batched products take the tiled
/// GEMM (`f32_gemm`, `f16_gemm`): a router's.
const FLOAT_GEMM_ROWS: usize = 1024;

/// The block shift of the int8 activations a weight of `ty` in an int8
/// layout pairs with on the CPU (`tern_quant::act_type`): Q8_0's blocks of
/// 32 (5), Q8_K's of 256 (8).
pub(super) fn act_shift(ty: GgmlType) -> i32 {
    match tern_quant::act_type(ty) {
        ActType::Q8_0 => 5,
        _ => 8,
    }
}

impl Lower<'_> {
    /// `x` (f32, rows of `k`) quantized by `act_q8` in blocks of 2^`ab`, once
    /// per node and block size: the workspace addresses of (q, d).
    pub(super) fn acts_q8(&mut self, x: NodeId, k: usize, ab: i32) -> Result<(u64, u64), Need> {
        if let Some(&p) = self.acts.get(&(x, ab)) {
            return Ok(p);
        }
        let n = self.node_ref(x).n_elements();
        let blocks = n >> ab;
        if !k.is_multiple_of(1 << ab) || !n.is_multiple_of(k) {
            return super::fail(format!("int8 activations of rows of {k} in blocks of {}", 1 << ab));
        }
        let (q, d) = (self.take(n), self.take(4 * blocks));
        let args = ActQ8Args { x: self.ptr(x)?, q, d, blocks: blocks as u64, ab };
        self.out.push(Launch::new(Kernel::ActQ8, grid1(blocks, 8), 256, args));
        self.acts.insert((x, ab), (q, d));
        Ok((q, d))
    }

    fn is_q6k_q8(&self, mm: NodeId) -> bool {
        let n = self.node_ref(mm);
        is_q6k_q8(n, self.weight(n.srcs[0]))
    }

    /// `rms_norm` at `nodes[i]`, then `mul` by a weight row, read only by the
    /// one-token Q6_K head right after them (a model's final norm when
    /// decoding): the head norms its input itself, so neither gets a launch.
    /// Nothing between them writes, so the norm's input is still there when
    /// the head runs; the head's output may not be placed over it.
    pub(super) fn norm_into_head(&mut self, nodes: &[NodeId], i: usize, eps: f32) -> Result<bool, Need> {
        let id = nodes[i];
        let (Some(&m), Some(&mm)) = (nodes.get(i + 1), nodes.get(i + 2)) else { return Ok(false) };
        let (node, mn, mmn) = (self.node_ref(id), self.node_ref(m), self.node_ref(mm));
        let x = node.srcs[0];
        let folds = node.n_rows() == 1
            && matches!(mn.op, Op::Mul)
            && mn.srcs[0] == id
            && self.uses[id.index()] == 1
            && self.node_ref(mn.srcs[1]).n_elements() == node.ne[0]
            && matches!(mmn.op, Op::MulMat { .. })
            && mmn.srcs[1] == m
            && self.uses[m.index()] == 1
            && self.is_q6k_q8(mm)
            && !self.overlaps(mm, x)
            && self.residual(mm, nodes.get(i + 3).copied())?.is_none();
        if !folds {
            return Ok(false);
        }
        let norm = HeadNorm { src: x, x: self.ptr(x)?, w: self.ptr(mn.srcs[1])?, eps };
        self.head_norm.insert(m, norm);
        Ok(true)
    }

    /// `rms_norm` at `nodes[i]`, then `mul` by a weight row, of one token,
    /// read only by paired products of int8 levels that quantize x in their
    /// blocks (`q8p_gemv1x`, its gated pair): each norms x itself, so
    /// neither node gets a launch. x must outlive them: a later node of this
    /// split reads it (the residual connection), so the memory plan keeps
    /// its bytes until then.
    pub(super) fn norm_into_levels(&mut self, nodes: &[NodeId], i: usize, eps: f32) -> Result<bool, Need> {
        let id = nodes[i];
        let Some(&m) = nodes.get(i + 1) else { return Ok(false) };
        let (node, mn) = (self.node_ref(id), self.node_ref(m));
        let (x, k) = (node.srcs[0], node.ne[0]);
        let row_ok = node.n_rows() == 1
            && matches!(mn.op, Op::Mul)
            && mn.srcs[0] == id
            && self.uses[id.index()] == 1
            && self.node_ref(mn.srcs[1]).n_elements() == k
            && self.node_ref(mn.srcs[1]).dtype == tern_graph::DType::F32;
        let readers = &self.readers[m.index()];
        if !row_ok || readers.is_empty() || readers.len() != self.uses[m.index()] as usize {
            return Ok(false);
        }
        let at = |n: NodeId| nodes.iter().position(|&v| v == n);
        let mut last = 0;
        for &r in readers {
            let rn = self.node_ref(r);
            let Some(w) = self.weight(rn.srcs[0]).filter(|_| rn.srcs[1] == m && rn.srcs[0] != m) else {
                return Ok(false);
            };
            let levels = matches!(w.quant, Some(QLayout::Levels | QLayout::LevelsOffset)) && w.staged.is_none();
            let paired = matches!(rn.op, Op::MulMat { precision: Precision::Paired }) && rn.ne[1] == 1;
            let fits = (k + 4 * (k >> act_shift(w.ty))).next_multiple_of(16) <= PAIRED_X_SMEM;
            match at(r) {
                Some(p) if levels && paired && fits && w.ternary.is_none() && !self.overlaps(r, x) => {
                    last = last.max(p)
                }
                _ => return Ok(false),
            }
        }
        let outlived = self.readers[x.index()].iter().any(|&r| r != id && at(r).is_some_and(|p| p > last));
        if !outlived {
            return Ok(false);
        }
        let norm = HeadNorm { src: x, x: self.ptr(x)?, w: self.ptr(mn.srcs[1])?, eps };
        self.head_norm.insert(m, norm);
        Ok(true)
    }

    /// A one-token gate product at `nodes[i]` of levels `w`, followed by the
    /// up product of the same x and shape and the activation that alone
    /// reads both: the up weight, the activation node and its `Act`.
    fn levels_pair(&self, nodes: &[NodeId], i: usize, w: &Weight) -> Result<Option<(Weight, NodeId, Act)>, Need> {
        let (Some(&u), Some(&a)) = (nodes.get(i + 1), nodes.get(i + 2)) else { return Ok(None) };
        let (gn, un, an) = (self.node_ref(nodes[i]), self.node_ref(u), self.node_ref(a));
        let Op::GatedAct(act) = an.op else { return Ok(None) };
        let same = matches!(un.op, Op::MulMat { precision: Precision::Paired })
            && un.srcs[1] == gn.srcs[1]
            && un.ne == gn.ne
            && an.srcs == [nodes[i], u]
            && self.uses[nodes[i].index()] == 1
            && self.uses[u.index()] == 1
            && self.node_ref(un.srcs[0]).ne == self.node_ref(gn.srcs[0]).ne;
        let up = self.weight(un.srcs[0]).filter(|up| {
            same && matches!(up.quant, Some(QLayout::Levels | QLayout::LevelsOffset))
                && up.staged.is_none()
                && act_shift(up.ty) == act_shift(w.ty)
        });
        Ok(up.map(|up| (up.clone(), a, Act::of(act))))
    }

    pub(super) fn fmat(&mut self, nodes: &[NodeId], i: usize, w: &Weight) -> Result<usize, Need> {
        let id = nodes[i];
        let node = self.node_ref(id).clone();
        let (k, rows, n_tok) = (self.node_ref(node.srcs[0]).ne[0], node.ne[0], node.ne[1]);
        let norm = self.head_norm.get(&node.srcs[1]).copied();
        // The sum may not be written over the activations this kernel reads
        // (a folded norm's source, else x).
        let read = norm.map_or(node.srcs[1], |n| n.src);
        let fused = self.residual(id, nodes.get(i + 1).copied())?.filter(|(add, _)| !self.overlaps(*add, read));
        let (out, res, consumed) = match fused {
            Some((add, r)) => (self.ptr(add)?, r, 2),
            None => (self.ptr(id)?, 0, 1),
        };
        let x = match norm {
            Some(n) => n.x,
            None => self.ptr(node.srcs[1])?,
        };
        let row_bytes = w.ty.row_bytes(k as u64).unwrap_or(0);
        let q6k_q8 = self.is_q6k_q8(id);
        // A quantized model's levels pair int8 activations (the CPU's
        // integers): one token's quantized by the GEMV's blocks themselves
        // (x's levels and scales in shared memory), a batch's by `act_q8`.
        let levels = matches!(w.quant, Some(QLayout::Levels | QLayout::LevelsOffset));
        let pairs = levels && matches!(node.op, Op::MulMat { precision: Precision::Paired });
        let ab = act_shift(w.ty);
        let x_smem = (k + 4 * (k >> ab)).next_multiple_of(16);
        let (nw, eps) = norm.map_or((0, 0.0), |n| (n.w, n.eps));
        if pairs && n_tok == 1 && x_smem <= PAIRED_X_SMEM {
            // Q4_K weights are read in the file's blocks (`q4k.cu`).
            let native = w.ptr_native != 0;
            if let Some((up, a, act)) = self.levels_pair(nodes, i, w)? {
                if native && up.ptr_native != 0 {
                    let (w, w2, out) = (w.ptr_native, up.ptr_native, self.ptr(a)?);
                    let args = Q4kGemv1xPairArgs { w, w2, rows: rows as i32, k: k as i32, x, out, act, nw, eps };
                    self.out.push(Launch::new(Kernel::Q4kGemv1xPair, grid1(rows, 8), 256, args).smem(x_smem));
                    return Ok(3);
                }
                let args = Q8pGemv1xPairArgs {
                    q: w.ptr_codes,
                    s: w.ptr_scales,
                    o: w.ptr_offsets,
                    q2: up.ptr_codes,
                    s2: up.ptr_scales,
                    o2: up.ptr_offsets,
                    rows: rows as i32,
                    k: k as i32,
                    x,
                    ab,
                    out: self.ptr(a)?,
                    act,
                    nw,
                    eps,
                };
                self.out.push(Launch::new(Kernel::Q8pGemv1xPair, grid1(rows, 8), 256, args).smem(x_smem));
                return Ok(3);
            }
            if native {
                let args = Q4kGemv1xArgs { w: w.ptr_native, rows: rows as i32, k: k as i32, x, out, res, nw, eps };
                self.out.push(Launch::new(Kernel::Q4kGemv1x, grid1(rows, 8), 256, args).smem(x_smem));
                return Ok(consumed);
            }
            let args = Q8pGemv1xArgs {
                q: w.ptr_codes,
                s: w.ptr_scales,
                o: w.ptr_offsets,
                rows: rows as i32,
                k: k as i32,
                x,
                ab,
                out,
                res,
                nw,
                eps,
            };
            self.out.push(Launch::new(Kernel::Q8pGemv1x, grid1(rows, 8), 256, args).smem(x_smem));
            return Ok(consumed);
        }
        if norm.is_some() && !q6k_q8 {
            return super::fail("a folded norm reaches a product that does not norm its input");
        }
        // A prompt's int8 levels, and a quantized model's Q6_K planes, go to
        // the tensor cores (64 rows × 64 tokens a block); float matrices of
        // few rows (routers) to a tiled GEMM, whose grid the GEMVs' 8 rows a
        // block cannot fill (larger float matrices keep the GEMVs, which
        // stream their weights near the memory's speed).
        let batch = n_tok > FMAT_TOKENS;
        let q6_mma = batch
            && w.quant == Some(QLayout::Q6K)
            && matches!(node.op, Op::MulMat { precision: Precision::Paired })
            && norm.is_none()
            && k % 256 == 0;
        if (pairs || q6_mma) && batch && k % MMA_K == 0 {
            let (qa, da) = self.acts_q8(node.srcs[1], k, ab)?;
            let kernel = if q6_mma { Kernel::Q6KMma } else { super::experts::mma_kernel(w, None) };
            let args = MmaArgs {
                n_tok: n_tok as i32,
                out_stride: rows as u64,
                res,
                ..super::experts::mma_args(w, None, rows, k, (qa, da), ab, out)
            };
            let grid = (rows.div_ceil(MMA_ROWS) as u32, n_tok.div_ceil(MMA_COLS) as u32, 1);
            self.out.push(Launch::new(kernel, grid, 128, args).smem(MMA_SMEM));
            return Ok(consumed);
        }
        let float_gemm = match w.ty {
            GgmlType::F32 => Some(Kernel::F32Gemm),
            GgmlType::F16 => Some(Kernel::F16Gemm),
            _ => None,
        };
        if let Some(kernel) = float_gemm.filter(|_| batch && rows <= FLOAT_GEMM_ROWS && k % 32 == 0 && norm.is_none()) {
            let io =
                GemvIo { rows: rows as i32, k: k as i32, x, n_tok: n_tok as i32, out, out_stride: rows as u64, res };
            let grid = (rows.div_ceil(16) as u32, n_tok.div_ceil(16) as u32, 1);
            self.out.push(Launch::new(kernel, grid, 256, F16GemvArgs { w: w.ptr_codes, io }));
            return Ok(consumed);
        }
        let paired = pairs.then(|| self.acts_q8(node.srcs[1], k, ab)).transpose()?;
        for t0 in (0..n_tok).step_by(FMAT_TOKENS) {
            let nt = (n_tok - t0).min(FMAT_TOKENS);
            let off = (t0 * rows * 4) as u64;
            let (xt, res_t) = (x + (t0 * k * 4) as u64, if res == 0 { 0 } else { res + off });
            let io = GemvIo {
                rows: rows as i32,
                k: k as i32,
                x: xt,
                n_tok: nt as i32,
                out: out + off,
                out_stride: rows as u64,
                res: res_t,
            };
            let l = if let Some((qa, da)) = paired {
                let args = Q8pGemvArgs {
                    q: w.ptr_codes,
                    s: w.ptr_scales,
                    o: w.ptr_offsets,
                    rows: rows as i32,
                    k: k as i32,
                    qa: qa + (t0 * k) as u64,
                    da: da + (4 * t0 * (k >> ab)) as u64,
                    ab,
                    n_tok: nt as i32,
                    out: out + off,
                    out_stride: rows as u64,
                    res: res_t,
                };
                let kernel = if nt == 1 { Kernel::Q8pGemv1 } else { Kernel::Q8pGemv };
                Launch::new(kernel, grid1(rows, 8), 256, args)
            } else if levels {
                let kernel = match (w.quant == Some(QLayout::LevelsOffset), nt == 1) {
                    (false, true) => Kernel::Q8Gemv1,
                    (false, false) => Kernel::Q8Gemv,
                    (true, true) => Kernel::Q8oGemv1,
                    (true, false) => Kernel::Q8oGemv,
                };
                let args = Q8GemvArgs { q: w.ptr_codes, s: w.ptr_scales, o: w.ptr_offsets, io };
                Launch::new(kernel, grid1(rows, 8), 256, args)
            } else if q6k_q8 {
                // A quantized model's products pair int8 activations (the
                // CPU's integers). Three blocks an SM walk the rows, each
                // quantizing x first (k + k/64 bytes) and staging its 8 warps'
                // weight rounds in shared memory (2080 bytes a warp; fmat.cu
                // `Q6_SLOT`).
                let blocks = rows.div_ceil(8).min(3 * self.sms.max(1));
                let smem = (k + k / 64).next_multiple_of(16) + 8 * 2080;
                let args = Q6KGemv1Q8Args { base: w.ptr_codes, io, nw, eps };
                Launch::new(Kernel::Q6KGemv1Q8, (blocks as u32, 1, 1), 256, args).smem(smem)
            } else if w.quant == Some(QLayout::Q6K) {
                let kernel = if nt == 1 { Kernel::Q6KGemv1 } else { Kernel::Q6KGemv };
                Launch::new(kernel, grid1(rows, 8), 256, Q6KGemvArgs { base: w.ptr_codes, io })
            } else if w.ty == GgmlType::F16 && k % 8 == 0 {
                Launch::new(Kernel::F16Gemv, grid1(rows, 8), 256, F16GemvArgs { w: w.ptr_codes, io })
            } else if w.ty == GgmlType::F32 && k % 4 == 0 {
                Launch::new(Kernel::F32Gemv, grid1(rows, 8), 256, F16GemvArgs { w: w.ptr_codes, io })
            } else {
                let args = FmatGemvArgs { w: w.ptr_codes, row_bytes, ty: w.ty.id() as i32, io };
                Launch::new(Kernel::FmatGemv, grid1(rows, 8), 256, args)
            };
            self.out.push(l);
        }
        Ok(consumed)
    }
}
