//! The worker of a disaggregated engine (vox_serve/worker/disagg_worker.py): two engine workers, one
//! per half (engine/disagg.py), and the hand-over between them.
//!
//! A step plan is split (`split_plan`): the LM half gets the admissions (without codec prefixes), the
//! page updates, the codec rows (whose windows it gathers) and the LM rows; the codec half gets the
//! admissions (with their prefixes) and the codec rows. Launch order, per step:
//!
//! ```text
//! LM stream:    upload, prologue, [wait: the last hand-over copy done], gathers, record `gathered`,
//!               ..., prefill, decode, download
//! codec stream: upload, prologue, codec_prime, [wait `gathered`], copy the hand-over arena LM -> codec,
//!               record `copied`, codec_first, codec, download
//! ```
//!
//! The codec half is queued before the LM half's prefill and decode, so on two GPUs the codec's work
//! of a step overlaps the LM's. With a codec lane (`--codec-gpu`: the codec halves of every replica
//! on one GPU, `codec_lane.rs`) the LM half is queued whole first, then the step waits for the lane
//! if it has codec rows, queues the codec half and, once that half's PCM is back, frees the lane. How the bytes cross is a `HandoverCopy`: a peer copy between the
//! streams on CUDA (`serve/peer_copy.rs`), a copy between the two arenas' memory on a CPU
//! (`HostCopy`). The result joins the LM half's out kinds with the codec half's PCM.
//!
//! With `--overlap-detok` (`deferring_codec`) a step waits for its LM half only: its codec half stays on
//! the device, in a backlog, and is collected once its download's event has fired (`Worker::land`), its
//! PCM handed back as a `LandedCodec` of its step; the scheduler plans no codec rows while its limit of
//! batches is in flight. A step with neither codec rows nor admissions skips the codec half. Before the
//! codec half writes a host buffer that a backlogged step will read its outputs from, that step is
//! collected first.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::Arc;

use super::codec_lane::{CodecLane, LaneTurn};
use super::spec::{EngineSpec, Half, Stage};
use super::worker::{EngineWorker, Launcher, StepHandle};
use super::writer::{Launch, CODEC_PREFIX};
use crate::sched::engine_loop::Worker;
use crate::sched::plan::{LandedCodec, LmLaunch, SlotInit, StepPlan, StepResult};

/// (the LM half's plan, the codec half's plan) of one step. The LM half's is the plan itself unless an
/// admission carries a codec prefix, which only the codec half reads.
pub fn split_plan(plan: &StepPlan) -> (Cow<'_, StepPlan>, StepPlan) {
    let codec = StepPlan { step_id: plan.step_id, admits: plan.admits.clone(), codec: plan.codec.clone(),
                           prefill: LmLaunch::empty(plan.prefill.columns), decode: LmLaunch::empty(plan.decode.columns),
                           ..StepPlan::default() };
    if !plan.admits.iter().any(|a| a.conditioning.iter().any(|c| c.name == CODEC_PREFIX)) {
        return (Cow::Borrowed(plan), codec);
    }
    let without_prefix = |a: &SlotInit| SlotInit {
        conditioning: a.conditioning.iter().filter(|c| c.name != CODEC_PREFIX).cloned().collect(),
        ..a.clone()
    };
    let lm = StepPlan { admits: plan.admits.iter().map(without_prefix).collect(), ..plan.clone() };
    (Cow::Owned(lm), codec)
}

/// How the hand-over bytes go from the LM half's arena to the codec half's.
pub trait HandoverCopy {
    /// Before the step's gathers (LM stream): the previous step's copy must have read the LM arena.
    fn before_gather(&mut self) -> Result<(), String>;
    /// After the gathers (LM stream).
    fn gathered(&mut self) -> Result<(), String>;
    /// The first `nbytes` of `src` (the LM half's arena) to `dst` (the codec half's), after the gathers.
    fn copy(&mut self, dst: u64, src: u64, nbytes: usize) -> Result<(), String>;
}

/// Both halves on the host: the stages have run when their calls return, so the copy is a memcpy.
pub struct HostCopy;

impl HandoverCopy for HostCopy {
    fn before_gather(&mut self) -> Result<(), String> {
        Ok(())
    }

    fn gathered(&mut self) -> Result<(), String> {
        Ok(())
    }

