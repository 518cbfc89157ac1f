//! The kernel sources embedded in the binary, and the typed table of every
//! kernel function once its module is compiled and loaded.
//!
//! The modules compile side by side on threads; the persistent decoding
//! kernel's three modules (`decode`, `decode_long`, `decode_grouped`) only
//! when `decode_run` is on.

use std::path::Path;

use cudarc::driver::sys;

use crate::driver::Gpu;
use crate::error::CudaError;
use crate::nvrtc;

const PRELUDE: &str = include_str!("../kernels/prelude.cuh");

/// decode_run's sources, in the order they build on each other.
macro_rules! decode_sources {
    () => {
        concat!(
            include_str!("../kernels/quantize.cu"),
            include_str!("../kernels/ternary.cu"),
            include_str!("../kernels/attention.cu"),
            include_str!("../kernels/decode_table.cu"),
            include_str!("../kernels/decode_ring.cu"),
            include_str!("../kernels/decode_gemv.cu"),
            include_str!("../kernels/decode_attention.cu"),
            include_str!("../kernels/decode_attention_kv.cu"),
            include_str!("../kernels/decode.cu")
        )
    };
}

/// Kernel source files (`kernels/*.cu`), each compiled to one module.
pub const SOURCES: &[(&str, &str)] = &[
    ("elementwise", include_str!("../kernels/elementwise.cu")),
    ("quantize", include_str!("../kernels/quantize.cu")),
    ("ternary", concat!(include_str!("../kernels/ternary.cu"), include_str!("../kernels/ternary_wgmma.cu"))),
    // The int8-activation products, the experts' and latent attention's
    // per-head products build on fmat.cu's level arithmetic.
    (
        "fmat",
        concat!(
            include_str!("../kernels/fmat.cu"),
            include_str!("../kernels/paired.cu"),
            include_str!("../kernels/q4k.cu"),
            include_str!("../kernels/experts.cu"),
            include_str!("../kernels/levels_mma.cu"),
            include_str!("../kernels/mla.cu")
        ),
    ),
    (
        "attention",
        concat!(
            include_str!("../kernels/attention.cu"),
            include_str!("../kernels/flash_attn.cu"),
            include_str!("../kernels/mla_mma.cu")
        ),
    ),
    ("route", include_str!("../kernels/route.cu")),
    // The persistent decoding kernel calls into the three files before it.
    (DECODE_MODULE, decode_sources!()),
    // The same for caches past LONG_CACHE_KEYS: attention cut into chunks
    // (decode_attention.cu). A module of its own because that path's code,
    // even unused, costs the short-cache kernel registers, and speed.
    (DECODE_LONG_MODULE, concat!("#define DEC_LONG_CACHES 1\n", decode_sources!())),
    // And from GROUP_CACHE_KEYS keys with grouped q heads: a block per KV
    // head and chunk (decode_attention_kv.cu).
    (DECODE_GROUPED_MODULE, concat!("#define DEC_LONG_CACHES 2\n", decode_sources!())),
];

/// The full text NVRTC compiles for source `name`: the prelude, then the file.
pub fn full_source(body: &str) -> String {
    format!("{PRELUDE}\n{body}")
}

