//! Bench mode's replicas (`bench::run`) on workers that make up their outputs: requests go to the
//! least-loaded replica, and a replica that panics fails only the requests it held.

use serde_json::json;

use super::bench::{least_loaded, run, Arrival};
use crate::driver::writer_tests::spec;
use crate::sched::engine_loop::{EngineLoop, Worker};
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
                        decode_kind: vec![audio; plan.decode.len()], pcm, stage_seconds: Vec::new() })
    }

    fn collect(&mut self, handle: StepResult) -> Result<StepResult, String> {
        Ok(handle)
    }
}

fn replica(panic_at: Option<usize>) -> Option<EngineLoop<MadeUp>> {
    let s = spec(false);
    let config = SchedulerConfig::from_json(&json!({})).unwrap();
    let worker = MadeUp { samples_per_frame: s.meta.samples_per_frame, steps: 0, panic_at };
    Some(EngineLoop::new(Scheduler::new(s.meta, s.limits, config, Clock::Monotonic), worker, None))
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
