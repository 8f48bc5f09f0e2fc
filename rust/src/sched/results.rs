//! A step's results applied to its requests (vox_serve/scheduler/results.py): each LM row's out kind
//! counts a token, ends generation at a stop or the length limit, or is dropped when its request no
//! longer holds the slot; each chunk's PCM becomes an audio event; requests whose tokens and chunks are
//! all done end, their pages freed once no step in flight writes them.

use super::base::{Event, Scheduler};
use super::plan::{CodecLaunch, StepPlan, StepResult};
use super::table::SlotState;
use super::types::{OutKind, ReqKey, RequestStatus};

impl Scheduler {
    /// Apply a step's results; its PCM moves into the audio events (no copy).
    pub fn update(&mut self, plan: &StepPlan, result: &mut StepResult) {
        let now = self.clock.now();
        if let Some(flight) = self.flights.remove(&plan.step_id) {
            let prefill_kinds = &result.prefill_kind;
            self.apply(&flight.prefill_slots, &flight.prefill_occupancy, Some(&flight.prefill_sample), prefill_kinds,
                       now);
            self.apply(&flight.decode_slots, &flight.decode_occupancy, None, &result.decode_kind, now);
        }
        if result.codec_deferred {
            self.codec_pending.insert(plan.step_id, plan.codec.clone());
        } else if !result.pcm_early {
            self.apply_pcm(&plan.codec, &mut result.pcm, now);
        }
        self.retire_drained();
        self.free_landed_pages();
    }

    /// A codec batch that landed after its step (`--overlap-detok`): its PCM, like `update`'s. Returns its
    /// rows (for the trace), or None for a step whose codec rows were not deferred.
    pub fn land_codec(&mut self, step_id: i64, result: &mut StepResult) -> Option<CodecLaunch> {
        let launch = self.codec_pending.remove(&step_id)?;
        let now = self.clock.now();
        self.apply_pcm(&launch, &mut result.pcm, now);
        self.retire_drained();
        Some(launch)
    }

    /// The PCM of a step's codec rows, handed over before the step is collected (`Worker::early_pcm`).
    pub fn land_early(&mut self, plan: &StepPlan, pcm: &mut [Vec<u8>]) {
        let now = self.clock.now();
        self.apply_pcm(&plan.codec, pcm, now);
        self.retire_drained();
    }

    /// A deferred codec batch failed: fail exactly the requests it carried.
    pub fn fail_codec(&mut self, step_id: i64, error: &str) {
        let keys = self.codec_pending.remove(&step_id).map_or_else(Vec::new, |launch| launch.keys);
        self.fail_chunks(&keys, error);
    }

    /// Codec rows whose PCM was lost: their requests fail.
    pub fn fail_chunks(&mut self, keys: &[ReqKey], error: &str) {
        for &key in keys {
            if self.get(key).is_some() {
                self.end(key, RequestStatus::Failed, Some("error".into()), Some(error.to_string()));
            }
        }
        self.retire_drained();
    }

    fn apply_pcm(&mut self, launch: &CodecLaunch, pcm: &mut [Vec<u8>], now: f64) {
        for (i, &key) in launch.keys.iter().enumerate() {
            if self.get(key).is_some() {
                self.on_audio(key, std::mem::take(&mut pcm[i]), now);
            }
        }
    }

    /// One launch's out kinds, for the rows whose request still holds the slot.
    fn apply(&mut self, slots: &[usize], occupancy: &[i64], sample: Option<&Vec<bool>>, kinds: &[i32], now: f64) {
        let mut live = Vec::with_capacity(slots.len());
        for (i, &slot) in slots.iter().enumerate() {
            let sampled = sample.map_or(true, |s| s[i]);
            if self.table.occupancy[slot] == occupancy[i] && sampled {
                self.table.num_pending[slot] -= 1;
                if self.table.state[slot] == SlotState::Running {
                    live.push((slot, OutKind::from_i32(kinds[i])));
                }
            }
        }
        let mut stops = Vec::new();
        let mut full = Vec::new();
        for &(slot, _) in &live {
            if self.table.num_generated[slot] == 0 {
                let key = self.key_at(slot);
                let stats = &mut self.req_mut(key).stats;
                stats.first_token = stats.first_token.or(Some(now));
            }
        }
        for &(slot, kind) in &live {
            let t = &mut self.table;
            if kind != OutKind::Stop {
                t.num_generated[slot] += 1;
            }
            if kind.is_audio() {
                t.num_codes[slot] += self.meta.codes_per_step;
            }
            if kind.stops() {
                stops.push(slot);
            } else if t.num_generated[slot] >= t.max_tokens[slot]
                || t.prompt_len[slot] + t.num_generated[slot] >= self.limits.max_model_len
            {
                full.push(slot);
            }
        }
        for slot in stops {
            self.finish_generation(self.key_at(slot), "stop");
        }
        for slot in full {
            self.finish_generation(self.key_at(slot), "length");
        }
    }

