//! The simulated worker (vox_serve/sim/worker.py): a simulated engine's device state per slot from
//! the plans' admissions and page updates, plausible outputs (audio codes, a stop at a frame
//! boundary once a request has its scripted frames, silent PCM of each chunk's length), and the
//! virtual clock moved by a cost model. It checks the plan contract the real engine relies on and
//! fails the step (an Err) when a plan breaks it -- the invariants the shared scenarios hold both
//! schedulers to.

use std::collections::HashMap;

use super::cost::CostModel;
use crate::sched::config::{EngineLimits, ProgramMeta};
use crate::sched::engine_loop::Worker;
use crate::sched::plan::{CodecLaunch, LmLaunch, StepPlan, StepResult};
use crate::sched::types::{OutKind, ABSENT_ID};
use crate::sched::{Clock, ReqKey};

pub const DEFAULT_FRAMES: i64 = 60;
pub const TEXT_ID_BASE: i32 = 100_000;
pub const TEXT_END_ID: i32 = 99_999;

struct SimSlot {
    key: Option<ReqKey>,
    prompt_len: i64,
    allow_stop: bool,
    pages: HashMap<i32, i32>,
    kv_len: i64,
    num_codes: i64,
    next_chunk: i64,
}

pub struct SimHandle {
    result: StepResult,
    done: f64,
}

pub struct SimWorker {
    meta: ProgramMeta,
    limits: EngineLimits,
    costs: CostModel,
    clock: Clock,
    device_free_at: f64,
    slots: HashMap<i32, SimSlot>,
    lengths: HashMap<ReqKey, i64>,
    text_ids: HashMap<ReqKey, i64>,
}

impl SimWorker {
    pub fn new(meta: ProgramMeta, limits: EngineLimits, costs: CostModel, clock: Clock) -> SimWorker {
        let device_free_at = clock.now();
        SimWorker { meta, limits, costs, clock, device_free_at, slots: HashMap::new(), lengths: HashMap::new(),
                    text_ids: HashMap::new() }
    }

    pub fn set_length(&mut self, key: ReqKey, frames: i64) {
        self.lengths.insert(key, frames);
    }

    pub fn set_text(&mut self, key: ReqKey, num_ids: i64) {
        self.text_ids.insert(key, num_ids);
    }

    fn names(plan: &StepPlan) -> HashMap<i32, ReqKey> {
        let mut names = HashMap::new();
        for (slots, keys) in [(&plan.prefill.slot, &plan.prefill.keys), (&plan.decode.slot, &plan.decode.keys),
                              (&plan.codec.slot, &plan.codec.keys)] {
            names.extend(slots.iter().copied().zip(keys.iter().copied()));
        }
        names
    }

    fn apply_admits(&mut self, plan: &StepPlan, names: &HashMap<i32, ReqKey>) -> Result<(), String> {
        if plan.admits.len() > self.limits.max_admits() {
            return Err(format!("{} admissions in one step; the engine takes {}", plan.admits.len(),
                               self.limits.max_admits()));
        }
        for a in &plan.admits {
            if a.slot >= self.limits.slots() {
                return Err(format!("slot {} outside the {} slots", a.slot, self.limits.slots()));
            }
            let slot = a.slot as i32;
            self.slots.insert(slot, SimSlot { key: names.get(&slot).copied(), prompt_len: a.prompt_len,
                                              allow_stop: a.allow_stop, pages: HashMap::new(), kv_len: 0,
                                              num_codes: 0, next_chunk: 0 });
        }
        Ok(())
    }

    fn apply_pages(&mut self, plan: &StepPlan) -> Result<(), String> {
        let p = &plan.pages;
        if p.len() > self.limits.max_page_updates() {
            return Err(format!("{} page updates exceed {}", p.len(), self.limits.max_page_updates()));
        }
        for i in 0..p.len() {
            let (slot, index, page) = (p.slot[i], p.index[i], p.page[i]);
            let usable = 1 <= page && (page as usize) < self.limits.num_pages;
            match self.slots.get_mut(&slot) {
                Some(s) if usable => {
                    s.pages.insert(index, page);
                }
                _ => return Err(format!("page update ({slot}, {index}, {page}) names no admitted slot or no usable page")),
            }
        }
        Ok(())
    }

    fn lm(&mut self, launch: &LmLaunch, decode: bool, names: &HashMap<i32, ReqKey>) -> Result<Vec<i32>, String> {
        if decode && (launch.len() > self.limits.max_batch || launch.num_tokens.iter().any(|&n| n != 1)) {
            return Err("a decode launch has one token per row, at most max_batch rows".into());
        }
        if !decode && (launch.total_tokens() > self.limits.max_prefill_tokens
                       || launch.len() > self.limits.max_prefill_seqs) {
            return Err("prefill exceeds max_prefill_tokens or max_prefill_seqs".into());
        }
        let mut kinds = vec![OutKind::Other.code(); launch.len()];
        let mut offset = 0usize;
        let page_size = self.limits.page_size;
        for i in 0..launch.len() {
            let slot = launch.slot[i];
            let (start, n) = (i64::from(launch.start[i]), i64::from(launch.num_tokens[i]));
            let s = self.slots.get_mut(&slot).ok_or_else(|| format!("a row names slot {slot}, which was never admitted"))?;
            if let Some(&k) = names.get(&slot) {
                s.key = Some(k);
            }
            if start != s.kv_len && start != 0 {
                return Err(format!("slot {slot} starts at {start} but has {} positions written", s.kv_len));
            }
            let pages_needed = (start + n + page_size - 1) / page_size;
            if (0..pages_needed).any(|p| !s.pages.contains_key(&(p as i32))) {
                return Err(format!("slot {slot}: its pages cannot hold {} tokens", start + n));
            }
            let cols = launch.columns;
            let ids = &launch.input_ids[offset * cols..(offset + n as usize) * cols];
            offset += n as usize;
            let (prompt_len, key) = (s.prompt_len, s.key);
            self.check_text(key, prompt_len, start, ids, cols)?;
            let s = self.slots.get_mut(&slot).expect("checked above");
            s.kv_len = start + n;
            if launch.sample[i] {
                let g = s.kv_len - s.prompt_len;
                kinds[i] = self.sample(slot, g);
            }
        }
        Ok(kinds)
    }

