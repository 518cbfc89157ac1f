//! The compute graph: plain data that a model builds and backends run.
//!
//! Shapes follow ggml: `ne[0]` is the contiguous dimension, so an activation
//! matrix of `n_tokens` rows of width `n_embd` is `[n_embd, n_tokens, 1, 1]`.
//! Nodes are stored in topological order (a node's sources always come
//! before it), which is the order backends execute them in.

mod op;

pub use op::{
    Activation, AttentionParams, ExpertGroups, Gating, HeadMatMul, InputKind, KvKind, LatentAttentionParams, Op,
    Precision, RopeMode, RopeParams, RouteParams, Yarn,
};
pub use tern_gguf::GgmlType;

/// Element type of a graph tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// A GGUF storage type (weights, f32 activations, f16 caches).
    Ggml(GgmlType),
    /// Token ids and positions.
    I32,
}

impl DType {
    pub const F32: DType = DType::Ggml(GgmlType::F32);
    pub const F16: DType = DType::Ggml(GgmlType::F16);

    /// Bytes of a tensor of this type with dims `ne` (`None` if not a whole number of blocks).
    pub fn nbytes(self, ne: [usize; 4]) -> Option<usize> {
        match self {
            DType::I32 => ne.iter().try_fold(4usize, |acc, &d| acc.checked_mul(d)),
            DType::Ggml(t) => t.tensor_bytes(&ne.map(|d| d as u64)).and_then(|b| usize::try_from(b).ok()),
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DType::Ggml(t) => write!(f, "{t}"),
            DType::I32 => f.write_str("I32"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

impl NodeId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

#[derive(Clone, Debug)]
pub struct Node {
    pub op: Op,
    pub srcs: Vec<NodeId>,
    pub ne: [usize; 4],
    pub dtype: DType,
    /// A label for plans and profiles: the weight name for weights, the weight
    /// a matmul reads (`blk.3.ffn_up`) for matmuls.
    pub label: Option<String>,
}

impl Node {
    pub fn n_elements(&self) -> usize {
        self.ne.iter().product()
    }

    pub fn nbytes(&self) -> usize {
        self.dtype.nbytes(self.ne).expect("graph tensors have valid shapes")
    }

    /// Number of rows (`ne[1] * ne[2] * ne[3]`).
    pub fn n_rows(&self) -> usize {
        self.ne[1] * self.ne[2] * self.ne[3]
    }
}

/// A graph under construction and, once built, the thing backends run.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    pub nodes: Vec<Node>,
    /// Nodes whose values the caller reads back (logits).
    pub outputs: Vec<NodeId>,
}

impl Graph {
    pub fn new() -> Graph {
        Graph::default()
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.index()]
    }

    pub fn ids(&self) -> impl Iterator<Item = NodeId> {
        (0..self.nodes.len() as u32).map(NodeId)
    }

    fn push(&mut self, op: Op, srcs: Vec<NodeId>, ne: [usize; 4], dtype: DType, label: Option<String>) -> NodeId {
        let id = NodeId(self.nodes.len() as u32);
        self.nodes.push(Node { op, srcs, ne, dtype, label });
        id
    }

    fn ne(&self, id: NodeId) -> [usize; 4] {
        self.node(id).ne
    }

    pub fn mark_output(&mut self, id: NodeId) {
        self.outputs.push(id);
    }

    // --- leaves ---

    pub fn weight(&mut self, index: usize, name: &str, dtype: GgmlType, ne: [usize; 4]) -> NodeId {
        self.push(Op::Weight(index), vec![], ne, DType::Ggml(dtype), Some(name.to_string()))
    }

    pub fn input(&mut self, kind: InputKind, n: usize) -> NodeId {
        self.push(Op::Input(kind), vec![], [n, 1, 1, 1], DType::I32, None)
    }

    pub fn kv_cache(&mut self, layer: usize, kind: KvKind, dtype: GgmlType, ne: [usize; 4]) -> NodeId {
        self.push(Op::KvCache { layer, kind }, vec![], ne, DType::Ggml(dtype), None)
    }

    // --- ops (shape inference; shape mismatches are bugs in model code, whose
    // weight shapes were validated at load) ---

    /// Rows `ids` of `table` as f32: `[ne0, n_ids]`.
    pub fn get_rows(&mut self, table: NodeId, ids: NodeId) -> NodeId {
        let (t, n) = (self.ne(table), self.ne(ids)[0]);
        self.push(Op::GetRows, vec![table, ids], [t[0], n, 1, 1], DType::F32, None)
    }

    pub fn rms_norm(&mut self, x: NodeId, eps: f32) -> NodeId {
        let ne = self.ne(x);
        self.push(Op::RmsNorm { eps }, vec![x], ne, DType::F32, None)
    }

    /// `rms_norm` of each `head_dim` slice of `x [head_dim * n_heads, n]`, times `w [head_dim]`.
    pub fn head_norm(&mut self, x: NodeId, w: NodeId, eps: f32) -> NodeId {
        let (ne, head_dim) = (self.ne(x), self.ne(w)[0]);
        assert!(head_dim > 0 && ne[0] % head_dim == 0, "head_norm: width {} is not whole heads of {head_dim}", ne[0]);
        assert_eq!(self.node(w).n_elements(), head_dim, "head_norm: the weight is one row");
        self.push(Op::HeadNorm { eps, head_dim }, vec![x, w], ne, DType::F32, None)
    }

    fn binary(&mut self, op: Op, a: NodeId, b: NodeId) -> NodeId {
        let (na, nb) = (self.ne(a), self.ne(b));
        assert!(
            na[0] == nb[0] && (nb[1..] == na[1..] || nb[1..].iter().all(|&d| d == 1)),
            "{}: shapes {na:?} and {nb:?} do not broadcast",
            op.name()
        );
        self.push(op, vec![a, b], na, DType::F32, None)
    }

    pub fn mul(&mut self, a: NodeId, b: NodeId) -> NodeId {
        self.binary(Op::Mul, a, b)
    }

    pub fn add(&mut self, a: NodeId, b: NodeId) -> NodeId {
        self.binary(Op::Add, a, b)
    }

    pub fn scale(&mut self, x: NodeId, factor: f32) -> NodeId {
        let ne = self.ne(x);
        self.push(Op::Scale { factor }, vec![x], ne, DType::F32, None)
    }

    /// `W·x`: `w [k, n]`, `x [k, m]` → `[n, m]`.
    pub fn mul_mat(&mut self, w: NodeId, x: NodeId, precision: Precision) -> NodeId {
        let (nw, nx) = (self.ne(w), self.ne(x));
        assert_eq!(nw[0], nx[0], "mul_mat: weight {nw:?} and input {nx:?} disagree on k");
        let label = self.node(w).label.as_ref().map(|l| l.trim_end_matches(".weight").to_string());
        self.push(Op::MulMat { precision }, vec![w, x], [nw[1], nx[1], 1, 1], DType::F32, label)
    }

    pub fn rope(&mut self, x: NodeId, positions: NodeId, freq_factors: Option<NodeId>, params: RopeParams) -> NodeId {
        let ne = self.ne(x);
        assert_eq!(ne[0] % params.head_dim, 0, "rope: width {} is not whole heads", ne[0]);
        assert_eq!(self.ne(positions)[0], ne[1], "rope: one position per token");
        let mut srcs = vec![x, positions];
        if let Some(f) = freq_factors {
            assert_eq!(self.ne(f)[0], params.n_rot / 2, "rope: one frequency factor per pair");
            srcs.push(f);
        }
        self.push(Op::Rope(params), srcs, ne, DType::F32, None)
    }

    pub fn gated_act(&mut self, gate: NodeId, up: NodeId, act: Activation) -> NodeId {
        assert_eq!(self.ne(gate), self.ne(up), "gated_act: gate and up differ");
        let ne = self.ne(gate);
        self.push(Op::GatedAct(act), vec![gate, up], ne, DType::F32, None)
    }

    // The sources are the op's operands, one argument each, in `srcs` order.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &mut self,
        q: NodeId,
        k: NodeId,
        v: NodeId,
        k_cache: NodeId,
        v_cache: NodeId,
        positions: NodeId,
        p: AttentionParams,
    ) -> NodeId {
        assert!(p.kv_pos + self.ne(q)[1] <= self.ne(k_cache)[1], "attention: cache too small");
        self.attention_op(vec![q, k, v, k_cache, v_cache, positions], p)
    }

    /// [`Graph::attention`] over a multi-sequence batch: `seq_starts [n_tokens]`
    /// gives each token's cache region ([`AttentionParams`]).
    #[allow(clippy::too_many_arguments)]
    pub fn seq_attention(
        &mut self,
        q: NodeId,
        k: NodeId,
        v: NodeId,
        k_cache: NodeId,
        v_cache: NodeId,
        positions: NodeId,
        seq_starts: NodeId,
        p: AttentionParams,
    ) -> NodeId {
        assert_eq!(self.ne(seq_starts)[0], self.ne(q)[1], "attention: one sequence start per token");
        self.attention_op(vec![q, k, v, k_cache, v_cache, positions, seq_starts], p)
    }

    fn attention_op(&mut self, srcs: Vec<NodeId>, p: AttentionParams) -> NodeId {
        let (q, k, k_cache) = (srcs[0], srcs[1], srcs[3]);
        let n_tokens = self.ne(q)[1];
        assert_eq!(self.ne(q)[0], p.head_dim * p.n_head, "attention: q width");
        assert_eq!(self.ne(k)[0], p.head_dim * p.n_head_kv, "attention: k width");
        assert_eq!(self.ne(k_cache)[0], p.head_dim * p.n_head_kv, "attention: cache width");
        self.push(Op::Attention(p), srcs, [p.head_dim * p.n_head, n_tokens, 1, 1], DType::F32, None)
    }

    /// Elements `start..start + len` of every `width`-wide piece of `x`'s rows.
    pub fn columns(&mut self, x: NodeId, width: usize, start: usize, len: usize) -> NodeId {
        let ne = self.ne(x);
        assert!(
            width > 0 && ne[0].is_multiple_of(width) && start + len <= width,
            "columns: {start}+{len} of {width} in {ne:?}"
        );
        let out = [len * (ne[0] / width), ne[1], ne[2], ne[3]];
        self.push(Op::Columns { width, start, len }, vec![x], out, DType::F32, None)
    }

    /// Per-head products with blocks of `w`'s rows ([`HeadMatMul`]).
    pub fn mul_mat_heads(&mut self, w: NodeId, x: NodeId, mm: HeadMatMul, precision: Precision) -> NodeId {
        let (nw, nx) = (self.ne(w), self.ne(x));
        let rows = nw[1] * nw[2] * nw[3];
        assert!(mm.n_head > 0 && (mm.n_head - 1) * mm.stride + mm.offset + mm.len <= rows, "mul_mat_heads: rows");
        let (k_in, k_out) = if mm.transposed { (mm.len, nw[0]) } else { (nw[0], mm.len) };
        assert_eq!(nx[0], k_in * mm.n_head, "mul_mat_heads: input width");
        let label = self.node(w).label.as_ref().map(|l| l.trim_end_matches(".weight").to_string());
        self.push(Op::MulMatHeads { mm, precision }, vec![w, x], [k_out * mm.n_head, nx[1], 1, 1], DType::F32, label)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn latent_attention(
        &mut self,
        q_lat: NodeId,
        q_pe: NodeId,
        c: NodeId,
        k_pe: NodeId,
        cache: NodeId,
        positions: NodeId,
        p: LatentAttentionParams,
    ) -> NodeId {
        assert!(p.kv_pos + self.ne(q_lat)[1] <= self.ne(cache)[1], "latent_attention: cache too small");
        self.latent_attention_op(vec![q_lat, q_pe, c, k_pe, cache, positions], p)
    }

    /// [`Graph::latent_attention`] over a multi-sequence batch, as
    /// [`Graph::seq_attention`].
    #[allow(clippy::too_many_arguments)]
    pub fn seq_latent_attention(
        &mut self,
        q_lat: NodeId,
        q_pe: NodeId,
        c: NodeId,
        k_pe: NodeId,
        cache: NodeId,
        positions: NodeId,
        seq_starts: NodeId,
        p: LatentAttentionParams,
    ) -> NodeId {
        assert_eq!(self.ne(seq_starts)[0], self.ne(q_lat)[1], "latent_attention: one sequence start per token");
        self.latent_attention_op(vec![q_lat, q_pe, c, k_pe, cache, positions, seq_starts], p)
    }

    fn latent_attention_op(&mut self, srcs: Vec<NodeId>, p: LatentAttentionParams) -> NodeId {
        let [q_lat, q_pe, c, k_pe, cache] = [srcs[0], srcs[1], srcs[2], srcs[3], srcs[4]];
        let n = self.ne(q_lat)[1];
        assert_eq!(self.ne(q_lat)[0], p.rank * p.n_head, "latent_attention: q_lat width");
        assert_eq!(self.ne(q_pe)[0], p.rope * p.n_head, "latent_attention: q_pe width");
        assert_eq!(self.ne(c)[0], p.rank, "latent_attention: latent width");
        assert_eq!(self.ne(k_pe)[0], p.rope, "latent_attention: k_pe width");
        assert_eq!(self.ne(cache)[0], p.rank + p.rope, "latent_attention: cache width");
        self.push(Op::LatentAttention(p), srcs, [p.rank * p.n_head, n, 1, 1], DType::F32, None)
    }

    /// The experts each token uses: i32 `[k, n]`.
    pub fn route(&mut self, logits: NodeId, bias: Option<NodeId>, p: RouteParams) -> NodeId {
        let ne = self.ne(logits);
        assert_eq!(ne[0], p.n_expert, "route: one logit per expert");
        assert_eq!(bias.is_some(), p.biased, "route: bias");
        let srcs = std::iter::once(logits).chain(bias).collect();
        self.push(Op::Route(p), srcs, [p.k, ne[1], 1, 1], DType::I32, None)
    }

    /// The weights of the chosen experts: `[k, n]`.
    pub fn route_weights(&mut self, logits: NodeId, experts: NodeId, p: RouteParams) -> NodeId {
        let ne = self.ne(experts);
        self.push(Op::RouteWeights(p), vec![logits, experts], ne, DType::F32, None)
    }

    /// Each chosen expert's `W·x` ([`Op::MulMatId`]): `[m, e, n]`.
    pub fn mul_mat_id(&mut self, w: NodeId, x: NodeId, experts: NodeId, precision: Precision) -> NodeId {
        let (nw, nx, ne) = (self.ne(w), self.ne(x), self.ne(experts));
        assert_eq!(nw[0], nx[0], "mul_mat_id: k");
        assert!(nx[1] == 1 || nx[1] == ne[0], "mul_mat_id: one input or one per slot");
        assert_eq!(nx[2], ne[1], "mul_mat_id: tokens");
        let label = self.node(w).label.as_ref().map(|l| l.trim_end_matches(".weight").to_string());
        self.push(Op::MulMatId { precision }, vec![w, x, experts], [nw[1], ne[0], ne[1], 1], DType::F32, label)
    }

    /// `act(Wg·x) ⊙ Wu·x` for each chosen expert: `[m, e, n]`.
    pub fn moe_up_gate(
        &mut self,
        gate: NodeId,
        up: NodeId,
        x: NodeId,
        experts: NodeId,
        act: Activation,
        precision: Precision,
    ) -> NodeId {
        let (ng, nx, ne) = (self.ne(gate), self.ne(x), self.ne(experts));
        assert_eq!(ng, self.ne(up), "moe_up_gate: gate and up differ");
        assert_eq!(ng[0], nx[0], "moe_up_gate: k");
        assert_eq!(nx[1], ne[1], "moe_up_gate: tokens");
        let label = self.node(up).label.as_ref().map(|l| l.trim_end_matches(".weight").to_string());
        let srcs = vec![gate, up, x, experts];
        self.push(Op::MoeUpGate { act, precision }, srcs, [ng[1], ne[0], ne[1], 1], DType::F32, label)
    }

    /// `Σ_j weights[j] · y[:, j]`: `[m, n]`.
    pub fn expert_sum(&mut self, y: NodeId, weights: NodeId) -> NodeId {
        let (ny, nw) = (self.ne(y), self.ne(weights));
        assert_eq!([ny[1], ny[2]], [nw[0], nw[1]], "expert_sum: one weight per slot");
        self.push(Op::ExpertSum, vec![y, weights], [ny[0], ny[2], 1, 1], DType::F32, None)
    }

    /// For each node, the index of the last node that reads it (`None` if
    /// nothing does). Memory planners free a tensor after its last reader.
    pub fn last_uses(&self) -> Vec<Option<NodeId>> {
        let mut last = vec![None; self.nodes.len()];
        for (i, n) in self.nodes.iter().enumerate() {
            for s in &n.srcs {
                last[s.index()] = Some(NodeId(i as u32));
            }
        }
        last
    }
}
