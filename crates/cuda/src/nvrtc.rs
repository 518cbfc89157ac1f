//! Run-time compilation of the embedded `.cu` sources with NVRTC, for the
//! device's own architecture, with an on-disk cache keyed by a hash of the
//! source, the options, the architecture and the NVRTC version.
//!
//! Hopper compiles for `sm_90a` (wgmma); a cache entry is written atomically
//! (a temporary file, then a rename).

use std::ffi::{c_char, CStr, CString};
use std::path::Path;

use cudarc::nvrtc::sys;

use crate::error::CudaError;

/// Compiler options shared by every kernel.
const OPTIONS: &[&str] = &["-std=c++17", "-lineinfo"];

/// Whether libnvrtc can be loaded.
pub fn available() -> bool {
    // SAFETY: only probes whether the shared library loads.
    unsafe { sys::is_culib_present() }
}

/// NVRTC's version, `(major, minor)`.
pub fn version() -> Result<(i32, i32), CudaError> {
    if !available() {
        return Err(missing());
    }
    let (mut major, mut minor) = (0, 0);
    check(unsafe { sys::nvrtcVersion(&mut major, &mut minor) }, "nvrtcVersion")?;
    Ok((major, minor))
}

fn missing() -> CudaError {
    CudaError::NoNvrtc(
        "install the CUDA toolkit or the nvidia-cuda-nvrtc wheel and add its lib/ to LD_LIBRARY_PATH".to_string(),
    )
}

fn check(r: sys::nvrtcResult, call: &'static str) -> Result<(), CudaError> {
    if r == sys::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::NvrtcCall { call, code: r as i32, name: format!("{r:?}") })
    }
}

/// FNV-1a, 64 bits: stable across builds and platforms, unlike std's hasher.
fn fnv(parts: &[&[u8]]) -> u64 {
    let mut h = 0xcbf29ce484222325u64;
    for p in parts {
        for &b in p.iter().chain(&[0xffu8]) {
            h = (h ^ b as u64).wrapping_mul(0x100000001b3);
        }
    }
    h
}

/// A compiled kernel module: a cubin for `arch` (e.g. `sm_90`).
pub struct Compiled {
    pub image: Vec<u8>,
    pub cached: bool,
}

/// Compiles `src` (module `name`) for `arch`, through the cache in `cache`
/// when given. A cache that cannot be written is skipped, never an error.
pub fn compile(name: &str, src: &str, arch: &str, cache: Option<&Path>) -> Result<Compiled, CudaError> {
    let (major, minor) = version()?;
    let ver = format!("{major}.{minor}");
    let key = fnv(&[src.as_bytes(), OPTIONS.join(" ").as_bytes(), arch.as_bytes(), ver.as_bytes()]);
    let path = cache.map(|d| d.join(format!("{name}-{arch}-{key:016x}.cubin")));
    if let Some(p) = &path {
        if let Ok(image) = std::fs::read(p) {
            if !image.is_empty() {
                return Ok(Compiled { image, cached: true });
            }
        }
    }
    let image = compile_uncached(name, src, arch)?;
    if let Some(p) = &path {
        store(p, &image);
    }
    Ok(Compiled { image, cached: false })
}

/// Writes a cache entry atomically (temporary file, then rename), so a
/// concurrent reader never sees half a file.
fn store(path: &Path, image: &[u8]) {
    let Some(dir) = path.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp =
        dir.join(format!(".{}.{}.tmp", path.file_name().unwrap_or_default().to_string_lossy(), std::process::id()));
    if std::fs::write(&tmp, image).is_ok() && std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

fn compile_uncached(name: &str, src: &str, arch: &str) -> Result<Vec<u8>, CudaError> {
    let csrc = CString::new(src).map_err(|_| CudaError::Other(format!("{name}.cu: source holds a NUL byte")))?;
    let cname = CString::new(format!("{name}.cu")).expect("kernel names hold no NUL");
    let mut prog = std::ptr::null_mut();
    check(
        unsafe {
            sys::nvrtcCreateProgram(&mut prog, csrc.as_ptr(), cname.as_ptr(), 0, std::ptr::null(), std::ptr::null())
        },
        "nvrtcCreateProgram",
    )?;
    let mut opts: Vec<CString> = OPTIONS.iter().map(|o| CString::new(*o).expect("static options")).collect();
    opts.push(
        CString::new(format!("--gpu-architecture={arch}"))
            .map_err(|_| CudaError::Other(format!("architecture {arch:?} holds a NUL byte")))?,
    );
    let ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    let r = unsafe { sys::nvrtcCompileProgram(prog, ptrs.len() as i32, ptrs.as_ptr()) };
    let out = if r == sys::nvrtcResult::NVRTC_SUCCESS {
        let mut size = 0usize;
        check(unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) }, "nvrtcGetCUBINSize").and_then(|_| {
            let mut image = vec![0u8; size];
            check(unsafe { sys::nvrtcGetCUBIN(prog, image.as_mut_ptr() as *mut c_char) }, "nvrtcGetCUBIN")?;
            Ok(image)
        })
    } else {
        Err(CudaError::Nvrtc { module: name.to_string(), arch: arch.to_string(), log: log(prog) })
    };
    unsafe { sys::nvrtcDestroyProgram(&mut prog) };
    out
}

fn log(prog: sys::nvrtcProgram) -> String {
    let mut size = 0usize;
    if unsafe { sys::nvrtcGetProgramLogSize(prog, &mut size) } != sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
        return String::new();
    }
    let mut buf = vec![0u8; size];
    unsafe { sys::nvrtcGetProgramLog(prog, buf.as_mut_ptr() as *mut c_char) };
    CStr::from_bytes_until_nul(&buf).map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_is_stable_and_separates_parts() {
        assert_eq!(fnv(&[b"ab", b"c"]), fnv(&[b"ab", b"c"]));
        assert_ne!(fnv(&[b"ab", b"c"]), fnv(&[b"a", b"bc"]));
    }
}
