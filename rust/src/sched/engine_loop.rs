//! The core loop: schedule, launch, collect, update (vox_serve/engine_loop.py). Any `Worker` drives it:
//! the engine driver, or the simulated engine. Synchronous by default; with `async_lm` (`--async-engines`)
//! it plans and launches step k+1 before it collects step k, as the Python runtime's `--async-scheduling`
//! does, so the host plans while the device runs (a request decoding in both steps takes its input for
//! k+1 from its slot's token history on the device, where step k writes it).

use std::any::Any;
use std::time::Instant;

use super::base::Scheduler;
use super::plan::{LandedCodec, StepPlan, StepResult};
use super::trace::Tracer;

/// Empty plans in a row, with requests waiting, before the queue head is stalled.
const MAX_IDLE_STEPS: u32 = 3;
/// Longest wait when only text that has not arrived can unblock the requests.
pub const TEXT_WAIT_S: f64 = 0.05;
/// How long to wait after an empty step with nothing held back.
const IDLE_WAIT_S: f64 = 0.001;

pub trait Worker {
    type Handle: Send + 'static;
    /// What stage times measure: "cuda" events, "wall" time or a "sim" cost model.
    fn timer(&self) -> &'static str;
    fn launch(&mut self, plan: &StepPlan) -> Result<Self::Handle, String>;
    fn collect(&mut self, handle: Self::Handle) -> Result<StepResult, String>;
    /// Codec batches of earlier steps that have finished since (`--overlap-detok`; `block`: wait for the
    /// oldest one still on the device). A worker that collects every codec batch with its step has none.
    fn land(&mut self, _block: bool) -> Vec<LandedCodec> {
        Vec::new()
    }
    /// The PCM of a launched step's codec rows (one per row), waited for until the device has made it, before
    /// the step's LM rows finish: None where the step hands its PCM back with its result or later. A step
    /// whose PCM came early returns none from `collect` (`StepResult::pcm_early`).
    fn early_pcm(&mut self, _handle: &mut Self::Handle) -> Option<Result<Vec<Vec<u8>>, String>> {
        None
    }
}

pub struct EngineLoop<W: Worker> {
    pub scheduler: Scheduler,
    pub worker: W,
    pub tracer: Option<Tracer>,
    pub num_steps: u64,
    idle_steps: u32,
    /// `--async-engines`: the next step is launched before this one is collected.
    pub async_lm: bool,
    in_flight: Option<(StepPlan, W::Handle)>,
}

impl<W: Worker> EngineLoop<W> {
    pub fn new(scheduler: Scheduler, worker: W, mut tracer: Option<Tracer>) -> EngineLoop<W> {
        if let Some(t) = tracer.as_mut() {
            t.header(&scheduler, worker.timer());
        }
        EngineLoop { scheduler, worker, tracer, num_steps: 0, idle_steps: 0, async_lm: false, in_flight: None }
    }

    /// Requests left, or a step still on the device.
    pub fn busy(&self) -> bool {
        self.scheduler.has_work() || self.in_flight.is_some()
    }

    /// One step; false when nothing was launched or collected. A failing step fails only its requests.
    /// A step whose PCM the worker gives early (`Worker::early_pcm`) hands it to its requests as soon as
    /// the device has made it; synchronously, such a step is then collected at the start of the next call,
    /// so that whoever drives the loop sends the audio on while the step's LM rows still run.
    pub fn step(&mut self) -> bool {
        let mut collected = false;
        if !self.async_lm {
            if let Some((plan, handle)) = self.in_flight.take() {
                self.collect(plan, handle);
                collected = true;
            }
        }
        let start = Instant::now();
        let plan = self.scheduler.schedule();
        let planned = !plan.is_empty();
        let launched = if planned { self.launch(plan, start) } else { None };
        if let Some((plan, handle)) = std::mem::replace(&mut self.in_flight, launched) {
            self.collect(plan, handle);
            collected = true;
        }
        let early = self.land_early();
        if !self.async_lm && !early {
            if let Some((plan, handle)) = self.in_flight.take() {
                self.collect(plan, handle);
            }
        }
        self.land(false);
        planned || collected
    }

    /// The PCM of the step in flight, if its worker gives it before the step ends; whether it did.
    fn land_early(&mut self) -> bool {
        let Some((plan, handle)) = self.in_flight.as_mut() else { return false };
        match self.worker.early_pcm(handle) {
            None => false,
            Some(Ok(mut pcm)) => {
                self.scheduler.land_early(plan, &mut pcm);
                true
            }
            Some(Err(error)) => {
                eprintln!("vox-serve: the codec rows of step {} failed: {error}", plan.step_id);
                self.scheduler.fail_chunks(&plan.codec.keys, &error);
                true
            }
        }
    }

    fn launch(&mut self, plan: StepPlan, start: Instant) -> Option<(StepPlan, W::Handle)> {
        self.num_steps += 1;
        if let Some(t) = self.tracer.as_mut() {
            t.decision(&self.scheduler, &plan, start.elapsed().as_secs_f64());
        }
        match self.worker.launch(&plan) {
            Ok(handle) => Some((plan, handle)),
            Err(error) => {
                self.fail(&plan, &error);
                None
            }
        }
    }

