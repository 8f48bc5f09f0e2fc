//! The `deadline` policy (vox_serve/scheduler/deadline.py): earliest playback deadline first, for
//! audio, tokens and admissions; admissions deferred, for at most a limit, while running streams
//! are about to underrun. That module's docstring states every rule; the constants are its.


use super::base::Scheduler;
use super::codec::Why;
use super::config::SchedulerConfig;
use super::policy::PLAYBACK_MARGIN_S;
use super::types::{ReqKey, RequestStatus};

const PERIOD_SMOOTHING: f64 = 0.05;
const PERIOD_WARMUP_STEPS: u32 = 8;
const PERIOD_MAX_SAMPLE_FACTOR: f64 = 4.0;
const NON_STREAMING_STARTUP_FACTOR: f64 = 10.0;

pub struct DeadlineState {
    startup_s: f64,
    max_deferral_s: f64,
    lm_step_s: f64,
    codec_s: f64,
    prefill_s: f64,
    /// Waiting request -> when its admission was first deferred (insertion order kept).
    deferred_since: Vec<(ReqKey, f64)>,
    at_risk: Vec<ReqKey>,
    period_s: f64,
    period_samples: u32,
    pub last_planned: Option<f64>,
}

impl DeadlineState {
    pub fn new(config: &SchedulerConfig) -> DeadlineState {
        let lm_step_s = config.deadline_lm_step_ms / 1000.0;
        DeadlineState {
            startup_s: config.deadline_startup_ms / 1000.0,
            max_deferral_s: config.deadline_max_prefill_deferral_ms / 1000.0,
            lm_step_s,
            codec_s: config.deadline_codec_ms / 1000.0,
            prefill_s: config.deadline_prefill_ms / 1000.0,
            deferred_since: Vec::new(),
            at_risk: Vec::new(),
            period_s: lm_step_s,
            period_samples: 0,
            last_planned: None,
        }
    }

    fn deferred(&self, key: ReqKey) -> Option<f64> {
        self.deferred_since.iter().find(|(k, _)| *k == key).map(|&(_, t)| t)
    }
}

fn ceil_div_f(codes: i64, per_step: i64) -> i64 {
    (codes.max(0) as f64 / per_step as f64).ceil() as i64
}

impl Scheduler {
    pub(super) fn deadline_mut(&mut self) -> &mut DeadlineState {
        self.deadline.as_mut().expect("the deadline policy's state")
    }

    fn dl(&self) -> &DeadlineState {
        self.deadline.as_ref().expect("the deadline policy's state")
    }

    /// Before each plan: the gap since the previous non-empty plan is a sample of the step period.
    pub(super) fn measure_step_period(&mut self) {
        let now = self.clock.now();
        let d = self.deadline_mut();
        if let Some(last) = d.last_planned {
            let gap = now - last;
            if 0.0 <= gap && gap <= PERIOD_MAX_SAMPLE_FACTOR * d.period_s.max(d.lm_step_s) {
                d.period_s += PERIOD_SMOOTHING * (gap - d.period_s);
                d.period_samples += 1;
            }
        }
    }

    pub fn step_period(&self) -> f64 {
        let d = self.dl();
        if d.period_samples >= PERIOD_WARMUP_STEPS { d.period_s } else { d.lm_step_s }
    }

    /// When the request's next chunk must reach its client (inf for non-streaming requests).
    pub fn deadline_of(&self, key: ReqKey) -> f64 {
        let req = self.req(key);
        if !req.streaming {
            return f64::INFINITY;
        }
        self.playback_deadline(key).unwrap_or(req.stats.arrival + self.dl().startup_s)
    }

    fn admission_deadline(&self, key: ReqKey) -> f64 {
        let req = self.req(key);
        if req.streaming {
            return self.deadline_of(key);
        }
        req.stats.arrival + NON_STREAMING_STARTUP_FACTOR * self.dl().startup_s
    }

