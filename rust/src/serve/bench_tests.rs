//! Bench mode's replicas (`bench::run`) on workers that make up their outputs: requests go to the
//! least-loaded replica, and a replica that panics fails only the requests it held.

use std::collections::VecDeque;

use serde_json::json;

use super::bench::{least_loaded, run, Arrival};
use crate::driver::writer_tests::spec;
use crate::sched::engine_loop::{EngineLoop, Worker};
use crate::sched::plan::LandedCodec;
use crate::sched::base::Event;
use crate::sched::{Clock, OutKind, Prompt, Request, SamplingParams, Scheduler, SchedulerConfig, StepPlan, StepResult};

/// Every LM row is audio; every codec row gets silence of its length. `panic_at`: the step it panics in.
struct MadeUp {
    samples_per_frame: i64,
    steps: usize,
    panic_at: Option<usize>,
}

impl Worker for MadeUp {
    type Handle = StepResult;

    fn timer(&self) -> &'static str {
        "wall"
    }

    fn launch(&mut self, plan: &StepPlan) -> Result<StepResult, String> {
        self.steps += 1;
        if self.panic_at == Some(self.steps) {
            panic!("a made-up failure");
        }
        let audio = OutKind::Audio.code();
        let pcm = plan.codec.num_frames.iter().map(|&f| vec![1u8; (2 * f as i64 * self.samples_per_frame) as usize]).collect();
        Ok(StepResult { step_id: plan.step_id, prefill_kind: vec![audio; plan.prefill.len()],
                        decode_kind: vec![audio; plan.decode.len()], pcm, stage_seconds: Vec::new(),
                        codec_deferred: false, pcm_early: false })
    }

    fn collect(&mut self, handle: StepResult) -> Result<StepResult, String> {
        Ok(handle)
    }
}

fn made_up(panic_at: Option<usize>) -> MadeUp {
    MadeUp { samples_per_frame: spec(false).meta.samples_per_frame, steps: 0, panic_at }
}

fn looped<W: Worker>(worker: W) -> Option<EngineLoop<W>> {
    let s = spec(false);
    let config = SchedulerConfig::from_json(&json!({})).unwrap();
    Some(EngineLoop::new(Scheduler::new(s.meta, s.limits, config, Clock::Monotonic), worker, None))
}

fn replica(panic_at: Option<usize>) -> Option<EngineLoop<MadeUp>> {
    looped(made_up(panic_at))
}

fn arrivals(offsets: &[f64]) -> Vec<Arrival> {
    offsets.iter().enumerate().map(|(i, &offset)| {
        let prompt = Prompt { ids: vec![5; 4], columns: 1, ..Prompt::default() };
        let sampling = SamplingParams { max_tokens: 12, ignore_eos: true, ..SamplingParams::default() };
        Arrival { req: Request::new(format!("r{i}"), prompt, sampling, true), offset }
    }).collect()
}

#[test]
fn requests_at_once_are_spread_over_the_replicas_and_all_end() {
    let (loops, outcomes, _) = run(vec![replica(None), replica(None)], arrivals(&[0.0; 6]));
    assert!(loops.iter().all(Option::is_some));
    assert_eq!(outcomes.iter().map(|o| o.replica).collect::<Vec<_>>(), [0, 1, 0, 1, 0, 1]);
    for o in &outcomes {
        assert_eq!((o.req.finish_reason.as_deref(), o.req.error.as_deref()), (Some("length"), None), "{}", o.req.req_id);
        assert!(!o.pcm.is_empty() && o.finished.is_some());
    }
}

#[test]
fn a_request_goes_to_the_live_replica_with_the_fewest_in_hand() {
    assert_eq!(least_loaded(&[(2, true), (0, true), (1, true)]), Some(1));
    assert_eq!(least_loaded(&[(2, true), (0, false), (1, true)]), Some(2));
    assert_eq!(least_loaded(&[(1, true), (0, false), (1, true)]), Some(0));
    assert_eq!(least_loaded(&[(0, false)]), None);
}

