//! llama-quantize's file-type presets (`Q4_K_M`, `Q3_K_M`, `IQ4_XS`, ...):
//! which type each tensor gets, decided as mainline llama.cpp (3f545be,
//! `src/llama-quant.cpp`) decides it, so `tern quantize IN OUT Q4_K_M` writes
//! the same mix of types as `llama-quantize IN OUT Q4_K_M`.
//!
//! The decision, tensor by tensor, in llama-quantize's order (by layer, the
//! tensors outside any `blk.N.` first, then by name):
//!
//! 1. **Left alone**: vectors (one dimension above 1), names not ending in
//!    `weight`, norms (`_norm.weight`), the MoE router (`ffn_gate_inp`) and a
//!    list of small or positional tensors of other architectures
//!    ([`KEPT_SUBSTRINGS`]). 3-D expert tensors are quantized like matrices.
//! 2. **User types**: `--token-embedding-type` and `--output-tensor-type` win
//!    outright (no fallback).
//! 3. **The preset's base type**, adjusted by role unless `--pure`:
//!    - the output head, and the token embedding when tied to it: Q8_0 when
//!      its rows are not whole blocks of the base type (or on Falcon), else
//!      Q6_K (Q8_0 stays Q8_0);
//!    - the V-like attention projections (`attn_v`, `attn_qkv`, `attn_kv_b`),
//!      counted in order: Q2_K takes Q4_K when the GQA factor
//!      (`head_count / head_count_kv`, of layer 0) is at least 4, else Q3_K;
//!      Q3_K_M gives the first two Q5_K and the rest Q4_K; Q3_K_L Q5_K;
//!      IQ4_XS Q5_K at GQA 4 or more; Q4_K_M and Q5_K_M Q6_K on the
//!      "more bits" ones ([`more_bits`]); Q4_K_S Q5_K on the first four.
//!      A 70B-class model (80 layers with GQA on Llama, 80 on Qwen2, Deci
//!      and OLMo, 68 on Jais2) lifts Q3_K/Q4_K there to Q5_K, and a model of
//!      exactly 8 experts takes Q8_0 for them, whatever the preset;
//!    - `attn_k` is Q8_0 with 8 experts;
//!    - `ffn_down` (any tensor with `ffn_down` in its name: dense, shared
//!      and expert down projections), with its layer read from the name in
//!      MoE models and counted otherwise: Q2_K takes Q3_K; Q3_K_M Q5_K in the
//!      first 1/16 of the layers and Q4_K after (Q3_K on Falcon's plain
//!      layers); Q3_K_L Q5_K (Q4_K on Falcon); Q4_K_M Q6_K on the "more bits"
//!      layers (Falcon: Q6_K first 1/16, Q5_K "more bits", Q4_K); IQ4_XS Q5_K
//!      in the first 1/8 (no importance matrix in tern); Q5_K_M Q6_K on the
//!      "more bits" layers; Q4_K_S Q5_K in the first 1/8 (not Falcon);
//!    - `attn_output`: with 8 experts Q5_K for Q2_K, Q3_K_S, Q3_K_M, Q4_K_S,
//!      Q4_K_M and IQ4_XS; otherwise Q3_K for Q2_K, Q4_K for Q3_K_M, Q5_K for
//!      Q3_K_L (Falcon: only Q3_K_L, to Q4_K);
//!    - everything else (`attn_q`, MLA's `attn_q_a/b`, `attn_kv_a_mqa`,
//!      `attn_k_b`, `attn_v_b`, `ffn_gate`, `ffn_up`, expert and shared
//!      experts' gate and up) keeps the base type. (`attn_k_b` and `attn_v_b`
//!      are not V-like: mainline matches `attn_v.weight`, `attn_kv_b.weight`.)
//! 4. **Fallback**: when a row is not a whole number of the chosen type's
//!    blocks, Q2_K and Q3_K (and the ternary and Q2_0 types) become Q4_0,
//!    Q4_K Q5_0, Q5_K Q5_1, Q6_K Q8_0, IQ4_XS IQ4_NL; if the fallback's
//!    32-blocks do not fit either, F16. Other types have no fallback: the
//!    preset is refused, as llama-quantize refuses it.