    fn collect(&mut self, plan: StepPlan, handle: W::Handle) {
        match self.worker.collect(handle) {
            Ok(mut result) => {
                if let Some(t) = self.tracer.as_mut() {
                    t.stages(&plan, &result);
                }
                self.scheduler.update(&plan, &mut result);
            }
            Err(error) => self.fail(&plan, &error),
        }
    }

    fn fail(&mut self, plan: &StepPlan, error: &str) {
        eprintln!("vox-serve: step {} failed: {error}", plan.step_id);
        self.scheduler.fail(plan, error);
    }

    /// Apply the codec batches that landed after their steps (`block`: wait for the oldest one).
    fn land(&mut self, block: bool) {
        let landed = self.worker.land(block);
        if block && landed.is_empty() {
            // the scheduler waits for batches the worker does not hold: fail them rather than spin
            for step_id in self.scheduler.pending_codec_steps() {
                self.scheduler.fail_codec(step_id, "the worker holds no codec batch of this step");
            }
        }
        for landed in landed {
            match landed.result {
                Ok(mut result) => {
                    if let Some(codec) = self.scheduler.land_codec(landed.step_id, &mut result) {
                        if let Some(t) = self.tracer.as_mut() {
                            t.stages(&StepPlan { step_id: landed.step_id, codec, ..StepPlan::default() }, &result);
                        }
                    }
                }
                Err(error) => {
                    eprintln!("vox-serve: the codec batch of step {} failed: {error}", landed.step_id);
                    self.scheduler.fail_codec(landed.step_id, &error);
                }
            }
        }
    }

    /// Step once if there is work: None when idle, else how long the caller may wait (0 after a
    /// step; the policy's own delay when it holds audio back). Empty plans in a row with nothing
    /// held back mean the queue's head can never be admitted: it is failed rather than left to spin.
    pub fn poll(&mut self) -> Option<f64> {
        if !self.busy() {
            return None;
        }
        if self.step() {
            self.idle_steps = 0;
            return Some(0.0);
        }
        if self.scheduler.codec_in_flight() {
            // nothing else can run until a codec batch lands (its requests' next chunks, their ends)
            self.land(true);
            return Some(0.0);
        }
        if let Some(wake) = self.scheduler.next_wakeup() {
            return Some((wake - self.scheduler.clock.now()).max(0.0));
        }
        if self.scheduler.num_waiting_for_text() > 0 {
            return Some(TEXT_WAIT_S);
        }
        self.idle_steps += 1;
        if self.idle_steps >= MAX_IDLE_STEPS {
            if let Some(&head) = self.scheduler.waiting.front() {
                self.idle_steps = 0;
                let id = self.scheduler.req(head).req_id.clone();
                self.scheduler.abort(&id, "stalled: the KV cache cannot hold this request");
            }
        }
        Some(IDLE_WAIT_S)
    }
}

/// A step handle of any worker (`StepWorker`).
pub type AnyHandle = Box<dyn Any + Send>;

/// A worker of any kind behind one type, so that replicas of different engine kinds can be held
/// together (`--dp-size`); its step handles are boxed.
pub trait StepWorker: Send {
    fn step_timer(&self) -> &'static str;
    fn launch_step(&mut self, plan: &StepPlan) -> Result<AnyHandle, String>;
    fn collect_step(&mut self, handle: AnyHandle) -> Result<StepResult, String>;
    fn land_codec(&mut self, block: bool) -> Vec<LandedCodec>;
    fn early_step_pcm(&mut self, handle: &mut AnyHandle) -> Option<Result<Vec<Vec<u8>>, String>>;
}

impl<W: Worker + Send> StepWorker for W {
    fn step_timer(&self) -> &'static str {
        self.timer()
    }

    fn launch_step(&mut self, plan: &StepPlan) -> Result<AnyHandle, String> {
        Ok(Box::new(self.launch(plan)?))
    }

    fn collect_step(&mut self, handle: AnyHandle) -> Result<StepResult, String> {
        let handle = handle.downcast::<W::Handle>().map_err(|_| "a step handle of another worker".to_string())?;
        self.collect(*handle)
    }

    fn land_codec(&mut self, block: bool) -> Vec<LandedCodec> {
        self.land(block)
    }

    fn early_step_pcm(&mut self, handle: &mut AnyHandle) -> Option<Result<Vec<Vec<u8>>, String>> {
        match handle.downcast_mut::<W::Handle>() {
            Some(handle) => self.early_pcm(handle),
            None => Some(Err("a step handle of another worker".to_string())),
        }
    }
}

pub type BoxWorker = Box<dyn StepWorker>;

impl Worker for BoxWorker {
    type Handle = AnyHandle;

    fn timer(&self) -> &'static str {
        self.as_ref().step_timer()
    }

    fn launch(&mut self, plan: &StepPlan) -> Result<AnyHandle, String> {
        self.as_mut().launch_step(plan)
    }

    fn collect(&mut self, handle: AnyHandle) -> Result<StepResult, String> {
        self.as_mut().collect_step(handle)
    }

    fn land(&mut self, block: bool) -> Vec<LandedCodec> {
        self.as_mut().land_codec(block)
    }

    fn early_pcm(&mut self, handle: &mut AnyHandle) -> Option<Result<Vec<Vec<u8>>, String>> {
        self.as_mut().early_step_pcm(handle)
    }
}
