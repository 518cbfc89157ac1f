//! Tensor maps: how the bulk tensor copy engine (sm_90) reads a 2-D byte
//! matrix in boxes, and how it swizzles them into shared memory. The prompt
//! GEMM on wgmma (`ternary_wgmma.cu`) takes one for its levels and one for
//! each weight matrix of its batch, by value. Lowering describes them
//! (`MatrixMap`); a launch encodes them.

use cudarc::driver::sys;

use crate::error::CudaError;

/// A `CUtensorMap`: 128 opaque bytes, 64-byte aligned (the kernel's
/// `TmaMap`).
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
pub struct TmaMap(pub [u64; 16]);
const _: () = assert!(std::mem::size_of::<TmaMap>() == 128);

/// How a box lands in shared memory: its 16-byte units permuted within
/// each span of this many bytes (wgmma's swizzled layouts).
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
pub enum Swizzle {
    #[default]
    B64,
    B128,
}

/// A row-major matrix of `rows` rows of `row_bytes` bytes at device
/// address `ptr`, read in boxes of `box_bytes` × `box_rows`; boxes reaching
/// past the matrix read zeros there. Plain data (launches hash it); the
/// launch encodes it.
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
pub struct MatrixMap {
    pub ptr: u64,
    pub row_bytes: u64,
    pub rows: u64,
    pub box_bytes: u32,
    pub box_rows: u32,
    pub swizzle: Swizzle,
}

impl MatrixMap {
    /// Whether the copy engine takes this shape (cuTensorMapEncodeTiled's
    /// limits): 16-byte aligned base and row stride, boxes of at most 256 a
    /// side and no wider than the swizzle span.
    pub fn check(&self) -> Result<(), CudaError> {
        let span = match self.swizzle {
            Swizzle::B64 => 64,
            Swizzle::B128 => 128,
        };
        let ok = self.ptr.is_multiple_of(16)
            && self.row_bytes.is_multiple_of(16)
            && self.rows > 0
            && self.box_bytes.is_multiple_of(16)
            && (16..=span).contains(&self.box_bytes)
            && (1..=256).contains(&self.box_rows);
        if ok {
            Ok(())
        } else {
            Err(CudaError::TensorMap(format!("{self:?}")))
        }
    }

    pub fn encode(&self) -> Result<TmaMap, CudaError> {
        self.check()?;
        let mut map = sys::CUtensorMap { opaque: [0; 16] };
        let dims = [self.row_bytes, self.rows];
        let strides = [self.row_bytes];
        let boxes = [self.box_bytes, self.box_rows];
        let steps = [1u32, 1];
        let sw = match self.swizzle {
            Swizzle::B64 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B,
            Swizzle::B128 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
        };
        // SAFETY: every pointer is to a local array of the rank's length; the
        // call only encodes (it reads no device memory). Launches run only
        // with the driver loaded.
        let r = unsafe {
            sys::cuTensorMapEncodeTiled(
                &mut map,
                sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
                2,
                self.ptr as *mut std::ffi::c_void,
                dims.as_ptr(),
                strides.as_ptr(),
                boxes.as_ptr(),
                steps.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                sw,
                sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        };
        r.result().map_err(|e| crate::driver::err("cuTensorMapEncodeTiled")(e).context(format!("{self:?}")))?;
        Ok(TmaMap(map.opaque))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_takes_the_gemm_shapes_and_refuses_what_the_engine_would() {
        let levels = MatrixMap {
            ptr: 1 << 40,
            row_bytes: 2560,
            rows: 77,
            box_bytes: 128,
            box_rows: 128,
            swizzle: Swizzle::B128,
        };
        assert!(levels.check().is_ok());
        assert!(MatrixMap { box_bytes: 64, box_rows: 192, swizzle: Swizzle::B64, ..levels }.check().is_ok());
        for bad in [
            MatrixMap { ptr: (1 << 40) + 8, ..levels },
            MatrixMap { row_bytes: 2568, ..levels },
            MatrixMap { rows: 0, ..levels },
            MatrixMap { box_bytes: 128, swizzle: Swizzle::B64, ..levels },
            MatrixMap { box_rows: 257, ..levels },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
    }
}