    fn check_text(&self, key: Option<ReqKey>, prompt_len: i64, start: i64, ids: &[i32], cols: usize)
                  -> Result<(), String> {
        let (column, num_ids) = match (self.meta.streamed_text_column, key.and_then(|k| self.text_ids.get(&k))) {
            (Some(c), Some(&n)) => (c, n),
            _ => return Ok(()),
        };
        for (i, row) in ids.chunks(cols).enumerate() {
            let frame = start + i as i64 - prompt_len;
            let want = if frame < num_ids { TEXT_ID_BASE + frame as i32 }
                       else if frame == num_ids { TEXT_END_ID } else { ABSENT_ID };
            if frame >= 0 && row[column] != want {
                return Err(format!("frame {frame} fed text id {}, expected {want}", row[column]));
            }
        }
        Ok(())
    }

    fn sample(&mut self, slot: i32, g: i64) -> i32 {
        let (cps, cpf) = (self.meta.codes_per_step, self.meta.codes_per_frame);
        let s = self.slots.get_mut(&slot).expect("an admitted slot");
        let frames = s.key.and_then(|k| self.lengths.get(&k)).copied().unwrap_or(DEFAULT_FRAMES);
        let at_boundary = (g * cps) % cpf == 0;
        let stops = s.allow_stop && at_boundary && g * cps >= frames * cpf;
        if stops && !self.meta.stop_rule.keeps_frame {
            return OutKind::Stop.code();
        }
        s.num_codes += cps;
        if stops { OutKind::AudioStop.code() } else { OutKind::Audio.code() }
    }

    fn codec(&mut self, launch: &CodecLaunch) -> Result<Vec<Vec<u8>>, String> {
        if launch.len() > self.limits.max_codec_batch {
            return Err(format!("{} chunks exceed max_codec_batch {}", launch.len(), self.limits.max_codec_batch));
        }
        let mut expected: HashMap<i32, i64> = HashMap::new();
        for i in 0..launch.len() {
            let slot = launch.slot[i];
            if self.meta.stateful_codec && expected.contains_key(&slot) {
                return Err("a stateful codec batch has two chunks of one request".into());
            }
            let s = self.slots.get(&slot).ok_or_else(|| format!("a chunk names slot {slot}, which was never admitted"))?;
            let want = expected.get(&slot).copied().unwrap_or(s.next_chunk);
            if i64::from(launch.chunk_index[i]) != want {
                return Err(format!("slot {slot}: chunk {} decoded, expected chunk {want}", launch.chunk_index[i]));
            }
            if i64::from(launch.window_end[i]) * self.meta.codes_per_frame > s.num_codes {
                return Err(format!("slot {slot}: chunk {want} reads frames that do not exist yet"));
            }
            expected.insert(slot, want + 1);
        }
        for (slot, next) in expected {
            self.slots.get_mut(&slot).expect("checked above").next_chunk = next;
        }
        let bytes = 2 * self.meta.samples_per_frame as usize;
        Ok(launch.num_frames.iter().map(|&n| vec![0u8; bytes * n as usize]).collect())
    }

    fn check_batch(&self, plan: &StepPlan) -> Result<(), String> {
        let rows: Vec<i32> = plan.prefill.slot.iter().chain(&plan.decode.slot).copied().collect();
        let mut seen = std::collections::HashSet::new();
        if !rows.iter().all(|s| seen.insert(*s)) {
            return Err(format!("a slot has two LM rows in step {}", plan.step_id));
        }
        let mut owner: HashMap<i32, i32> = HashMap::new();
        for &slot in &rows {
            let s = &self.slots[&slot];
            for index in 0..(s.kv_len + self.limits.page_size - 1) / self.limits.page_size {
                let page = s.pages[&(index as i32)];
                if *owner.entry(page).or_insert(slot) != slot {
                    return Err(format!("page {page} of slot {slot} is held by slot {}", owner[&page]));
                }
            }
        }
        Ok(())
    }
}

impl Worker for SimWorker {
    type Handle = SimHandle;

    fn timer(&self) -> &'static str {
        "sim"
    }

    fn launch(&mut self, plan: &StepPlan) -> Result<SimHandle, String> {
        let names = Self::names(plan);
        self.apply_admits(plan, &names)?;
        self.apply_pages(plan)?;
        let pcm = self.codec(&plan.codec)?;
        let prefill_kind = self.lm(&plan.prefill, false, &names)?;
        let decode_kind = self.lm(&plan.decode, true, &names)?;
        self.check_batch(plan)?;
        self.clock.advance(self.costs.host_seconds(plan));
        let stages = self.costs.stage_seconds(plan);
        let start = self.clock.now().max(self.device_free_at);
        self.device_free_at = start + stages.iter().map(|(_, s)| s).sum::<f64>();
        let result = StepResult { step_id: plan.step_id, prefill_kind, decode_kind, pcm, stage_seconds: stages,
                                  codec_deferred: false, pcm_early: false };
        Ok(SimHandle { result, done: self.device_free_at })
    }

    fn collect(&mut self, handle: SimHandle) -> Result<StepResult, String> {
        self.clock.advance_to(handle.done);
        Ok(handle.result)
    }
}
