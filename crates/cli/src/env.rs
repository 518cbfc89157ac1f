//! The environment variables tern reads: this table, and only here. The
//! libraries take options (`LoadOptions`, `CpuOptions`, `CudaOptions`);
//! this module fills them. `docs/environment.md` documents every entry
//! (a test checks that it names each one).

use std::ffi::OsString;
use std::path::PathBuf;

use tern_engine::{kernel_cache_dir, Isa, LoadOptions};

use crate::CliError;

/// One variable: its name, its default, and what it does.
pub struct Var {
    pub name: &'static str,
    pub default: &'static str,
    pub meaning: &'static str,
}

/// Every variable tern reads (the source of `docs/environment.md`).
pub const VARS: &[Var] = &[
    Var { name: "TERN_MODEL", default: "the demo model", meaning: "the model to load when -m is not given" },
    Var {
        name: "TERN_CPU_ISA",
        default: "the best detected",
        meaning: "scalar, avx2 or avx512: the highest ISA level CPU kernels use",
    },
    Var {
        name: "TERN_KERNEL_CACHE",
        default: "$XDG_CACHE_HOME/tern/kernels, else ~/.cache/tern/kernels",
        meaning: "where compiled CUDA kernels are cached",
    },
    Var {
        name: "XDG_CACHE_HOME",
        default: "~/.cache",
        meaning: "the base of the kernel cache and of the demo model's copy",
    },
    Var {
        name: "HOME",
        default: "-",
        meaning: "the base of the kernel cache and of the demo model's copy without XDG_CACHE_HOME",
    },
    Var { name: "TERN_CUDA_GRAPHS", default: "1", meaning: "0: launch kernels directly, no CUDA graphs" },
    Var { name: "TERN_CUDA_PDL", default: "1", meaning: "0: no programmatic dependent launch (sm_90)" },
    Var {
        name: "TERN_CUDA_FUSE",
        default: "1",
        meaning:
            "0: decode with separate launches instead of the persistent kernel (sm_90; for GPUs under an MPS SM limit)",
    },
    Var { name: "TERN_CUDA_WGMMA", default: "1", meaning: "0: prompt GEMMs on mma.sync instead of wgmma (sm_90)" },
    Var { name: "TERN_CUDA_PIN", default: "1", meaning: "0: do not page-lock the host arenas" },
    Var { name: "TERN_CUDA_PROFILE", default: "0", meaning: "1: time every kernel, print a table at exit" },
    Var { name: "TERN_CUDA_STATS", default: "0", meaning: "1: print launch and graph counts at exit" },
    Var { name: "TERN_CUDA_FUSE_TRACE", default: "0", meaning: "1: print the persistent kernel's per-phase times" },
];

/// The table as `tern --help` ends with it.
pub fn help() -> String {
    let mut out = String::from("Environment (docs/environment.md):\n");
    for v in VARS {
        out += &format!("  {:<22} {} (default: {})\n", v.name, v.meaning, v.default);
    }
    out
}

/// Reads the table from the process environment into `opts`.
pub fn apply(opts: &mut LoadOptions) -> Result<(), CliError> {
    apply_from(opts, |name| std::env::var_os(name))
}

