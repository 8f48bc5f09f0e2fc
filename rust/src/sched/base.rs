//! The request life cycle every policy shares (vox_serve/scheduler/base.py), in the same order of
//! decisions: each step ready audio chunks are decoded, new requests are admitted and prefilled,
//! every other running request decodes one token; results are applied by out kind alone.
//!
//! Requests live in a slab addressed by `ReqKey`; the slot table mirrors the counters of those
//! holding a slot. Audio and ends go out as `Event`s, drained by whoever drives the scheduler. What a
//! step's results do to its requests is results.rs's half.

use std::collections::{BTreeMap, HashMap, VecDeque};

use super::chunks::ChunkGeometry;
use super::clock::Clock;
use super::codec::CodecRows;
use super::config::{EngineLimits, PolicyKind, ProgramMeta, SchedulerConfig};
use super::deadline::DeadlineState;
use super::plan::{CodecLaunch, LmLaunch, StepPlan};
use super::pool::PagePool;
use super::table::{SlotState, SlotTable};
use super::types::{ReqKey, Request, RequestStatus};

/// What the scheduler hands out: a chunk's PCM, or a request that has ended (with its final state).
#[derive(Debug, Clone)]
pub enum Event {
    Audio { key: ReqKey, pcm: Vec<u8> },
    Done(Box<Request>),
}

/// Why a request could not be queued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddError {
    /// Too many requests are waiting: retry later.
    QueueFull(String),
    Invalid(String),
}

impl std::fmt::Display for AddError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AddError::QueueFull(m) | AddError::Invalid(m) => f.write_str(m),
        }
    }
}

/// A planned step whose results have not been applied: the slot occupancies its rows belong to.
#[derive(Debug, Clone, Default)]
pub(super) struct Flight {
    pub prefill_slots: Vec<usize>,
    pub prefill_occupancy: Vec<i64>,
    pub prefill_sample: Vec<bool>,
    pub decode_slots: Vec<usize>,
    pub decode_occupancy: Vec<i64>,
    /// Whether the step decodes codec rows.
    pub has_codec: bool,
}

/// Why each request got its rows this step (for traces), by stage.
#[derive(Debug, Clone, Default)]
pub struct Reasons {
    pub codec: HashMap<ReqKey, String>,
    pub prefill: HashMap<ReqKey, String>,
    pub decode: HashMap<ReqKey, String>,
}

struct Entry {
    generation: u32,
    req: Option<Request>,
}

pub struct Scheduler {
    pub meta: ProgramMeta,
    pub limits: EngineLimits,
    pub config: SchedulerConfig,
    pub clock: Clock,
    pub pool: PagePool<ReqKey>,
    pub geometry: ChunkGeometry,
    pub table: SlotTable,
    entries: Vec<Entry>,
    free_entries: Vec<u32>,
    by_id: HashMap<String, ReqKey>,
    pub waiting: VecDeque<ReqKey>,
    pub running: Vec<ReqKey>,
    pub draining: Vec<ReqKey>,
    pub step_id: i64,
    pub now: f64,
    pub reasons: Reasons,
    pub notes: Vec<String>,
    pub events: Vec<Event>,
    pub(super) flights: BTreeMap<i64, Flight>,
    /// Codec batches still on the device after their step (`--overlap-detok`), by step: their rows.
    pub(super) codec_pending: BTreeMap<i64, CodecLaunch>,
    /// How many codec batches may be on the device at once (`--overlap-detok`; a stateful codec's chunks
    /// of one request run in order behind each other on the codec stream, and land in that order).
    pub max_codec_in_flight: usize,
    pub(super) free_later: Vec<(ReqKey, i64)>,
    pub(super) planned: Vec<bool>,
    pub(super) running_slots: Vec<usize>,
    pub(super) pages: Vec<(Vec<i32>, Vec<i32>, Vec<i32>)>,
    pub(super) admits: Vec<super::plan::SlotInit>,
    pub(super) codec_rows: CodecRows,
    pub(super) deadline: Option<DeadlineState>,
}

