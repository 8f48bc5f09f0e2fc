//! Prefill and admission (vox_serve/scheduler/base.py `select_prefill` and below, rows.py): chunks
//! of prompts that continue first, then waiting requests in the policy's order while the step's
//! token budget, sequence limit, slots and KV pages allow.

use super::base::Scheduler;
use super::plan::{LmLaunch, SlotInit};
use super::types::{ReqKey, Request, RequestStatus, ABSENT_ID};

impl Scheduler {
    pub(super) fn select_prefill(&mut self) -> LmLaunch {
        let mut rows = self.empty_launch();
        let max_tokens = self.limits.max_prefill_tokens;
        let max_seqs = self.limits.max_prefill_seqs;
        let mut budget = max_tokens;
        for key in self.continuing_prefills() {
            if rows.len() >= max_seqs || budget <= 0 {
                return rows;
            }
            if self.prefill_row(key, budget, &mut rows) {
                budget = max_tokens - rows.total_tokens();
                self.reasons.prefill.insert(key, "continue".into());
            }
        }
        if self.waiting.is_empty() || self.defer_admissions() {
            return rows;
        }
        for key in self.admission_order() {
            if self.waits_for_text(key) {
                continue; // preempted while its text ran dry: readmitted once the text arrives
            }
            if rows.len() >= max_seqs || budget <= 0 || !self.can_admit(key) {
                break;
            }
            if !self.admit(key, budget, &mut rows) {
                break; // not enough pages or slots: wait for running requests to free some
            }
            budget = max_tokens - rows.total_tokens();
            let why = self.admission_reason(key);
            self.reasons.prefill.insert(key, why);
        }
        rows
    }

    /// Running requests with more than one position to compute (a chunked prompt), admission order.
    fn continuing_prefills(&self) -> Vec<ReqKey> {
        let t = &self.table;
        self.running_slots.iter().copied()
            .filter(|&s| {
                let todo = t.prompt_len[s] + t.num_generated[s] + t.num_pending[s] - t.num_computed[s];
                todo > 1 && !self.text_waiting(s)
            })
            .map(|s| self.key_at(s))
            .collect()
    }

    fn admit(&mut self, key: ReqKey, budget: i64, rows: &mut LmLaunch) -> bool {
        let fresh = self.req(key).slot.is_none();
        if fresh {
            if !self.table.can_acquire() {
                let note = format!("{} waits for a free request slot", self.req(key).req_id);
                self.notes.push(note);
                return false;
            }
            self.acquire(key);
        }
        if !self.prefill_row(key, budget, rows) {
            if fresh {
                self.release(key);
            }
            return false;
        }
        if fresh {
            let init = slot_init(self.req(key));
            self.admits.push(init);
        } else {
            let slot = self.req(key).slot.unwrap();
            self.table.mark_admitted(slot);
        }
        self.waiting.retain(|&k| k != key);
        self.req_mut(key).status = RequestStatus::Running;
        self.running.push(key);
        true
    }

    fn acquire(&mut self, key: ReqKey) {
        let mut req = std::mem::replace(self.req_mut(key), placeholder());
        self.table.acquire(key, &mut req);
        *self.req_mut(key) = req;
    }

    fn release(&mut self, key: ReqKey) {
        let mut req = std::mem::replace(self.req_mut(key), placeholder());
        self.table.release(key, &mut req);
        *self.req_mut(key) = req;
    }

    /// Positions whose KV is not written yet, counting tokens sampled in flight.
    fn todo(&self, key: ReqKey) -> i64 {
        self.total_len(key) + self.num_pending(key) - self.num_computed(key)
    }

    fn prefill_row(&mut self, key: ReqKey, budget: i64, rows: &mut LmLaunch) -> bool {
        let todo = self.todo(key);
        let n = todo.min(budget);
        if n < todo && budget < self.limits.max_prefill_tokens {
            return false; // chunk long prompts only when they have the step's whole budget
        }
        let start = self.num_computed(key);
        if !self.reserve(key, start + n) {
            return false;
        }
        self.add_prefill_row(key, start, n, n == todo, rows);
        let slot = self.req(key).slot.unwrap();
        self.mark_row(slot, start + n, n == todo);
        true
    }

    /// Grow the request's KV pages to hold kv_len tokens, recording the page-table entries.
    pub(super) fn reserve(&mut self, key: ReqKey, kv_len: i64) -> bool {
        if !self.pool.can_reserve(key, kv_len) {
            return false;
        }
        let page_size = self.pool.page_size;
        let have = (self.pool.num_tokens_capacity(key) / page_size) as i32;
        let new = self.pool.reserve(key, kv_len);
        let slot = self.req(key).slot.expect("reserving pages for a request with a slot");
        let n = new.len() as i32;
        self.push_pages(vec![slot as i32; new.len()], (have..have + n).collect(), new);
        self.table.capacity[slot] = i64::from(have + n) * page_size;
        true
    }

    /// Positions start .. start + n of the request (rows.py `PrefillRows.add`).
    fn add_prefill_row(&self, key: ReqKey, start: i64, n: i64, sample: bool, rows: &mut LmLaunch) {
        let req = self.req(key);
        let offset = rows.total_tokens();
        self.input_ids(req, start, n, &mut rows.input_ids);
        for (pos, vec) in &req.prompt.vectors {
            let pos = *pos as i64;
            if start <= pos && pos < start + n {
                rows.vector_token.push((offset + pos - start) as i32);
                rows.vectors.extend_from_slice(vec);
            }
        }
        rows.keys.push(key);
        rows.slot.push(req.slot.unwrap() as i32);
        rows.start.push(start as i32);
        rows.num_tokens.push(n as i32);
        rows.sample.push(sample);
    }

    /// `[n][input_columns]` the host's ids of positions start..: the prompt's rows, then ABSENT_ID
    /// rows for generated positions (with the streamed text id in its column).
    fn input_ids(&self, req: &Request, start: i64, n: i64, out: &mut Vec<i32>) {
        let width = self.meta.input_columns;
        let prompt_len = req.prompt_len();
        let first = out.len();
        out.resize(first + n as usize * width, ABSENT_ID);
        let columns = req.prompt.columns;
        for pos in start..(start + n).min(prompt_len) {
            let row = first + (pos - start) as usize * width;
            out[row..row + columns].copy_from_slice(req.prompt.row(pos as usize));
        }
        if let (Some(column), Some(feed)) = (self.meta.streamed_text_column, &req.text_feed) {
            for pos in start.max(prompt_len)..start + n {
                let k = (pos - prompt_len) as usize;
                out[first + (pos - start) as usize * width + column] = feed.ids.get(k).copied().unwrap_or(ABSENT_ID);
            }
        }
    }

    pub(super) fn admission_reason_base(&self, key: ReqKey) -> String {
        if self.num_generated(key) == 0 { "new".into() } else { "readmit after preemption".into() }
    }
}

pub fn slot_init(req: &Request) -> SlotInit {
    let s = &req.sampling;
    SlotInit { slot: req.slot.expect("an admitted request holds a slot"), prompt_len: req.prompt_len(),
               temperature: s.temperature, top_k: s.top_k, top_p: s.top_p, min_p: s.min_p,
               repetition_penalty: s.repetition_penalty, repetition_window: s.repetition_window, seed: s.seed,
               allow_stop: !s.ignore_eos, conditioning: req.prompt.conditioning.clone() }
}

/// A request standing in while the real one is borrowed out of the slab.
fn placeholder() -> Request {
    Request::new(String::new(), Default::default(), Default::default(), false)
}
