//! What the CUDA backend can run: `supports`, a free function so that plans
//! for machines with GPUs can be made without one. Which weights a node may
//! read follows how they are held (`weights::Held`).

use tern_graph::{DType, Node, Op};
use tern_quant::GgmlType;

use crate::lower;
use crate::weights::Held;

/// Whether the CUDA backend can run `node` with sources `srcs`. A free
/// function so that plans for machines with GPUs can be made without one.
pub fn supports(node: &Node, srcs: &[&Node]) -> bool {
    let f32 = |n: &Node| n.dtype == DType::F32;
    // What reads a weight (or any table) depends on how this backend holds it.
    let held = |n: &Node| match n.dtype {
        DType::Ggml(t) => Held::of(t, n.ne),
        DType::I32 => None,
    };
    match &node.op {
        Op::Weight(_) | Op::Input(_) | Op::KvCache { .. } => true,
        Op::GetRows => held(srcs[0]).is_some_and(Held::has_rows),
        Op::MulMat { .. } => {
            let is_matrix = srcs[0].ne[2] == 1 && srcs[0].ne[3] == 1;
            is_matrix && held(srcs[0]).is_some() && f32(srcs[1])
        }
        Op::Rope(p) => f32(srcs[0]) && p.head_dim % 2 == 0 && p.n_rot <= p.head_dim,
        // Expert tensors in an int8 layout or stored as floats; a gated
        // pair's two the same way (both stored: of one type).
        Op::MulMatId { .. } => held(srcs[0]).is_some_and(Held::is_expert) && f32(srcs[1]),
        Op::MoeUpGate { .. } => {
            let (g, u) = (held(srcs[0]), held(srcs[1]));
            let same = match (g, u) {
                (Some(Held::Stored), Some(Held::Stored)) => srcs[0].dtype == srcs[1].dtype,
                // One int8 form of x serves both: the same activation blocks.
                (Some(Held::Quant(_)), Some(Held::Quant(_))) => match (srcs[0].dtype, srcs[1].dtype) {
                    (DType::Ggml(a), DType::Ggml(b)) => tern_quant::act_type(a) == tern_quant::act_type(b),
                    _ => false,
                },
                _ => false,
            };
            same && g.is_some_and(Held::is_expert) && u.is_some_and(Held::is_expert) && f32(srcs[2])
        }
        Op::Columns { .. } | Op::MulMatHeads { .. } | Op::LatentAttention(_) => lower::mla_supports(node, srcs),
        Op::Route(_) | Op::RouteWeights(_) | Op::ExpertSum => lower::route_supports(node, srcs),
        Op::Attention(p) => {
            let cache = |n: &Node| matches!(n.dtype, DType::Ggml(GgmlType::F32 | GgmlType::F16));
            // Six sources: one sequence. A multi-sequence batch's seventh
            // (`SeqStarts`) is not lowered; the session then refuses such batches.
            srcs[..3].iter().all(|n| f32(n))
                && srcs[3..5].iter().all(|n| cache(n))
                && srcs.len() == 6
                && p.head_dim <= 256
                && p.n_head % p.n_head_kv == 0
                && p.n_head / p.n_head_kv <= 32
        }
        Op::RmsNorm { .. } | Op::HeadNorm { .. } | Op::Mul | Op::Add | Op::Scale { .. } | Op::GatedAct(_) => {
            srcs.iter().all(|n| f32(n))
        }
    }
}
