//! The offload policy (`-op`): whether an op that reads a host-resident
//! weight runs on a GPU instead, with the weight streamed over for that
//! micro-batch. Streaming costs the weight's bytes over the host link once per
//! micro-batch, so it pays for prompts (many tokens per weight byte) and not
//! for token generation (one token per weight byte).
//!
//! `-op` takes op names, or ik_llama.cpp's `enum ggml_op` numbers for
//! compatibility (those shift between ik versions; names do not).

use std::fmt;

/// The ops the policy covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OffloadOp {
    /// A dense matrix product on a weight. The expert products of MoE
    /// models join this enum with the ops that run them.
    MulMat,
}

impl OffloadOp {
    pub const ALL: [OffloadOp; 1] = [OffloadOp::MulMat];

    pub fn name(self) -> &'static str {
        match self {
            OffloadOp::MulMat => "mul_mat",
        }
    }

    /// ik_llama.cpp's op numbers (its `enum ggml_op` as of 2026). Its dense
    /// FUSED_UP_GATE (30) is two `mul_mat`s here.
    fn from_ik_id(id: i64) -> Option<OffloadOp> {
        match id {
            27 | 30 => Some(OffloadOp::MulMat),
            _ => None,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// What the policy does for one op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Never offload.
    Off,
    /// Offload from `min_batch` tokens on (llama.cpp's rule).
    On,
    /// Offload when the cost model says the GPU finishes first.
    Auto,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Off => "0",
            Mode::On => "1",
            Mode::Auto => "auto",
        })
    }
}

/// Rates the `auto` mode weighs. The defaults are conservative guesses for
/// plans made without the hardware; a real load measures the host link and
/// the CPU (`tern_engine`), and `tern info --plan` says which it used.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CostModel {
    /// Host-to-device copy rate of streamed weights, bytes/s.
    pub h2d_bytes_per_s: f64,
    /// CPU multiply-adds per second on ternary or quantized weights (all threads).
    pub cpu_macs_per_s: f64,
    /// CPU weight-read rate when a product is bound by memory, bytes/s.
    pub cpu_bytes_per_s: f64,
    /// GPU multiply-adds per second (int8 tensor cores, far below peak).
    pub gpu_macs_per_s: f64,
    /// Whether the rates were measured on this machine.
    pub measured: bool,
}

impl Default for CostModel {
    fn default() -> CostModel {
        CostModel {
            h2d_bytes_per_s: 20e9,
            cpu_macs_per_s: 0.5e12,
            cpu_bytes_per_s: 40e9,
            gpu_macs_per_s: 100e12,
            measured: false,
        }
    }
}

impl CostModel {
    /// Seconds on the CPU: the slower of its arithmetic and its weight reads.
    pub fn cpu_s(&self, w: &Work) -> f64 {
        (w.macs as f64 / self.cpu_macs_per_s).max(w.weight_bytes as f64 / self.cpu_bytes_per_s)
    }

    /// Seconds on the GPU: streaming the weight, then the arithmetic.
    pub fn gpu_s(&self, w: &Work) -> f64 {
        w.weight_bytes as f64 / self.h2d_bytes_per_s + w.macs as f64 / self.gpu_macs_per_s
    }
}

/// One op on a host-resident weight, as the policy sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Work {
    pub op: OffloadOp,
    /// Tokens in the micro-batch.
    pub batch: usize,
    pub weight_bytes: u64,
    pub macs: u64,
}

/// Why an op on a host weight was offloaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OffloadWhy {
    /// Mode `On` and the batch reached `min_batch`.
    Batch { min_batch: usize },
    /// Mode `Auto`: the cost model's GPU time (µs) beat the CPU's.
    Cost { gpu_us: u32, cpu_us: u32 },
}

impl fmt::Display for OffloadWhy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OffloadWhy::Batch { min_batch } => write!(f, "batch >= {min_batch}"),
            OffloadWhy::Cost { gpu_us, cpu_us } => write!(f, "cost: GPU {gpu_us} us < CPU {cpu_us} us"),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct OffloadPolicy {
    modes: [Mode; 1],
    /// `--offload-batch`: tokens from which `On` offloads (default 32).
    pub min_batch: usize,
    pub cost: CostModel,
}