use std::fmt;

use tern_gguf::{GgmlType, Metadata};

/// A type a preset chooses.
type Ty = GgmlType;

const F16: Ty = GgmlType::F16;
const Q4_0: Ty = GgmlType::Q4_0;
const Q5_0: Ty = GgmlType::Q5_0;
const Q5_1: Ty = GgmlType::Q5_1;
const Q8_0: Ty = GgmlType::Q8_0;
const Q4_K: Ty = GgmlType::Q4_K;
const Q5_K: Ty = GgmlType::Q5_K;
const Q6_K: Ty = GgmlType::Q6_K;
const IQ4_NL: Ty = GgmlType::IQ4_NL;
const Q2_K: Ty = GgmlType::Q2_K;
const Q3_K: Ty = GgmlType::Q3_K;
const IQ4_XS: Ty = GgmlType::IQ4_XS;

/// llama-quantize's presets that tern takes (the k-quant family, IQ4_XS and
/// Q8_0); each is a `llama_ftype`.
#[allow(non_camel_case_types)] // llama-quantize's names
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    Q2_K,
    Q3_K_S,
    Q3_K_M,
    Q3_K_L,
    Q4_K_S,
    Q4_K_M,
    Q5_K_S,
    Q5_K_M,
    Q6_K,
    IQ4_XS,
    Q8_0,
}

impl Preset {
    pub const ALL: [Preset; 11] = [
        Preset::Q2_K,
        Preset::Q3_K_S,
        Preset::Q3_K_M,
        Preset::Q3_K_L,
        Preset::Q4_K_S,
        Preset::Q4_K_M,
        Preset::Q5_K_S,
        Preset::Q5_K_M,
        Preset::Q6_K,
        Preset::IQ4_XS,
        Preset::Q8_0,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Preset::Q2_K => "Q2_K",
            Preset::Q3_K_S => "Q3_K_S",
            Preset::Q3_K_M => "Q3_K_M",
            Preset::Q3_K_L => "Q3_K_L",
            Preset::Q4_K_S => "Q4_K_S",
            Preset::Q4_K_M => "Q4_K_M",
            Preset::Q5_K_S => "Q5_K_S",
            Preset::Q5_K_M => "Q5_K_M",
            Preset::Q6_K => "Q6_K",
            Preset::IQ4_XS => "IQ4_XS",
            Preset::Q8_0 => "Q8_0",
        }
    }

    /// Case-insensitive (`q4_k_m`).
    pub fn from_name(s: &str) -> Option<Preset> {
        Preset::ALL.into_iter().find(|p| p.name().eq_ignore_ascii_case(s))
    }

    /// The `general.file_type` (`llama_ftype`) llama-quantize records.
    pub fn file_type(self) -> u32 {
        match self {
            Preset::Q8_0 => 7,
            Preset::Q2_K => 10,
            Preset::Q3_K_S => 11,
            Preset::Q3_K_M => 12,
            Preset::Q3_K_L => 13,
            Preset::Q4_K_S => 14,
            Preset::Q4_K_M => 15,
            Preset::Q5_K_S => 16,
            Preset::Q5_K_M => 17,
            Preset::Q6_K => 18,
            Preset::IQ4_XS => 30,
        }
    }

    /// The type every quantized tensor starts from.
    pub fn base(self) -> Ty {
        match self {
            Preset::Q2_K => Q2_K,
            Preset::Q3_K_S | Preset::Q3_K_M | Preset::Q3_K_L => Q3_K,
            Preset::Q4_K_S | Preset::Q4_K_M => Q4_K,
            Preset::Q5_K_S | Preset::Q5_K_M => Q5_K,
            Preset::Q6_K => Q6_K,
            Preset::IQ4_XS => IQ4_XS,
            Preset::Q8_0 => Q8_0,
        }
    }
}

