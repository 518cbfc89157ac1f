//! SIMD dot products for the non-ternary GGUF weight formats: one weight row
//! (file format) against one activation row in the format `tern_quant::act_type`
//! pairs it with. Same semantics and argument layout as `tern_quant::vec_dot`,
//! which is the scalar reference these kernels are tested against
//! (`tests/block_kernels.rs`). Each kernel file registers its kernels in a
//! `KERNELS` table of (weight type, ISA level, kernel) entries, and
//! [`dot_fn`] picks among them; nothing else names a format here.
//!
//! | weights | activations | AVX2 | AVX-512 |
//! |---|---|---|---|
//! | Q8_0, Q4_0, IQ4_NL, Q5_0 | Q8_0 | `maddubs` (sign trick), 8 blocks per step | `dpbusd` on unsigned codes + offset term, 16 blocks per step |
//! | Q4_1, Q5_1 | Q8_0 | `maddubs` of codes and of ones (the min's `Σa`), 8 blocks per step | `dpbusd` of codes and of ones, 16 blocks per step |
//! | Q2_K, Q3_K, Q4_K, Q5_K, Q6_K | Q8_K | `maddubs` + `madd` by sub-scale | `maddubs` + `dpwssd` by sub-scale |
//! | IQ4_XS | Q8_K | table shuffle, `maddubs` (sign trick) + `madd` by sub-scale | levels × sub-scale in i16, `dpwssd` |
//! | F32, F16, BF16 | f32 | 4 × 8-lane FMA accumulators | 4 × 16-lane FMA accumulators, masked tail |
//! | Q1_0 | Q8_0 | `maddubs` of unsigned codes − `maddubs` of ones, 8 activation blocks per step | `dpbusd` + offset term, 64 codes per vector, 16 activation blocks per step |
//!
//! Numerics: the integer sum of every block (sub-scales and the Q4_K/Q5_K mins
//! included) is exactly the integer the reference forms; it is converted to
//! f32 and scaled as the reference does. K-quant, IQ4_XS, Q4_1 and Q5_1
//! blocks are summed in the reference's order, so those kernels return the
//! reference's bits; the other 32-element formats sum blocks in 8 or 16 f32 lanes (order
//! differs, ≈1 ulp per block). Float weights accumulate in f32 lanes where the reference uses
//! f64: the error is bounded by about `(n/32 + 16) · 2⁻²⁴ · Σ|w·x|` (see
//! `float.rs`) and in practice far below it.
//!
//! Preconditions beyond `vec_dot`'s: Q8_0 activation quants, and the Q8_K
//! quants IQ4_XS meets, lie in −127..=127 (what `quantize_acts` produces);
//! the AVX2 sign trick would mis-handle −128 against a negative weight (the
//! AVX-512 kernels, the AVX2 ones of Q4_1 and Q5_1, and those of the
//! k-quants take any byte). Weight bytes may hold any value.
//!
//! Lengths are checked as `vec_dot` checks them (panics on mismatch); all loads
//! are unaligned, so rows may sit anywhere in an mmap.

use tern_quant::GgmlType;

use crate::isa::Isa;

/// One `#[target_feature]` entry point per ISA level for each generic kernel
/// `dot_avx2::<Fmt>` / `dot_avx512::<Fmt>` of the including module (`Fmt` a
/// type or a const argument), and the
/// module's registry entries for them (`KERNELS`).
#[cfg(target_arch = "x86_64")]
macro_rules! kernels {
    ($($avx2:ident, $avx512:ident, $fmt:tt => $ty:ident;)*) => {
        $(
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn $avx2(n: usize, w: &[u8], act: &[u8]) -> f32 {
                dot_avx2::<$fmt>(n, w, act)
            }

            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
            unsafe fn $avx512(n: usize, w: &[u8], act: &[u8]) -> f32 {
                dot_avx512::<$fmt>(n, w, act)
            }
        )*

        /// This file's kernels, by weight type and ISA level.
        pub(super) const KERNELS: &[super::Entry] = &[$(
            super::Entry { ty: tern_quant::GgmlType::$ty, isa: crate::isa::Isa::Avx2, dot: $avx2 },
            super::Entry { ty: tern_quant::GgmlType::$ty, isa: crate::isa::Isa::Avx512, dot: $avx512 },
        )*];
    };
}