impl Scheduler {
    pub fn new(meta: ProgramMeta, limits: EngineLimits, config: SchedulerConfig, clock: Clock) -> Scheduler {
        let geometry = ChunkGeometry::new(&meta, &limits);
        let slots = limits.slots();
        let deadline = (config.policy == PolicyKind::Deadline).then(|| DeadlineState::new(&config));
        let now = clock.now();
        Scheduler {
            pool: PagePool::new(limits.num_pages, limits.page_size),
            table: SlotTable::new(slots, geometry),
            geometry, meta, limits, config, clock, entries: Vec::new(), free_entries: Vec::new(),
            by_id: HashMap::new(), waiting: VecDeque::new(), running: Vec::new(), draining: Vec::new(),
            step_id: 0, now, reasons: Reasons::default(), notes: Vec::new(), events: Vec::new(),
            flights: BTreeMap::new(), codec_pending: BTreeMap::new(), max_codec_in_flight: 1,
            free_later: Vec::new(), planned: vec![false; slots],
            running_slots: Vec::new(), pages: Vec::new(), admits: Vec::new(), codec_rows: CodecRows::default(),
            deadline,
        }
    }

    pub fn policy(&self) -> PolicyKind {
        self.config.policy
    }

    // ---- the request slab ----------------------------------------------------------------
    pub fn req(&self, key: ReqKey) -> &Request {
        self.get(key).expect("a live request key")
    }

    pub fn req_mut(&mut self, key: ReqKey) -> &mut Request {
        let entry = &mut self.entries[key.index as usize];
        assert_eq!(entry.generation, key.generation, "a stale request key");
        entry.req.as_mut().expect("a live request key")
    }

    pub fn get(&self, key: ReqKey) -> Option<&Request> {
        let entry = self.entries.get(key.index as usize)?;
        if entry.generation != key.generation {
            return None;
        }
        entry.req.as_ref()
    }

    pub fn key_of(&self, req_id: &str) -> Option<ReqKey> {
        self.by_id.get(req_id).copied()
    }

    /// The key of the request in `slot` (which holds one).
    pub(super) fn key_at(&self, slot: usize) -> ReqKey {
        self.table.requests[slot].expect("a slot with a request")
    }

    fn insert(&mut self, req: Request) -> ReqKey {
        let index = match self.free_entries.pop() {
            Some(i) => i,
            None => {
                self.entries.push(Entry { generation: 0, req: None });
                (self.entries.len() - 1) as u32
            }
        };
        let entry = &mut self.entries[index as usize];
        entry.generation = entry.generation.wrapping_add(1);
        entry.req = Some(req);
        ReqKey { index, generation: entry.generation }
    }

    pub(super) fn remove(&mut self, key: ReqKey) -> Request {
        let req = self.entries[key.index as usize].req.take().expect("a live request key");
        self.free_entries.push(key.index);
        self.by_id.remove(&req.req_id);
        req
    }

    /// A request's counter, from the slot table while it holds a slot.
    pub fn counter(&self, key: ReqKey, pick: fn(&crate::sched::types::Counters) -> i64) -> i64 {
        let req = self.req(key);
        match req.slot {
            Some(slot) => pick(&self.table.counters(slot)),
            None => pick(&req.counters),
        }
    }

    pub fn num_generated(&self, key: ReqKey) -> i64 {
        self.counter(key, |c| c.num_generated)
    }

    pub fn num_pending(&self, key: ReqKey) -> i64 {
        self.counter(key, |c| c.num_pending)
    }

    pub fn num_computed(&self, key: ReqKey) -> i64 {
        self.counter(key, |c| c.num_computed)
    }

    pub fn num_codes(&self, key: ReqKey) -> i64 {
        self.counter(key, |c| c.num_codes)
    }

    pub fn next_chunk(&self, key: ReqKey) -> i64 {
        self.counter(key, |c| c.next_chunk)
    }

    pub fn total_len(&self, key: ReqKey) -> i64 {
        self.req(key).prompt_len() + self.num_generated(key)
    }

