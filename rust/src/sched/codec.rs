//! Audio chunks: which are ready, and taking them into the step's codec rows
//! (vox_serve/scheduler/base.py `take_chunks`, `_ready_chunks`, `_take_chunks`).

use super::base::Scheduler;
use super::config::PolicyKind;
use super::plan::CodecLaunch;
use super::table::SlotState;
use super::types::ReqKey;

/// Codec rows collected over a step's rounds of requests.
#[derive(Debug, Clone, Default)]
pub struct CodecRows {
    launch: CodecLaunch,
}

#[allow(clippy::len_without_is_empty)]
impl CodecRows {
    pub fn len(&self) -> usize {
        self.launch.len()
    }

    pub fn launch(self) -> CodecLaunch {
        self.launch
    }
}

/// Why a request got chunks: fixed, or decided per request once they are taken.
pub enum Why<'a> {
    Fixed(&'a str),
    Per(&'a dyn Fn(&Scheduler, ReqKey) -> &'static str),
}

impl Scheduler {
    /// Running and draining requests with a ready chunk, in arrival order.
    pub fn ready_requests(&self) -> Vec<ReqKey> {
        let t = &self.table;
        let mut ready: Vec<ReqKey> = (0..t.num_slots)
            .filter(|&s| matches!(t.state[s], SlotState::Running | SlotState::Draining) && t.ready(s))
            .map(|s| self.key_at(s))
            .collect();
        ready.sort_by(|a, b| self.req(*a).stats.arrival.total_cmp(&self.req(*b).stats.arrival));
        ready
    }

    pub fn has_ready_chunk(&self, key: ReqKey) -> bool {
        self.req(key).slot.map_or(false, |s| self.table.ready(s))
    }

    pub(super) fn select_codec(&mut self) {
        match self.policy() {
            PolicyKind::Base => {
                let ready = self.ready_requests();
                self.take_chunks(&ready, Why::Fixed("ready"), None);
            }
            PolicyKind::Online => self.online_select_codec(),
            PolicyKind::Offline => self.offline_select_codec(),
            PolicyKind::Deadline => self.deadline_select_codec(),
        }
    }

    /// Plan ready chunks of `keys` in that order, at most `room` more (default: up to the codec
    /// batch limit); returns how many requests got chunks. A stateful codec takes at most one
    /// chunk per request per step, since each chunk advances the request's state.
    pub(super) fn take_chunks(&mut self, keys: &[ReqKey], why: Why, room: Option<usize>) -> usize {
        let have = self.codec_rows.len();
        let max = self.limits.max_codec_batch;
        let limit = room.map_or(max, |r| (have + r).min(max)) as i64;
        let slots: Vec<usize> = keys.iter().map(|&k| self.req(k).slot.expect("a ready request holds a slot")).collect();
        let mut before = 0i64;
        let mut takes = Vec::with_capacity(slots.len());
        let mut got = 0;
        for &slot in &slots {
            let (count, no_more) = self.ready_chunks(slot);
            let take = count.min((limit - have as i64 - before).max(0));
            before += count;
            takes.push((take, take == count && no_more));
        }
        for (i, &slot) in slots.iter().enumerate() {
            let (take, last) = takes[i];
            if take > 0 {
                self.take_slot_chunks(keys[i], slot, take, last);
                got += 1;
            }
        }
        for (i, &key) in keys.iter().enumerate() {
            if takes[i].0 > 0 {
                let reason = match &why {
                    Why::Fixed(text) => text.to_string(),
                    Why::Per(decide) => decide(self, key).to_string(),
                };
                self.reasons.codec.insert(key, reason);
            }
        }
        got
    }

    /// (chunks ready now, whether the last of them is a draining request's final one). Chunk i
    /// needs `skip + first + lookahead + i * frames_per_chunk` frames; after the full ones, a
    /// draining request has a shorter final chunk while frames remain that have lookahead.
    fn ready_chunks(&self, slot: usize) -> (i64, bool) {
        let (t, g) = (&self.table, &self.geometry);
        let (frames, next) = (t.num_frames(slot), t.next_chunk[slot]);
        let full = ((frames - g.first_need()).div_euclid(g.frames_per_chunk) + 1 - next).max(0);
        let (start, _) = g.emitted(next + full);
        let draining = t.state[slot] == SlotState::Draining;
        let short = i64::from(draining && frames - g.lookahead > start);
        let mut count = full + short;
        if self.meta.stateful_codec {
            count = count.min(1);
        }
        (count, draining && count == full + short)
    }

    /// The codec rows of the slot's next `take` chunks; advances its next chunk.
    fn take_slot_chunks(&mut self, key: ReqKey, slot: usize, take: i64, last_is_final: bool) {
        let g = self.geometry;
        let next = self.table.next_chunk[slot];
        let frames = self.table.num_frames(slot);
        let rows = &mut self.codec_rows.launch;
        for offset in 0..take {
            let index = next + offset;
            let (start, full_end) = g.emitted(index);
            let end = if frames >= full_end + g.lookahead { full_end } else { frames - g.lookahead };
            rows.keys.push(key);
            rows.slot.push(slot as i32);
            rows.chunk_index.push(index as i32);
            rows.first_frame.push((start - g.lookback) as i32);
            rows.window_end.push((end + g.lookahead) as i32);
            rows.num_frames.push((end - start) as i32);
            rows.is_last.push(offset == take - 1 && last_is_final);
        }
        self.table.set_next_chunk(slot, next + take);
    }

    pub fn num_planned_chunks(&self) -> usize {
        self.codec_rows.len()
    }
}