#[test]
fn a_failed_replica_fails_its_requests_only_and_later_ones_go_elsewhere() {
    let (loops, outcomes, _) = run(vec![replica(None), replica(Some(3))], arrivals(&[0.0, 0.0, 0.0, 0.0, 0.3, 0.3]));
    assert!(loops[0].is_some() && loops[1].is_none());
    for o in &outcomes {
        let error = o.req.error.as_deref();
        if o.replica == 1 {
            assert!(error.unwrap().contains("replica 1 failed"), "{}: {error:?}", o.req.req_id);
            assert!(o.offset == 0.0);
        } else {
            assert_eq!((o.req.finish_reason.as_deref(), error), (Some("length"), None), "{}", o.req.req_id);
        }
    }
    assert_eq!(outcomes.iter().filter(|o| o.replica == 0).count(), 4); // r4 and r5 went to the survivor
    // the next phase runs on the survivor alone
    let (loops, outcomes, _) = run(loops, arrivals(&[0.0, 0.0]));
    assert!(loops[0].is_some());
    assert!(outcomes.iter().all(|o| o.replica == 0 && o.req.error.is_none()));
}

/// `--overlap-detok`'s contract on made-up outputs: each codec batch lands `delay` polls after its step (a
/// blocking land at once); with `fail_single`, the first batch of a single row fails. Codec rows planned while
/// `max_in_flight` batches are on the device panic.
struct Deferring {
    inner: MadeUp,
    delay: usize,
    max_in_flight: usize,
    fail_single: bool,
    failing: Option<i64>,
    /// (step, its PCM, polls left)
    pending: VecDeque<(i64, Vec<Vec<u8>>, usize)>,
    /// The most batches on the device at once.
    peak: usize,
}

impl Worker for Deferring {
    type Handle = StepResult;

    fn timer(&self) -> &'static str {
        "wall"
    }

    fn launch(&mut self, plan: &StepPlan) -> Result<StepResult, String> {
        assert!(plan.codec.is_empty() || self.pending.len() < self.max_in_flight, "codec rows planned, lane full");
        let mut result = self.inner.launch(plan)?;
        if self.fail_single && plan.codec.len() == 1 && self.failing.is_none() {
            self.failing = Some(plan.step_id);
        }
        if !plan.codec.is_empty() {
            self.pending.push_back((plan.step_id, std::mem::take(&mut result.pcm), self.delay));
            self.peak = self.peak.max(self.pending.len());
            result.codec_deferred = true;
        }
        Ok(result)
    }

    fn collect(&mut self, handle: StepResult) -> Result<StepResult, String> {
        Ok(handle)
    }

    fn land(&mut self, block: bool) -> Vec<LandedCodec> {
        let Some(front) = self.pending.front_mut() else { return Vec::new() };
        front.2 = if block { 0 } else { front.2.saturating_sub(1) };
        if front.2 > 0 {
            return Vec::new();
        }
        let (step_id, pcm, _) = self.pending.pop_front().unwrap();
        let result = if self.failing == Some(step_id) { Err("a made-up codec failure".to_string()) } else {
            Ok(StepResult { step_id, pcm, ..StepResult::default() })
        };
        vec![LandedCodec { step_id, result }]
    }
}

fn deferring(delay: usize, max_in_flight: usize, fail_single: bool) -> Option<EngineLoop<Deferring>> {
    let worker = Deferring { inner: made_up(None), delay, max_in_flight, fail_single, failing: None,
                             pending: VecDeque::new(), peak: 0 };
    let mut lp = looped(worker)?;
    lp.scheduler.max_codec_in_flight = max_in_flight;
    Some(lp)
}