/// One AVX2 prompt-GEMM entry point per format (`gemm_k::<Decoder>` or
/// `gemm_32::<Decoder>` of `gemm.rs`), and the including module's registry
/// entries for them (`GEMMS`).
#[cfg(target_arch = "x86_64")]
macro_rules! gemms {
    ($($name:ident, $kernel:ident::<$fmt:ty> => $ty:ident;)*) => {
        $(
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn $name(g: &mut super::Gemm) {
                super::gemm::$kernel::<$fmt>(g)
            }
        )*

        /// This file's prompt GEMMs.
        pub(super) const GEMMS: &[super::GemmEntry] = &[$(
            super::GemmEntry { ty: tern_quant::GgmlType::$ty, isa: crate::isa::Isa::Avx2, gemm: $name },
        )*];
    };
}

#[cfg(target_arch = "x86_64")]
mod float;
#[cfg(target_arch = "x86_64")]
mod gemm;
#[cfg(target_arch = "x86_64")]
mod iq4xs;
#[cfg(target_arch = "x86_64")]
mod lowbit;
#[cfg(target_arch = "x86_64")]
mod q23k;
#[cfg(target_arch = "x86_64")]
mod q32;
#[cfg(target_arch = "x86_64")]
mod q32min;
#[cfg(target_arch = "x86_64")]
mod q45k;
#[cfg(target_arch = "x86_64")]
mod q6k;

/// A dot of one weight row (file format, `n` elements) with one activation
/// row in the paired format, same semantics and argument layout as
/// `tern_quant::vec_dot` (`TensorScale` is not needed for these types).
///
/// # Safety
/// The processor must support the ISA level the kernel was obtained for.
/// [`dot_fn`] never returns a kernel above `Isa::detected()`, so a pointer it
/// returned is always safe to call. Lengths are checked (panic on mismatch).
pub type DotFn = unsafe fn(n: usize, w_row: &[u8], act: &[u8]) -> f32;

/// One registered kernel: the weight type it multiplies, the ISA level it
/// needs, and the kernel. Each kernel file lists its own (`KERNELS`).
#[derive(Clone, Copy)]
pub struct Entry {
    pub ty: GgmlType,
    pub isa: Isa,
    pub dot: DotFn,
}

/// Four activation rows against one weight row, each result bit-identical to
/// the format's [`DotFn`] on that row: the weight block is decoded once for
/// the four (a prompt's tokens, or the tokens an expert serves).
///
/// # Safety
/// As [`DotFn`].
pub type Dot4Fn = unsafe fn(n: usize, w_row: &[u8], acts: [&[u8]; 4]) -> [f32; 4];

/// A registered four-row kernel.
#[derive(Clone, Copy)]
pub struct TileEntry {
    pub ty: GgmlType,
    pub isa: Isa,
    pub dot4: Dot4Fn,
}

#[cfg(target_arch = "x86_64")]
const TILE_REGISTRY: &[&[TileEntry]] = &[q45k::TILES];

/// Every registered four-row kernel (none off x86-64).
pub fn tile_registry() -> impl Iterator<Item = &'static TileEntry> {
    #[cfg(target_arch = "x86_64")]
    let files: &[&[TileEntry]] = TILE_REGISTRY;
    #[cfg(not(target_arch = "x86_64"))]
    let files: &[&[TileEntry]] = &[];
    files.iter().flat_map(|f| f.iter())
}

/// The four-row kernel for `ty` at ISA level `isa` (capped at
/// `Isa::detected()`), if there is one.
pub fn dot4_fn(ty: GgmlType, isa: Isa) -> Option<Dot4Fn> {
    let isa = isa.min(Isa::detected());
    tile_registry().filter(|e| e.ty == ty && e.isa <= isa).max_by_key(|e| e.isa).map(|e| e.dot4)
}

/// A batch product: `out[t·rows + r] = dot(rows[r], acts[t])`.
pub struct Gemm<'a> {
    /// Elements per row.
    pub k: usize,
    /// Weight rows in the file format, `k` elements each.
    pub rows: &'a [&'a [u8]],
    /// Activation rows in the format the weight type pairs with.
    pub acts: &'a [&'a [u8]],
    /// `acts.len() · rows.len()` results, token-major.
    pub out: &'a mut [f32],
}

impl Gemm<'_> {
    #[cfg(target_arch = "x86_64")]
    fn check(&self, qk: usize, w_bytes: usize, a_bytes: usize) -> usize {
        assert!(self.k.is_multiple_of(qk), "a row of {} elements is not whole {qk}-element blocks", self.k);
        let nb = self.k / qk;
        assert!(self.rows.iter().all(|r| r.len() == nb * w_bytes), "weight row byte length");
        assert!(self.acts.iter().all(|a| a.len() == nb * a_bytes), "activation row byte length");
        assert_eq!(self.out.len(), self.rows.len() * self.acts.len(), "output length");
        nb
    }
}

