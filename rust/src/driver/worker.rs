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
    /// step_out's device bytes `[offset, offset + nbytes)` -> host buffer `parity`, with an event behind them,
    /// queued before the step's later launches (the PCM of its codec rows, `EngineWorker::early_pcm`). A no-op
    /// where the outputs are in host memory once a launch's call returns.
    fn download_early(&mut self, _parity: usize, _offset: usize, _nbytes: usize) -> Result<(), String> {
        Ok(())
    }
    /// Wait for the bytes of `download_early` of `parity`.
    fn wait_early(&mut self, _parity: usize) -> Result<(), String> {
        Ok(())
    }
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
    pcm: PcmHandOver,
}

/// How a step's PCM comes back to the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PcmHandOver {
    /// With the step's outputs, once the step is done (also a step without codec rows).
    WithStep,
    /// Copied back right after the codec launches, for `early_pcm` to read before the step is done.
    Early,
    /// Read by `early_pcm`: the step's result carries none.
    Taken,
}

pub struct EngineWorker<L: Launcher> {
    pub launcher: L,
    writer: StepWriter,
    reader: StepReader,
    in_bufs: Vec<HostBuf>,
    out_bufs: Vec<HostBuf>,
    steps: u64,
    /// Whether steps copy their PCM back right after their codec launches (`early_pcm`).
    early: bool,
}

impl<L: Launcher> EngineWorker<L> {
    pub fn new(spec: &EngineSpec, launcher: L) -> Result<EngineWorker<L>, String> {
        let bufs = |ptrs: &[u64]| ptrs.iter().map(|&p| HostBuf { base: p as *mut u8 }).collect::<Vec<_>>();
        Ok(EngineWorker { launcher, writer: StepWriter::new(spec)?, reader: StepReader::new(spec)?,
                          in_bufs: bufs(&spec.step_in.host_ptrs), out_bufs: bufs(&spec.step_out.host_ptrs), steps: 0,
                          early: early_pcm_enabled()? })
    }

    /// Whether steps hand their PCM over early (`early_pcm`); on unless `VOX_EARLY_PCM=0`.
    pub fn with_early_pcm(mut self, early: bool) -> EngineWorker<L> {
        self.early = early;
        self
    }

    pub fn gives_early_pcm(&self) -> bool {
        self.early
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
        Ok(StepHandle { shape: PlanShape::of(plan), launches, parity, seconds, pcm: PcmHandOver::WithStep })
    }

    /// Run all of the step's launches, its PCM copied back early after its last codec launch (`early_pcm`),
    /// then download the rest of its outputs.
    pub fn run_all(&mut self, handle: &mut StepHandle) -> Result<(), String> {
        let early = if self.early { self.reader.pcm_bytes(&handle.launches) } else { None };
        let last_codec = handle.launches.iter().rposition(|l| l.stage.decodes_windows());
        for index in 0..handle.launches.len() {
            self.run(handle, index)?;
            if let (Some((start, end)), Some(last)) = (early, last_codec) {
                if index == last {
                    self.launcher.download_early(handle.parity, start, end - start)?;
                    handle.pcm = PcmHandOver::Early;
                }
            }
        }
        self.finish(handle)
    }

    /// The PCM of a step whose codec rows were copied back early (`run_all`), once the copy has landed.
    pub fn early_pcm(&mut self, handle: &mut StepHandle) -> Option<Result<Vec<Vec<u8>>, String>> {
        if handle.pcm != PcmHandOver::Early {
            return None;
        }
        handle.pcm = PcmHandOver::Taken;
        Some(self.launcher.wait_early(handle.parity)
            .map(|()| self.reader.read_pcm(self.out_bufs[handle.parity], &handle.shape, &handle.launches)))
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

    /// After the step's launches: download its outputs (the out kinds alone where its PCM came back early).
    pub fn finish(&mut self, handle: &StepHandle) -> Result<(), String> {
        let nbytes = match (handle.pcm, self.reader.kinds_end) {
            (PcmHandOver::Early, Some(kinds_end)) => kinds_end,
            _ => self.reader.download_bytes(&handle.launches),
        };
        self.launcher.download(handle.parity, nbytes)
    }
}

impl<L: Launcher> Worker for EngineWorker<L> {
    type Handle = StepHandle;

    fn timer(&self) -> &'static str {
        self.launcher.timer()
    }

    fn launch(&mut self, plan: &StepPlan) -> Result<StepHandle, String> {
        let mut handle = self.begin(plan)?;
        self.run_all(&mut handle)?;
        Ok(handle)
    }

    fn collect(&mut self, handle: StepHandle) -> Result<StepResult, String> {
        let device_seconds = self.launcher.wait(handle.parity, &handle.launches)?;
        let with_pcm = handle.pcm != PcmHandOver::Taken;
        let mut result = self.reader.read(self.out_bufs[handle.parity], &handle.shape, &handle.launches, with_pcm);
        result.stage_seconds = if device_seconds.is_empty() { handle.seconds } else { device_seconds };
        Ok(result)
    }

    fn early_pcm(&mut self, handle: &mut StepHandle) -> Option<Result<Vec<Vec<u8>>, String>> {
        EngineWorker::early_pcm(self, handle)
    }
}

/// `VOX_EARLY_PCM`: whether steps hand their codec rows' PCM over as soon as the device has made it (1, the
/// default) or with the step's other outputs (0: an A/B switch for the benchmarks).
fn early_pcm_enabled() -> Result<bool, String> {
    match std::env::var("VOX_EARLY_PCM").as_deref() {
        Err(_) | Ok("1") => Ok(true),
        Ok("0") => Ok(false),
        Ok(other) => Err(format!("VOX_EARLY_PCM={other:?}: expected 1 (the default) or 0")),
    }
}