    fn copy(&mut self, dst: u64, src: u64, nbytes: usize) -> Result<(), String> {
        // SAFETY: both are host arenas of at least `nbytes` (`Handover::new` checks the layouts), kept
        // alive by the engine registry, and distinct buffers (two engines' arenas).
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, nbytes) };
        Ok(())
    }
}

/// The two halves' hand-over arenas (the same layout on both devices) and, per codec stage, the end
/// of its last field: a step copies the bytes up to the last one its codec launches use.
pub struct Handover {
    src: u64,
    dst: u64,
    ends: Vec<(Stage, usize)>,
}

impl Handover {
    pub fn new(lm: &EngineSpec, codec: &EngineSpec) -> Result<Handover, String> {
        let (src, dst) = match (&lm.handover, &codec.handover) {
            (Some(src), Some(dst)) if src.fields == dst.fields && src.nbytes == dst.nbytes => (src, dst),
            _ => return Err("the two halves' hand-over arenas differ; the engine was not split by \
                             engine/disagg.py".into()),
        };
        let mut ends: Vec<(Stage, usize)> = Vec::new();
        for (name, field) in &src.fields {
            let prefix = name.rsplit_once('_').map_or(name.as_str(), |(p, _)| p);
            let stage = Stage::parse(prefix).map_err(|e| format!("spec.handover field {name}: {e}"))?;
            match ends.iter_mut().find(|(s, _)| *s == stage) {
                Some(entry) => entry.1 = entry.1.max(field.end()),
                None => ends.push((stage, field.end())),
            }
        }
        Ok(Handover { src: src.device_ptr, dst: dst.device_ptr, ends })
    }

    /// Bytes the step's codec launches hand over (0: the step has none).
    fn nbytes(&self, launches: &[Launch]) -> usize {
        launches.iter().filter(|l| l.stage.decodes_windows())
            .filter_map(|l| self.ends.iter().find(|(s, _)| *s == l.stage).map(|&(_, end)| end)).max().unwrap_or(0)
    }
}

pub struct DisaggregatedHandle {
    step_id: i64,
    lm: StepHandle,
    /// The codec half's step (None: skipped, with nothing to do while deferring).
    codec: Option<StepHandle>,
    /// Whether the step decodes codec rows.
    codec_rows: bool,
    /// The step's turn on the codec lane, held until its codec half is collected.
    turn: Option<LaneTurn>,
    /// The codec half's outputs, collected early (`early_pcm`), its PCM handed over.
    codec_early: Option<StepResult>,
}

/// A codec half's step still on the device after its LM step (`--overlap-detok`).
struct PendingCodec {
    step_id: i64,
    handle: StepHandle,
    /// Whether it decodes codec rows (else it ran admissions only: nothing to hand back).
    rows: bool,
}

pub struct DisaggregatedWorker<L: Launcher, X: HandoverCopy> {
    pub lm: EngineWorker<L>,
    pub codec: EngineWorker<L>,
    handover: Handover,
    copier: X,
    lane: Option<Arc<CodecLane>>,
    /// `--overlap-detok`: the codec half's steps on the device, oldest first (None: collected with their step).
    backlog: Option<VecDeque<PendingCodec>>,
    /// Codec batches collected and not yet handed back by `land`.
    landed: Vec<LandedCodec>,
}

fn check_half(spec: &EngineSpec, half: Half) -> Result<(), String> {
    if spec.half != half {
        return Err(format!("expected the spec of a disaggregated engine's {} half, got the {} half's",
                           half.name(), spec.half.name()));
    }
    Ok(())
}

impl<L: Launcher, X: HandoverCopy> DisaggregatedWorker<L, X> {
    /// The worker over the halves' specs and their launchers.
    pub fn new(lm: (&EngineSpec, L), codec: (&EngineSpec, L), copier: X) -> Result<DisaggregatedWorker<L, X>, String> {
        check_half(lm.0, Half::Lm)?;
        check_half(codec.0, Half::Codec)?;
        Ok(DisaggregatedWorker { handover: Handover::new(lm.0, codec.0)?, lm: EngineWorker::new(lm.0, lm.1)?,
                                 codec: EngineWorker::new(codec.0, codec.1)?, copier, lane: None, backlog: None,
                                 landed: Vec::new() })
    }