/// Every kernel entry point, by module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    GetRows,
    RmsNorm,
    Binary,
    Scale,
    GatedAct,
    Rope,
    NormQuant,
    /// `norm_quant` of act(gate) · up, formed as each row is staged.
    GatedNormQuant,
    TernaryGemv,
    TernaryGemv1,
    /// gate/up for one token at `k_pad` ≤ `PAIR_MAX_K_PAD`: two row pairs a warp.
    TernaryGemv1Pair,
    /// The prompt GEMM, 256-row tiles, one scale a row.
    TernaryGemm,
    /// The prompt GEMM for a scale per 256-chunk, 128-row tiles.
    TernaryGemmGrouped,
    /// The prompt GEMM on sm_90a's warpgroup MMA, fed by bulk tensor
    /// copies (`ternary_wgmma.cu`); one scale a row. 192-row blocks.
    TernaryGemmWg,
    /// `TernaryGemmWg` on 128-row blocks (two warpgroups); lowering takes
    /// the shape whose rounds of blocks over the SMs cost less.
    TernaryGemmWgNarrow,
    FmatGemv,
    Q8Gemv,
    /// `Q8Gemv` for one token, with fewer registers (more warps in flight).
    Q8Gemv1,
    /// The two for levels with an offset per 16 (`QLayout::LevelsOffset`).
    Q8oGemv,
    Q8oGemv1,
    /// f32 activations to Q8_0 or Q8_K blocks, as the CPU quantizes them (paired.cu).
    ActQ8,
    /// Levels (with or without offsets) times int8 activations (`Precision::Paired`).
    Q8pGemv,
    Q8pGemv1,
    /// `Q8pGemv1` quantizing x in each block's shared memory (no `ActQ8`).
    Q8pGemv1x,
    /// `Q8pGemv1x` of a gate/up pair with the activation (paired.cu).
    Q8pGemv1xPair,
    /// One token's products of Q4_K weights in the file's blocks (q4k.cu),
    /// x quantized in each block; alone and as a gated pair.
    Q4kGemv1x,
    Q4kGemv1xPair,
    /// Q6_K planes (`qlayout.rs`) times f32 activations, up to 8 tokens.
    Q6KGemv,
    /// `Q6KGemv` for one token (the decoding head), with fewer registers.
    Q6KGemv1,
    /// One token's Q6_K product with Q8_K activations, the CPU's integers
    /// (`Precision::Paired`); its blocks walk the rows.
    Q6KGemv1Q8,
    F16Gemv,
    F32Gemv,
    GetRowsQ8,
    GetRowsQ6K,
    /// A batch's (token, slot) pairs grouped by chosen expert (experts.cu).
    MoePlan,
    /// The chosen experts' rows times their pairs' activations: int8 levels,
    /// levels with offsets, stored floats; each also as a gated pair
    /// (`Op::MoeUpGate`).
    MoeQ8,
    MoeQ8Pair,
    MoeQ8o,
    MoeQ8oPair,
    MoeDq,
    MoeDqPair,
    /// The levels' two and pairs with int8 activations.
    MoeQ8p,
    MoeQ8pPair,
    MoeQ8op,
    MoeQ8opPair,
    /// The four with int8 activations for one token, quantized by each
    /// block in shared memory (no `ActQ8` launch).
    MoeQ8pX,
    MoeQ8pPairX,
    MoeQ8opX,
    MoeQ8opPairX,
    /// One token's expert GEMVs over the file's Q4_K blocks.
    MoeQ4kX,
    MoeQ4kPairX,
    /// Levels times int8 activations on tensor cores, dense or over a
    /// plan's expert items: levels, levels with offsets, each also as a
    /// gated pair (levels_mma.cu).
    Q8pMma,
    Q8pMmaO,
    Q8pMmaPair,
    Q8pMmaOPair,
    /// The four for scales that span 32 elements: a k32 mma per two groups.
    Q8pMma32,
    Q8pMmaO32,
    Q8pMmaPair32,
    Q8pMmaOPair32,
    /// Q6_K planes decoded to levels as they are staged (dense only).
    Q6KMma,
    /// Float weights times a batch past 8 tokens (64 × 64 tiles).
    F32Gemm,
    F16Gemm,
    KvStore,
    RopeStore,
    Attention,
    FlashAttn,
    /// FlashAttn with each block's key tiles split over two sets of warps.
    FlashAttnSplit,
    /// The two for head_dim 128.
    FlashAttn128,
    FlashAttnSplit128,
    /// A MoE router's choice (`route.cu`), a block per token; with the
    /// weights of the same logits when a RouteWeights is fused in.
    Route,
    RouteWeights,
    /// The experts' outputs summed by the router's weights.
    ExpertSum,
    /// Multi-head latent attention (mla.cu): a head's slice of a row, the
    /// per-head products (levels or stored floats; `T`: transposed), the
    /// latent cache store, attention in splits and their merge.
    Columns,
    HeadsQ8,
    HeadsQ8p,
    /// `HeadsQ8p` for one token, each block quantizing its head's slice.
    HeadsQ8pX,
    HeadsDq,
    HeadsQ8T,
    HeadsDqT,
    MlaStore,
    /// kv_a's rows normed and rotated into the latent cache, and q's heads
    /// split with q_pe rotated: the graph's columns, norm, ropes and store.
    MlaKvStore,
    MlaQSplit,
    MlaAttention,
    /// A prompt's latent attention on tensor cores (F16 caches).
    MlaAttentionMma,
    MlaMerge,
    CopyIn,
    /// A small copy from the device into mapped host memory, run as this
    /// kernel: its writes cross the link without a round trip each.
    HostWrite,
    /// A run of one-token launches as phases of one persistent kernel (`decode.rs`).
    DecodeRun,
    /// `DecodeRun` for caches past `decode::LONG_CACHE_KEYS`.
    DecodeRunLong,
    /// `DecodeRun` for caches of `decode::GROUP_CACHE_KEYS` keys or more
    /// with grouped q heads.
    DecodeRunGrouped,
}

