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
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionParams {
    pub layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub scale: f32,
    /// Cache position of the first token of this batch.
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
    /// work read them instead of the parameter.
    Attention(AttentionParams),
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
        }
    }

    /// Leaves hold data that lives outside the per-step arena.
    pub fn is_leaf(&self) -> bool {
        matches!(self, Op::Weight(_) | Op::Input(_) | Op::KvCache { .. })
    }
}