    // ---- requests in and out -------------------------------------------------------------
    /// Queue a request (its arrival is now).
    pub fn add_request(&mut self, mut req: Request) -> Result<ReqKey, AddError> {
        if self.by_id.contains_key(&req.req_id) {
            return Err(AddError::Invalid(format!("request id {:?} is already in use", req.req_id)));
        }
        let prompt_len = req.prompt_len();
        if prompt_len + 1 > self.limits.max_model_len {
            return Err(AddError::Invalid(format!("prompt of {prompt_len} tokens exceeds max_model_len {}",
                                                 self.limits.max_model_len)));
        }
        let pages = (prompt_len + 1 + self.limits.page_size - 1) / self.limits.page_size;
        if pages > self.pool.num_usable() as i64 {
            return Err(AddError::Invalid(format!("prompt of {prompt_len} tokens does not fit in the KV cache")));
        }
        if req.prompt.columns > self.meta.input_columns {
            return Err(AddError::Invalid(format!("prompt rows have {} ids; the model takes {}", req.prompt.columns,
                                                 self.meta.input_columns)));
        }
        if self.waiting.len() >= self.config.max_queued_requests {
            return Err(AddError::QueueFull(format!("{} requests are already waiting", self.waiting.len())));
        }
        req.stats.arrival = self.clock.now();
        let id = req.req_id.clone();
        let key = self.insert(req);
        self.by_id.insert(id, key);
        self.waiting.push_back(key);
        Ok(key)
    }

    pub fn abort(&mut self, req_id: &str, reason: &str) -> bool {
        match self.key_of(req_id) {
            None => false,
            Some(key) => {
                self.end(key, RequestStatus::Aborted, Some(reason.to_string()), None);
                true
            }
        }
    }

    /// More streamed text for an input-streaming request (scheduler/text_input.py `extend`).
    pub fn append_text(&mut self, req_id: &str, ids: &[i32], ended: bool) -> Result<(), String> {
        let key = match self.key_of(req_id) {
            None => return Ok(()),
            Some(key) => key,
        };
        let req = self.req_mut(key);
        let feed = req.text_feed.as_mut().ok_or_else(|| format!("request {req_id} does not stream its text"))?;
        if feed.ended && !ids.is_empty() {
            return Err(format!("request {req_id}: text after its end"));
        }
        feed.ids.extend_from_slice(ids);
        feed.ended = feed.ended || ended;
        let limit = feed.limit();
        if let Some(slot) = req.slot {
            self.table.text_limit[slot] = limit;
        }
        Ok(())
    }

    /// Whether the slot's next LM row needs streamed text that has not arrived.
    pub(super) fn text_waiting(&self, slot: usize) -> bool {
        let t = &self.table;
        t.num_generated[slot] + t.num_pending[slot] - 1 >= t.text_limit[slot]
    }

    /// Whether the request (waiting or running) needs text it does not have for its next LM row.
    pub fn waits_for_text(&self, key: ReqKey) -> bool {
        let req = self.req(key);
        if !matches!(req.status, RequestStatus::Waiting | RequestStatus::Running) {
            return false;
        }
        let pos = self.total_len(key) + self.num_pending(key) - 1;
        match &req.text_feed {
            None => false,
            Some(feed) => !(pos < req.prompt_len() || feed.has(pos - req.prompt_len())),
        }
    }

    pub fn num_waiting_for_text(&self) -> usize {
        let t = &self.table;
        (0..t.num_slots)
            .filter(|&s| matches!(t.state[s], SlotState::Running | SlotState::Waiting) && self.text_waiting(s))
            .count()
    }

    /// Running requests not waiting for text (what admission counts against the batch).
    pub fn num_generating(&self) -> usize {
        let t = &self.table;
        (0..t.num_slots).filter(|&s| t.state[s] == SlotState::Running && !self.text_waiting(s)).count()
    }

    pub fn has_work(&self) -> bool {
        !self.by_id.is_empty()
    }

    pub fn num_active(&self) -> usize {
        self.by_id.len()
    }

    pub fn num_in_flight(&self) -> usize {
        self.flights.len()
    }

    /// Whether a codec batch is still on the device after its step (`--overlap-detok`).
    pub fn codec_in_flight(&self) -> bool {
        !self.codec_pending.is_empty()
    }

    /// Codec batches on the device: of steps not collected yet (`--async-engines`), and landing after theirs.
    fn codec_batches_on_device(&self) -> usize {
        self.codec_pending.len() + self.flights.values().filter(|f| f.has_codec).count()
    }

    /// The steps whose codec batches are still on the device, oldest first.
    pub fn pending_codec_steps(&self) -> Vec<i64> {
        self.codec_pending.keys().copied().collect()
    }

