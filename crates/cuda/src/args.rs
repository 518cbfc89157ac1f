//! Every kernel's arguments as a struct with named fields, in the order of
//! its `extern "C"` signature. `kernel_args!` writes that order once: for
//! the struct and for its encoding into a launch's positional arguments, so
//! lowering builds launches, and `decode.rs` reads them, by name. A host
//! test (`args_tests.rs`) reads the signatures in `kernels/*.cu` and checks
//! each struct's encoding against them.
//!
//! The integer codes the kernels take (activation, rope mode, binary op,
//! fused mode, gating) are `#[repr(i32)]` enums here and enum constants in
//! `prelude.cuh`; the same test compares the two.

use tern_graph::{Activation, Gating as GraphGating, RopeMode as GraphRope};

use crate::kernels::Kernel;
use crate::launch::{Arg, AttRope, TernaryBatch};
use crate::tma::MatrixMap;

/// act(gate) · up (`gated` in prelude.cuh, `enum Act`); `None`: a GEMV
/// with no (gate, up) pair.
#[repr(i32)]
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
pub enum Act {
    #[default]
    None = -1,
    Silu = 0,
    Relu2 = 1,
}

impl Act {
    pub fn of(a: Activation) -> Act {
        match a {
            Activation::Silu => Act::Silu,
            Activation::Relu2 => Act::Relu2,
        }
    }
}

/// The pairs a rope rotates (`rope_pair` in prelude.cuh, `enum RopeMode`).
#[repr(i32)]
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
pub enum RopeMode {
    #[default]
    Norm = 0,
    Neox = 1,
}

impl RopeMode {
    pub fn of(m: GraphRope) -> RopeMode {
        match m {
            GraphRope::Norm => RopeMode::Norm,
            GraphRope::Neox => RopeMode::Neox,
        }
    }
}

/// `binary`'s operation (`enum BinOp`).
#[repr(i32)]
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
pub enum BinOp {
    #[default]
    Add = 0,
    Mul = 1,
}

/// Where a fused GEMV phase of `decode_run` takes its input levels
/// (`GemvArgs::fused` in decode_table.cu, `enum Fused`).
#[repr(i32)]
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
pub enum FusedMode {
    /// From the `norm_quant` before it (`nq.q`, `nq.d`, `nq.lsum`).
    #[default]
    Levels = 0,
    /// Every block quantizes `nq.x` itself, with block reductions.
    Block = 1,
    /// The same, from the statistics the phase before left (`stat_in`).
    Stats = 2,
}

/// How a router's logits become scores (`gate_scores` in route.cu, `enum
/// Gating`).
#[repr(i32)]
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
pub enum Gating {
    #[default]
    Softmax = 0,
    Sigmoid = 1,
}

impl Gating {
    pub fn of(g: GraphGating) -> Gating {
        match g {
            GraphGating::Softmax => Gating::Softmax,
            GraphGating::Sigmoid => Gating::Sigmoid,
        }
    }
}

/// A launch's arguments in their positional form, as the driver takes them.
#[derive(Debug, Default)]
pub struct Enc {
    pub args: Vec<Arg>,
    /// A `late` argument was still unset: the launch must not run.
    pub unbound: bool,
}

impl Enc {
    fn ptr(&mut self, v: u64) {
        self.args.push(Arg::Ptr(v));
    }
    fn u64(&mut self, v: u64) {
        self.args.push(Arg::U64(v));
    }
    fn i32(&mut self, v: i32) {
        self.args.push(Arg::I32(v));
    }
    /// A C `u32`: the same four bytes as an `int`.
    fn u32(&mut self, v: u32) {
        self.args.push(Arg::I32(v as i32));
    }
    fn f32(&mut self, v: f32) {
        self.args.push(Arg::F32(v.to_bits()));
    }
    fn act(&mut self, v: Act) {
        self.i32(v as i32);
    }
    fn mode(&mut self, v: RopeMode) {
        self.i32(v as i32);
    }
    fn op(&mut self, v: BinOp) {
        self.i32(v as i32);
    }
    fn gating(&mut self, v: Gating) {
        self.i32(v as i32);
    }
    fn batch(&mut self, v: TernaryBatch) {
        self.args.push(Arg::Batch(v));
    }
    fn rope(&mut self, v: AttRope) {
        self.args.push(Arg::Rope(v));
    }
    fn map(&mut self, v: MatrixMap) {
        self.args.push(Arg::Map(v));
    }
    fn io(&mut self, v: GemvIo) {
        v.encode(self);
    }
    /// A pointer known only after lowering (`decode::bind`).
    fn late(&mut self, v: Option<u64>) {
        self.unbound |= v.is_none();
        self.ptr(v.unwrap_or(0));
    }
}

