//! SIMD dot products for the block formats (being written).