    /// The worker of `--overlap-detok`: each step waits for its LM half only, its codec batch landing later.
    pub fn deferring_codec(mut self) -> DisaggregatedWorker<L, X> {
        self.backlog = Some(VecDeque::new());
        self
    }

    /// Whether codec batches are collected after their steps.
    pub fn defers_codec(&self) -> bool {
        self.backlog.is_some()
    }

    /// The worker of a replica whose codec half shares `lane` with other replicas' (`--codec-gpu`).
    pub fn with_lane(mut self, lane: Arc<CodecLane>) -> DisaggregatedWorker<L, X> {
        self.lane = Some(lane);
        self
    }

    /// The codec half's step, its hand-over copy before its first window launch.
    fn codec_step(&mut self, plan: &StepPlan, nbytes: usize) -> Result<StepHandle, String> {
        let mut codec = self.codec.begin(plan)?;
        let mut pending = nbytes;
        for index in 0..codec.launches.len() {
            if codec.launches[index].stage.decodes_windows() && pending > 0 {
                self.copier.copy(self.handover.dst, self.handover.src, pending)?;
                pending = 0;
            }
            self.codec.run(&mut codec, index)?;
        }
        self.codec.finish(&codec)?;
        Ok(codec)
    }

    /// The codec half's step while deferring: none when the plan gives it nothing to do, else queued once
    /// no backlogged step still reads the host buffer it will write.
    fn deferred_codec_step(&mut self, plan: &StepPlan, nbytes: usize) -> Result<Option<StepHandle>, String> {
        if plan.admits.is_empty() && plan.codec.is_empty() {
            return Ok(None);
        }
        let next = self.codec.next_parity();
        let backlog = self.backlog.as_ref().expect("deferring");
        if let Some(last) = backlog.iter().rposition(|p| p.handle.parity == next) {
            for _ in 0..=last {
                self.collect_oldest();
            }
        }
        self.codec_step(plan, nbytes).map(Some)
    }

    /// Collect the oldest backlogged codec step (waiting for it); one with rows becomes a `LandedCodec`.
    fn collect_oldest(&mut self) -> Option<bool> {
        let pending = self.backlog.as_mut().and_then(VecDeque::pop_front)?;
        let result = self.codec.collect(pending.handle);
        let rows = pending.rows;
        if rows || result.is_err() {
            let result = result.map(|r| StepResult {
                step_id: pending.step_id, pcm: r.pcm, stage_seconds: joined_seconds(Vec::new(), r.stage_seconds),
                ..StepResult::default()
            });
            self.landed.push(LandedCodec { step_id: pending.step_id, result });
        }
        Some(rows)
    }

    /// Collect the backlogged codec steps that have finished, oldest first, without waiting.
    fn collect_finished(&mut self) {
        while let Some(pending) = self.backlog.as_ref().and_then(VecDeque::front) {
            let step_id = pending.step_id;
            match self.codec.done(&pending.handle) {
                Ok(false) => return,
                Ok(true) => {
                    self.collect_oldest();
                }
                Err(error) => {
                    self.backlog.as_mut().map(VecDeque::pop_front);
                    self.landed.push(LandedCodec { step_id, result: Err(error) });
                }
            }
        }
    }
}

