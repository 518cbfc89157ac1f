//! SIMD kernels with their ISA dispatch. Each has a scalar twin (in
//! `tern-quant` or in the kernel's own module) that tests compare against.

pub mod blocks;
pub mod ternary;
pub mod vec;