/// A prompt GEMM over many weight rows and activation rows ([`Gemm`]),
/// each result within a stated rounding bound of the format's [`DotFn`].
///
/// # Safety
/// As [`DotFn`].
pub type GemmFn = unsafe fn(g: &mut Gemm);

/// A registered prompt GEMM.
#[derive(Clone, Copy)]
pub struct GemmEntry {
    pub ty: GgmlType,
    pub isa: Isa,
    pub gemm: GemmFn,
}

/// Weight rows a GEMM decodes at once; every activation row then passes over them.
pub const GEMM_GROUP: usize = 32;

#[cfg(target_arch = "x86_64")]
const GEMM_REGISTRY: &[&[GemmEntry]] = &[q23k::GEMMS, q45k::GEMMS, q6k::GEMMS, q32::GEMMS];

/// Every registered prompt GEMM (none off x86-64).
pub fn gemm_registry() -> impl Iterator<Item = &'static GemmEntry> {
    #[cfg(target_arch = "x86_64")]
    let files: &[&[GemmEntry]] = GEMM_REGISTRY;
    #[cfg(not(target_arch = "x86_64"))]
    let files: &[&[GemmEntry]] = &[];
    files.iter().flat_map(|f| f.iter())
}

/// The prompt GEMM for `ty` at ISA level `isa` (capped at
/// `Isa::detected()`), if there is one.
pub fn gemm_fn(ty: GgmlType, isa: Isa) -> Option<GemmFn> {
    let isa = isa.min(Isa::detected());
    gemm_registry().filter(|e| e.ty == ty && e.isa <= isa).max_by_key(|e| e.isa).map(|e| e.gemm)
}

/// Every kernel file's entries: the one place a new file is added.
#[cfg(target_arch = "x86_64")]
const REGISTRY: &[&[Entry]] = &[
    q32::KERNELS,
    q32min::KERNELS,
    q23k::KERNELS,
    q45k::KERNELS,
    q6k::KERNELS,
    iq4xs::KERNELS,
    float::KERNELS,
    lowbit::KERNELS,
];

/// Every registered kernel (none off x86-64).
pub fn registry() -> impl Iterator<Item = &'static Entry> {
    #[cfg(target_arch = "x86_64")]
    let files: &[&[Entry]] = REGISTRY;
    #[cfg(not(target_arch = "x86_64"))]
    let files: &[&[Entry]] = &[];
    files.iter().flat_map(|f| f.iter())
}

/// The fastest registered kernel for `ty` at ISA level `isa` (capped at
/// `Isa::detected()`): the entry of the highest level not above it, or `None`
/// where only the scalar reference exists: `Isa::Scalar`, types without SIMD
/// kernels here (the ternary formats), and targets other than x86-64.
pub fn dot_fn(ty: GgmlType, isa: Isa) -> Option<DotFn> {
    let isa = isa.min(Isa::detected());
    registry().filter(|e| e.ty == ty && e.isa <= isa).max_by_key(|e| e.isa).map(|e| e.dot)
}

/// Checks the row lengths as `vec_dot` does and returns the number of blocks:
/// `n` a multiple of `qk`, `w` exactly `n/qk` blocks of `w_bytes`, `act`
/// exactly `n/qk` blocks of `a_bytes`.
#[cfg(target_arch = "x86_64")]
#[inline]
fn blocks_of(n: usize, w: &[u8], act: &[u8], qk: usize, w_bytes: usize, a_bytes: usize) -> usize {
    assert!(n.is_multiple_of(qk), "a row of {n} elements is not whole {qk}-element blocks");
    let nb = n / qk;
    assert_eq!(w.len(), nb * w_bytes, "weight row byte length");
    assert_eq!(act.len(), nb * a_bytes, "activation row byte length");
    nb
}

