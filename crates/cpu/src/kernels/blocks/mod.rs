//! SIMD dot products for the non-ternary GGUF weight formats: one weight row
//! (file format) against one activation row in the format `tern_quant::act_type`
//! pairs it with. Same semantics and argument layout as `tern_quant::vec_dot`,
//! which is the scalar reference these kernels are tested against
//! (`tests/block_kernels.rs`).
//!
//! | weights | activations | AVX2 | AVX-512 |
//! |---|---|---|---|
//! | Q8_0, Q4_0, IQ4_NL | Q8_0 | `maddubs` (sign trick), 8 blocks per step | `dpbusd` on unsigned codes + offset term, 16 blocks per step |
//! | Q4_K, Q5_K, Q6_K | Q8_K | `maddubs` + `madd` by sub-scale | `maddubs` + `dpwssd` by sub-scale |
//! | F32, F16, BF16 | f32 | 4 × 8-lane FMA accumulators | 4 × 16-lane FMA accumulators, masked tail |
//!
//! Numerics: the integer sum of every block (sub-scales and the Q4_K/Q5_K mins
//! included) is exactly the integer the reference forms; it is converted to
//! f32 and scaled as the reference does. K-quant blocks are summed in the
//! reference's order, so those kernels return the reference's bits; the
//! 32-element formats sum blocks in 8 or 16 f32 lanes (order differs, ≈1 ulp
//! per block). Float weights accumulate in f32 lanes where the reference uses
//! f64: the error is bounded by about `(n/32 + 16) · 2⁻²⁴ · Σ|w·x|` (see
//! `float.rs`) and in practice far below it.
//!
//! Preconditions beyond `vec_dot`'s: Q8_0 activation quants lie in −127..=127
//! (what `quantize_acts` produces); the AVX2 sign trick would mis-handle −128
//! against a negative weight (the AVX-512 kernels take any byte). Weight bytes
//! may hold any value.
//!
//! Lengths are checked as `vec_dot` checks them (panics on mismatch); all loads
//! are unaligned, so rows may sit anywhere in an mmap.

use tern_quant::GgmlType;

use crate::isa::Isa;

/// One `#[target_feature]` entry point per ISA level for each generic kernel
/// `dot_avx2::<Fmt>` / `dot_avx512::<Fmt>` of the including module.
#[cfg(target_arch = "x86_64")]
macro_rules! kernels {
    ($($avx2:ident, $avx512:ident, $fmt:ty;)*) => {$(
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(super) unsafe fn $avx2(n: usize, w: &[u8], act: &[u8]) -> f32 {
            dot_avx2::<$fmt>(n, w, act)
        }

        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        pub(super) unsafe fn $avx512(n: usize, w: &[u8], act: &[u8]) -> f32 {
            dot_avx512::<$fmt>(n, w, act)
        }
    )*};
}

#[cfg(target_arch = "x86_64")]
mod float;
#[cfg(target_arch = "x86_64")]
mod q32;
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

/// The fastest kernel for `ty` at ISA level `isa` (capped at
/// `Isa::detected()`), or `None` where only the scalar reference exists:
/// `Isa::Scalar`, types without SIMD kernels here (the ternary formats), and
/// targets other than x86-64.
pub fn dot_fn(ty: GgmlType, isa: Isa) -> Option<DotFn> {
    #[cfg(target_arch = "x86_64")]
    {
        let isa = isa.min(Isa::detected());
        let f: DotFn = match (ty, isa) {
            (_, Isa::Scalar) => return None,
            (GgmlType::Q8_0, Isa::Avx2) => q32::q8_0_avx2,
            (GgmlType::Q8_0, Isa::Avx512) => q32::q8_0_avx512,
            (GgmlType::Q4_0, Isa::Avx2) => q32::q4_0_avx2,
            (GgmlType::Q4_0, Isa::Avx512) => q32::q4_0_avx512,
            (GgmlType::IQ4_NL, Isa::Avx2) => q32::iq4nl_avx2,
            (GgmlType::IQ4_NL, Isa::Avx512) => q32::iq4nl_avx512,
            (GgmlType::Q4_K, Isa::Avx2) => q45k::q4k_avx2,
            (GgmlType::Q4_K, Isa::Avx512) => q45k::q4k_avx512,
            (GgmlType::Q5_K, Isa::Avx2) => q45k::q5k_avx2,
            (GgmlType::Q5_K, Isa::Avx512) => q45k::q5k_avx512,
            (GgmlType::Q6_K, Isa::Avx2) => q6k::q6k_avx2,
            (GgmlType::Q6_K, Isa::Avx512) => q6k::q6k_avx512,
            (GgmlType::F32, Isa::Avx2) => float::f32_avx2,
            (GgmlType::F32, Isa::Avx512) => float::f32_avx512,
            (GgmlType::F16, Isa::Avx2) => float::f16_avx2,
            (GgmlType::F16, Isa::Avx512) => float::f16_avx512,
            (GgmlType::BF16, Isa::Avx2) => float::bf16_avx2,
            (GgmlType::BF16, Isa::Avx512) => float::bf16_avx512,
            _ => return None,
        };
        Some(f)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (ty, isa);
        None
    }
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

    /// Eight f16 values at `p`, `p + stride`, ..., `p + 7·stride`, widened.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub unsafe fn f16x8_strided(p: *const u8, stride: usize) -> __m256 {
        let s = stride as i32;
        let idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(s));
        // Reads 4 bytes per block: the f16 and the two bytes after it.
        let g = _mm256_i32gather_epi32::<1>(p.cast(), idx);
        let keep = _mm256_setr_epi8(
            0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1, //
            0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,
        );
        let packed = _mm256_permute4x64_epi64::<0b00_00_10_00>(_mm256_shuffle_epi8(g, keep));
        _mm256_cvtph_ps(_mm256_castsi256_si128(packed))
    }
}