impl Kernel {
    pub const ALL: [Kernel; 90] = [
        Kernel::GetRows,
        Kernel::RmsNorm,
        Kernel::Binary,
        Kernel::Scale,
        Kernel::GatedAct,
        Kernel::Rope,
        Kernel::NormQuant,
        Kernel::GatedNormQuant,
        Kernel::TernaryGemv,
        Kernel::TernaryGemv1,
        Kernel::TernaryGemv1Pair,
        Kernel::TernaryGemm,
        Kernel::TernaryGemmGrouped,
        Kernel::TernaryGemmWg,
        Kernel::TernaryGemmWgNarrow,
        Kernel::FmatGemv,
        Kernel::Q8Gemv,
        Kernel::Q8Gemv1,
        Kernel::Q8oGemv,
        Kernel::Q8oGemv1,
        Kernel::ActQ8,
        Kernel::Q8pGemv,
        Kernel::Q8pGemv1,
        Kernel::Q8pGemv1x,
        Kernel::Q8pGemv1xPair,
        Kernel::Q4kGemv1x,
        Kernel::Q4kGemv1xPair,
        Kernel::Q6KGemv,
        Kernel::Q6KGemv1,
        Kernel::Q6KGemv1Q8,
        Kernel::F16Gemv,
        Kernel::F32Gemv,
        Kernel::GetRowsQ8,
        Kernel::GetRowsQ6K,
        Kernel::MoePlan,
        Kernel::MoeQ8,
        Kernel::MoeQ8Pair,
        Kernel::MoeQ8o,
        Kernel::MoeQ8oPair,
        Kernel::MoeDq,
        Kernel::MoeDqPair,
        Kernel::MoeQ8p,
        Kernel::MoeQ8pPair,
        Kernel::MoeQ8op,
        Kernel::MoeQ8opPair,
        Kernel::MoeQ8pX,
        Kernel::MoeQ8pPairX,
        Kernel::MoeQ8opX,
        Kernel::MoeQ8opPairX,
        Kernel::MoeQ4kX,
        Kernel::MoeQ4kPairX,
        Kernel::Q8pMma,
        Kernel::Q8pMmaO,
        Kernel::Q8pMmaPair,
        Kernel::Q8pMmaOPair,
        Kernel::Q8pMma32,
        Kernel::Q8pMmaO32,
        Kernel::Q8pMmaPair32,
        Kernel::Q8pMmaOPair32,
        Kernel::Q6KMma,
        Kernel::F32Gemm,
        Kernel::F16Gemm,
        Kernel::KvStore,
        Kernel::RopeStore,
        Kernel::Attention,
        Kernel::FlashAttn,
        Kernel::FlashAttnSplit,
        Kernel::FlashAttn128,
        Kernel::FlashAttnSplit128,
        Kernel::Route,
        Kernel::RouteWeights,
        Kernel::ExpertSum,
        Kernel::Columns,
        Kernel::HeadsQ8,
        Kernel::HeadsQ8p,
        Kernel::HeadsQ8pX,
        Kernel::HeadsDq,
        Kernel::HeadsQ8T,
        Kernel::HeadsDqT,
        Kernel::MlaStore,
        Kernel::MlaKvStore,
        Kernel::MlaQSplit,
        Kernel::MlaAttention,
        Kernel::MlaAttentionMma,
        Kernel::MlaMerge,
        Kernel::CopyIn,
        Kernel::HostWrite,
        Kernel::DecodeRun,
        Kernel::DecodeRunLong,
        Kernel::DecodeRunGrouped,
    ];

