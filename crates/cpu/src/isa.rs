//! Instruction-set selection. Kernels exist per ISA level; the best one the
//! processor has is chosen at run time, and `CpuOptions::isa` (the CLI's
//! `TERN_CPU_ISA=scalar|avx2|avx512`) caps it (tests cover every level the
//! machine has).

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

    /// A level by its [`Isa::name`], in any case.
    pub fn parse(s: &str) -> Option<Isa> {
        Isa::ALL.into_iter().find(|i| i.name().eq_ignore_ascii_case(s.trim()))
    }
}

/// The level kernels use: the detected one, lowered to `cap` if given.
pub fn active(cap: Option<Isa>) -> Isa {
    let best = Isa::detected();
    cap.map_or(best, |c| c.min(best))
}