    /// When a policy holding work back plans it without any new event (None: never waits).
    pub fn next_wakeup(&self) -> Option<f64> {
        match self.policy() {
            PolicyKind::Online => self.online_next_wakeup(),
            PolicyKind::Deadline => self.deadline_next_wakeup(),
            PolicyKind::Base | PolicyKind::Offline => None,
        }
    }

    // ---- planning ------------------------------------------------------------------------
    pub fn schedule(&mut self) -> StepPlan {
        if self.policy() == PolicyKind::Deadline {
            self.measure_step_period();
        }
        self.step_id += 1;
        self.now = self.clock.now();
        self.reasons = Reasons::default();
        self.notes.clear();
        self.planned.iter_mut().for_each(|p| *p = false);
        self.running_slots = self.table.slots_in(SlotState::Running);
        self.pages.clear();
        self.admits.clear();
        self.codec_rows = CodecRows::default();
        let mut plan = StepPlan { step_id: self.step_id, ..StepPlan::default() };
        if self.codec_batches_on_device() < self.max_codec_in_flight {
            // else the codec lane is full: ready chunks wait for a batch to land
            self.select_codec();
        }
        plan.codec = std::mem::take(&mut self.codec_rows).launch();
        plan.codec.deadline = self.codec_deadline(&plan.codec.keys);
        plan.prefill = self.select_prefill();
        plan.decode = self.select_decode();
        plan.admits = std::mem::take(&mut self.admits);
        for (slot, index, page) in self.pages.drain(..) {
            plan.pages.slot.extend(slot);
            plan.pages.index.extend(index);
            plan.pages.page.extend(page);
        }
        self.record_flight(&plan);
        if self.policy() == PolicyKind::Deadline {
            let planned = plan.num_lm_rows() > 0;
            self.deadline_mut().last_planned = if planned { Some(self.now) } else { None };
        }
        plan
    }

    fn record_flight(&mut self, plan: &StepPlan) {
        if plan.is_empty() {
            return;
        }
        let prefill: Vec<usize> = plan.prefill.slot.iter().map(|&s| s as usize).collect();
        let decode: Vec<usize> = plan.decode.slot.iter().map(|&s| s as usize).collect();
        let t = &mut self.table;
        let flight = Flight {
            prefill_occupancy: prefill.iter().map(|&s| t.occupancy[s]).collect(),
            prefill_sample: plan.prefill.sample.clone(),
            decode_occupancy: decode.iter().map(|&s| t.occupancy[s]).collect(),
            prefill_slots: prefill,
            decode_slots: decode,
            has_codec: !plan.codec.is_empty(),
        };
        for &s in flight.prefill_slots.iter().chain(&flight.decode_slots) {
            t.lm_step[s] = plan.step_id;
        }
        for &s in &plan.codec.slot {
            t.codec_step[s as usize] = plan.step_id;
        }
        self.flights.insert(plan.step_id, flight);
    }

    /// The request has an LM row in the plan: its KV up to kv_len counts as computed.
    pub(super) fn mark_row(&mut self, slot: usize, kv_len: i64, sample: bool) {
        let t = &mut self.table;
        t.num_computed[slot] = kv_len;
        t.num_pending[slot] += i64::from(sample);
        t.last_decode[slot] = self.now;
        self.planned[slot] = true;
    }

    /// A check for tests: pages and slots are all accounted for, and none is held once idle.
    pub fn check_idle(&self) -> Result<(), String> {
        self.pool.check()?;
        if self.has_work() {
            return Err(format!("{} requests are still active", self.num_active()));
        }
        if self.pool.num_free() != self.pool.num_usable() || self.table.num_held() != 0 {
            return Err(format!("{} pages and {} slots are still held", self.pool.num_usable() - self.pool.num_free(),
                               self.table.num_held()));
        }
        Ok(())
    }

    /// Prefill rows as a launch (empty when there are none).
    pub(super) fn empty_launch(&self) -> LmLaunch {
        LmLaunch::empty(self.meta.input_columns)
    }

    pub(super) fn push_pages(&mut self, slots: Vec<i32>, index: Vec<i32>, pages: Vec<i32>) {
        self.pages.push((slots, index, pages));
    }
}