    /// Codes until the request's next chunk has its whole window.
    fn codes_to_next_chunk(&self, key: ReqKey) -> i64 {
        let window_end = self.geometry.window_end(self.next_chunk(key));
        window_end * self.geometry.codes_per_frame - self.num_codes(key)
    }

    fn time_to_next_chunk(&self, key: ReqKey) -> f64 {
        let d = self.dl();
        if self.has_ready_chunk(key) || self.req(key).status == RequestStatus::Draining {
            return d.codec_s;
        }
        let steps = ceil_div_f(self.codes_to_next_chunk(key), self.meta.codes_per_step);
        let share = (self.limits.max_batch as f64 / self.running.len().max(1) as f64).min(1.0);
        steps as f64 * self.step_period() / share + d.codec_s
    }

    fn time_to_first_audio(&self, key: ReqKey) -> f64 {
        let d = self.dl();
        let steps = (ceil_div_f(self.codes_to_next_chunk(key), self.meta.codes_per_step) - 1).max(0);
        let share = (self.limits.max_batch as f64 / (self.running.len() + 1) as f64).min(1.0);
        d.prefill_s + steps as f64 * self.step_period() / share + d.codec_s
    }

    fn first_audio_slack(&self, key: ReqKey) -> f64 {
        self.deadline_of(key) - self.now - self.time_to_first_audio(key)
    }

    fn realtime_capacity(&self) -> f64 {
        let frame_s = self.meta.samples_per_frame as f64 / self.meta.sample_rate as f64;
        let codes_per_slot_per_frame = frame_s / self.step_period() * self.meta.codes_per_step as f64;
        self.limits.max_batch as f64 * codes_per_slot_per_frame / self.meta.codes_per_frame as f64
    }

    fn slack(&self, key: ReqKey) -> f64 {
        self.deadline_of(key) - self.now - self.time_to_next_chunk(key)
    }

    fn chunk_due(&self, key: ReqKey) -> bool {
        let req = self.req(key);
        if !req.streaming {
            return req.status == RequestStatus::Draining;
        }
        req.stats.first_audio.is_none() || self.deadline_of(key) - self.now <= PLAYBACK_MARGIN_S
    }

    pub(super) fn deadline_select_codec(&mut self) {
        let mut ready = self.ready_requests();
        if !ready.iter().any(|&k| self.chunk_due(k)) {
            if !ready.is_empty() {
                self.notes.push(format!("codec held: {} requests have ready chunks, none due", ready.len()));
            }
            return;
        }
        ready.sort_by(|&a, &b| {
            let key = |k: ReqKey| (!self.chunk_due(k), self.deadline_of(k), self.req(k).stats.arrival);
            let (x, y) = (key(a), key(b));
            x.0.cmp(&y.0).then(x.1.total_cmp(&y.1)).then(x.2.total_cmp(&y.2))
        });
        let why = |s: &Scheduler, k: ReqKey| if s.chunk_due(k) { "due" } else { "joins a due batch" };
        self.take_chunks(&ready, Why::Per(&why), None);
    }

    pub(super) fn deadline_admission_order(&self) -> Vec<ReqKey> {
        let mut order: Vec<ReqKey> = self.waiting.iter().copied().collect();
        order.sort_by(|&a, &b| {
            self.admission_deadline(a).total_cmp(&self.admission_deadline(b))
                .then(self.req(a).stats.arrival.total_cmp(&self.req(b).stats.arrival))
        });
        order
    }

    pub(super) fn deadline_admission_reason(&self, key: ReqKey) -> String {
        format!("{}, first audio due in {:.0} ms", self.admission_reason_base(key),
                (self.deadline_of(key) - self.now) * 1000.0)
    }