    fn on_audio(&mut self, key: ReqKey, pcm: Vec<u8>, now: f64) {
        let stats = &mut self.req_mut(key).stats;
        if stats.first_audio.is_none() {
            stats.first_audio = Some(now);
        }
        let samples = (pcm.len() / 2) as i64;
        stats.num_audio_samples += samples;
        stats.last_chunk_samples = samples;
        self.events.push(Event::Audio { key, pcm });
    }

    fn finish_generation(&mut self, key: ReqKey, reason: &str) {
        let req = self.req_mut(key);
        req.finish_reason = Some(reason.to_string());
        req.status = RequestStatus::Draining;
        let slot = req.slot.expect("a running request holds a slot");
        self.table.state[slot] = SlotState::Draining;
        self.free_pages(key);
        self.running.retain(|&k| k != key);
        self.draining.push(key);
    }

    /// Draining requests with no chunk left, and none on the device, are finished (slot order).
    fn retire_drained(&mut self) {
        let t = &self.table;
        let on_device = |step: &i64| self.flights.contains_key(step) || self.codec_pending.contains_key(step);
        let done: Vec<usize> = (0..t.num_slots)
            .filter(|&s| t.state[s] == SlotState::Draining)
            .filter(|&s| !t.ready(s) && !on_device(&t.codec_step[s]))
            .collect();
        for slot in done {
            let key = self.key_at(slot);
            let reason = self.req(key).finish_reason.clone();
            self.end(key, RequestStatus::Finished, reason, None);
        }
    }

    /// A step failed: fail exactly the requests it carried; the others go on.
    pub fn fail(&mut self, plan: &StepPlan, error: &str) {
        self.flights.remove(&plan.step_id);
        let keys = plan.prefill.keys.iter().chain(&plan.decode.keys).chain(&plan.codec.keys).copied();
        for key in keys.collect::<Vec<_>>() {
            if self.get(key).is_some() {
                self.end(key, RequestStatus::Failed, Some("error".into()), Some(error.to_string()));
            }
        }
        self.free_landed_pages();
    }

    pub(super) fn end(&mut self, key: ReqKey, status: RequestStatus, reason: Option<String>, error: Option<String>) {
        self.free_pages(key);
        let mut req = self.remove(key);
        self.table.release(key, &mut req);
        self.running.retain(|&k| k != key);
        self.draining.retain(|&k| k != key);
        self.waiting.retain(|&k| k != key);
        req.status = status;
        req.finish_reason = reason;
        req.error = error;
        req.stats.finished = Some(self.clock.now());
        self.events.push(Event::Done(Box::new(req)));
    }

    /// A request's pages go back now, or once no step in flight writes them.
    fn free_pages(&mut self, key: ReqKey) {
        let slot = self.get(key).and_then(|r| r.slot);
        match slot {
            Some(s) if self.lm_in_flight(s) => {
                let step = self.table.lm_step[s];
                match self.free_later.iter_mut().find(|(k, _)| *k == key) {
                    Some(entry) => entry.1 = step,
                    None => self.free_later.push((key, step)),
                }
            }
            _ => {
                self.pool.free(key);
            }
        }
    }

    fn free_landed_pages(&mut self) {
        let flights = &self.flights;
        let (landed, later): (Vec<_>, Vec<_>) = self.free_later.drain(..).partition(|(_, s)| !flights.contains_key(s));
        self.free_later = later;
        for (key, _) in landed {
            self.pool.free(key);
        }
    }

    /// Whether a step still on the device has an LM row of the slot's request.
    pub fn lm_in_flight(&self, slot: usize) -> bool {
        self.flights.contains_key(&self.table.lm_step[slot])
    }
}