/// Where tern keeps files it writes for itself (the demo model's copy):
/// `$XDG_CACHE_HOME/tern`, else `~/.cache/tern`, else the temporary directory's.
pub fn cache_dir() -> PathBuf {
    let nonempty = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    nonempty("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| nonempty("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("tern")
}

/// `$TERN_MODEL`, when set.
pub fn model() -> Option<PathBuf> {
    debug_assert!(VARS.iter().any(|v| v.name == "TERN_MODEL"));
    std::env::var_os("TERN_MODEL").filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// [`apply`] with the variables looked up by `get`.
pub fn apply_from(opts: &mut LoadOptions, get: impl Fn(&str) -> Option<OsString>) -> Result<(), CliError> {
    let get = |name: &str| {
        debug_assert!(VARS.iter().any(|v| v.name == name), "{name} is missing from VARS");
        get(name)
    };
    let text = |name: &str| -> Result<Option<String>, CliError> {
        match get(name) {
            None => Ok(None),
            Some(v) => match v.into_string() {
                Ok(s) if s.trim().is_empty() => Ok(None),
                Ok(s) => Ok(Some(s.trim().to_string())),
                Err(v) => Err(CliError(format!("{name}: not UTF-8 ({v:?})"))),
            },
        }
    };
    let flag = |name: &str, default: bool| -> Result<bool, CliError> {
        match text(name)?.as_deref().map(str::to_ascii_lowercase).as_deref() {
            None => Ok(default),
            Some("1" | "on" | "true" | "yes") => Ok(true),
            Some("0" | "off" | "false" | "no") => Ok(false),
            Some(v) => Err(CliError(format!("{name}: expected 1 or 0, not {v:?}"))),
        }
    };
    if let Some(s) = text("TERN_CPU_ISA")? {
        let isa = Isa::parse(&s)
            .ok_or_else(|| CliError(format!("TERN_CPU_ISA: expected scalar, avx2 or avx512, not {s:?}")))?;
        opts.cpu_isa = Some(isa);
    }
    let c = &mut opts.cuda;
    c.graphs = flag("TERN_CUDA_GRAPHS", c.graphs)?;
    c.pdl = flag("TERN_CUDA_PDL", c.pdl)?;
    c.fused_decode = flag("TERN_CUDA_FUSE", c.fused_decode)?;
    c.wgmma = flag("TERN_CUDA_WGMMA", c.wgmma)?;
    c.pin_host = flag("TERN_CUDA_PIN", c.pin_host)?;
    c.profile = flag("TERN_CUDA_PROFILE", c.profile)?;
    c.stats = flag("TERN_CUDA_STATS", c.stats)?;
    c.fuse_trace = flag("TERN_CUDA_FUSE_TRACE", c.fuse_trace)?;
    c.kernel_cache = kernel_cache_dir(get("TERN_KERNEL_CACHE"), get("XDG_CACHE_HOME"), get("HOME"));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> Result<LoadOptions, CliError> {
        let mut opts = LoadOptions::default();
        apply_from(&mut opts, |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| OsString::from(v)))?;
        Ok(opts)
    }

    #[test]
    fn nothing_set_gives_the_defaults_and_no_cache() {
        let o = with(&[]).ok().unwrap();
        assert_eq!(o.cpu_isa, None);
        assert_eq!(o.cuda, tern_engine::CudaOptions::default());
    }

    #[test]
    fn variables_fill_the_options() {
        let o = with(&[
            ("TERN_CPU_ISA", "AVX2"),
            ("TERN_CUDA_FUSE", "0"),
            ("TERN_CUDA_GRAPHS", "off"),
            ("TERN_CUDA_PROFILE", "1"),
            ("TERN_CUDA_WGMMA", ""),
            ("HOME", "/home/u"),
        ])
        .ok()
        .unwrap();
        assert_eq!(o.cpu_isa, Some(Isa::Avx2));
        assert!(!o.cuda.fused_decode && !o.cuda.graphs && o.cuda.profile);
        assert!(o.cuda.wgmma && o.cuda.pdl && o.cuda.pin_host, "empty or unset keeps the default");
        assert_eq!(o.cuda.kernel_cache, Some(PathBuf::from("/home/u/.cache/tern/kernels")));
        let o = with(&[("TERN_KERNEL_CACHE", "/k"), ("XDG_CACHE_HOME", "/x"), ("HOME", "/h")]).ok().unwrap();
        assert_eq!(o.cuda.kernel_cache, Some(PathBuf::from("/k")));
    }

    #[test]
    fn bad_values_are_one_line_errors() {
        let e = with(&[("TERN_CPU_ISA", "sse9")]).err().unwrap();
        assert_eq!(e.0, "TERN_CPU_ISA: expected scalar, avx2 or avx512, not \"sse9\"");
        let e = with(&[("TERN_CUDA_FUSE", "maybe")]).err().unwrap();
        assert_eq!(e.0, "TERN_CUDA_FUSE: expected 1 or 0, not \"maybe\"");
    }

    /// Every variable of the table is in docs/environment.md, and the page's
    /// tables of what tern reads (before "Removed") name no other.
    #[test]
    fn the_documented_table_matches() {
        let page = include_str!("../../../docs/environment.md");
        for v in VARS {
            assert!(page.contains(&format!("`{}`", v.name)), "docs/environment.md lacks {}", v.name);
        }
        let read = page.split("## Removed").next().unwrap();
        for word in read.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if word.starts_with("TERN_") {
                assert!(
                    VARS.iter().any(|v| v.name == word),
                    "docs/environment.md names {word}, which tern does not read"
                );
            }
        }
    }
}
