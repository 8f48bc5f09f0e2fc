//! The policies' hooks (vox_serve/scheduler/online.py, offline.py, and base.py's defaults):
//! which chunks to decode, the admission order and test, and the decode order. `deadline` has
//! its own module.

use super::base::Scheduler;
use super::codec::Why;
use super::config::PolicyKind;
use super::types::{ReqKey, RequestStatus};

/// How far ahead of a client's playback `online` and `deadline` decode audio (playback.py).
pub const PLAYBACK_MARGIN_S: f64 = 1.0;

impl Scheduler {
    // ---- the client's playback clock (scheduler/playback.py) -------------------------------
    /// When the client runs out of audio; None before the first chunk.
    pub fn playback_deadline(&self, key: ReqKey) -> Option<f64> {
        let stats = &self.req(key).stats;
        let rate = self.meta.sample_rate as f64;
        stats.first_audio.map(|first| first + stats.num_audio_samples as f64 / rate)
    }

    /// The earliest chunk deadline of these requests' streams (playback, or first audio due
    /// `--deadline-startup-ms` after arrival); None when none of them streams.
    pub fn codec_deadline(&self, keys: &[ReqKey]) -> Option<f64> {
        let startup_s = self.config.deadline_startup_ms / 1000.0;
        keys.iter().filter(|&&k| self.req(k).streaming)
            .map(|&k| self.playback_deadline(k).unwrap_or(self.req(k).stats.arrival + startup_s))
            .reduce(f64::min)
    }

    /// When the client starts playing the last chunk it has received; None before the first.
    fn last_chunk_play_start(&self, key: ReqKey) -> Option<f64> {
        let stats = &self.req(key).stats;
        let played_before = stats.num_audio_samples - stats.last_chunk_samples;
        stats.first_audio.map(|first| first + played_before as f64 / self.meta.sample_rate as f64)
    }

    // ---- admission hooks -------------------------------------------------------------------
    pub(super) fn admission_order(&self) -> Vec<ReqKey> {
        match self.policy() {
            PolicyKind::Deadline => self.deadline_admission_order(),
            _ => self.waiting.iter().copied().collect(),
        }
    }

    pub(super) fn can_admit(&mut self, key: ReqKey) -> bool {
        match self.policy() {
            PolicyKind::Deadline => self.deadline_can_admit(key),
            // As many generating requests as the decode batch holds (requests waiting for streamed
            // text hold their pages and slot, but not a place in the batch).
            _ => self.num_generating() < self.limits.max_batch,
        }
    }

    pub(super) fn admission_reason(&self, key: ReqKey) -> String {
        match self.policy() {
            PolicyKind::Deadline => self.deadline_admission_reason(key),
            _ => self.admission_reason_base(key),
        }
    }

    /// True to admit no new request this step.
    pub(super) fn defer_admissions(&mut self) -> bool {
        match self.policy() {
            PolicyKind::Deadline => self.deadline_defer_admissions(),
            _ => false,
        }
    }

    // ---- online ----------------------------------------------------------------------------
    /// When the request becomes pressing (-inf: now and until an event; None: not before an event).
    fn pressing_from(&self, key: ReqKey) -> Option<f64> {
        let req = self.req(key);
        if !req.streaming {
            return (req.status == RequestStatus::Draining).then(|| f64::NEG_INFINITY);
        }
        Some(self.last_chunk_play_start(key).map_or(f64::NEG_INFINITY, |start| start - PLAYBACK_MARGIN_S))
    }

    fn is_pressing(&self, key: ReqKey) -> bool {
        self.pressing_from(key).map_or(false, |since| since <= self.now)
    }

    pub(super) fn online_select_codec(&mut self) {
        let ready = self.ready_requests();
        let mut pressing: Vec<ReqKey> = ready.iter().copied().filter(|&k| self.is_pressing(k)).collect();
        pressing.sort_by(|a, b| self.pressing_from(*a).unwrap().total_cmp(&self.pressing_from(*b).unwrap()));
        if pressing.is_empty() {
            if !ready.is_empty() {
                self.notes.push(format!("codec held: {} requests have ready chunks, none pressing", ready.len()));
            }
            return;
        }
        self.take_chunks(&pressing, Why::Fixed("pressing"), None);
        let rest: Vec<ReqKey> = ready.into_iter().filter(|&k| !self.is_pressing(k)).collect();
        self.take_chunks(&rest, Why::Fixed("joins a pressing batch"), None);
    }

    pub(super) fn online_decode_order(&mut self, candidates: Vec<usize>) -> Vec<usize> {
        let (pressing, rest): (Vec<usize>, Vec<usize>) =
            candidates.into_iter().partition(|&s| self.is_pressing(self.key_at(s)));
        for &s in &pressing {
            let key = self.key_at(s);
            self.reasons.decode.insert(key, "pressing".into());
        }
        pressing.into_iter().chain(rest).collect()
    }

    pub(super) fn online_next_wakeup(&self) -> Option<f64> {
        self.ready_requests().into_iter()
            .filter_map(|k| self.pressing_from(k))
            .filter(|&t| t > self.now)
            .min_by(|a, b| a.total_cmp(b))
    }

    // ---- offline ---------------------------------------------------------------------------
    /// Audio is decoded only while no admitted request is generating tokens.
    pub(super) fn offline_select_codec(&mut self) {
        let generating = self.num_generating();
        let ready = self.ready_requests();
        if generating > 0 {
            if !ready.is_empty() {
                self.notes.push(format!("codec held: {generating} requests generating tokens"));
            }
            return;
        }
        self.take_chunks(&ready, Why::Fixed("LM idle"), None);
    }
}