impl Default for OffloadPolicy {
    fn default() -> OffloadPolicy {
        OffloadPolicy { modes: [Mode::On; 1], min_batch: OFFLOAD_MIN_BATCH, cost: CostModel::default() }
    }
}

/// Batch size from which work on a host-resident weight is worth doing on
/// the device (llama.cpp's default offload rule).
pub const OFFLOAD_MIN_BATCH: usize = 32;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    #[error("offload policy {0:?}: expected OP,0|1|auto pairs")]
    Syntax(String),
    #[error("offload policy: unknown op {0:?}; valid: mul_mat, all (or ik ids 27, 30, -1)")]
    UnknownOp(String),
    #[error("offload policy: {0:?} is an expert op, and no model tern runs has experts yet (valid: mul_mat, all)")]
    ExpertOp(String),
    #[error("offload policy: {op}: expected 0, 1 or auto, got {value:?}")]
    Value { op: String, value: String },
}

impl OffloadPolicy {
    /// Parses `-op` values: each a comma list of `OP,MODE` pairs, applied in
    /// order (a later pair overrides an earlier one). `OP` is a name, `all`,
    /// or an ik op number (`-1` or any unknown number past ik's range means
    /// all, as in ik); `MODE` is `0`, `1` or `auto`.
    pub fn parse(values: &[String]) -> Result<OffloadPolicy, PolicyError> {
        let mut policy = OffloadPolicy::default();
        for value in values {
            let parts: Vec<&str> = value.split(',').map(str::trim).collect();
            if !parts.len().is_multiple_of(2) || parts.iter().any(|p| p.is_empty()) {
                return Err(PolicyError::Syntax(value.clone()));
            }
            for pair in parts.chunks(2) {
                let mode = match pair[1].to_ascii_lowercase().as_str() {
                    "0" | "off" => Mode::Off,
                    "1" | "on" => Mode::On,
                    "auto" => Mode::Auto,
                    _ => return Err(PolicyError::Value { op: pair[0].to_string(), value: pair[1].to_string() }),
                };
                for op in ops_named(pair[0])? {
                    policy.modes[op.index()] = mode;
                }
            }
        }
        Ok(policy)
    }

    pub fn mode(&self, op: OffloadOp) -> Mode {
        self.modes[op.index()]
    }

    pub fn set(&mut self, op: OffloadOp, mode: Mode) {
        self.modes[op.index()] = mode;
    }

    /// Whether `w` runs on the GPU, and why.
    pub fn decide(&self, w: &Work) -> Option<OffloadWhy> {
        match self.mode(w.op) {
            Mode::Off => None,
            Mode::On => (w.batch >= self.min_batch).then_some(OffloadWhy::Batch { min_batch: self.min_batch }),
            Mode::Auto => {
                let (gpu, cpu) = (self.cost.gpu_s(w), self.cost.cpu_s(w));
                let us = |s: f64| (s * 1e6).round().min(u32::MAX as f64) as u32;
                (gpu < cpu).then_some(OffloadWhy::Cost { gpu_us: us(gpu), cpu_us: us(cpu) })
            }
        }
    }
}

impl fmt::Display for OffloadPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let modes: Vec<String> = OffloadOp::ALL.iter().map(|op| format!("{},{}", op.name(), self.mode(*op))).collect();
        write!(f, "{} (batch >= {})", modes.join(","), self.min_batch)
    }
}

fn ops_named(name: &str) -> Result<Vec<OffloadOp>, PolicyError> {
    let lower = name.to_ascii_lowercase();
    if let Some(op) = OffloadOp::ALL.iter().find(|op| op.name() == lower) {
        return Ok(vec![*op]);
    }
    match (lower.as_str(), lower.parse::<i64>()) {
        ("all", _) => Ok(OffloadOp::ALL.to_vec()),
        ("fused_up_gate", _) => Ok(vec![OffloadOp::MulMat]),
        ("mul_mat_id" | "moe_up_gate" | "moe_fused_up_gate", _) | (_, Ok(28 | 31)) => {
            Err(PolicyError::ExpertOp(name.to_string()))
        }
        (_, Ok(id)) => match OffloadOp::from_ik_id(id) {
            Some(op) => Ok(vec![op]),
            // ik: a negative or out-of-range number sets every op.
            None if !(0..IK_OP_COUNT).contains(&id) => Ok(OffloadOp::ALL.to_vec()),
            None => Err(PolicyError::UnknownOp(name.to_string())),
        },
        _ => Err(PolicyError::UnknownOp(name.to_string())),
    }
}

