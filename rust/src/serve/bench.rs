//! Bench mode's run (vox_serve/bench.py): one phase of requests through the scheduler thread
//! without HTTP, each queued when its arrival offset from the phase start has come. The outcomes
//! go back to Python, which reports them for both runtimes (vox_serve/bench_report.py).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::sched::engine_loop::{EngineLoop, Worker};
use crate::sched::{Event, ReqKey, Request};

/// A request and when it arrives: seconds from the phase start.
pub struct Arrival {
    pub req: Request,
    pub offset: f64,
}

/// A request's outcome: its final state, when it was queued, its audio chunks and its end (seconds
/// from the phase start).
pub struct Outcome {
    pub req: Request,
    pub offset: f64,
    /// None: the scheduler refused it (the error says why).
    pub admitted: Option<f64>,
    /// (arrival, samples) of each audio chunk.
    pub chunks: Vec<(f64, usize)>,
    pub pcm: Vec<u8>,
    pub finished: Option<f64>,
}

/// One phase in flight: its clock, the outcomes so far, and the next request to queue.
struct Phase {
    start: Instant,
    outcomes: Vec<Outcome>,
    next: usize,
    by_key: HashMap<ReqKey, usize>,
    by_id: HashMap<String, usize>,
}

impl Phase {
    fn new(arrivals: Vec<Arrival>) -> Phase {
        let by_id = arrivals.iter().enumerate().map(|(i, a)| (a.req.req_id.clone(), i)).collect();
        let outcomes = arrivals.into_iter().map(|a| Outcome { req: a.req, offset: a.offset, admitted: None,
                                                              chunks: Vec::new(), pcm: Vec::new(), finished: None })
            .collect();
        Phase { start: Instant::now(), outcomes, next: 0, by_key: HashMap::new(), by_id }
    }

    fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Queue every request whose offset has come (offsets are in order); a refused one fails.
    fn admit_due<W: Worker>(&mut self, lp: &mut EngineLoop<W>) {
        while self.next < self.outcomes.len() && self.outcomes[self.next].offset <= self.now() {
            let i = self.next;
            self.next += 1;
            let now = self.now();
            let outcome = &mut self.outcomes[i];
            match lp.scheduler.add_request(outcome.req.clone()) {
                Ok(key) => {
                    self.by_key.insert(key, i);
                    outcome.admitted = Some(now);
                }
                Err(e) => {
                    outcome.req.finish_reason = Some("error".into());
                    outcome.req.error = Some(e.to_string());
                }
            }
        }
    }

    /// The scheduler's events since the last poll, timed now.
    fn collect<W: Worker>(&mut self, lp: &mut EngineLoop<W>) {
        let now = self.now();
        for event in lp.scheduler.events.drain(..) {
            match event {
                Event::Audio { key, pcm } => {
                    let outcome = &mut self.outcomes[self.by_key[&key]];
                    outcome.chunks.push((now, pcm.len() / 2));
                    outcome.pcm.extend_from_slice(&pcm);
                }
                Event::Done(req) => {
                    let outcome = &mut self.outcomes[self.by_id[&req.req_id]];
                    outcome.req = *req;
                    outcome.finished = Some(now);
                }
            }
        }
    }

    /// Seconds until the next arrival (0 when it is due); None when every request is queued.
    fn until_next(&self) -> Option<f64> {
        self.outcomes.get(self.next).map(|o| (o.offset - self.now()).max(0.0))
    }
}

/// Run one phase to its end on the calling thread (the replica's scheduler thread): requests are
/// queued at their offsets, and while nothing can run the thread sleeps until the next arrival (or
/// the policy's own wake-up). Returns the outcomes in order and the phase's wall seconds.
pub fn run<W: Worker>(lp: &mut EngineLoop<W>, arrivals: Vec<Arrival>) -> (Vec<Outcome>, f64) {
    let mut phase = Phase::new(arrivals);
    loop {
        phase.admit_due(lp);
        let wait = lp.poll();
        phase.collect(lp);
        let delay = match (wait, phase.until_next()) {
            (None, None) => break,
            (Some(w), None) | (None, Some(w)) => w,
            (Some(w), Some(a)) => w.min(a),
        };
        if delay > 0.0 {
            std::thread::sleep(Duration::from_secs_f64(delay));
        }
    }
    if let Some(t) = lp.tracer.as_mut() {
        t.flush();
    }
    let wall = phase.now();
    (phase.outcomes, wall)
}