/// llama.cpp's name for a `general.file_type` value (`llama_ftype`, as
/// llama-quantize spells its presets), for `tern info`.
pub fn file_type_name(ft: u64) -> Option<&'static str> {
    Some(match ft {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        19 => "IQ2_XXS",
        20 => "IQ2_XS",
        21 => "Q2_K_S",
        22 => "IQ3_XS",
        23 => "IQ3_XXS",
        24 => "IQ1_S",
        25 => "IQ4_NL",
        26 => "IQ3_S",
        27 => "IQ3_M",
        28 => "IQ2_S",
        29 => "IQ2_M",
        30 => "IQ4_XS",
        31 => "IQ1_M",
        32 => "BF16",
        36 => "TQ1_0",
        37 => "TQ2_0",
        38 => "MXFP4_MOE",
        39 => "NVFP4",
        40 => "Q1_0",
        41 => "Q2_0",
        _ => return None,
    })
}

/// The hyper-parameters the choice reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelFacts {
    pub arch: String,
    /// `block_count`.
    pub n_layer: u32,
    /// `expert_count`, 0 for a dense model.
    pub n_expert: u32,
    /// `attention.head_count` of layer 0.
    pub n_head: u32,
    /// `attention.head_count_kv` of layer 0 (`n_head` when absent).
    pub n_head_kv: u32,
}

impl ModelFacts {
    pub fn of(md: &Metadata) -> Result<ModelFacts, ChoiceError> {
        let arch = md.str("general.architecture").map_err(|e| ChoiceError::Metadata(e.to_string()))?.to_string();
        // A per-layer array counts by its first layer, as llama's `n_gqa()`.
        let first = |key: &str| -> Result<Option<u32>, ChoiceError> {
            let key = format!("{arch}.{key}");
            let bad = |why: &str| ChoiceError::Metadata(format!("{key}: {why}"));
            let Some(v) = md.get(&key) else { return Ok(None) };
            let x = match v.as_array() {
                Some(a) => a.as_i64s().ok_or_else(|| bad("not integers"))?.first().copied().unwrap_or(0),
                None => v.as_i64().ok_or_else(|| bad("not an integer"))?,
            };
            u32::try_from(x).map(Some).map_err(|_| bad(&format!("{x} out of range")))
        };
        let n_layer =
            first("block_count")?.ok_or_else(|| ChoiceError::Metadata(format!("{arch}.block_count missing")))?;
        let n_head = first("attention.head_count")?.unwrap_or(0);
        Ok(ModelFacts {
            n_layer,
            n_expert: first("expert_count")?.unwrap_or(0),
            n_head,
            n_head_kv: first("attention.head_count_kv")?.unwrap_or(n_head),
            arch,
        })
    }

    /// Query heads per KV head (0 without KV heads).
    fn gqa(&self) -> u32 {
        self.n_head.checked_div(self.n_head_kv).unwrap_or(0)
    }

    fn falcon(&self) -> bool {
        self.arch == "falcon"
    }

    /// llama.cpp's `LLM_TYPE_70B`, the one model size its presets look at.
    fn is_70b(&self) -> bool {
        match self.arch.as_str() {
            "llama" => self.n_expert != 8 && self.n_layer == 80 && self.n_head != self.n_head_kv,
            "qwen2" | "deci" | "olmo" => self.n_layer == 80,
            "jais2" => self.n_layer == 68,
            _ => false,
        }
    }
}

/// A tensor as the choice sees it.
#[derive(Clone, Copy, Debug)]
pub struct Tensor<'a> {
    pub name: &'a str,
    /// ggml order: `dims[0]` is the row length.
    pub dims: &'a [u64],
}

/// What the user set beside the preset.
#[derive(Clone, Copy, Debug, Default)]
pub struct Overrides {
    pub token_embd: Option<Ty>,
    pub output: Option<Ty>,
    /// No role adjustments: every quantized tensor takes the base type (with
    /// the fallback), except where the two types above say otherwise.
    pub pure: bool,
}