    /// (source module, entry point).
    pub fn symbol(self) -> (&'static str, &'static str) {
        match self {
            Kernel::GetRows => ("elementwise", "get_rows"),
            Kernel::RmsNorm => ("elementwise", "rms_norm"),
            Kernel::Binary => ("elementwise", "binary"),
            Kernel::Scale => ("elementwise", "scale"),
            Kernel::GatedAct => ("elementwise", "gated_act"),
            Kernel::Rope => ("elementwise", "rope"),
            Kernel::NormQuant => ("quantize", "norm_quant"),
            Kernel::GatedNormQuant => ("quantize", "gated_norm_quant"),
            Kernel::TernaryGemv => ("ternary", "ternary_gemv"),
            Kernel::TernaryGemv1 => ("ternary", "ternary_gemv1"),
            Kernel::TernaryGemv1Pair => ("ternary", "ternary_gemv1_pair"),
            Kernel::TernaryGemm => ("ternary", "ternary_gemm"),
            Kernel::TernaryGemmGrouped => ("ternary", "ternary_gemm_grouped"),
            Kernel::TernaryGemmWg => ("ternary", "ternary_gemm_wg"),
            Kernel::TernaryGemmWgNarrow => ("ternary", "ternary_gemm_wg_narrow"),
            Kernel::FmatGemv => ("fmat", "fmat_gemv"),
            Kernel::Q8Gemv => ("fmat", "q8_gemv"),
            Kernel::Q8Gemv1 => ("fmat", "q8_gemv1"),
            Kernel::Q8oGemv => ("fmat", "q8o_gemv"),
            Kernel::Q8oGemv1 => ("fmat", "q8o_gemv1"),
            Kernel::ActQ8 => ("fmat", "act_q8"),
            Kernel::Q8pGemv => ("fmat", "q8p_gemv"),
            Kernel::Q8pGemv1 => ("fmat", "q8p_gemv1"),
            Kernel::Q8pGemv1x => ("fmat", "q8p_gemv1x"),
            Kernel::Q8pGemv1xPair => ("fmat", "q8p_gemv1x_pair"),
            Kernel::Q4kGemv1x => ("fmat", "q4k_gemv1x"),
            Kernel::Q4kGemv1xPair => ("fmat", "q4k_gemv1x_pair"),
            Kernel::F16Gemv => ("fmat", "f16_gemv"),
            Kernel::F32Gemv => ("fmat", "f32_gemv"),
            Kernel::GetRowsQ8 => ("fmat", "get_rows_q8"),
            Kernel::Q6KGemv => ("fmat", "q6k_gemv"),
            Kernel::Q6KGemv1 => ("fmat", "q6k_gemv1"),
            Kernel::Q6KGemv1Q8 => ("fmat", "q6k_gemv1_q8"),
            Kernel::GetRowsQ6K => ("fmat", "get_rows_q6k"),
            Kernel::MoePlan => ("fmat", "moe_plan"),
            Kernel::MoeQ8 => ("fmat", "moe_q8"),
            Kernel::MoeQ8Pair => ("fmat", "moe_q8_pair"),
            Kernel::MoeQ8o => ("fmat", "moe_q8o"),
            Kernel::MoeQ8oPair => ("fmat", "moe_q8o_pair"),
            Kernel::MoeDq => ("fmat", "moe_dq"),
            Kernel::MoeDqPair => ("fmat", "moe_dq_pair"),
            Kernel::MoeQ8p => ("fmat", "moe_q8p"),
            Kernel::MoeQ8pPair => ("fmat", "moe_q8p_pair"),
            Kernel::MoeQ8op => ("fmat", "moe_q8op"),
            Kernel::MoeQ8opPair => ("fmat", "moe_q8op_pair"),
            Kernel::MoeQ8pX => ("fmat", "moe_q8p_x"),
            Kernel::MoeQ8pPairX => ("fmat", "moe_q8p_pair_x"),
            Kernel::MoeQ8opX => ("fmat", "moe_q8op_x"),
            Kernel::MoeQ8opPairX => ("fmat", "moe_q8op_pair_x"),
            Kernel::MoeQ4kX => ("fmat", "moe_q4k_x"),
            Kernel::MoeQ4kPairX => ("fmat", "moe_q4k_pair_x"),
            Kernel::Q8pMma => ("fmat", "q8p_mma"),
            Kernel::Q8pMmaO => ("fmat", "q8p_mma_o"),
            Kernel::Q8pMmaPair => ("fmat", "q8p_mma_pair"),
            Kernel::Q8pMmaOPair => ("fmat", "q8p_mma_opair"),
            Kernel::Q8pMma32 => ("fmat", "q8p_mma_32"),
            Kernel::Q8pMmaO32 => ("fmat", "q8p_mma_o_32"),
            Kernel::Q8pMmaPair32 => ("fmat", "q8p_mma_pair_32"),
            Kernel::Q8pMmaOPair32 => ("fmat", "q8p_mma_opair_32"),
            Kernel::Q6KMma => ("fmat", "q6k_mma"),
            Kernel::F32Gemm => ("fmat", "f32_gemm"),
            Kernel::F16Gemm => ("fmat", "f16_gemm"),
            Kernel::KvStore => ("attention", "kv_store"),
            Kernel::RopeStore => ("attention", "rope_store"),
            Kernel::Attention => ("attention", "attention"),
            Kernel::FlashAttn => ("attention", "flash_attn"),
            Kernel::FlashAttnSplit => ("attention", "flash_attn_split"),
            Kernel::FlashAttn128 => ("attention", "flash_attn_128"),
            Kernel::FlashAttnSplit128 => ("attention", "flash_attn_split_128"),
            Kernel::Route => ("route", "route"),
            Kernel::RouteWeights => ("route", "route_weights"),
            Kernel::ExpertSum => ("route", "expert_sum"),
            Kernel::Columns => ("fmat", "columns"),
            Kernel::HeadsQ8 => ("fmat", "heads_q8"),
            Kernel::HeadsQ8p => ("fmat", "heads_q8p"),
            Kernel::HeadsQ8pX => ("fmat", "heads_q8p_x"),
            Kernel::HeadsDq => ("fmat", "heads_dq"),
            Kernel::HeadsQ8T => ("fmat", "heads_q8_t"),
            Kernel::HeadsDqT => ("fmat", "heads_dq_t"),
            Kernel::MlaStore => ("fmat", "mla_store"),
            Kernel::MlaKvStore => ("fmat", "mla_kv_store"),
            Kernel::MlaQSplit => ("fmat", "mla_q_split"),
            Kernel::MlaAttention => ("fmat", "mla_attention"),
            Kernel::MlaAttentionMma => ("attention", "mla_attention_mma"),
            Kernel::MlaMerge => ("fmat", "mla_merge"),
            Kernel::CopyIn | Kernel::HostWrite => ("elementwise", "copy_in"),
            Kernel::DecodeRun => (DECODE_MODULE, "decode_run"),
            Kernel::DecodeRunLong => (DECODE_LONG_MODULE, "decode_run"),
            Kernel::DecodeRunGrouped => (DECODE_GROUPED_MODULE, "decode_run"),
        }
    }
}

