//! `--profile` on the GPU: every launch of a plan timed with events.

use std::collections::HashMap;

use crate::driver::Event;
use crate::kernels;
use crate::{CudaBackend, CudaError, CudaResult};

#[derive(Default)]
pub(crate) struct Profile {
    /// Launches are timed one by one (profiling through graphs failed).
    pub one_by_one: bool,
    pub events: Vec<Event>,
    /// By kernel (`None`: DMA copies), and whether the step reached host memory.
    pub per_kernel: HashMap<(Option<kernels::Kernel>, bool), (f64, u64)>,
    pub gpu_ms: f64,
    pub host_ms: f64,
    pub computes: u64,
}

impl Profile {
    /// Prints the per-kernel table for `TERN_CUDA_PROFILE=1`.
    pub fn report(&self, id: tern_backend::BackendId) {
        let n = self.computes.max(1) as f64;
        eprintln!(
            "{id} profile: {} computes, GPU {:.3} ms and host (lowering) {:.3} ms per compute",
            self.computes,
            self.gpu_ms / n,
            self.host_ms / n
        );
        let mut rows: Vec<_> = self.per_kernel.iter().collect();
        rows.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0));
        for (k, (ms, count)) in rows {
            eprintln!(
                "  {:<12} {:>8.3} ms per compute {:>5.1}%  {:>6.1} launches per compute, {:>7.2} µs each",
                step_name(*k),
                ms / n,
                100.0 * ms / self.gpu_ms.max(1e-9),
                *count as f64 / n,
                1e3 * ms / *count as f64
            );
        }
    }
}

impl CudaBackend {
    /// Runs plan `key` with an event between each pair of launches and books
    /// the times. The launches and events are captured into a graph once and
    /// replayed, as an ordinary step is, so that a small kernel's time is its
    /// own rather than the host's gap to the next launch.
    /// Where that capture fails, launches go one by one, as they used to.
    pub(crate) fn run_profiled(&mut self, key: u64, host_start: std::time::Instant) -> CudaResult<()> {
        let mut p = self.profile.take().expect("profiling");
        let n = self.plans[&key].steps.len();
        let mut r = (|| {
            while p.events.len() < n + 1 {
                p.events.push(self.gpu.event()?);
            }
            Ok(())
        })();
        if r.is_ok() {
            r = match (self.use_graphs && !p.one_by_one).then(|| self.replay_profiled(key, &p)) {
                Some(Ok(())) => Ok(()),
                Some(Err(m)) if !self.plans[&key].profiled_ran => {
                    eprintln!(
                        "warning: {}: profiling through a graph failed ({m}); timing launches one by one",
                        self.id
                    );
                    p.one_by_one = true;
                    self.launch_profiled(key, &p)
                }
                Some(Err(m)) => Err(m),
                None => self.launch_profiled(key, &p),
            };
        }
        if r.is_ok() {
            r = (|| {
                for (i, s) in self.plans[&key].steps.iter().enumerate() {
                    let ms = p.events[i].elapsed_ms(&p.events[i + 1])? as f64;
                    let e = p.per_kernel.entry((s.kernel(), self.touches_host(s))).or_default();
                    e.0 += ms;
                    e.1 += 1;
                }
                p.gpu_ms += p.events[0].elapsed_ms(&p.events[n])? as f64;
                Ok(())
            })();
        }
        p.host_ms += host_start.elapsed().as_secs_f64() * 1e3;
        p.computes += 1;
        self.profile = Some(p);
        r
    }

    /// Plan `key` with events recorded around every launch, one by one.
    fn launch_profiled(&self, key: u64, p: &Profile) -> CudaResult<()> {
        self.gpu.record(&p.events[0])?;
        for (i, s) in self.plans[&key].steps.iter().enumerate() {
            s.run(&self.gpu, &self.kernels, false)?;
            self.gpu.record(&p.events[i + 1])?;
        }
        Ok(())
    }

    /// Plan `key` as a captured graph with an event node after every launch.
    fn replay_profiled(&mut self, key: u64, p: &Profile) -> CudaResult<()> {
        if self.plans[&key].profiled.is_none() {
            let plan = &self.plans[&key];
            self.gpu.begin_capture()?;
            let run = (|| {
                self.gpu.record_in_graph(&p.events[0])?;
                for (i, s) in plan.steps.iter().enumerate() {
                    s.run(&self.gpu, &self.kernels, self.pdl)?;
                    self.gpu.record_in_graph(&p.events[i + 1])?;
                }
                Ok::<(), CudaError>(())
            })();
            let graph = self.gpu.end_capture();
            run?;
            self.plans.get_mut(&key).expect("looked up above").profiled = Some(graph?);
        }
        let plan = self.plans.get_mut(&key).expect("looked up above");
        self.gpu.replay(plan.profiled.as_ref().expect("captured above"))?;
        plan.profiled_ran = true;
        Ok(())
    }
}

/// A profile row's name: the kernel, or the DMA copies, and whether the step
/// reached host memory.
pub(crate) fn step_name((kernel, host): (Option<kernels::Kernel>, bool)) -> String {
    let name = kernel.map_or("DmaCopy".to_string(), |k| format!("{k:?}"));
    if host {
        format!("{name} (host memory)")
    } else {
        name
    }
}