/// The arguments the float and block-quantized GEMVs (fmat.cu) share after
/// their weight's: `rows` outputs of `k` inputs for `n_tok` tokens of `x`,
/// each token's row of `out` `out_stride` floats on, plus `res` (0: none).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GemvIo {
    pub rows: i32,
    pub k: i32,
    pub x: u64,
    pub n_tok: i32,
    pub out: u64,
    pub out_stride: u64,
    pub res: u64,
}

impl GemvIo {
    fn encode(&self, e: &mut Enc) {
        e.i32(self.rows);
        e.i32(self.k);
        e.ptr(self.x);
        e.i32(self.n_tok);
        e.ptr(self.out);
        e.u64(self.out_stride);
        e.ptr(self.res);
    }
}

/// One struct per argument list: `Variant(Struct) for [kernels taking it]
/// { field: type => how it is encoded, ... }` in signature order.
macro_rules! kernel_args {
    ($(
        $(#[$m:meta])*
        $variant:ident($name:ident) for [$($k:ident),+] {
            $( $(#[$fm:meta])* $f:ident : $t:ty => $enc:ident ),* $(,)?
        }
    )*) => {
        $(
            $(#[$m])*
            #[repr(C)]
            #[derive(Clone, Copy, Debug, Default, PartialEq)]
            pub struct $name { $( $(#[$fm])* pub $f: $t ),* }

            impl $name {
                pub const KERNELS: &'static [Kernel] = &[$(Kernel::$k),+];
            }

            impl From<$name> for Args {
                fn from(a: $name) -> Args {
                    Args::$variant(a)
                }
            }
        )*

        /// A launch's arguments: the struct of its kernel.
        #[derive(Clone, Copy, Debug, PartialEq)]
        pub enum Args { $( $variant($name) ),* }

        impl Args {
            /// The kernels that take these arguments.
            pub fn kernels(&self) -> &'static [Kernel] {
                match self { $( Args::$variant(_) => $name::KERNELS ),* }
            }

            /// The positional form, in signature order.
            pub fn encode(&self) -> Enc {
                let mut e = Enc { args: Vec::with_capacity(17), unbound: false };
                match self { $( Args::$variant(a) => { $( e.$enc(a.$f); )* } ),* }
                e
            }

            /// Each struct's default value (the signature test encodes them).
            #[cfg(test)]
            pub fn every() -> Vec<Args> {
                vec![$( Args::$variant($name::default()) ),*]
            }
        }
    };
}

kernel_args! {
    /// `get_rows` (elementwise.cu): rows of a float or block table.
    GetRows(GetRowsArgs) for [GetRows] {
        table: u64 => ptr, row_bytes: u64 => u64, ty: i32 => i32, ids: u64 => ptr, out: u64 => ptr, ne0: i32 => i32,
    }
    /// `rms_norm`; `w` 0: unweighted.
    RmsNorm(RmsNormArgs) for [RmsNorm] {
        x: u64 => ptr, w: u64 => ptr, y: u64 => ptr, ne0: i32 => i32, eps: f32 => f32,
    }
    /// `binary`: `out = a op b[i % nb]`.
    Binary(BinaryArgs) for [Binary] {
        a: u64 => ptr, b: u64 => ptr, out: u64 => ptr, n: u64 => u64, nb: u64 => u64, op: BinOp => op,
    }
    Scale(ScaleArgs) for [Scale] {
        x: u64 => ptr, out: u64 => ptr, n: u64 => u64, f: f32 => f32,
    }
    GatedAct(GatedActArgs) for [GatedAct] {
        gate: u64 => ptr, up: u64 => ptr, out: u64 => ptr, n: u64 => u64, act: Act => act,
    }
    /// `rope`; `factors` 0: none. YaRN's ramp between pair indices
    /// `y_low` and `y_high`, applied `y_ext` much, and its magnitude
    /// (`lower::mla::YarnRamp`; none: 0, 0, 0, 1).
    Rope(RopeArgs) for [Rope] {
        x: u64 => ptr, out: u64 => ptr, pos: u64 => ptr, factors: u64 => ptr,
        head_dim: i32 => i32, n_head: i32 => i32, n_tok: i32 => i32, n_rot: i32 => i32, mode: RopeMode => mode,
        base: f32 => f32, fscale: f32 => f32, y_low: f32 => f32, y_high: f32 => f32, y_ext: f32 => f32,
        y_mag: f32 => f32,
    }
    /// 16-byte words from `src` to `dst` (`copy_in`: staged weights, and
    /// small copies into mapped host memory).
    CopyIn(CopyInArgs) for [CopyIn, HostWrite] {
        src: u64 => ptr, dst: u64 => ptr, n16: u64 => u64,
    }
    /// `norm_quant` (quantize.cu), and a `decode_run` table's `NqArgs`:
    /// `w` 0 unweighted, `y` 0 no f32 copy, `norm` 0 quantization alone.
    NormQuant(NormQuantArgs) for [NormQuant] {
        x: u64 => ptr, w: u64 => ptr, y: u64 => ptr, q: u64 => ptr, d: u64 => ptr, lsum: u64 => ptr,
        ne0: i32 => i32, k_pad: i32 => i32, norm: i32 => i32, eps: f32 => f32,
    }
    /// `gated_norm_quant`: `norm_quant` of act(gate) · up.
    GatedNormQuant(GatedNormQuantArgs) for [GatedNormQuant] {
        gate: u64 => ptr, up: u64 => ptr, act: Act => act, w: u64 => ptr, q: u64 => ptr, d: u64 => ptr,
        lsum: u64 => ptr, ne0: i32 => i32, k_pad: i32 => i32, norm: i32 => i32, eps: f32 => f32,
    }
    /// The ternary GEMVs (ternary.cu); `pair_act` not `None`: b.m[0] and
    /// b.m[1] are (gate, up), written as act(gate) · up to b.m[0].out.
    TernaryGemv(TernaryGemvArgs) for [TernaryGemv, TernaryGemv1, TernaryGemv1Pair] {
        b: TernaryBatch => batch, k_pad: i32 => i32, q: u64 => ptr, d: u64 => ptr, lsum: u64 => ptr,
        n_tok: i32 => i32, pair_act: Act => act,
    }
    /// The mma.sync prompt GEMMs.
    TernaryGemm(TernaryGemmArgs) for [TernaryGemm, TernaryGemmGrouped] {
        b: TernaryBatch => batch, k_pad: i32 => i32, q: u64 => ptr, d: u64 => ptr, lsum: u64 => ptr,
        n_tok: i32 => i32,
    }
    /// The wgmma prompt GEMMs (ternary_wgmma.cu): the levels' tensor map and
    /// each matrix's codes' (the unused slots repeat the first).
    TernaryGemmWg(TernaryGemmWgArgs) for [TernaryGemmWg, TernaryGemmWgNarrow] {
        b: TernaryBatch => batch, tq: MatrixMap => map, tw0: MatrixMap => map, tw1: MatrixMap => map,
        tw2: MatrixMap => map, k_pad: i32 => i32, d: u64 => ptr, lsum: u64 => ptr, n_tok: i32 => i32,
    }
    /// `fmat_gemv` (fmat.cu): any float or block type the prelude's `dq` reads.
    FmatGemv(FmatGemvArgs) for [FmatGemv] {
        w: u64 => ptr, row_bytes: u64 => u64, ty: i32 => i32, io: GemvIo => io,
    }
    /// Int8 levels with a scale per 16 (`qlayout::QLayout::Levels`), and
    /// an offset per 16 (`o`, `LevelsOffset`; the others ignore it).
    Q8Gemv(Q8GemvArgs) for [Q8Gemv, Q8Gemv1, Q8oGemv, Q8oGemv1] {
        q: u64 => ptr, s: u64 => ptr, o: u64 => ptr, io: GemvIo => io,
    }
    /// Q6_K planes (`qlayout::QLayout::Q6K`).
    Q6KGemv(Q6KGemvArgs) for [Q6KGemv, Q6KGemv1] {
        base: u64 => ptr, io: GemvIo => io,
    }
    /// One token's Q6_K product with Q8_K activations; `nw` not 0: x is
    /// first normed with that weight and `eps`.
    Q6KGemv1Q8(Q6KGemv1Q8Args) for [Q6KGemv1Q8] {
        base: u64 => ptr, io: GemvIo => io, nw: u64 => ptr, eps: f32 => f32,
    }
    /// `f16_gemv` and `f32_gemv`: float weights, 16-byte loads.
    F16Gemv(F16GemvArgs) for [F16Gemv, F32Gemv, F16Gemm, F32Gemm] {
        w: u64 => ptr, io: GemvIo => io,
    }
    /// `act_q8` (paired.cu): x [k, n] → q, d in blocks of 2^ab (5: Q8_0, 8: Q8_K).
    ActQ8(ActQ8Args) for [ActQ8] {
        x: u64 => ptr, q: u64 => ptr, d: u64 => ptr, blocks: u64 => u64, ab: i32 => i32,
    }
    /// Levels (`o` 0: no offsets) times `act_q8`'s int8 activations.
    Q8pGemv(Q8pGemvArgs) for [Q8pGemv, Q8pGemv1] {
        q: u64 => ptr, s: u64 => ptr, o: u64 => ptr, rows: i32 => i32, k: i32 => i32, qa: u64 => ptr,
        da: u64 => ptr, ab: i32 => i32, n_tok: i32 => i32, out: u64 => ptr, out_stride: u64 => u64,
        res: u64 => ptr,
    }
    /// One token's `Q8pGemv` quantizing x itself (`x`: f32, blocks of 2^ab);
    /// `nw` not 0: x RMS-normed with that weight row and `eps` first.
    Q8pGemv1x(Q8pGemv1xArgs) for [Q8pGemv1x] {
        q: u64 => ptr, s: u64 => ptr, o: u64 => ptr, rows: i32 => i32, k: i32 => i32, x: u64 => ptr,
        ab: i32 => i32, out: u64 => ptr, res: u64 => ptr, nw: u64 => ptr, eps: f32 => f32,
    }
    /// One token's product of Q4_K blocks `w` (q4k.cu), x quantized as
    /// `Q8pGemv1x` does (`nw` not 0: normed first).
    Q4kGemv1x(Q4kGemv1xArgs) for [Q4kGemv1x] {
        w: u64 => ptr, rows: i32 => i32, k: i32 => i32, x: u64 => ptr, out: u64 => ptr, res: u64 => ptr,
        nw: u64 => ptr, eps: f32 => f32,
    }
    /// One token's gate (w) and up (w2) products of Q4_K blocks and act(gate) · up.
    Q4kGemv1xPair(Q4kGemv1xPairArgs) for [Q4kGemv1xPair] {
        w: u64 => ptr, w2: u64 => ptr, rows: i32 => i32, k: i32 => i32, x: u64 => ptr, out: u64 => ptr,
        act: Act => act, nw: u64 => ptr, eps: f32 => f32,
    }
    /// One token's gate (q, s, o) and up (q2, s2, o2) products and
    /// act(gate) · up in one launch, x quantized as `Q8pGemv1x` does.
    Q8pGemv1xPair(Q8pGemv1xPairArgs) for [Q8pGemv1xPair] {
        q: u64 => ptr, s: u64 => ptr, o: u64 => ptr, q2: u64 => ptr, s2: u64 => ptr, o2: u64 => ptr,
        rows: i32 => i32, k: i32 => i32, x: u64 => ptr, ab: i32 => i32, out: u64 => ptr, act: Act => act,
        nw: u64 => ptr, eps: f32 => f32,
    }
    /// `o` 0: no offsets.
    GetRowsQ8(GetRowsQ8Args) for [GetRowsQ8] {
        q: u64 => ptr, s: u64 => ptr, o: u64 => ptr, k: i32 => i32, ids: u64 => ptr, out: u64 => ptr,
    }
    /// `moe_plan` (experts.cu): `ids` [k_used, n] → `items`, `n_items`, `sorted`.
    MoePlan(MoePlanArgs) for [MoePlan] {
        ids: u64 => ptr, n_pairs: i32 => i32, n_expert: i32 => i32, per_item: i32 => i32, items: u64 => ptr,
        n_items: u64 => ptr, sorted: u64 => ptr,
    }
    /// The expert GEMVs: matrix (q, s, o), and for a gated pair the up
    /// matrix (q2, s2, o2) and `act`; stored weights in `q`/`q2` with
    /// `row_bytes` and `ty`; the `*p` kernels read `act_q8`'s (qa, da, ab)
    /// instead of x. `x_pair`: a column of x per pair, else per token.
    MoeGemv(MoeGemvArgs) for [
        MoeQ8, MoeQ8Pair, MoeQ8o, MoeQ8oPair, MoeDq, MoeDqPair, MoeQ8p, MoeQ8pPair, MoeQ8op, MoeQ8opPair, MoeQ8pX,
        MoeQ8pPairX, MoeQ8opX, MoeQ8opPairX, MoeQ4kX, MoeQ4kPairX
    ] {
        q: u64 => ptr, s: u64 => ptr, o: u64 => ptr, q2: u64 => ptr, s2: u64 => ptr, o2: u64 => ptr,
        row_bytes: u64 => u64, ty: i32 => i32, rows: i32 => i32, k: i32 => i32, x: u64 => ptr,
        qa: u64 => ptr, da: u64 => ptr, ab: i32 => i32, x_pair: i32 => i32, k_used: i32 => i32, items: u64 => ptr,
        n_items: u64 => ptr, sorted: u64 => ptr, ids: u64 => ptr, n_expert: i32 => i32, out: u64 => ptr, act: Act => act,
    }
    /// The tensor-core products of levels with int8 activations
    /// (levels_mma.cu): dense over `n_tok` tokens (`items` 0) or experts
    /// over a plan's items; (q2, s2, o2) and `act` for a gated pair.
    /// `n_head` > 0: per-head products, head h's rows from h · stride + offset.
    Mma(MmaArgs) for [
        Q8pMma, Q8pMmaO, Q8pMmaPair, Q8pMmaOPair, Q8pMma32, Q8pMmaO32, Q8pMmaPair32, Q8pMmaOPair32, Q6KMma
    ] {
        q: u64 => ptr, s: u64 => ptr, o: u64 => ptr, q2: u64 => ptr, s2: u64 => ptr, o2: u64 => ptr,
        rows: i32 => i32, k: i32 => i32, qa: u64 => ptr, da: u64 => ptr, ab: i32 => i32, n_tok: i32 => i32,
        out_stride: u64 => u64, res: u64 => ptr, items: u64 => ptr, n_items: u64 => ptr, sorted: u64 => ptr,
        x_pair: i32 => i32, k_used: i32 => i32, n_head: i32 => i32, stride: i32 => i32, offset: i32 => i32,
        out: u64 => ptr, act: Act => act,
    }
    GetRowsQ6K(GetRowsQ6KArgs) for [GetRowsQ6K] {
        base: u64 => ptr, rows: i32 => i32, k: i32 => i32, ids: u64 => ptr, out: u64 => ptr,
    }
    /// `kv_store` (attention.cu): rows of `row` floats into the caches at `pos`.
    KvStore(KvStoreArgs) for [KvStore] {
        k: u64 => ptr, v: u64 => ptr, kc: u64 => ptr, vc: u64 => ptr, pos: u64 => ptr,
        row: i32 => i32, k_type: i32 => i32, v_type: i32 => i32,
    }
    /// `rope_store`: q and k rotated, k and v stored in the caches.
    RopeStore(RopeStoreArgs) for [RopeStore] {
        q: u64 => ptr, q_out: u64 => ptr, k: u64 => ptr, v: u64 => ptr, kc: u64 => ptr, vc: u64 => ptr,
        pos: u64 => ptr, factors: u64 => ptr, head_dim: i32 => i32, n_head: i32 => i32, n_head_kv: i32 => i32,
        n_rot: i32 => i32, mode: RopeMode => mode, base: f32 => f32, fscale: f32 => f32,
        k_type: i32 => i32, v_type: i32 => i32,
    }
    /// `attention`, and a `decode_run` table's `AttArgs`: flash-decoding in
    /// `n_split` splits of `split` keys (`part` and `counters` for the merge).
    Attention(AttentionArgs) for [Attention] {
        q: u64 => ptr, kc: u64 => ptr, vc: u64 => ptr, pos: u64 => ptr, out: u64 => ptr, part: u64 => ptr,
        counters: u64 => ptr, n_head: i32 => i32, n_head_kv: i32 => i32, head_dim: i32 => i32,
        scale: f32 => f32, split: i32 => i32, n_split: i32 => i32, k_type: i32 => i32, v_type: i32 => i32,
        r: AttRope => rope,
    }
    /// The prompt attention on tensor cores (flash_attn.cu), f16 caches.
    FlashAttn(FlashAttnArgs) for [FlashAttn, FlashAttnSplit, FlashAttn128, FlashAttnSplit128] {
        q: u64 => ptr, kc: u64 => ptr, vc: u64 => ptr, pos: u64 => ptr, out: u64 => ptr,
        n_tok: i32 => i32, n_head: i32 => i32, n_head_kv: i32 => i32, head_dim: i32 => i32, scale: f32 => f32,
    }
    /// `route` (route.cu): ids [k, n] of logits [n_expert, n]; `bias` 0:
    /// none; `w` not 0: the weights too (a fused RouteWeights); `n_group`
    /// 0: no group limit.
    Route(RouteArgs) for [Route] {
        logits: u64 => ptr, bias: u64 => ptr, ids: u64 => ptr, w: u64 => ptr, n_expert: i32 => i32, k: i32 => i32,
        gating: Gating => gating, n_group: i32 => i32, group_used: i32 => i32, norm: i32 => i32, scale: f32 => f32,
    }
    /// `route_weights`: the weights [k, n] of the experts in `ids`.
    RouteWeights(RouteWeightsArgs) for [RouteWeights] {
        logits: u64 => ptr, ids: u64 => ptr, w: u64 => ptr, n_expert: i32 => i32, k: i32 => i32,
        gating: Gating => gating, norm: i32 => i32, scale: f32 => f32,
    }
    /// `expert_sum`: y [m, n] from ys [m, k, n] and w [k, n]; `total` = m · n.
    ExpertSum(ExpertSumArgs) for [ExpertSum] {
        ys: u64 => ptr, w: u64 => ptr, y: u64 => ptr, m: i32 => i32, k: i32 => i32, total: u64 => u64,
    }
    /// `columns` (mla.cu): elements `start..start + len` of every piece of `width`.
    Columns(ColumnsArgs) for [Columns] {
        x: u64 => ptr, out: u64 => ptr, n: u64 => u64, width: i32 => i32, start: i32 => i32, len: i32 => i32,
    }
    /// The per-head products (mla.cu): head h's rows `h·stride + offset ..+ len`
    /// of a weight of `k`-wide rows, as levels (q, s, o; `o` 0: no offsets)
    /// or stored bytes (`q`, `row_bytes`, `ty`).
    /// `heads_q8p` reads `act_q8`'s (qa, da, ab) instead of x.
    MulMatHeads(MulMatHeadsArgs) for [HeadsQ8, HeadsQ8p, HeadsQ8pX, HeadsDq, HeadsQ8T, HeadsDqT] {
        q: u64 => ptr, s: u64 => ptr, o: u64 => ptr, row_bytes: u64 => u64, ty: i32 => i32, k: i32 => i32,
        stride: i32 => i32, offset: i32 => i32, len: i32 => i32, n_head: i32 => i32, x: u64 => ptr,
        qa: u64 => ptr, da: u64 => ptr, ab: i32 => i32, n_tok: i32 => i32, out: u64 => ptr,
    }
    /// `mla_store`: `[c | k_pe]` rows into the latent cache (`ty`: F32 or F16) at `pos`.
    MlaStore(MlaStoreArgs) for [MlaStore] {
        c: u64 => ptr, k_pe: u64 => ptr, cache: u64 => ptr, pos: u64 => ptr, rank: i32 => i32, rope: i32 => i32,
        ty: i32 => i32,
    }
    /// `mla_kv_store`: kv_a's `[c | k_pe]` rows into the latent cache at
    /// `pos`, c normed (× `w`, 0: unweighted) and k_pe rotated (one head of
    /// `rope`; the rope kernel's parameters).
    MlaKvStore(MlaKvStoreArgs) for [MlaKvStore] {
        kv: u64 => ptr, w: u64 => ptr, eps: f32 => f32, cache: u64 => ptr, pos: u64 => ptr, rank: i32 => i32,
        rope: i32 => i32, ty: i32 => i32, factors: u64 => ptr, n_rot: i32 => i32, mode: RopeMode => mode,
        base: f32 => f32, fscale: f32 => f32, y_low: f32 => f32, y_high: f32 => f32, y_ext: f32 => f32,
        y_mag: f32 => f32,
    }
    /// `mla_q_split`: q's heads into q_nope and the rotated q_pe.
    MlaQSplit(MlaQSplitArgs) for [MlaQSplit] {
        q: u64 => ptr, q_nope: u64 => ptr, q_pe: u64 => ptr, pos: u64 => ptr, n_head: i32 => i32, n_tok: i32 => i32,
        nope: i32 => i32, rope: i32 => i32, factors: u64 => ptr, n_rot: i32 => i32, mode: RopeMode => mode,
        base: f32 => f32, fscale: f32 => f32, y_low: f32 => f32, y_high: f32 => f32, y_ext: f32 => f32,
        y_mag: f32 => f32,
    }
    /// `mla_attention`: `n_split` splits of `split` cache rows (`part` their
    /// states when more than one).
    MlaAttention(MlaAttentionArgs) for [MlaAttention] {
        q_lat: u64 => ptr, q_pe: u64 => ptr, cache: u64 => ptr, pos: u64 => ptr, out: u64 => ptr, part: u64 => ptr,
        n_head: i32 => i32, rank: i32 => i32, rope: i32 => i32, ty: i32 => i32, scale: f32 => f32,
        split: i32 => i32, n_split: i32 => i32,
    }
    /// `mla_attention_mma` (mla_mma.cu): the latent attention on tensor
    /// cores over an F16 cache, in `n_split` splits of `split` keys.
    MlaMma(MlaMmaArgs) for [MlaAttentionMma] {
        q_lat: u64 => ptr, q_pe: u64 => ptr, cache: u64 => ptr, pos: u64 => ptr, out: u64 => ptr, part: u64 => ptr,
        n_tok: i32 => i32, n_head: i32 => i32, rank: i32 => i32, rope: i32 => i32, scale: f32 => f32,
        split: i32 => i32, n_split: i32 => i32,
    }
    /// `mla_merge`: the splits' states in `part` → the output.
    MlaMerge(MlaMergeArgs) for [MlaMerge] {
        part: u64 => ptr, pos: u64 => ptr, out: u64 => ptr, n_head: i32 => i32, rank: i32 => i32,
        split: i32 => i32, n_split: i32 => i32,
    }
    /// `decode_run` (decode.cu). The table is uploaded after fusing, so its
    /// two pointers are unset (`None`) until `decode::bind` sets them; a
    /// launch with either unset refuses to run.
    DecodeRun(DecodeRunArgs) for [DecodeRun, DecodeRunLong, DecodeRunGrouped] {
        /// The phases, after the table's header.
        phases: Option<u64> => late,
        n: i32 => i32,
        /// The barrier words at the head of the table.
        bar: Option<u64> => late,
        /// Phase descriptors each block loads ahead.
        look: i32 => i32,
        ne0_max: i32 => i32,
        k_pad_max: i32 => i32,
        /// Where a traced run leaves its stamps (0: untraced).
        trace: u64 => ptr,
        /// The positions every attention of the run reads (0: each its own).
        pos: u64 => ptr,
        ring_cap: u32 => u32,
        n_copies: i32 => i32,
        spin_ns: i32 => i32,
        att_floats: i32 => i32,
        refill: u32 => u32,
    }
}

#[cfg(test)]
#[path = "args_tests.rs"]
mod tests;
