//! What the engine's GPU and split tests share.
#![allow(dead_code)] // each test binary uses a different subset

use tern_engine::{CudaOptions, LoadOptions};
use tern_testutil::Device;

/// The kernel cache `tern` uses, and separate launches under
/// `TERN_CUDA_FUSE=0` (`scripts/gpu check` runs the GPU tests both ways).
pub fn cuda_options() -> CudaOptions {
    let var = |k| std::env::var_os(k);
    CudaOptions {
        kernel_cache: tern_cuda::kernel_cache_dir(var("TERN_KERNEL_CACHE"), var("XDG_CACHE_HOME"), var("HOME")),
        fused_decode: !std::env::var("TERN_CUDA_FUSE").is_ok_and(|v| v == "0"),
        ..CudaOptions::default()
    }
}

/// `base` with `dev` there to be placed on: a second CPU instance, or the
/// GPU's options.
pub fn with_device(dev: Device, base: LoadOptions) -> LoadOptions {
    match dev {
        Device::Cpu => base,
        Device::Cpu1 => LoadOptions { cpu_instances: 2, ..base },
        Device::Cuda0 => LoadOptions { cuda: cuda_options(), ..base },
    }
}
