//! Lowering the int8 activations of ternary matmuls: the RMS norm and its
//! weight fused into the quantization (`norm_quant`), and a prompt's gated
//! FFN product formed inside it (`gated_norm_quant`).
//!
//! `norm_quant` runs a block per row. When the row's permuted int8 words fit
//! four a thread, each thread norms, weights and quantizes its own words in
//! registers; longer rows are staged in shared memory. A lone token's row uses
//! the fewest threads that keep it in registers (256 up to k_pad 4096, else
//! 512), so the block finds room beside the previous GEMV's and starts early
//! under programmatic launch; batches of 64 rows or more use 256 threads a row.

use tern_graph::{Activation, NodeId, Op};

use super::{Lower, Need, Quant, GEMV_MAX_TOKENS};
use crate::args::{Act, GatedNormQuantArgs, NormQuantArgs, RmsNormArgs};
use crate::kernels::Kernel;
use crate::launch::Launch;

impl Lower<'_> {
    /// Whether a ternary matmul reads `id` (so its int8 form is wanted).
    fn read_by_ternary(&self, id: NodeId) -> bool {
        self.readers[id.index()].iter().any(|&r| {
            let n = self.graph.node(r);
            matches!(n.op, Op::MulMat { .. })
                && n.srcs.get(1) == Some(&id)
                && self.weight(n.srcs[0]).is_some_and(|w| w.ternary.is_some())
        })
    }

    /// Whether only ternary matmuls of this split read `id` (through its
    /// int8 levels), so its f32 values need not be written at all.
    fn only_levels_read(&self, id: NodeId) -> bool {
        let readers = &self.readers[id.index()];
        readers.len() == self.uses[id.index()] as usize
            && readers.iter().all(|&r| {
                let n = self.graph.node(r);
                self.in_split[r.index()]
                    && matches!(n.op, Op::MulMat { .. })
                    && n.srcs.get(1) == Some(&id)
                    && n.srcs[0] != id
                    && self.weight(n.srcs[0]).is_some_and(|w| w.ternary.is_some())
            })
    }

    pub(super) fn rms_norm(&mut self, nodes: &[NodeId], i: usize, eps: f32) -> Result<usize, Need> {
        if self.norm_into_head(nodes, i, eps)? || self.norm_into_levels(nodes, i, eps)? {
            return Ok(2);
        }
        let node = self.node_ref(nodes[i]).clone();
        let (ne0, rows) = (node.ne[0], node.n_rows());
        let (dst, w, consumed) = self.norm_weight(nodes, i)?;
        let x = self.ptr(node.srcs[0])?;
        let y = self.ptr(dst)?;
        if self.read_by_ternary(dst) {
            let y = if self.only_levels_read(dst) { 0 } else { y };
            let q = self.quantize(x, w, y, ne0, rows, true, eps);
            self.quant.insert(dst, q);
        } else {
            let args = RmsNormArgs { x, w, y, ne0: ne0 as i32, eps };
            let l = Launch::new(Kernel::RmsNorm, (rows as u32, 1, 1), 256, args);
            self.out.push(l);
        }
        Ok(consumed)
    }

    /// Where the RMS norm `nodes[i]` leaves its result: the `mul` by a
    /// one-row weight right after it, fused (then with the weight's address),
    /// or the norm itself (weight 0); and the nodes that takes.
    fn norm_weight(&mut self, nodes: &[NodeId], i: usize) -> Result<(NodeId, u64, usize), Need> {
        let (id, next) = (nodes[i], nodes.get(i + 1).copied());
        let (ne0, src) = (self.node_ref(id).ne[0], self.node_ref(id).srcs[0]);
        let fused = next.filter(|&m| {
            let mn = self.node_ref(m);
            matches!(mn.op, Op::Mul)
                && mn.srcs[0] == id
                && self.uses[id.index()] == 1
                && self.node_ref(mn.srcs[1]).n_elements() == ne0
                && !self.overlaps(m, src)
        });
        Ok(match fused {
            Some(m) => (m, self.ptr(self.node_ref(m).srcs[1])?, 2),
            None => (id, 0, 1),
        })
    }

    /// A prompt's act(gate) · up that reaches only ternary matmuls, through
    /// their int8 levels: directly (llama's ffn_down) or through an RMS norm
    /// and its weight (BitNet's ffn_sub_norm). One `gated_norm_quant` forms
    /// the product as it stages each row, so the f32 product is never written
    /// and read back (57 MB each way a 2,048-token step at the 2B-4T
    /// ffn_down). One token's gate/up pairs fuse into the GEMV instead
    /// (`mul_mat`). Returns the nodes consumed, or None to lower it alone.
    pub(super) fn gated_into_levels(
        &mut self,
        nodes: &[NodeId],
        i: usize,
        act: Activation,
    ) -> Result<Option<usize>, Need> {
        let id = nodes[i];
        let node = self.node_ref(id).clone();
        let (ne0, rows) = (node.ne[0], node.n_rows());
        if rows <= GEMV_MAX_TOKENS {
            return Ok(None);
        }
        let (dst, w, consumed, norm, eps) = if self.only_levels_read(id) {
            (id, 0, 1, false, 0.0)
        } else {
            let Some(&n1) = nodes.get(i + 1) else { return Ok(None) };
            let Op::RmsNorm { eps } = self.node_ref(n1).op else { return Ok(None) };
            if self.node_ref(n1).srcs[0] != id || self.uses[id.index()] != 1 {
                return Ok(None);
            }
            let (dst, w, consumed) = self.norm_weight(nodes, i + 1)?;
            if !self.only_levels_read(dst) {
                return Ok(None);
            }
            (dst, w, 1 + consumed, true, eps)
        };
        let (gate, up) = (self.ptr(node.srcs[0])?, self.ptr(node.srcs[1])?);
        let q = self.quant_buffers(ne0, rows);
        let args = GatedNormQuantArgs {
            gate,
            up,
            act: Act::of(act),
            w,
            q: q.q,
            d: q.d,
            lsum: q.lsum,
            ne0: ne0 as i32,
            k_pad: q.k_pad as i32,
            norm: norm as i32,
            eps,
        };
        let l = Launch::new(Kernel::GatedNormQuant, (rows as u32, 1, 1), 256, args).smem(ne0 * 4);
        self.out.push(l);
        self.quant.insert(dst, q);
        Ok(Some(consumed))
    }

    /// Scratch for the int8 levels of `rows` rows of `ne0`.
    fn quant_buffers(&mut self, ne0: usize, rows: usize) -> Quant {
        let k_pad = ne0.next_multiple_of(256);
        let q = self.take(rows * k_pad);
        let d = self.take(rows * 4);
        let lsum = self.take(rows * (k_pad / 64) * 4);
        Quant { q, d, lsum, k_pad }
    }

    /// Emits `norm_quant` for `rows` rows of `ne0` at `x`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn quantize(&mut self, x: u64, w: u64, y: u64, ne0: usize, rows: usize, norm: bool, eps: f32) -> Quant {
        let quant = self.quant_buffers(ne0, rows);
        let Quant { q, d, lsum, k_pad } = quant;
        // Rows staged in shared memory may take it past 48 KiB (opted in at
        // load). A prompt's rows run best many at once: in registers, 4
        // words of the permuted layout a thread, as few threads as that
        // takes (fewer idle threads a row), else 256. A lone token's row is a chain of
        // dependent phases (load, two block reductions, stores) held in
        // registers: 256 threads up to k_pad 4096 and 512 beyond.
        // The smaller the block, the sooner it finds room on an SM beside
        // the GEMV before it and starts under programmatic launch.
        let threads = if rows >= 64 && k_pad <= 4 * 4 * 256 {
            (k_pad / 16).next_multiple_of(32).max(64) as u32
        } else if rows >= 64 || k_pad <= 4 * 4 * 256 {
            256
        } else {
            512
        };
        let args = NormQuantArgs { x, w, y, q, d, lsum, ne0: ne0 as i32, k_pad: k_pad as i32, norm: norm as i32, eps };
        let l = Launch::new(Kernel::NormQuant, (rows as u32, 1, 1), threads, args).smem(ne0 * 4);
        self.out.push(l);
        quant
    }
}
