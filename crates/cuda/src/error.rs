//! The CUDA crate's one error type. Each variant keeps what the failing call
//! returned (the driver's `CUresult`, NVRTC's whole log), and displays as one
//! line for the user.

use crate::driver::Unavailable;

/// Why a CUDA call failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CudaError {
    /// No driver or no device: nothing on the GPU can run.
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
    /// A driver call returned an error `CUresult`: its number and name.
    #[error("{call} failed: {name} ({code}){}", if text.is_empty() { String::new() } else { format!(": {text}") })]
    Driver { call: &'static str, code: i32, name: String, text: String },
    /// A device allocation found too little free memory.
    #[error("out of device memory allocating {bytes} bytes")]
    OutOfMemory { bytes: usize },
    /// A module NVRTC rejected; `log` holds its whole log.
    #[error("{module}.cu does not compile for {arch}: {}", log_summary(log))]
    Nvrtc { module: String, arch: String, log: String },
    /// An NVRTC call other than the compile itself failed.
    #[error("{call} failed: {name} ({code})")]
    NvrtcCall { call: &'static str, code: i32, name: String },
    /// libnvrtc could not be loaded.
    #[error("libnvrtc.so could not be loaded: {0}")]
    NoNvrtc(String),
    /// A tensor map the copy engine does not take.
    #[error("{0}: not a shape the bulk tensor copy engine takes")]
    TensorMap(String),
    /// What failed (`what`: a kernel, a copy) around the error that says why.
    #[error("{what}: {source}")]
    Context { what: String, source: Box<CudaError> },
    /// Failures of tern's own bookkeeping, with no CUDA status behind them.
    #[error("{0}")]
    Other(String),
}

impl CudaError {
    /// `self`, said to have happened in `what`.
    pub fn context(self, what: impl Into<String>) -> CudaError {
        CudaError::Context { what: what.into(), source: Box::new(self) }
    }

    /// The bytes of a failed allocation, through any context.
    pub fn out_of_memory(&self) -> Option<usize> {
        match self {
            CudaError::OutOfMemory { bytes } => Some(*bytes),
            CudaError::Context { source, .. } => source.out_of_memory(),
            _ => None,
        }
    }
}

/// What the CUDA crate's fallible calls return.
pub type CudaResult<T> = Result<T, CudaError>;

/// An NVRTC log as one line: the first error line (or the first line), and
/// how many lines follow.
pub(crate) fn log_summary(log: &str) -> String {
    let lines: Vec<&str> = log.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let Some(first) = lines.iter().find(|l| l.contains("error")).or(lines.first()) else {
        return "(no log)".to_string();
    };
    match lines.len() - 1 {
        0 => first.to_string(),
        more => format!("{first} (+{more} more log lines)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_line(e: &CudaError) -> String {
        let s = e.to_string();
        assert!(!s.contains('\n'), "{s:?}");
        s
    }

    #[test]
    fn out_of_memory_names_the_bytes() {
        let e = CudaError::OutOfMemory { bytes: 1 << 30 };
        assert_eq!(one_line(&e), "out of device memory allocating 1073741824 bytes");
        assert_eq!(e.clone().context("alloc").out_of_memory(), Some(1 << 30));
    }

    #[test]
    fn driver_error_names_the_call_and_the_result() {
        let e = CudaError::Driver {
            call: "cuLaunchKernelEx",
            code: 700,
            name: "CUDA_ERROR_ILLEGAL_ADDRESS".into(),
            text: "an illegal memory access was encountered".into(),
        };
        let s = one_line(&e.context("GemmQ8"));
        assert_eq!(
            s,
            "GemmQ8: cuLaunchKernelEx failed: CUDA_ERROR_ILLEGAL_ADDRESS (700): an illegal memory access was encountered"
        );
        assert_eq!(CudaError::Other("x".into()).out_of_memory(), None);
    }

    #[test]
    fn nvrtc_failure_is_one_line_and_keeps_the_log() {
        let log =
            "gemm.cu(12): warning: unused\ngemm.cu(40): error: identifier \"x\" is undefined\n\n1 error detected\n";
        let e = CudaError::Nvrtc { module: "gemm".into(), arch: "sm_90a".into(), log: log.into() };
        let s = one_line(&e);
        assert_eq!(s, "gemm.cu does not compile for sm_90a: gemm.cu(40): error: identifier \"x\" is undefined (+2 more log lines)");
        assert!(matches!(&e, CudaError::Nvrtc { log: l, .. } if l == log));
        let empty = CudaError::Nvrtc { module: "m".into(), arch: "sm_80".into(), log: String::new() };
        assert_eq!(one_line(&empty), "m.cu does not compile for sm_80: (no log)");
    }
}