/// Helpers shared by the kernel files. Every function here is `#[inline]` with
/// the AVX2 feature set, so it inlines into AVX2 and AVX-512 kernels alike.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub unsafe fn load128(p: *const u8) -> __m128i {
        _mm_loadu_si128(p.cast())
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub unsafe fn load256(p: *const u8) -> __m256i {
        _mm256_loadu_si256(p.cast())
    }

    /// A little-endian IEEE half at `p`, widened.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub unsafe fn f16_at(p: *const u8) -> f32 {
        let bits = p.cast::<u16>().read_unaligned();
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
    }

    /// A little-endian f32 at `p`.
    #[inline]
    pub unsafe fn f32_at(p: *const u8) -> f32 {
        p.cast::<f32>().read_unaligned()
    }

    /// Sum of the eight i32 lanes (wrapping, exact when no overflow).
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub unsafe fn hsum_i32x8(v: __m256i) -> i32 {
        let x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let x = _mm_add_epi32(x, _mm_shuffle_epi32::<0b01_00_11_10>(x));
        let x = _mm_add_epi32(x, _mm_shuffle_epi32::<0b10_11_00_01>(x));
        _mm_cvtsi128_si32(x)
    }

    /// Lane sums of two i32x8 vectors at once.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub unsafe fn hsum2_i32x8(a: __m256i, b: __m256i) -> (i32, i32) {
        // [a01 a23 b01 b23 | a45 a67 b45 b67]
        let h = _mm256_hadd_epi32(a, b);
        let x = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
        // [a_lo a_hi b_lo b_hi] -> [a b a b]
        let x = _mm_hadd_epi32(x, x);
        (_mm_cvtsi128_si32(x), _mm_extract_epi32::<1>(x))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub unsafe fn hsum_f32x8(v: __m256) -> f32 {
        let x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let x = _mm_add_ps(x, _mm_movehl_ps(x, x));
        let x = _mm_add_ss(x, _mm_movehdup_ps(x));
        _mm_cvtss_f32(x)
    }

    /// Eight signed-int8 dot products of four: lane `i` of the result is
    /// `Σ_{k<4} w[4i+k]·a[4i+k]`, exact for |w| ≤ 128 and |a| ≤ 127 (the
    /// `maddubs` pair sums stay below 2·128·127 < 2¹⁵).
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub unsafe fn dot_i8x32(w: __m256i, a: __m256i) -> __m256i {
        let p = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(a, w));
        _mm256_madd_epi16(p, _mm256_set1_epi16(1))
    }

    /// Reduces eight vectors of eight i32 lanes to one: lane `k` of the result
    /// is the lane sum of `v[k]`.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub unsafe fn reduce8x8(v: &[__m256i; 8]) -> __m256i {
        let h01 = _mm256_hadd_epi32(v[0], v[1]);
        let h23 = _mm256_hadd_epi32(v[2], v[3]);
        let h45 = _mm256_hadd_epi32(v[4], v[5]);
        let h67 = _mm256_hadd_epi32(v[6], v[7]);
        // Low 128 bits: lanes 0..4 of v[0..4] summed; high: lanes 4..8.
        let h0123 = _mm256_hadd_epi32(h01, h23);
        let h4567 = _mm256_hadd_epi32(h45, h67);
        let lo = _mm256_permute2x128_si256::<0x20>(h0123, h4567);
        let hi = _mm256_permute2x128_si256::<0x31>(h0123, h4567);
        _mm256_add_epi32(lo, hi)
    }

    /// Eight f16 values at byte offsets `idx` from `p`, widened. Reads 4
    /// bytes at each offset (the f16 and the two bytes after it).
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub unsafe fn f16x8_at(p: *const u8, idx: __m256i) -> __m256 {
        let g = _mm256_i32gather_epi32::<1>(p.cast(), idx);
        let keep = _mm256_setr_epi8(
            0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1, //
            0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,
        );
        let packed = _mm256_permute4x64_epi64::<0b00_00_10_00>(_mm256_shuffle_epi8(g, keep));
        _mm256_cvtph_ps(_mm256_castsi256_si128(packed))
    }

    /// Eight f16 values at `p`, `p + stride`, ..., `p + 7·stride`, widened.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub unsafe fn f16x8_strided(p: *const u8, stride: usize) -> __m256 {
        let s = stride as i32;
        let idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(s));
        f16x8_at(p, idx)
    }
}

/// AVX-512 helpers shared by the kernel files (integer sums of unsigned codes
/// against signed quants, and the transposing reduction of 16 block sums).
#[cfg(target_arch = "x86_64")]
mod x86_512 {
    use std::arch::x86_64::*;