/// Whether a device of this architecture runs wgmma (`ternary_gemm_wg*`):
/// sm_90 only (its arch-specific `sm_90a` features; later architectures
/// dropped the instruction).
pub fn has_wgmma(arch: (i32, i32)) -> bool {
    arch == (9, 0)
}

/// The target NVRTC compiles for: the device's own architecture, with
/// Hopper's arch-specific features (`sm_90a`) where it runs wgmma; such a
/// cubin runs on sm_90 and nowhere else.
pub fn arch_name((major, minor): (i32, i32)) -> String {
    if has_wgmma((major, minor)) {
        "sm_90a".into()
    } else {
        format!("sm_{major}{minor}")
    }
}

/// Loaded modules and the function handle of every [`Kernel`] whose module
/// was loaded.
pub struct Kernels {
    funcs: Vec<Option<sys::CUfunction>>,
    /// Modules compiled now rather than read from the cache.
    pub compiled: usize,
}

unsafe impl Send for Kernels {}

/// The persistent decoding kernel's modules (opt-in, and the slowest to
/// compile: longer than all the others together).
const DECODE_MODULE: &str = "decode";
const DECODE_LONG_MODULE: &str = "decode_long";
const DECODE_GROUPED_MODULE: &str = "decode_grouped";
const DECODE_MODULES: [&str; 3] = [DECODE_MODULE, DECODE_LONG_MODULE, DECODE_GROUPED_MODULE];

