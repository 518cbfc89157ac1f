//! The operations a model graph is made of. Each variant carries its own typed
//! parameters; a new operation is a new variant, never a string.

/// Per-step inputs that the engine fills before running a graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InputKind {
    /// Token ids, i32 `[n_tokens]`.
    Tokens,
    /// Absolute positions of the tokens, i32 `[n_tokens]`.
    Positions,
    /// Indices of the rows whose logits are wanted, i32 `[n_outputs]`.
    OutputRows,
    /// A multi-sequence batch's cache regions, i32 `[n_tokens]`: the cache
    /// row that holds position 0 of each token's sequence (its slot).
    SeqStarts,
}

/// Which half of a layer's KV cache a leaf refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvKind {
    K,
    V,
}

/// How RoPE pairs dimensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeMode {
    /// Adjacent pairs `(2i, 2i+1)` (llama).
    Norm,
    /// Rotate-half pairs `(i, i + n_rot/2)` (GPT-NeoX, BitNet).
    Neox,
}

/// Rotary embedding parameters, including the scaling a GGUF may declare.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    pub mode: RopeMode,
    /// Rotated dimensions per head (≤ head_dim).
    pub n_rot: usize,
    pub head_dim: usize,
    pub freq_base: f32,
    /// Linear position scale (1 / `rope.scaling.factor`), 1.0 when unscaled.
    pub freq_scale: f32,
    /// YaRN's blend of interpolated and extrapolated frequencies, when the
    /// file declares `rope.scaling.type` yarn.
    pub yarn: Option<Yarn>,
}

/// YaRN (Peng et al. 2023): pairs that turn fewer than `beta_slow` times over
/// the original context are interpolated (`freq_scale`), pairs that turn more
/// than `beta_fast` times keep their frequency, a linear ramp in between; the
/// rotated values are multiplied by `magnitude`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    /// The context the model was trained on before scaling.
    pub n_ctx_orig: usize,
    pub beta_fast: f32,
    pub beta_slow: f32,
    /// How much of the ramp applies (1 for YaRN).
    pub ext_factor: f32,
    /// The factor on cos and sin.
    pub magnitude: f32,
}

/// Pointwise activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `x * sigmoid(x)`.
    Silu,
    /// `relu(x)^2` (BitNet b1.58).
    Relu2,
}

/// What a matrix multiplication does with its activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    /// Quantize activations to the int8 type that the weight format pairs with
    /// (float weights keep float activations).
    Paired,
    /// Keep activations in f32 whatever the weight format (output heads).
    Float,
}

/// Attention over a layer's KV cache. The op first stores the new keys and
/// values at positions `kv_pos..kv_pos + n_tokens`, then lets token `i`
/// attend causally to cache rows `0..=kv_pos + i`.
///
/// A multi-sequence batch (the op's optional last source, `SeqStarts`)
/// ignores `kv_pos`: token `i` at position `pos[i]` of the sequence whose
/// region starts at cache row `start[i]` stores at row `start[i] + pos[i]`
/// and attends to rows `start[i] ..= start[i] + pos[i]`, so sequences never
/// see each other's rows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionParams {
    pub layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub scale: f32,
    /// Cache position of the first token of this batch (0 and unused in a
    /// multi-sequence batch).
    pub kv_pos: usize,
}

/// How a router turns its logits into expert scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gating {
    /// Softmax over all experts (Qwen3-MoE, DeepSeek-V2).
    Softmax,
    /// A sigmoid per expert (DeepSeek-V3).
    Sigmoid,
}

/// Group-limited routing (DeepSeek-V3): experts form `count` equal groups,
/// a group scores the sum of its two best experts, and only the `used` best
/// groups' experts may be chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertGroups {
    pub count: usize,
    pub used: usize,
}

/// A mixture-of-experts router: which `k` of `n_expert` experts each token
/// uses, and with what weights.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RouteParams {
    pub n_expert: usize,
    /// Experts used per token.
    pub k: usize,
    pub gating: Gating,
    /// A per-expert bias (`exp_probs_b`) is added to the scores for the
    /// choice only; the weights use the unbiased scores.
    pub biased: bool,
    pub groups: Option<ExpertGroups>,
    /// Renormalise the chosen weights to sum 1.
    pub norm: bool,
    /// Multiplies the weights (after any renormalisation).
    pub scale: f32,
}

/// Per-head matrix products with a weight that holds one block of rows per
/// head (`stride` rows apart; a 3-D `[k, rows, n_head]` weight has
/// `stride` = rows): head `h` uses rows `h·stride + offset ..+ len`.
/// Multi-head latent attention absorbs its key and value up-projections
/// into the queries and the output with these.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadMatMul {
    pub n_head: usize,
    pub stride: usize,
    pub offset: usize,
    pub len: usize,
    /// `false`: `y_h [len] = W_h · x_h` with `x_h [ne0]`; `true`:
    /// `y_h [ne0] = W_hᵀ · x_h` with `x_h [len]`.
    pub transposed: bool,
}