/// ik's `GGML_OP_COUNT` is above 90; numbers below this that are not a
/// matrix product name an op tern never offloads.
const IK_OP_COUNT: i64 = 100;

#[cfg(test)]
mod tests {
    use super::*;

    fn p(v: &[&str]) -> Result<OffloadPolicy, PolicyError> {
        OffloadPolicy::parse(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    fn dense(batch: usize) -> Work {
        Work { op: OffloadOp::MulMat, batch, weight_bytes: 4_423_680, macs: 17_694_720 * batch as u64 }
    }

    #[test]
    fn names_and_ik_ids() {
        assert_eq!(p(&[]).unwrap(), OffloadPolicy::default());
        let q = p(&["mul_mat,0"]).unwrap();
        assert_eq!(q.mode(OffloadOp::MulMat), Mode::Off);
        assert_eq!(p(&["27,0"]).unwrap(), q, "ik's 27 is mul_mat");
        assert_eq!(p(&["all,0", "30,1"]).unwrap().mode(OffloadOp::MulMat), Mode::On, "ik's 30 is two mul_mats");
        let none = p(&["-1,0"]).unwrap();
        assert!(OffloadOp::ALL.iter().all(|op| none.mode(*op) == Mode::Off), "ik's -1 is every op");
        assert_eq!(p(&["MUL_MAT,Auto"]).unwrap().mode(OffloadOp::MulMat), Mode::Auto);
        for expert in ["mul_mat_id,1", "moe_up_gate,0", "28,0", "31,auto"] {
            assert!(matches!(p(&[expert]), Err(PolicyError::ExpertOp(_))), "{expert}");
        }
    }

    #[test]
    fn bad_values_say_what_is_valid() {
        assert!(matches!(p(&["mul_mat"]), Err(PolicyError::Syntax(_))));
        assert!(matches!(p(&["mul_mat,0,"]), Err(PolicyError::Syntax(_))));
        assert!(matches!(p(&["mul_mat,2"]), Err(PolicyError::Value { .. })));
        let e = p(&["softmax,1"]).unwrap_err();
        assert!(e.to_string().contains("mul_mat,"), "{e}");
        assert!(matches!(p(&["42,1"]), Err(PolicyError::UnknownOp(_))), "ik's GET_ROWS is never offloaded");
    }

    #[test]
    fn batch_rule() {
        let on = OffloadPolicy::default();
        assert_eq!(on.decide(&dense(1)), None);
        assert_eq!(on.decide(&dense(31)), None);
        assert_eq!(on.decide(&dense(32)), Some(OffloadWhy::Batch { min_batch: 32 }));
        assert!(on.decide(&dense(512)).is_some());
        let off = p(&["mul_mat,0"]).unwrap();
        assert_eq!(off.decide(&dense(512)), None);
        let mut fewer = on.clone();
        fewer.min_batch = 8;
        assert!(fewer.decide(&dense(8)).is_some());
    }

    #[test]
    fn auto_weighs_the_link_against_the_cpu() {
        let mut a = p(&["mul_mat,auto"]).unwrap();
        a.cost = CostModel {
            h2d_bytes_per_s: 25e9,
            cpu_macs_per_s: 1e12,
            cpu_bytes_per_s: 80e9,
            gpu_macs_per_s: 100e12,
            measured: true,
        };
        // One token: the CPU reads 4.4 MB in 55 us; the link needs 177 us.
        assert_eq!(a.decide(&dense(1)), None);
        // 512 tokens: 9 G multiply-adds take the CPU 9 ms; the GPU 0.27 ms with the copy.
        assert!(matches!(a.decide(&dense(512)), Some(OffloadWhy::Cost { .. })));
        // A slow link moves the crossover up.
        a.cost.h2d_bytes_per_s = 1e9;
        assert_eq!(a.decide(&dense(64)), None);
        assert!(a.decide(&dense(512)).is_some());
    }
}
