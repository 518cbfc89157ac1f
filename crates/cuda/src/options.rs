//! How a CUDA backend runs: switches a user may need and the kernel cache.
//! The library reads no environment; the CLI fills this from its table of
//! variables (`docs/environment.md`).

use std::ffi::OsString;
use std::path::PathBuf;

/// Options of [`crate::CudaBackend::with_options`]. `Default` is the fast
/// configuration with no kernel cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaOptions {
    /// Capture a split's launches into a CUDA graph and replay it.
    pub graphs: bool,
    /// Programmatic dependent launch (sm_90 and later).
    pub pdl: bool,
    /// Decode through the persistent `decode_run` kernel (sm_90 and later).
    /// Off launches the kernels one by one: the way out on a GPU shared
    /// under an MPS SM limit, where its blocks cannot all be resident.
    pub fused_decode: bool,
    /// Prompt GEMMs on wgmma (sm_90); off keeps the mma.sync GEMM, which
    /// the GPU tests check on Hopper too.
    pub wgmma: bool,
    /// Page-lock the host arenas (`Backend::pin_host`); off copies through
    /// the driver's staging instead, with no copies inside a split's work.
    pub pin_host: bool,
    /// Time every kernel from the start and print a per-kernel table when
    /// the backend is dropped.
    pub profile: bool,
    /// Print launch and graph counts when the backend is dropped.
    pub stats: bool,
    /// Print where each `decode_run` phase kind spends its time.
    pub fuse_trace: bool,
    /// Where compiled kernels are cached; `None` compiles every time.
    pub kernel_cache: Option<PathBuf>,
    /// The most bytes of shared memory `decode_run`'s weight ring may take
    /// (0: all there is). For tests: a small ring wraps and waits.
    pub ring_max: usize,
}

impl Default for CudaOptions {
    fn default() -> CudaOptions {
        CudaOptions {
            graphs: true,
            pdl: true,
            fused_decode: true,
            wgmma: true,
            pin_host: true,
            profile: false,
            stats: false,
            fuse_trace: false,
            kernel_cache: None,
            ring_max: 0,
        }
    }
}

/// The kernel cache directory from the values of `TERN_KERNEL_CACHE`,
/// `XDG_CACHE_HOME` and `HOME` (read by the caller): the first, else
/// `$XDG_CACHE_HOME/tern/kernels`, else `$HOME/.cache/tern/kernels`.
pub fn kernel_cache_dir(
    tern_kernel_cache: Option<OsString>,
    xdg_cache_home: Option<OsString>,
    home: Option<OsString>,
) -> Option<PathBuf> {
    let nonempty = |v: Option<OsString>| v.filter(|v| !v.is_empty());
    if let Some(d) = nonempty(tern_kernel_cache) {
        return Some(PathBuf::from(d));
    }
    let base = nonempty(xdg_cache_home)
        .map(PathBuf::from)
        .or_else(|| nonempty(home).map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("tern").join("kernels"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_dir_prefers_the_explicit_directory_then_xdg_then_home() {
        let s = |v: &str| Some(OsString::from(v));
        assert_eq!(kernel_cache_dir(s("/k"), s("/x"), s("/h")), Some(PathBuf::from("/k")));
        assert_eq!(kernel_cache_dir(None, s("/x"), s("/h")), Some(PathBuf::from("/x/tern/kernels")));
        assert_eq!(kernel_cache_dir(s(""), None, s("/h")), Some(PathBuf::from("/h/.cache/tern/kernels")));
        assert_eq!(kernel_cache_dir(None, None, None), None);
    }
}
