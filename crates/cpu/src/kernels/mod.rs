//! SIMD kernels with their ISA dispatch. Each has a scalar twin (in
//! `tern-quant` or in the kernel's own module) that tests compare against.

pub mod blocks;
#[cfg(target_arch = "x86_64")]
pub mod q2_0;
pub mod ternary;
pub mod vec;

/// Asks for the `len` bytes at `p` to be brought into cache. A hint only:
/// it never faults, whatever the address, and does nothing off x86.
#[inline(always)]
/// Rows of `row_bytes` that a one-token GEMV fetches ahead of the row it
/// multiplies: about a page, past where the hardware prefetcher stops.
pub fn rows_ahead(row_bytes: usize) -> usize {
    4096usize.div_ceil(row_bytes.max(1))
}

pub fn prefetch(p: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    for off in (0..len).step_by(64) {
        // SAFETY: prefetching is architecturally side-effect free, even for invalid addresses.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.wrapping_add(off) as *const i8)
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, len);
}