/// One tensor's outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pick {
    /// Copied in the file's type.
    Keep,
    To(Ty),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChoiceError {
    /// The chosen type does not fit the rows and has no fallback.
    NoFallback {
        tensor: String,
        ty: Ty,
        row: u64,
    },
    /// An MoE model's FFN tensor whose layer cannot be read from its name.
    NoLayer {
        tensor: String,
        n_layer: u32,
    },
    Metadata(String),
}

impl fmt::Display for ChoiceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChoiceError::NoFallback { tensor, ty, row } => write!(
                f,
                "{tensor}: rows of {row} are not whole {ty} blocks of {}, and {ty} has no fallback type",
                ty.block_elems() as u64
            ),
            ChoiceError::NoLayer { tensor, n_layer } => {
                write!(f, "{tensor}: no layer below {n_layer} in the name (blk.N.)")
            }
            ChoiceError::Metadata(why) => write!(f, "metadata: {why}"),
        }
    }
}

/// Substrings (and whole names) of tensors llama-quantize never quantizes,
/// beside norms and the router: small or positional tensors of other
/// architectures (Gemma 3n, Mamba, RWKV, T5, vision and audio encoders).
pub const KEPT_SUBSTRINGS: [&str; 32] = [
    "ffn_gate_inp.weight",
    "ffn_gate_tid2eid.weight",
    "altup",
    "laurel",
    "per_layer_model_proj",
    "ssm_conv1d",
    "shortconv.conv.weight",
    "indexer.k_proj.weight",
    "indexer.q_proj.weight",
    "time_mix_first.weight",
    "time_mix_w0.weight",
    "time_mix_w1.weight",
    "time_mix_w2.weight",
    "time_mix_v0.weight",
    "time_mix_v1.weight",
    "time_mix_v2.weight",
    "time_mix_a0.weight",
    "time_mix_a1.weight",
    "time_mix_a2.weight",
    "time_mix_g1.weight",
    "time_mix_g2.weight",
    "time_mix_decay_w1.weight",
    "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight",
    "attn_rel_b.weight",
    ".position_embd",
    "sam.pos_embd",
    "sam.neck.",
    "sam.net_",
    ".rel_pos",
    ".patch_embd",
    ".patch_merger",
];

/// Audio codebooks, kept as well.
const KEPT_AUDIO: [&str; 2] = ["a.rvq.codebook", "mm.a.code_embd"];

/// Whether llama-quantize would quantize this tensor at all.
pub fn quantizable(t: &Tensor) -> bool {
    // ggml's dimension count ignores trailing dimensions of 1.
    let n_dims = t.dims.iter().rposition(|&d| d > 1).map_or(1, |i| i + 1);
    let n = t.name;
    n_dims >= 2
        && n.ends_with("weight")
        && !n.contains("_norm.weight")
        && n != "position_embd.weight"
        && n != "token_types.weight"
        && !KEPT_SUBSTRINGS.iter().chain(&KEPT_AUDIO).any(|s| n.contains(s))
}

/// A tensor's role, by the first pattern its name matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Output,
    TokenEmbd,
    /// `attn_qkv`, `attn_kv_b`, `attn_v`: the values' projections.
    VLike,
    AttnK,
    AttnOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Other,
}

fn role(name: &str) -> Role {
    if name == "output.weight" {
        return Role::Output;
    }
    if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
        return Role::TokenEmbd;
    }
    let has = |s: &str| name.contains(s);
    if has("attn_qkv.weight") || has("attn_kv_b.weight") || has("attn_v.weight") {
        Role::VLike
    } else if has("attn_k.weight") {
        Role::AttnK
    } else if has("attn_q.weight") {
        Role::Other // no rule for the presets tern takes
    } else if has("attn_output.weight") {
        Role::AttnOutput
    } else if has("ffn_up") {
        Role::FfnUp
    } else if has("ffn_gate") {
        Role::FfnGate
    } else if has("ffn_down") {
        Role::FfnDown
    } else {
        Role::Other
    }
}