    /// Sixteen dot products of four, `Σ (u − off)·a` per i32 lane, for unsigned
    /// codes `u` and signed quants `a`: `Σ u·a` plus `Σ (a ^ 0x80)·(−off)`, which
    /// is `−off·Σa − 512·off`, from a start value of `512·off`. Exact for all
    /// bytes with 0 ≤ off ≤ 128.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[inline]
    pub unsafe fn dot_codes(u: __m512i, a: __m512i, off: i32) -> __m512i {
        let s = _mm512_dpbusd_epi32(_mm512_set1_epi32(512 * off), u, a);
        let a_biased = _mm512_xor_si512(a, _mm512_set1_epi8(-128));
        _mm512_dpbusd_epi32(s, a_biased, _mm512_set1_epi8((-off) as i8))
    }

    /// [`dot_codes`] for one block (eight lanes).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[inline]
    pub unsafe fn dot_codes256(u: __m256i, a: __m256i, off: i32) -> __m256i {
        let s = _mm256_dpbusd_epi32(_mm256_set1_epi32(512 * off), u, a);
        let a_biased = _mm256_xor_si256(a, _mm256_set1_epi8(-128));
        _mm256_dpbusd_epi32(s, a_biased, _mm256_set1_epi8((-off) as i8))
    }

    /// Reduces eight vectors, each holding two blocks' partial sums (block `2k` in
    /// lanes 0..8 of `v[k]`, block `2k+1` in lanes 8..16; if `split`, block `2k`
    /// in lanes 0..4 and 8..12, block `2k+1` in lanes 4..8 and 12..16), to one
    /// vector of the sixteen block sums. The result is in a transposed order: lane `4j + t`
    /// holds block `j + 4t` (see [`LANE_BLOCK`]).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[inline]
    pub unsafe fn reduce16(v: &[__m512i; 8], split: bool) -> __m512i {
        // 8 lanes per block -> 4: one block per 128-bit lane, blocks 4m..4m+4.
        // Whole blocks: block 2k in 128-bit lanes 0, 1 of v[k]; split: lanes 0, 2.
        let fold1 = |a: __m512i, b: __m512i| {
            if split {
                _mm512_add_epi32(
                    _mm512_shuffle_i64x2::<0b01_00_01_00>(a, b),
                    _mm512_shuffle_i64x2::<0b11_10_11_10>(a, b),
                )
            } else {
                _mm512_add_epi32(
                    _mm512_shuffle_i64x2::<0b10_00_10_00>(a, b),
                    _mm512_shuffle_i64x2::<0b11_01_11_01>(a, b),
                )
            }
        };
        let w0 = fold1(v[0], v[1]);
        let w1 = fold1(v[2], v[3]);
        let w2 = fold1(v[4], v[5]);
        let w3 = fold1(v[6], v[7]);
        // 4 -> 2: 128-bit lane j holds blocks j, j+4 (u0) and j+8, j+12 (u1).
        let u0 = _mm512_add_epi32(_mm512_unpacklo_epi64(w0, w1), _mm512_unpackhi_epi64(w0, w1));
        let u1 = _mm512_add_epi32(_mm512_unpacklo_epi64(w2, w3), _mm512_unpackhi_epi64(w2, w3));
        // 2 -> 1: lane 4j + t holds block j + 4t.
        let (e, f) = (_mm512_castsi512_ps(u0), _mm512_castsi512_ps(u1));
        let even = _mm512_castps_si512(_mm512_shuffle_ps::<0b10_00_10_00>(e, f));
        let odd = _mm512_castps_si512(_mm512_shuffle_ps::<0b11_01_11_01>(e, f));
        _mm512_add_epi32(even, odd)
    }

    /// The block whose sum [`reduce16`] leaves in each lane.
    pub const LANE_BLOCK: [i32; 16] = [0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15];

    /// Sixteen f16 values at byte offsets `idx` from `p`, widened. Reads 4
    /// bytes at each offset (the f16 and the two bytes after it).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[inline]
    pub unsafe fn f16x16_at(p: *const u8, idx: __m512i) -> __m512 {
        let g = _mm512_i32gather_epi32::<1>(idx, p.cast());
        _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g))
    }

    /// The f16 scales of sixteen blocks of `stride` bytes from `p` (the first
    /// two bytes of each block), widened, in [`reduce16`]'s lane order.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[inline]
    pub unsafe fn scales16(p: *const u8, stride: usize) -> __m512 {
        let idx = _mm512_mullo_epi32(_mm512_loadu_si512(LANE_BLOCK.as_ptr().cast()), _mm512_set1_epi32(stride as i32));
        f16x16_at(p, idx)
    }
}
