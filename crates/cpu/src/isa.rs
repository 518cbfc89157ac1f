//! Instruction-set selection. Kernels exist per ISA level; the best one the
//! processor has is chosen at run time, and `TERN_CPU_ISA=scalar|avx2|avx512`
//! forces a lower one (tests use it to cover every path the machine has).

use std::sync::OnceLock;

/// ISA levels, lowest first. `Avx512` means AVX-512 F/BW/VL plus VNNI.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    Scalar,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512 F, BW, VL, VNNI.
    Avx512,
}

impl Isa {
    pub const ALL: [Isa; 3] = [Isa::Scalar, Isa::Avx2, Isa::Avx512];

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// The best level this processor supports.
    pub fn detected() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512vnni") {
                return Isa::Avx512;
            }
            if has!("avx2") && has!("fma") && has!("f16c") {
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    }

    /// Whether this processor can run kernels of level `self`.
    pub fn available(self) -> bool {
        self <= Isa::detected()
    }

    fn parse(s: &str) -> Option<Isa> {
        Isa::ALL.into_iter().find(|i| i.name().eq_ignore_ascii_case(s.trim()))
    }
}

/// The level kernels use: the detected one, lowered by `TERN_CPU_ISA`.
pub fn active() -> Isa {
    static ACTIVE: OnceLock<Isa> = OnceLock::new();
    *ACTIVE.get_or_init(|| {
        let best = Isa::detected();
        match std::env::var("TERN_CPU_ISA").ok().as_deref().and_then(Isa::parse) {
            Some(forced) if forced <= best => forced,
            _ => best,
        }
    })
}