/// The layer of `blk.N.…`, read as C's `sscanf("blk.%d.")` reads it.
fn layer_of(name: &str) -> Option<i64> {
    let rest = name.strip_prefix("blk.")?.trim_start();
    let digits_from = usize::from(rest.starts_with(['+', '-']));
    let end = rest[digits_from..].find(|c: char| !c.is_ascii_digit()).map_or(rest.len(), |i| i + digits_from);
    if end == digits_from {
        return None;
    }
    rest[..end].parse().ok()
}

/// The "more bits" layers of the mixed presets: the first and last eighth,
/// and every third layer between.
pub fn more_bits(i: i64, n: i64) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// Counters llama-quantize keeps while it walks the tensors.
struct Walk<'a> {
    preset: Preset,
    facts: &'a ModelFacts,
    over: Overrides,
    /// No `output.weight`: the embedding is the head.
    tied: bool,
    n_vlike: i64,
    i_vlike: i64,
    i_down: i64,
    i_gate: i64,
    i_up: i64,
}

impl Walk<'_> {
    fn pick(&mut self, t: &Tensor) -> Result<Pick, ChoiceError> {
        if !quantizable(t) {
            return Ok(Pick::Keep);
        }
        let role = role(t.name);
        match (role, self.over.token_embd, self.over.output) {
            (Role::TokenEmbd, Some(ty), _) | (Role::Output, _, Some(ty)) => return Ok(Pick::To(ty)),
            _ => {}
        }
        let mut ty = self.preset.base();
        if !self.over.pure {
            ty = self.adjust(t, role, ty)?;
        }
        fallback(t, ty).map(Pick::To)
    }

    /// The role-specific choice, starting from the base type `ty`.
    fn adjust(&mut self, t: &Tensor, role: Role, ty: Ty) -> Result<Ty, ChoiceError> {
        use Preset as P;
        let (p, f) = (self.preset, self.facts);
        if role == Role::Output || (self.tied && role == Role::TokenEmbd) {
            return Ok(match self.over.output {
                Some(o) => o,
                None if f.falcon() || !t.dims[0].is_multiple_of(ty.block_elems() as u64) => Q8_0,
                None if ty == Q8_0 => Q8_0,
                None => Q6_K,
            });
        }
        Ok(match role {
            Role::TokenEmbd | Role::Other => ty,
            Role::VLike => {
                let (i, n) = (self.i_vlike, self.n_vlike);
                self.i_vlike += 1;
                let mut v = match p {
                    P::Q2_K if f.gqa() >= 4 => Q4_K,
                    P::Q2_K => Q3_K,
                    P::Q3_K_M if i < 2 => Q5_K,
                    P::Q3_K_M => Q4_K,
                    P::Q3_K_L => Q5_K,
                    P::IQ4_XS if f.gqa() >= 4 => Q5_K,
                    P::Q4_K_M | P::Q5_K_M if more_bits(i, n) => Q6_K,
                    P::Q4_K_S if i < 4 => Q5_K,
                    _ => ty,
                };
                // A 70B's eight query heads share each V row: more bits there cost little.
                if f.is_70b() && (v == Q3_K || v == Q4_K) {
                    v = Q5_K;
                }
                if f.n_expert == 8 {
                    v = Q8_0;
                }
                v
            }
            Role::AttnK if f.n_expert == 8 => Q8_0,
            Role::AttnK => ty,
            Role::AttnOutput => match p {
                _ if f.falcon() => {
                    if p == P::Q3_K_L {
                        Q4_K
                    } else {
                        ty
                    }
                }
                P::Q2_K | P::Q3_K_S | P::Q3_K_M | P::Q4_K_S | P::Q4_K_M | P::IQ4_XS if f.n_expert == 8 => Q5_K,
                _ if f.n_expert == 8 => ty,
                P::Q2_K => Q3_K,
                P::Q3_K_M => Q4_K,
                P::Q3_K_L => Q5_K,
                _ => ty,
            },
            Role::FfnDown => {
                let i = self.layer(t, self.i_down)?;
                let n = i64::from(f.n_layer);
                self.i_down += 1;
                let falcon = f.falcon();
                match p {
                    P::Q2_K => Q3_K,
                    P::Q3_K_M if i < n / 16 => Q5_K,
                    P::Q3_K_M if !falcon || more_bits(i, n) => Q4_K,
                    P::Q3_K_M => Q3_K,
                    P::Q3_K_L if falcon => Q4_K,
                    P::Q3_K_L => Q5_K,
                    P::Q4_K_M if falcon && i < n / 16 => Q6_K,
                    P::Q4_K_M if falcon && more_bits(i, n) => Q5_K,
                    P::Q4_K_M if falcon => Q4_K,
                    P::Q4_K_M if more_bits(i, n) => Q6_K,
                    // llama-quantize does this only without an importance matrix, which tern never has.
                    P::IQ4_XS if i < n / 8 => Q5_K,
                    P::Q5_K_M if more_bits(i, n) => Q6_K,
                    P::Q4_K_S if !falcon && i < n / 8 => Q5_K,
                    _ => ty,
                }
            }
            // No rule for these presets, but llama-quantize still reads (and checks) the layer.
            Role::FfnGate => {
                self.layer(t, self.i_gate)?;
                self.i_gate += 1;
                ty
            }
            Role::FfnUp => {
                self.layer(t, self.i_up)?;
                self.i_up += 1;
                ty
            }
            Role::Output => unreachable!("handled above"),
        })
    }

    /// An FFN tensor's layer: from its name in an MoE model (experts need not
    /// come in layer order), else the count of such tensors so far.
    fn layer(&self, t: &Tensor, counted: i64) -> Result<i64, ChoiceError> {
        if self.facts.n_expert <= 1 {
            return Ok(counted);
        }
        let n_layer = self.facts.n_layer;
        match layer_of(t.name) {
            Some(i) if (0..i64::from(n_layer)).contains(&i) => Ok(i),
            _ => Err(ChoiceError::NoLayer { tensor: t.name.to_string(), n_layer }),
        }
    }
}