#[test]
fn codec_batches_landing_after_their_steps_give_every_request_its_whole_audio() {
    let (_, serial, _) = run(vec![replica(None)], arrivals(&[0.0, 0.0, 0.0, 0.1]));
    for (delay, max_in_flight, async_lm) in [(1, 1, false), (3, 1, false), (3, 2, false), (3, 2, true)] {
        let mut lp = deferring(delay, max_in_flight, false);
        lp.as_mut().unwrap().async_lm = async_lm;
        let (loops, deferred, _) = run(vec![lp], arrivals(&[0.0, 0.0, 0.0, 0.1]));
        let lp = loops[0].as_ref().unwrap();
        assert!(lp.worker.pending.is_empty() && !lp.scheduler.codec_in_flight());
        assert_eq!(lp.worker.peak, max_in_flight);
        lp.scheduler.check_idle().unwrap();
        for (d, s) in deferred.iter().zip(&serial) {
            assert_eq!((d.req.finish_reason.as_deref(), d.req.error.as_deref()), (Some("length"), None));
            assert_eq!((d.pcm.len(), d.chunks.len()), (s.pcm.len(), s.chunks.len()), "{} {delay} {max_in_flight}",
                       d.req.req_id);
        }
    }
}

#[test]
fn a_failed_deferred_codec_batch_fails_exactly_its_requests() {
    // r2 generates twice as long, so some chunks are decoded alone: the first such batch fails its one request
    let mut requests = arrivals(&[0.0, 0.0, 0.0]);
    requests[2].req.sampling.max_tokens = 24;
    let (loops, outcomes, _) = run(vec![deferring(2, 2, true)], requests);
    let lp = loops[0].as_ref().unwrap();
    assert!(lp.worker.failing.is_some());
    lp.scheduler.check_idle().unwrap();
    let failed: Vec<_> = outcomes.iter().filter(|o| o.req.error.is_some()).collect();
    assert_eq!(failed.len(), 1);
    assert_eq!((failed[0].req.finish_reason.as_deref(), failed[0].req.error.as_deref()),
               (Some("error"), Some("a made-up codec failure")));
    for o in outcomes.iter().filter(|o| o.req.error.is_none()) {
        assert_eq!(o.req.finish_reason.as_deref(), Some("length"));
    }
}

#[test]
fn with_the_next_step_launched_before_the_last_is_collected_every_request_ends_with_its_audio() {
    let (_, serial, _) = run(vec![replica(None)], arrivals(&[0.0, 0.0, 0.0, 0.05]));
    let mut lp = replica(None);
    lp.as_mut().unwrap().async_lm = true;
    let (loops, ahead, _) = run(vec![lp], arrivals(&[0.0, 0.0, 0.0, 0.05]));
    let lp = loops[0].as_ref().unwrap();
    assert!(!lp.busy());
    lp.scheduler.check_idle().unwrap();
    for (a, s) in ahead.iter().zip(&serial) {
        assert_eq!((a.req.finish_reason.as_deref(), a.req.error.as_deref()), (Some("length"), None));
        assert_eq!((a.req.counters.num_generated, a.pcm.len()), (s.req.counters.num_generated, s.pcm.len()));
    }
}

/// Defers every codec batch and never lands one: a worker that lost its batches.
struct Losing(MadeUp);

impl Worker for Losing {
    type Handle = StepResult;

    fn timer(&self) -> &'static str {
        "wall"
    }

    fn launch(&mut self, plan: &StepPlan) -> Result<StepResult, String> {
        let mut result = self.0.launch(plan)?;
        result.codec_deferred = !plan.codec.is_empty();
        result.pcm.clear();
        Ok(result)
    }

    fn collect(&mut self, handle: StepResult) -> Result<StepResult, String> {
        Ok(handle)
    }
}

