//! `--trace-dir`: JSON lines of every scheduling decision and every stage launch, in the record
//! shapes of the Python tracer (vox_serve/trace.py), so benchmark/trace_summary.py and
//! vox_serve.sim.calibrate read both runtimes' traces.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{json, Value};

use super::base::Scheduler;
use super::plan::{StepPlan, StepResult};

static FILES: AtomicUsize = AtomicUsize::new(0);

pub struct Tracer {
    pub path: PathBuf,
    timer: &'static str,
    out: Option<BufWriter<File>>,
    /// Records kept in memory instead (the simulator's scenario runs hand them back).
    pub records: Option<Vec<Value>>,
}

impl Tracer {
    /// A file `trace-<pid>-<n>.jsonl` in `dir` (created).
    pub fn to_dir(dir: &Path) -> Result<Tracer, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("--trace-dir {}: {e}", dir.display()))?;
        let n = FILES.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("trace-{}-rs{n}.jsonl", std::process::id()));
        let file = File::create(&path).map_err(|e| format!("--trace-dir {}: {e}", path.display()))?;
        Ok(Tracer { path, timer: "wall", out: Some(BufWriter::new(file)), records: None })
    }

    pub fn in_memory() -> Tracer {
        Tracer { path: PathBuf::new(), timer: "sim", out: None, records: Some(Vec::new()) }
    }

    fn write(&mut self, record: Value) {
        if let Some(records) = self.records.as_mut() {
            records.push(record);
            return;
        }
        if let Some(out) = self.out.as_mut() {
            // A trace is a diagnostic: a full disk must not fail the requests being traced.
            let _ = serde_json::to_writer(&mut *out, &record).map_err(std::io::Error::from)
                .and_then(|_| out.write_all(b"\n")).and_then(|_| out.flush());
        }
    }

    pub fn header(&mut self, s: &Scheduler, timer: &'static str) {
        self.timer = timer;
        let mut meta = s.meta.raw.clone();
        if let Some(m) = meta.as_object_mut() {
            m.remove("prompt_builder"); // tokenizer text or paths: not what a trace is read for
        }
        self.write(json!({"type": "header", "policy": s.policy().name(), "timer": timer, "meta": meta,
                          "limits": limits_json(s), "scheduler": s.config.raw}));
    }

    pub fn decision(&mut self, s: &Scheduler, plan: &StepPlan, plan_seconds: f64) {
        let id = |k| s.req(k).req_id.clone();
        let why = |map: &std::collections::HashMap<_, String>, k| map.get(&k).cloned().unwrap_or_default();
        let c = &plan.codec;
        let codec: Vec<Value> = (0..c.len())
            .map(|i| json!([id(c.keys[i]), c.chunk_index[i], why(&s.reasons.codec, c.keys[i])])).collect();
        let p = &plan.prefill;
        let prefill: Vec<Value> = (0..p.len())
            .map(|i| json!([id(p.keys[i]), p.num_tokens[i], why(&s.reasons.prefill, p.keys[i])])).collect();
        let decode: Vec<Value> = plan.decode.keys.iter()
            .map(|&k| json!([id(k), s.reasons.decode.get(&k).cloned().unwrap_or_else(|| "running".into())]))
            .collect();
        let pool = &s.pool;
        self.write(json!({
            "type": "schedule", "step": plan.step_id, "t": s.now, "policy": s.policy().name(),
            "plan_ms": plan_seconds * 1000.0, "codec": codec, "prefill": prefill, "decode": decode,
            "admits": plan.admits.iter().map(|a| a.slot).collect::<Vec<_>>(), "page_updates": plan.pages.len(),
            "notes": s.notes,
            "queue": {"waiting": s.waiting.len(), "running": s.running.len(), "draining": s.draining.len(),
                      "in_flight_steps": s.num_in_flight(), "codec_in_flight": s.codec_pending.len()},
            "kv": {"free_pages": pool.num_free(), "used_pages": pool.num_usable() - pool.num_free(),
                   "usable_pages": pool.num_usable()},
        }));
    }

    /// A record per launch: its rows, tokens (frames for the codec) and device time.
    pub fn stages(&mut self, plan: &StepPlan, result: &StepResult) {
        let c = &plan.codec;
        let split = result.stage_seconds.iter().any(|(name, _)| *name == "codec_first");
        let first = |i: usize| split && c.chunk_index[i] == 0;
        let count = |want: bool| (0..c.len()).filter(|&i| first(i) == want).count();
        let frames = |want: bool| -> i64 {
            (0..c.len()).filter(|&i| first(i) == want).map(|i| i64::from(c.num_frames[i])).sum()
        };
        for &(stage, seconds) in &result.stage_seconds {
            let (rows, tokens) = match stage {
                "prefill" => (plan.prefill.len() as i64, plan.prefill.total_tokens()),
                "decode" => (plan.decode.len() as i64, plan.decode.len() as i64),
                "codec" => (count(false) as i64, frames(false)),
                "codec_first" => (count(true) as i64, frames(true)),
                _ => (0, 0),
            };
            self.write(json!({"type": "stage", "step": plan.step_id, "stage": stage, "rows": rows, "tokens": tokens,
                              "device_ms": seconds * 1000.0, "timer": self.timer}));
        }
    }

    pub fn flush(&mut self) {
        if let Some(out) = self.out.as_mut() {
            let _ = out.flush();
        }
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        self.flush();
    }
}

fn limits_json(s: &Scheduler) -> Value {
    let l = &s.limits;
    json!({"max_batch": l.max_batch, "max_prefill_tokens": l.max_prefill_tokens,
           "max_prefill_seqs": l.max_prefill_seqs, "max_codec_batch": l.max_codec_batch,
           "frames_per_chunk": l.frames_per_chunk, "num_pages": l.num_pages, "page_size": l.page_size,
           "max_model_len": l.max_model_len, "repetition_window": l.repetition_window, "num_slots": l.num_slots,
           "first_chunk_frames": l.first_chunk_frames})
}
