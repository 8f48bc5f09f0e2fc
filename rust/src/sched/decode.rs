//! The decode batch and preemption (vox_serve/scheduler/base.py `select_decode` and below): every
//! running request with one token to decode, in the policy's order, up to max_batch rows that
//! have (or get) a KV page; when none is free the newest unprotected running request is preempted.

use super::base::Scheduler;
use super::config::PolicyKind;
use super::plan::LmLaunch;
use super::table::SlotState;
use super::types::{ReqKey, RequestStatus, ABSENT_ID, NEVER};

impl Scheduler {
    /// Slots of running requests with one token to decode and room for it, admission order.
    pub fn decode_candidates(&self) -> Vec<usize> {
        let t = &self.table;
        self.running_slots.iter().copied()
            .filter(|&s| t.state[s] == SlotState::Running)
            .filter(|&s| {
                let generated = t.num_generated[s] + t.num_pending[s];
                let todo = t.prompt_len[s] + generated - t.num_computed[s];
                todo == 1 && generated < t.max_tokens[s] && t.prompt_len[s] + generated < self.limits.max_model_len
                    && !self.text_waiting(s) && !self.planned[s]
            })
            .collect()
    }

    pub(super) fn select_decode(&mut self) -> LmLaunch {
        let mut candidates = self.decode_candidates();
        match self.policy() {
            PolicyKind::Online => candidates = self.online_decode_order(candidates),
            PolicyKind::Deadline => candidates = self.deadline_decode_order(candidates),
            PolicyKind::Base | PolicyKind::Offline => {}
        }
        let slots = self.with_pages(&candidates);
        let now = self.now;
        let mut starts = Vec::with_capacity(slots.len());
        for &s in &slots {
            let t = &mut self.table;
            starts.push(t.num_computed[s]);
            t.num_computed[s] += 1;
            t.num_pending[s] += 1;
            t.last_decode[s] = now;
            self.planned[s] = true;
        }
        self.decode_launch(&slots, &starts)
    }

    /// One token per row: position `starts[i]` of each request (its last sampled token's).
    fn decode_launch(&self, slots: &[usize], starts: &[i64]) -> LmLaunch {
        let width = self.meta.input_columns;
        let mut launch = LmLaunch::empty(width);
        launch.input_ids = vec![ABSENT_ID; slots.len() * width];
        for (i, &s) in slots.iter().enumerate() {
            let key = self.key_at(s);
            launch.keys.push(key);
            launch.slot.push(s as i32);
            launch.start.push(starts[i] as i32);
            launch.num_tokens.push(1);
            launch.sample.push(true);
            if let Some(column) = self.meta.streamed_text_column {
                if self.table.text_limit[s] < NEVER {
                    let req = self.req(key);
                    let k = starts[i] - req.prompt_len();
                    let id = req.text_feed.as_ref().and_then(|f| usize::try_from(k).ok().and_then(|k| f.ids.get(k)));
                    launch.input_ids[i * width + column] = id.copied().unwrap_or(ABSENT_ID);
                }
            }
        }
        launch
    }

    /// The first max_batch candidates that have (or get) a KV page for their next token. Rows
    /// needing a page reserve it in order; when none is free the newest running request not
    /// protected (rows planned before it, steps in flight) is preempted, which may be the row
    /// itself or a later candidate.
    fn with_pages(&mut self, candidates: &[usize]) -> Vec<usize> {
        let mut chosen = Vec::new();
        let mut room = self.limits.max_batch;
        let mut rest = candidates;
        while room > 0 && !rest.is_empty() {
            let (block, tail) = rest.split_at(room.min(rest.len()));
            rest = tail;
            let needs: Vec<usize> = (0..block.len())
                .filter(|&i| self.table.num_computed[block[i]] + 1 > self.table.capacity[block[i]])
                .collect();
            for &s in block {
                self.planned[s] = true; // protected from preemption, unless a page is found missing below
            }
            if needs.len() <= self.pool.num_free() {
                let slots: Vec<usize> = needs.iter().map(|&i| block[i]).collect();
                self.one_page_each(&slots);
            } else {
                for &i in &needs {
                    self.planned[block[i]] = false;
                    let ok = self.page_for(self.key_at(block[i]), &block[i + 1..]);
                    self.planned[block[i]] = ok;
                }
            }
            let mut kept = 0;
            for &s in block {
                let ok = self.planned[s] && self.table.state[s] == SlotState::Running;
                self.planned[s] = ok;
                if ok {
                    chosen.push(s);
                    kept += 1;
                }
            }
            room -= kept;
        }
        chosen
    }

    /// The next page of each slot's request, all at once (there are enough free pages).
    fn one_page_each(&mut self, slots: &[usize]) {
        if slots.is_empty() {
            return;
        }
        let page_size = self.pool.page_size;
        let owners: Vec<ReqKey> = slots.iter().map(|&s| self.key_at(s)).collect();
        let pages = self.pool.extend_each(&owners);
        let index = slots.iter().map(|&s| (self.table.capacity[s] / page_size) as i32).collect();
        for &s in slots {
            self.table.capacity[s] += page_size;
        }
        self.push_pages(slots.iter().map(|&s| s as i32).collect(), index, pages);
    }

    /// Reserve the request's next page, preempting if needed; false when the row must wait a
    /// step. Rows after it in the block (`later`) are not protected yet.
    fn page_for(&mut self, key: ReqKey, later: &[usize]) -> bool {
        let slot = self.req(key).slot.unwrap();
        if self.table.state[slot] != SlotState::Running {
            return false; // preempted for an earlier row
        }
        while !self.reserve(key, self.num_computed(key) + 1) {
            for &s in later {
                self.planned[s] = false;
            }
            let victim = self.running.iter().rev().copied().find(|&k| {
                let s = self.req(k).slot.unwrap();
                !self.planned[s] && !self.lm_in_flight(s)
            });
            for &s in later {
                self.planned[s] = true;
            }
            let victim = match victim {
                None => {
                    let note = format!("{} waits a step for a KV page", self.req(key).req_id);
                    self.notes.push(note);
                    return false;
                }
                Some(v) => v,
            };
            self.preempt(victim);
            if victim == key {
                return false;
            }
        }
        true
    }

    fn preempt(&mut self, key: ReqKey) {
        self.pool.free(key);
        let slot = self.req(key).slot.unwrap();
        let t = &mut self.table;
        t.num_computed[slot] = 0;
        t.capacity[slot] = 0;
        t.state[slot] = SlotState::Waiting;
        let req = self.req_mut(key);
        req.status = RequestStatus::Waiting;
        let note = format!("preempted {}: out of KV pages", req.req_id);
        self.running.retain(|&k| k != key);
        self.waiting.push_front(key);
        self.notes.push(note);
    }
}