/// Attention in a compressed latent space (DeepSeek's MLA, absorbed form):
/// one cache row per token holds the normalised latent `c [rank]` and the
/// roped key part `k_pe [rope]`; a head's score is `q_lat·c + q_pe·k_pe`,
/// and its output is the softmax-weighted sum of the latents.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LatentAttentionParams {
    pub layer: usize,
    pub n_head: usize,
    /// The latent's width (`kv_lora_rank`).
    pub rank: usize,
    /// The rope part's width.
    pub rope: usize,
    pub scale: f32,
    /// Cache position of the first token of this batch (0 and unused in a
    /// multi-sequence batch, as [`AttentionParams::kv_pos`]).
    pub kv_pos: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// A model weight (leaf), by index into the model's weight table.
    Weight(usize),
    /// A per-step input (leaf).
    Input(InputKind),
    /// A layer's K or V cache (leaf): `[head_dim * n_head_kv, n_ctx]`.
    KvCache { layer: usize, kind: KvKind },
    /// `srcs = [table [ne0, rows], ids [n]]` → f32 `[ne0, n]`.
    GetRows,
    /// `srcs = [x [n, rows]]`, normalised over `ne[0]`.
    RmsNorm { eps: f32 },
    /// `srcs = [x [head_dim * n_heads, n_tokens], w [head_dim]]` → each head's
    /// `head_dim` slice RMS-normalised and multiplied by `w` (Qwen3's q/k norms,
    /// applied before rope).
    HeadNorm { eps: f32, head_dim: usize },
    /// Elementwise product; `srcs[1]` broadcasts over rows when it has one row.
    Mul,
    /// Elementwise sum; `srcs[1]` broadcasts over rows when it has one row.
    Add,
    /// `x * factor`.
    Scale { factor: f32 },
    /// `srcs = [w [k, n], x [k, m]]` → `[n, m]`: y = W·x per column.
    MulMat { precision: Precision },
    /// `srcs = [x [head_dim * n_head, n_tokens], positions [n_tokens]]`, plus
    /// optionally per-pair frequency divisors `[n_rot / 2]` (Llama 3.1's `rope_freqs`).
    Rope(RopeParams),
    /// `srcs = [gate, up]` → `act(gate) * up`.
    GatedAct(Activation),
    /// `srcs = [q, k, v, k_cache, v_cache, positions]` → `[head_dim * n_head,
    /// n_tokens]`. Positions repeat `kv_pos..`; devices that replay captured
    /// work read them instead of the parameter. A multi-sequence batch adds
    /// `seq_starts [n_tokens]` (see [`AttentionParams`]).
    Attention(AttentionParams),
    /// `srcs = [x [width · g, n]]` → `[len · g, n]`: elements
    /// `start..start + len` of every piece of `width` (a head's slice).
    Columns { width: usize, start: usize, len: usize },
    /// `srcs = [w, x [k · n_head, n]]` → per head, see [`HeadMatMul`].
    MulMatHeads { mm: HeadMatMul, precision: Precision },
    /// `srcs = [q_lat [rank · n_head, n], q_pe [rope · n_head, n], c [rank, n],
    /// k_pe [rope, n], cache [rank + rope, n_ctx], positions]` → `[rank · n_head,
    /// n]`. Stores `[c | k_pe]` at the batch's positions, then attends causally;
    /// a multi-sequence batch adds `seq_starts [n]`, as `Attention`.
    LatentAttention(LatentAttentionParams),
    /// `srcs = [logits [n_expert, n], bias [n_expert] (when `biased`)]` → i32
    /// `[k, n]`: each token's chosen experts, best first.
    Route(RouteParams),
    /// `srcs = [logits [n_expert, n], experts [k, n]]` → `[k, n]`: the weights of
    /// the chosen experts.
    RouteWeights(RouteParams),
    /// `srcs = [w [k, m, n_expert], x [k, s, n], experts [e, n]]` → `[m, e, n]`:
    /// slot `j` of token `t` is `W[experts[j, t]] · x[:, j, t]` (`s` = `e`), or
    /// `· x[:, 0, t]` (`s` = 1, one input shared by the slots). ggml's MUL_MAT_ID.
    MulMatId { precision: Precision },
    /// `srcs = [gate [k, m, n_expert], up [k, m, n_expert], x [k, n],
    /// experts [e, n]]` → `[m, e, n]`: `act(Wg·x) ⊙ Wu·x` per chosen expert, the
    /// token's activation quantized once for both.
    MoeUpGate { act: Activation, precision: Precision },
    /// `srcs = [y [m, e, n], weights [e, n]]` → `[m, n]`: `Σ_j weights[j] · y[:, j]`.
    ExpertSum,
}

impl Op {
    /// Short lowercase name for profiles and plans.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Weight(_) => "weight",
            Op::Input(_) => "input",
            Op::KvCache { .. } => "kv_cache",
            Op::GetRows => "get_rows",
            Op::RmsNorm { .. } => "rms_norm",
            Op::HeadNorm { .. } => "head_norm",
            Op::Mul => "mul",
            Op::Add => "add",
            Op::Scale { .. } => "scale",
            Op::MulMat { .. } => "mul_mat",
            Op::Rope(_) => "rope",
            Op::GatedAct(_) => "gated_act",
            Op::Attention(_) => "attention",
            Op::Columns { .. } => "columns",
            Op::MulMatHeads { .. } => "mul_mat_heads",
            Op::LatentAttention(_) => "latent_attention",
            Op::Route(_) => "route",
            Op::RouteWeights(_) => "route_weights",
            Op::MulMatId { .. } => "mul_mat_id",
            Op::MoeUpGate { .. } => "moe_up_gate",
            Op::ExpertSum => "expert_sum",
        }
    }

    /// Leaves hold data that lives outside the per-step arena.
    pub fn is_leaf(&self) -> bool {
        matches!(self, Op::Weight(_) | Op::Input(_) | Op::KvCache { .. })
    }
}
