//! The host's mirror of the request slots (vox_serve/core/slot_table.py): one row of counters per
//! slot, the request that holds it, and when its next chunk is ready.

use super::chunks::ChunkGeometry;
use super::pool::SlotPool;
use super::types::{Counters, ReqKey, Request, NEVER};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotState {
    Free,
    /// Preempted: holds its slot (its tokens and codes are on the device), no pages.
    Waiting,
    Running,
    Draining,
}

pub struct SlotTable {
    pub num_slots: usize,
    pub geometry: ChunkGeometry,
    pool: SlotPool<ReqKey>,
    pub requests: Vec<Option<ReqKey>>,
    pub num_computed: Vec<i64>,
    pub num_generated: Vec<i64>,
    pub num_pending: Vec<i64>,
    pub num_codes: Vec<i64>,
    pub next_chunk: Vec<i64>,
    pub prompt_len: Vec<i64>,
    pub max_tokens: Vec<i64>,
    pub text_limit: Vec<i64>,
    /// Frames the next (not final) chunk needs, and its first emitted frame.
    pub chunk_need: Vec<i64>,
    pub chunk_start: Vec<i64>,
    /// Tokens the slot's KV pages hold.
    pub capacity: Vec<i64>,
    /// A number unique to each admission into the slot (0: free).
    pub occupancy: Vec<i64>,
    /// Order of (re)admission: the base policy's decode order.
    pub admit_rank: Vec<i64>,
    pub lm_step: Vec<i64>,
    pub codec_step: Vec<i64>,
    /// When the slot last had an LM row (NaN before its first).
    pub last_decode: Vec<f64>,
    pub state: Vec<SlotState>,
    occupancies: i64,
    ranks: i64,
}

impl SlotTable {
    pub fn new(num_slots: usize, geometry: ChunkGeometry) -> SlotTable {
        let zeros = || vec![0i64; num_slots];
        SlotTable {
            num_slots, geometry, pool: SlotPool::new(num_slots), requests: vec![None; num_slots],
            num_computed: zeros(), num_generated: zeros(), num_pending: zeros(), num_codes: zeros(),
            next_chunk: zeros(), prompt_len: zeros(), max_tokens: zeros(), text_limit: zeros(),
            chunk_need: vec![NEVER; num_slots], chunk_start: vec![NEVER; num_slots], capacity: zeros(),
            occupancy: zeros(), admit_rank: zeros(), lm_step: zeros(), codec_step: zeros(),
            last_decode: vec![0.0; num_slots], state: vec![SlotState::Free; num_slots], occupancies: 0, ranks: 0,
        }
    }

    pub fn num_free(&self) -> usize {
        self.pool.num_free()
    }

    pub fn can_acquire(&self) -> bool {
        self.pool.can_acquire()
    }

    /// Give the request a slot, its counters moved into the table.
    pub fn acquire(&mut self, key: ReqKey, req: &mut Request) -> usize {
        let slot = self.pool.acquire(key);
        self.occupancies += 1;
        let c = req.counters;
        self.num_computed[slot] = c.num_computed;
        self.num_generated[slot] = c.num_generated;
        self.num_pending[slot] = c.num_pending;
        self.num_codes[slot] = c.num_codes;
        self.prompt_len[slot] = req.prompt_len();
        self.max_tokens[slot] = req.sampling.max_tokens;
        self.text_limit[slot] = req.text_feed.as_ref().map_or(NEVER, |f| f.limit());
        self.capacity[slot] = 0;
        self.lm_step[slot] = 0;
        self.codec_step[slot] = 0;
        self.occupancy[slot] = self.occupancies;
        self.state[slot] = SlotState::Running;
        self.mark_admitted(slot);
        self.last_decode[slot] = f64::NAN;
        self.requests[slot] = Some(key);
        req.slot = Some(slot);
        self.set_next_chunk(slot, c.next_chunk);
        slot
    }

    /// Take the request's slot back; its counters move back into the request.
    pub fn release(&mut self, key: ReqKey, req: &mut Request) -> Option<usize> {
        let slot = req.slot?;
        req.counters = self.counters(slot);
        req.slot = None;
        self.requests[slot] = None;
        self.occupancy[slot] = 0;
        self.state[slot] = SlotState::Free;
        self.chunk_need[slot] = NEVER;
        self.chunk_start[slot] = NEVER;
        self.pool.release(key);
        Some(slot)
    }

    pub fn counters(&self, slot: usize) -> Counters {
        Counters { num_computed: self.num_computed[slot], num_generated: self.num_generated[slot],
                   num_pending: self.num_pending[slot], num_codes: self.num_codes[slot],
                   next_chunk: self.next_chunk[slot] }
    }

    /// The slot's request joins the running requests (again, after a preemption).
    pub fn mark_admitted(&mut self, slot: usize) {
        self.ranks += 1;
        self.admit_rank[slot] = self.ranks;
        self.state[slot] = SlotState::Running;
    }

    /// Slots in `state`, in admission order.
    pub fn slots_in(&self, state: SlotState) -> Vec<usize> {
        let mut slots: Vec<usize> = (0..self.num_slots).filter(|&s| self.state[s] == state).collect();
        slots.sort_by_key(|&s| self.admit_rank[s]);
        slots
    }

    pub fn set_next_chunk(&mut self, slot: usize, index: i64) {
        self.next_chunk[slot] = index;
        let (start, end) = self.geometry.emitted(index);
        self.chunk_start[slot] = start;
        self.chunk_need[slot] = end + self.geometry.lookahead;
    }

    pub fn num_frames(&self, slot: usize) -> i64 {
        self.num_codes[slot].div_euclid(self.geometry.codes_per_frame)
    }

    /// Whether the slot's next chunk can be decoded now (a draining slot also when only its
    /// shorter final chunk is left).
    pub fn ready(&self, slot: usize) -> bool {
        let frames = self.num_frames(slot);
        let only_final = self.state[slot] == SlotState::Draining
            && frames - self.geometry.lookahead > self.chunk_start[slot];
        frames >= self.chunk_need[slot] || only_final
    }

    pub fn num_held(&self) -> usize {
        self.pool.num_held()
    }
}
