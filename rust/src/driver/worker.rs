//! The engine worker: step plans in, step results out, driving an engine through its spec alone
//! (vox_serve/worker/engine_worker.py). Per step: the plan is written into host buffer
//! `step mod buffers` (`writer.rs`), uploaded in one copy, each launch planned (LM launches) and
//! run by its handle, and the outputs downloaded in one copy. How handles are run is a `Launcher`:
//! CUDA graphs and copies through the driver API, or callables through Python on a CPU device.

use super::layout::HostBuf;
use super::spec::EngineSpec;
use super::writer::{AttentionPlan, Launch, PlanShape, StepReader, StepWriter};
use crate::sched::engine_loop::Worker;
use crate::sched::plan::{StepPlan, StepResult};

/// Runs a spec's handles. `parity` names the host buffer pair of the step.
pub trait Launcher {
    /// What stage times measure: "cuda" events or "wall" time.
    fn timer(&self) -> &'static str;
    /// Host buffer `parity` of step_in -> the device (first `nbytes`); a no-op on a CPU device.
    fn upload(&mut self, parity: usize, nbytes: usize) -> Result<(), String>;
    /// Plan the attention of an LM launch (`plan` is `launch.attention`) before it runs.
    fn plan_attention(&mut self, launch: &Launch, plan: &AttentionPlan, parity: usize) -> Result<(), String>;
    /// Run the launch's handle; returns its wall seconds where the launcher times by wall clock.
    fn run(&mut self, parity: usize, launch: &Launch) -> Result<Option<f64>, String>;
    /// step_out's device buffer -> host buffer `parity` (first `nbytes`), then an event behind it.
    fn download(&mut self, parity: usize, nbytes: usize) -> Result<(), String>;
    /// Wait for the step of `parity` (its download); then the stage times measured on the device.
    fn wait(&mut self, parity: usize, launches: &[Launch]) -> Result<Vec<(&'static str, f64)>, String>;
    /// Whether the step of `parity` has finished, without waiting (a launcher whose calls return when
    /// they have run is always done).
    fn done(&mut self, _parity: usize) -> Result<bool, String> {
        Ok(true)
    }
}

pub struct StepHandle {
    shape: PlanShape,
    /// The step's launches, in launch order.
    pub launches: Vec<Launch>,
    /// The host buffer the step was written into (and its outputs come back to).
    pub parity: usize,
    seconds: Vec<(&'static str, f64)>,
}

pub struct EngineWorker<L: Launcher> {
    pub launcher: L,
    writer: StepWriter,
    reader: StepReader,
    in_bufs: Vec<HostBuf>,
    out_bufs: Vec<HostBuf>,
    steps: u64,
}

impl<L: Launcher> EngineWorker<L> {
    pub fn new(spec: &EngineSpec, launcher: L) -> Result<EngineWorker<L>, String> {
        let bufs = |ptrs: &[u64]| ptrs.iter().map(|&p| HostBuf { base: p as *mut u8 }).collect::<Vec<_>>();
        Ok(EngineWorker { launcher, writer: StepWriter::new(spec)?, reader: StepReader::new(spec)?,
                          in_bufs: bufs(&spec.step_in.host_ptrs), out_bufs: bufs(&spec.step_out.host_ptrs), steps: 0 })
    }

    // The parts of `Worker::launch`, for a worker that interleaves two engines' steps (`disagg.rs`).

    /// The host buffer the next step will be written into.
    pub fn next_parity(&self) -> usize {
        (self.steps % self.in_bufs.len() as u64) as usize
    }

    /// Whether the step of `handle` has finished on the device, without waiting.
    pub fn done(&mut self, handle: &StepHandle) -> Result<bool, String> {
        self.launcher.done(handle.parity)
    }

    /// Write the plan into the next host buffer and upload it; the handle lists the step's launches.
    pub fn begin(&mut self, plan: &StepPlan) -> Result<StepHandle, String> {
        let parity = self.next_parity();
        self.steps += 1;
        let (launches, nbytes) = self.writer.write(self.in_bufs[parity], plan)?;
        self.launcher.upload(parity, nbytes)?;
        let seconds = Vec::with_capacity(launches.len());
        Ok(StepHandle { shape: PlanShape::of(plan), launches, parity, seconds })
    }

    /// Plan (LM launches) and run the step's launch `index`.
    pub fn run(&mut self, handle: &mut StepHandle, index: usize) -> Result<(), String> {
        let launch = &handle.launches[index];
        if let Some(attention) = &launch.attention {
            self.launcher.plan_attention(launch, attention, handle.parity)?;
        }
        if let Some(wall) = self.launcher.run(handle.parity, launch)? {
            handle.seconds.push((launch.stage.name(), wall));
        }
        Ok(())
    }

    /// After the step's launches: download its outputs.
    pub fn finish(&mut self, handle: &StepHandle) -> Result<(), String> {
        self.launcher.download(handle.parity, self.reader.download_bytes(&handle.launches))
    }
}

impl<L: Launcher> Worker for EngineWorker<L> {
    type Handle = StepHandle;

    fn timer(&self) -> &'static str {
        self.launcher.timer()
    }

    fn launch(&mut self, plan: &StepPlan) -> Result<StepHandle, String> {
        let mut handle = self.begin(plan)?;
        for index in 0..handle.launches.len() {
            self.run(&mut handle, index)?;
        }
        self.finish(&handle)?;
        Ok(handle)
    }

    fn collect(&mut self, handle: StepHandle) -> Result<StepResult, String> {
        let device_seconds = self.launcher.wait(handle.parity, &handle.launches)?;
        let mut result = self.reader.read(self.out_bufs[handle.parity], &handle.shape, &handle.launches);
        result.stage_seconds = if device_seconds.is_empty() { handle.seconds } else { device_seconds };
        Ok(result)
    }
}