#[test]
fn codec_batches_the_worker_never_lands_fail_their_requests_instead_of_hanging() {
    let (loops, outcomes, _) = run(vec![looped(Losing(made_up(None)))], arrivals(&[0.0, 0.0]));
    loops[0].as_ref().unwrap().scheduler.check_idle().unwrap();
    for o in &outcomes {
        assert_eq!(o.req.error.as_deref(), Some("the worker holds no codec batch of this step"), "{}", o.req.req_id);
    }
}

/// Hands each step's PCM over early (`Worker::early_pcm`), logging ("early" | "collect", step); with `fail_first`
/// the first step with codec rows loses its PCM there.
struct Early {
    inner: MadeUp,
    fail_first: bool,
    log: Vec<(&'static str, i64)>,
}

impl Worker for Early {
    type Handle = StepResult;

    fn timer(&self) -> &'static str {
        "wall"
    }

    fn launch(&mut self, plan: &StepPlan) -> Result<StepResult, String> {
        self.inner.launch(plan)
    }

    fn collect(&mut self, handle: StepResult) -> Result<StepResult, String> {
        self.log.push(("collect", handle.step_id));
        Ok(handle)
    }

    fn early_pcm(&mut self, handle: &mut StepResult) -> Option<Result<Vec<Vec<u8>>, String>> {
        if handle.pcm.is_empty() {
            return None;
        }
        self.log.push(("early", handle.step_id));
        handle.pcm_early = true;
        let pcm = std::mem::take(&mut handle.pcm);
        if std::mem::take(&mut self.fail_first) {
            return Some(Err("a made-up lost copy".to_string()));
        }
        Some(Ok(pcm))
    }
}

fn early(fail_first: bool, async_lm: bool) -> Option<EngineLoop<Early>> {
    let mut lp = looped(Early { inner: made_up(None), fail_first, log: Vec::new() })?;
    lp.async_lm = async_lm;
    Some(lp)
}

#[test]
fn pcm_handed_over_early_goes_out_before_its_step_is_collected_and_the_audio_is_the_same() {
    let (_, serial, _) = run(vec![replica(None)], arrivals(&[0.0, 0.0, 0.0, 0.05]));
    for async_lm in [false, true] {
        let mut lp = early(false, async_lm).unwrap();
        for a in arrivals(&[0.0, 0.0]) {
            lp.scheduler.add_request(a.req).unwrap();
        }
        let mut chunks = 0;
        while lp.busy() {
            lp.poll();
            let audio = lp.scheduler.events.drain(..).filter(|e| matches!(e, Event::Audio { .. })).count();
            if audio > 0 {
                let &(what, step) = lp.worker.log.iter().rev().find(|(w, _)| *w == "early").unwrap();
                assert!(!lp.worker.log.contains(&("collect", step)), "{what} {step}: collected before its audio went out");
                chunks += audio;
            }
        }
        assert!(chunks > 2);
        lp.scheduler.check_idle().unwrap();

        let (loops, outcomes, _) = run(vec![early(false, async_lm)], arrivals(&[0.0, 0.0, 0.0, 0.05]));
        loops[0].as_ref().unwrap().scheduler.check_idle().unwrap();
        for (e, s) in outcomes.iter().zip(&serial) {
            assert_eq!((e.req.finish_reason.as_deref(), e.req.error.as_deref()), (Some("length"), None));
            assert_eq!((&e.pcm, e.chunks.len()), (&s.pcm, s.chunks.len()), "{} async {async_lm}", e.req.req_id);
        }
    }
}

#[test]
fn pcm_lost_on_its_early_hand_over_fails_exactly_the_requests_of_those_rows() {
    let (loops, outcomes, _) = run(vec![early(true, false)], arrivals(&[0.0, 0.1]));
    loops[0].as_ref().unwrap().scheduler.check_idle().unwrap();
    assert_eq!(outcomes[0].req.error.as_deref(), Some("a made-up lost copy"));
    assert_eq!((outcomes[1].req.finish_reason.as_deref(), outcomes[1].req.error.as_deref()), (Some("length"), None));
}