/// The step's stage times: the LM half's gathers as `handover`, the codec half's prologue as
/// `codec_prologue` (a stage named twice keeps its first place and its last time, as a Python dict).
fn joined_seconds(lm: Vec<(&'static str, f64)>, codec: Vec<(&'static str, f64)>) -> Vec<(&'static str, f64)> {
    let lm = lm.into_iter().map(|(s, t)| (if s == "codec" || s == "codec_first" { "handover" } else { s }, t));
    let codec = codec.into_iter().map(|(s, t)| (if s == "prologue" { "codec_prologue" } else { s }, t));
    let mut out: Vec<(&'static str, f64)> = Vec::new();
    for (name, seconds) in lm.chain(codec) {
        match out.iter_mut().find(|(n, _)| *n == name) {
            Some(entry) => entry.1 = seconds,
            None => out.push((name, seconds)),
        }
    }
    out
}

impl<L: Launcher, X: HandoverCopy> Worker for DisaggregatedWorker<L, X> {
    type Handle = DisaggregatedHandle;

    fn timer(&self) -> &'static str {
        self.lm.timer()
    }

    fn launch(&mut self, plan: &StepPlan) -> Result<DisaggregatedHandle, String> {
        let (lm_plan, codec_plan) = split_plan(plan);
        let mut lm = self.lm.begin(&lm_plan)?;
        // the prologue and the gathers come first
        let num_head = lm.launches.iter().position(|l| matches!(l.stage, Stage::Prefill | Stage::Decode))
            .unwrap_or(lm.launches.len());
        let nbytes = self.handover.nbytes(&lm.launches);
        if nbytes > 0 {
            self.copier.before_gather()?;
        }
        for index in 0..num_head {
            self.lm.run(&mut lm, index)?;
        }
        self.copier.gathered()?;
        let codec_rows = !codec_plan.codec.is_empty();
        let lane = match self.lane.clone() {
            Some(lane) => lane,
            None => {
                let codec = if self.defers_codec() {
                    self.deferred_codec_step(&codec_plan, nbytes)?
                } else {
                    Some(self.codec_step(&codec_plan, nbytes)?)
                };
                for index in num_head..lm.launches.len() {
                    self.lm.run(&mut lm, index)?;
                }
                self.lm.finish(&lm)?;
                return Ok(DisaggregatedHandle { step_id: plan.step_id, lm, codec, codec_rows, turn: None, codec_early: None });
            }
        };
        for index in num_head..lm.launches.len() {
            self.lm.run(&mut lm, index)?;
        }
        self.lm.finish(&lm)?;
        let turn = if codec_rows { Some(lane.turn(codec_plan.codec.deadline)) } else { None };
        let codec = Some(self.codec_step(&codec_plan, nbytes)?); // an error drops the turn
        Ok(DisaggregatedHandle { step_id: plan.step_id, lm, codec, codec_rows, turn, codec_early: None })
    }

    fn collect(&mut self, handle: DisaggregatedHandle) -> Result<StepResult, String> {
        let step_id = handle.step_id;
        if let Some(backlog) = self.backlog.as_mut() {
            if let Some(codec) = handle.codec {
                backlog.push_back(PendingCodec { step_id, handle: codec, rows: handle.codec_rows });
            }
            // the finished codec steps are collected by `land`, which the engine loop calls after every step
            let lm = self.lm.collect(handle.lm)?;
            return Ok(StepResult { step_id, prefill_kind: lm.prefill_kind, decode_kind: lm.decode_kind,
                                   stage_seconds: joined_seconds(lm.stage_seconds, Vec::new()),
                                   codec_deferred: handle.codec_rows, ..StepResult::default() });
        }
        let codec = match (handle.codec, handle.codec_early) {
            (Some(codec), _) => self.codec.collect(codec),
            (None, early) => Ok(early.expect("a codec half step when not deferring")),
        };
        drop(handle.turn);
        let (codec, lm) = (codec?, self.lm.collect(handle.lm)?);
        Ok(StepResult { step_id, prefill_kind: lm.prefill_kind, decode_kind: lm.decode_kind, pcm: codec.pcm,
                        stage_seconds: joined_seconds(lm.stage_seconds, codec.stage_seconds), codec_deferred: false,
                        pcm_early: codec.pcm_early })
    }

    /// Not deferring, the codec half's step is collected as soon as it is done, its lane turn given back, and
    /// its PCM handed over while the LM half still runs.
    fn early_pcm(&mut self, handle: &mut DisaggregatedHandle) -> Option<Result<Vec<Vec<u8>>, String>> {
        if self.defers_codec() || !handle.codec_rows || !self.lm.gives_early_pcm() {
            return None;
        }
        let collected = self.codec.collect(handle.codec.take()?);
        handle.turn = None;
        let (pcm, rest) = match collected {
            Ok(mut result) => (Ok(std::mem::take(&mut result.pcm)), result),
            Err(error) => (Err(error), StepResult::default()),
        };
        handle.codec_early = Some(StepResult { pcm_early: true, ..rest });
        Some(pcm)
    }

    fn land(&mut self, block: bool) -> Vec<LandedCodec> {
        if block {
            // wait until a batch with rows lands (steps of admissions alone hand nothing back)
            while self.landed.is_empty() && self.collect_oldest().is_some() {}
        }
        self.collect_finished();
        std::mem::take(&mut self.landed)
    }
}
