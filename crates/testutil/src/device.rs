//! One test body on every backend: the host CPU, a second CPU instance
//! (`CPU1`, which stands in for a device: splits and copies, but the host's
//! arithmetic, so results stay bit-identical), and the first GPU when there
//! is one; in the spirit of candle's `test_device!`.

/// A backend a test body runs on, by the name placement rules use
/// (`-ot REGEX=CPU1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cpu1,
    Cuda0,
}

impl Device {
    /// The backend's name (`BackendId`'s display, and `-ot`'s target).
    pub fn name(self) -> &'static str {
        match self {
            Device::Cpu => "CPU",
            Device::Cpu1 => "CPU1",
            Device::Cuda0 => "CUDA0",
        }
    }

    /// Whether it computes what the host CPU computes, bit for bit.
    pub fn exact(self) -> bool {
        self != Device::Cuda0
    }

    /// The first GPU, or why there is none (printed as the test's skip
    /// reason). `TERN_REQUIRE_GPU=1` makes a missing GPU a failure.
    pub fn cuda() -> Option<Device> {
        match gpu() {
            Ok(()) => Some(Device::Cuda0),
            Err(why) => {
                if std::env::var("TERN_REQUIRE_GPU").is_ok_and(|v| v == "1") {
                    panic!("TERN_REQUIRE_GPU=1 but no GPU: {why}");
                }
                eprintln!("skipped: {why}");
                None
            }
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(feature = "cuda")]
fn gpu() -> Result<(), String> {
    tern_cuda::devices().map(|_| ()).map_err(|e| e.to_string())
}

#[cfg(not(feature = "cuda"))]
fn gpu() -> Result<(), String> {
    Err("tern-testutil was built without its `cuda` feature".into())
}

/// Runs `fn NAME(dev: Device)` as three tests, `NAME::cpu`, `NAME::cpu1`
/// and `NAME::cuda`; the last prints why it skips without a GPU.
///
/// ```ignore
/// fn split_execution(dev: Device) { /* layer 1 on dev, against one CPU */ }
/// tern_testutil::test_device!(split_execution);
/// ```
#[macro_export]
macro_rules! test_device {
    ($name:ident) => {
        mod $name {
            #[test]
            fn cpu() {
                super::$name($crate::Device::Cpu)
            }

            #[test]
            fn cpu1() {
                super::$name($crate::Device::Cpu1)
            }

            #[test]
            fn cuda() {
                if let Some(dev) = $crate::Device::cuda() {
                    super::$name(dev)
                }
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::Device;

    fn names(dev: Device) {
        assert_eq!(dev.to_string(), dev.name());
        assert_eq!(dev.exact(), dev.name().starts_with("CPU"));
    }
    crate::test_device!(names);
}
