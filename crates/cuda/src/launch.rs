//! A kernel launch as plain data: the kernel, its grid and its arguments by
//! value (the kernel's argument struct, `args.rs`). Lowering produces a list of these; a plan is that list with the
//! split's copies around it (`Step`), and its hash identifies a captured CUDA
//! graph that replays it.
//!
//! Kernels use programmatic dependent launch: each waits for its inputs in
//! `pdl_wait`, and issues before it everything that does not depend on the
//! previous kernel (weight rows, the norm weight, rope angles, earlier
//! positions' K/V rows). A plan runs as launches the first time and is
//! captured into a graph on its second run. One-token kernels are capped at 64
//! registers so four 256-thread blocks share an SM; gate/up pairs take two
//! row pairs a warp for the same reason (`ternary_gemv1_pair`).

use std::ffi::c_void;
use std::hash::{Hash, Hasher};

use crate::args::{Args, RopeMode};
use crate::driver::{DResult, Gpu};
use crate::error::CudaError;
use crate::kernels::{Kernel, Kernels};
use crate::tma::{MatrixMap, TmaMap};

/// One ternary matrix of a batched launch (`struct TernaryMat` in ternary.cu).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
pub struct TernaryMat {
    pub w: u64,
    pub scales: u64,
    pub out: u64,
    pub res: u64,
    pub rows: i32,
    pub groups: i32,
}
const _: () = assert!(std::mem::size_of::<TernaryMat>() == 40);

/// Up to three matrices sharing one input (`struct TernaryBatch`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
pub struct TernaryBatch {
    pub m: [TernaryMat; 3],
    pub n: i32,
    pub block_start: [i32; 4],
    /// Explicit, so the struct has no padding and can be read as bytes.
    pub pad: i32,
}
const _: () = assert!(std::mem::size_of::<TernaryBatch>() == 144);

/// The rope a one-token attention applies itself (`struct AttRope` in
/// attention.cu): unrotated k and v rows of the token, and the rotation.
/// Floats are f32 bits; `on` 0 means q arrives rotated and the caches filled.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
pub struct AttRope {
    pub k: u64,
    pub v: u64,
    pub factors: u64,
    pub n_rot: i32,
    pub mode: RopeMode,
    pub base: u32,
    pub fscale: u32,
    pub on: i32,
    /// Explicit, so the struct has no padding and can be read as bytes.
    pub pad: i32,
}
const _: () = assert!(std::mem::size_of::<AttRope>() == 48);

/// A kernel argument, by value. Floats are kept as bits so launches hash.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Arg {
    Ptr(u64),
    U64(u64),
    I32(i32),
    F32(u32),
    Batch(TernaryBatch),
    Rope(AttRope),
    /// A tensor map, encoded at launch and passed by value
    /// (`__grid_constant__`).
    Map(MatrixMap),
}

/// A kernel launch: the kernel, its shape, and its arguments as the struct
/// of its kernel (`args.rs`), encoded only when it runs.
#[derive(Clone, Debug)]
pub struct Launch {
    pub kernel: Kernel,
    pub grid: (u32, u32, u32),
    pub block: u32,
    /// Dynamic shared memory, bytes.
    pub smem: u32,
    pub args: Args,
    /// Starts only once the previous launch has finished (no programmatic
    /// dependent launch): for launches around a weight being streamed in,
    /// since the kernels read their weights before `pdl_wait`.
    pub serial: bool,
}

/// Launches compare and hash as what the driver is given (floats by their
/// bits), so equality and hashing agree.
impl Launch {
    #[allow(clippy::type_complexity)]
    fn key(&self) -> (Kernel, (u32, u32, u32), u32, u32, Vec<Arg>, bool, bool) {
        let e = self.args.encode();
        (self.kernel, self.grid, self.block, self.smem, e.args, e.unbound, self.serial)
    }
}

impl PartialEq for Launch {
    fn eq(&self, o: &Launch) -> bool {
        self.key() == o.key()
    }
}

impl Eq for Launch {}

impl Hash for Launch {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.key().hash(h);
    }
}

impl Launch {
    /// A launch of `kernel`, which must be one that takes `args`.
    pub fn new(kernel: Kernel, grid: (u32, u32, u32), block: u32, args: impl Into<Args>) -> Launch {
        let args = args.into();
        assert!(args.kernels().contains(&kernel), "{kernel:?} does not take {args:?}");
        Launch { kernel, grid, block, smem: 0, args, serial: false }
    }

    pub fn smem(mut self, bytes: usize) -> Launch {
        self.smem = bytes as u32;
        self
    }

    pub fn serial(mut self) -> Launch {
        self.serial = true;
        self
    }

    /// The arguments in signature order, as the driver takes them.
    pub fn params(&self) -> Vec<Arg> {
        self.args.encode().args
    }

    pub fn run(&self, gpu: &Gpu, kernels: &Kernels, pdl: bool) -> DResult<()> {
        let enc = self.args.encode();
        if enc.unbound {
            return Err(CudaError::Other("an argument set after lowering is unset".into()));
        }
        let maps: Vec<TmaMap> = enc
            .args
            .iter()
            .filter_map(|a| match a {
                Arg::Map(m) => Some(m.encode()),
                _ => None,
            })
            .collect::<Result<_, _>>()?;
        let mut next_map = maps.iter();
        // The driver copies the argument values at launch; `enc` and `maps`
        // outlive the call.
        let mut params: Vec<*mut c_void> = enc
            .args
            .iter()
            .map(|a| match a {
                Arg::Ptr(v) | Arg::U64(v) => v as *const u64 as *mut c_void,
                Arg::I32(v) => v as *const i32 as *mut c_void,
                Arg::F32(v) => v as *const u32 as *mut c_void,
                Arg::Batch(v) => v as *const TernaryBatch as *mut c_void,
                Arg::Rope(v) => v as *const AttRope as *mut c_void,
                Arg::Map(_) => next_map.next().expect("one map per Map argument") as *const TmaMap as *mut c_void,
            })
            .collect();
        gpu.launch(kernels.get(self.kernel), self.grid, self.block, self.smem, &mut params, pdl && !self.serial)
    }
}

/// One entry of a plan: a kernel launch, or a copy that the copy engine runs
/// (a copy node in a captured graph).
// Launches hold their arguments inline (a wgmma GEMM's are ~350 bytes,
// less than the heap vector of `Arg`s they replaced); copies are few.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub enum Step {
    Kernel(Launch),
    /// A DMA copy between device memory and pinned host memory, either way.
    Dma {
        src: u64,
        dst: u64,
        bytes: usize,
    },
}

impl Step {
    pub fn run(&self, gpu: &Gpu, kernels: &Kernels, pdl: bool) -> DResult<()> {
        match self {
            Step::Kernel(l) => l.run(gpu, kernels, pdl).map_err(|e| e.context(format!("{:?}", l.kernel))),
            Step::Dma { src, dst, bytes } => gpu.copy_async(*dst, *src, *bytes).map_err(|e| e.context("DMA copy")),
        }
    }

    /// The kernel this step launches; `None` for a DMA copy.
    pub fn kernel(&self) -> Option<Kernel> {
        match self {
            Step::Kernel(l) => Some(l.kernel),
            Step::Dma { .. } => None,
        }
    }
}