/// `decode_run` in each of its modules (`decode::CacheSpan` picks one).
pub const DECODE_RUNS: [Kernel; 3] = [Kernel::DecodeRun, Kernel::DecodeRunLong, Kernel::DecodeRunGrouped];

impl Kernels {
    /// Compiles (or reads from the cache) and loads every module, the
    /// decoding kernel's only when `decode_run` will run: NVRTC compiles the
    /// modules side by side, so a first run waits for the slowest.
    pub fn load(gpu: &Gpu, cache: Option<&Path>, with_decode_run: bool) -> Result<Kernels, CudaError> {
        let arch = arch_name(gpu.info.arch);
        let wanted: Vec<_> =
            SOURCES.iter().filter(|(name, _)| with_decode_run || !DECODE_MODULES.contains(name)).collect();
        let images: Vec<Result<nvrtc::Compiled, CudaError>> = std::thread::scope(|s| {
            let jobs: Vec<_> = wanted
                .iter()
                .map(|(name, body)| {
                    let arch = &arch;
                    s.spawn(move || nvrtc::compile(name, &full_source(body), arch, cache))
                })
                .collect();
            jobs.into_iter()
                .map(|j| j.join().unwrap_or_else(|_| Err(CudaError::Other("an NVRTC compile panicked".into()))))
                .collect()
        });
        let mut modules = Vec::new();
        let mut compiled = 0;
        for ((name, _), image) in wanted.iter().zip(images) {
            let c = image?;
            compiled += !c.cached as usize;
            modules.push((*name, gpu.load_module(&c.image)?));
        }
        let funcs = Kernel::ALL
            .iter()
            .map(|k| {
                let (module, entry) = k.symbol();
                match modules.iter().find(|(n, _)| *n == module) {
                    Some((_, m)) => gpu.function(*m, entry).map(Some),
                    None => Ok(None),
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Kernels { funcs, compiled })
    }

    /// The kernel's function. Kernels of the decoding module exist only
    /// when it was loaded (`load`'s `with_decode_run`), and only decode_run
    /// launches them.
    pub fn get(&self, k: Kernel) -> sys::CUfunction {
        // ALL lists the variants in declaration order.
        self.funcs[k as usize].unwrap_or_else(|| panic!("{k:?}: its module was not loaded"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only sm_90 compiles for its arch-specific target and runs wgmma.
    #[test]
    fn sm_90_alone_takes_sm_90a_and_wgmma() {
        let names: Vec<_> = [(8, 0), (8, 9), (9, 0), (10, 0), (12, 0)].map(arch_name).into();
        assert_eq!(names, ["sm_80", "sm_89", "sm_90a", "sm_100", "sm_120"]);
        assert!(has_wgmma((9, 0)) && !has_wgmma((8, 9)) && !has_wgmma((10, 0)));
    }

    /// `Kernels::get` indexes by discriminant: ALL must list the variants in order.
    #[test]
    fn all_lists_every_kernel_in_declaration_order() {
        for (i, k) in Kernel::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i, "{k:?}");
        }
        for (module, _) in Kernel::ALL.iter().map(|k| k.symbol()) {
            assert!(SOURCES.iter().any(|(name, _)| *name == module), "{module} is not a source");
        }
    }
}