    /// Find the streams about to underrun; each waiting request then decides in can_admit.
    pub(super) fn deadline_defer_admissions(&mut self) -> bool {
        let prefill_s = self.dl().prefill_s;
        let at_risk: Vec<ReqKey> = self.running.iter().chain(&self.draining).copied()
            .filter(|&k| self.req(k).streaming && self.slack(k) < prefill_s && !self.waits_for_text(k))
            .collect();
        let now = self.now;
        let waiting: Vec<ReqKey> = self.waiting.iter().copied().collect();
        let d = self.deadline_mut();
        if at_risk.is_empty() {
            d.deferred_since.clear();
        } else {
            for key in waiting {
                if d.deferred(key).is_none() {
                    d.deferred_since.push((key, now));
                }
            }
        }
        d.at_risk = at_risk;
        false
    }

    pub(super) fn deadline_can_admit(&mut self, key: ReqKey) -> bool {
        let (at_risk, max_deferral_s, prefill_s) = {
            let d = self.dl();
            (d.at_risk.clone(), d.max_deferral_s, d.prefill_s)
        };
        if !at_risk.is_empty() {
            let deferred = self.now - self.dl().deferred(key).expect("a deferred waiting request");
            let worst = at_risk.iter().map(|&k| self.slack(k)).fold(f64::INFINITY, f64::min) * 1000.0;
            let own = if self.req(key).streaming { self.first_audio_slack(key) } else { f64::INFINITY };
            if deferred < max_deferral_s && own >= prefill_s {
                self.notes.push(format!("admissions deferred: {} streams about to underrun (least slack {:.0} ms)",
                                        at_risk.len(), worst));
                return false;
            }
            let why = if deferred < max_deferral_s { "its own first audio is due" } else { "the deferral limit" };
            let note = format!("{} admitted after {:.0} ms deferred, {why} ({} streams at risk, least slack {:.0} ms)",
                               self.req(key).req_id, deferred * 1000.0, at_risk.len(), worst);
            self.notes.push(note);
        }
        self.deadline_mut().deferred_since.retain(|(k, _)| *k != key);
        if self.num_generating() < self.limits.max_batch {
            return true;
        }
        if !at_risk.is_empty() || (self.num_generating() + 1) as f64 > self.realtime_capacity() {
            return false; // the batch is full and has no slack to lend: wait, as in base
        }
        let need = self.pool.pages_needed(key, self.req(key).prompt_len() + 1);
        self.pool.num_free() as i64 - need > self.running.len() as i64
    }

    pub(super) fn deadline_decode_order(&mut self, candidates: Vec<usize>) -> Vec<usize> {
        let max_deferral_s = self.dl().max_deferral_s;
        let key_of = |s: &Scheduler, slot: usize| -> (u8, f64, f64) {
            let last = s.table.last_decode[slot]; // NaN before its first row: never "waited too long"
            let arrival = s.req(s.key_at(slot)).stats.arrival;
            if s.now - last >= max_deferral_s {
                (0, last, arrival) // waited too long: first, whatever its deadline
            } else {
                (1, s.deadline_of(s.key_at(slot)), arrival)
            }
        };
        let mut order = candidates;
        order.sort_by(|&a, &b| {
            let (x, y) = (key_of(self, a), key_of(self, b));
            x.0.cmp(&y.0).then(x.1.total_cmp(&y.1)).then(x.2.total_cmp(&y.2))
        });
        if order.len() > self.limits.max_batch {
            for &s in &order[..self.limits.max_batch] {
                let key = self.key_at(s);
                self.reasons.decode.insert(key, "earliest deadline".into());
            }
        }
        order
    }

    pub(super) fn deadline_next_wakeup(&self) -> Option<f64> {
        let d = self.dl();
        let mut times: Vec<f64> = self.ready_requests().into_iter()
            .filter(|&k| self.req(k).streaming)
            .map(|k| self.deadline_of(k) - PLAYBACK_MARGIN_S)
            .collect();
        times.extend(d.deferred_since.iter().map(|&(_, since)| since + d.max_deferral_s));
        times.extend(self.waiting.iter().copied()
            .filter(|&k| self.req(k).streaming && d.deferred(k).is_some())
            .map(|k| self.now + self.first_audio_slack(k) - d.prefill_s));
        times.into_iter().filter(|&t| t > self.now).min_by(|a, b| a.total_cmp(b))
    }
}