/// A type whose blocks fit the rows: `ty` itself, its smaller-block stand-in, or F16.
fn fallback(t: &Tensor, ty: Ty) -> Result<Ty, ChoiceError> {
    let row = t.dims[0];
    if row.is_multiple_of(ty.block_elems() as u64) {
        return Ok(ty);
    }
    let instead = match ty {
        Q2_K | Q3_K => Q4_0,
        GgmlType::TQ1_0 | GgmlType::TQ2_0 | GgmlType::Q2_0 => Q4_0,
        GgmlType::Q4_K => Q5_0,
        GgmlType::Q5_K => Q5_1,
        GgmlType::Q6_K => Q8_0,
        IQ4_XS => IQ4_NL,
        _ => return Err(ChoiceError::NoFallback { tensor: t.name.to_string(), ty, row }),
    };
    Ok(if row.is_multiple_of(instead.block_elems() as u64) { instead } else { F16 })
}

/// Every tensor's outcome under `preset`, in the order given.
pub fn choose(
    preset: Preset,
    facts: &ModelFacts,
    tensors: &[Tensor],
    over: Overrides,
) -> Result<Vec<Pick>, ChoiceError> {
    let mut walk = Walk {
        preset,
        facts,
        over,
        tied: !tensors.iter().any(|t| role(t.name) == Role::Output),
        n_vlike: tensors.iter().filter(|t| role(t.name) == Role::VLike).count() as i64,
        i_vlike: 0,
        i_down: 0,
        i_gate: 0,
        i_up: 0,
    };
    // llama-quantize's order: by layer (tensors outside the blocks first), then by name.
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by(|&a, &b| {
        let key = |t: &Tensor| layer_of(t.name).unwrap_or(-1);
        key(&tensors[a]).cmp(&key(&tensors[b])).then_with(|| tensors[a].name.cmp(tensors[b].name))
    });
    let mut picks = vec![Pick::Keep; tensors.len()];
    for i in order {
        picks[i] = walk.pick(&tensors[i])?;
    }
    Ok(picks)
}

#[cfg(test)]
mod tests;
