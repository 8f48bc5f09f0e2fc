//! What the scheduler reads from an engine spec and the command line: the program meta
//! (core/meta.py `ProgramMeta`), the engine limits (`EngineLimits`) and the scheduler settings
//! (config.py `SchedulerConfig`), parsed from their JSON forms with errors naming the field.

use serde_json::Value;

pub fn get<'a>(obj: &'a Value, path: &str, name: &str) -> Result<&'a Value, String> {
    obj.get(name).ok_or_else(|| format!("{path}{name} is missing"))
}

pub fn int(obj: &Value, path: &str, name: &str) -> Result<i64, String> {
    get(obj, path, name)?.as_i64().ok_or_else(|| format!("{path}{name} is not an integer"))
}

pub fn int_or(obj: &Value, path: &str, name: &str, default: i64) -> Result<i64, String> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(_) => int(obj, path, name),
    }
}

pub fn float(obj: &Value, path: &str, name: &str) -> Result<f64, String> {
    get(obj, path, name)?.as_f64().ok_or_else(|| format!("{path}{name} is not a number"))
}

pub fn boolean(obj: &Value, path: &str, name: &str) -> Result<bool, String> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(v) => v.as_bool().ok_or_else(|| format!("{path}{name} is not a boolean")),
    }
}

pub fn string(obj: &Value, path: &str, name: &str) -> Result<String, String> {
    get(obj, path, name)?.as_str().map(str::to_string).ok_or_else(|| format!("{path}{name} is not a string"))
}

fn strings(obj: &Value, path: &str, name: &str) -> Result<Vec<String>, String> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items.iter().map(|v| v.as_str().map(str::to_string)
            .ok_or_else(|| format!("{path}{name} holds a non-string"))).collect(),
        Some(_) => Err(format!("{path}{name} is not a list")),
    }
}

/// Whether a layout declares paired KV streams (`ProgramLayout.kv_streams` > 1: classifier-free
/// guidance rows), which this runtime does not drive yet.
fn paired_kv_streams(layout: &Value) -> bool {
    match layout.get("kv_streams") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::Number(n)) => n.as_i64().map_or(true, |k| k > 1),
        Some(_) => true,
    }
}

/// A per-slot field a program declares (`SlotField`).
#[derive(Debug, Clone, PartialEq)]
pub struct SlotField {
    pub name: String,
    pub shape: Vec<usize>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct StopRule {
    pub token: i64,
    pub keeps_frame: bool,
}

/// The program meta a runtime needs without the program's code.
#[derive(Debug, Clone)]
pub struct ProgramMeta {
    pub name: String,
    pub sample_rate: i64,
    pub input_columns: usize,
    pub codes_per_step: i64,
    pub codes_per_frame: i64,
    pub samples_per_frame: i64,
    pub frames_per_chunk: i64,
    pub codec_lookback_frames: i64,
    pub codec_lookahead_frames: i64,
    pub skip_leading_frames: i64,
    pub max_model_len: i64,
    pub max_text_chars: i64,
    pub stop_rule: StopRule,
    pub default_sampling: Value,
    pub accepted_fields: Vec<String>,
    pub voices: Vec<String>,
    pub default_voice: Option<String>,
    pub streamed_text_column: Option<usize>,
    pub stateful_codec: bool,
    pub prompt_vector_dim: usize,
    pub slot_fields: Vec<SlotField>,
    pub prompt_builder: Value,
    /// The whole meta as the spec gives it (trace headers echo it).
    pub raw: Value,
}

impl ProgramMeta {
    pub fn from_json(m: &Value) -> Result<ProgramMeta, String> {
        let p = "meta.";
        let layout = m.get("layout").cloned().unwrap_or(Value::Null);
        if paired_kv_streams(&layout) {
            return Err("meta.layout.kv_streams: paired KV streams (classifier-free guidance rows) are not \
                        supported by the Rust runtime yet; serve this model with --runtime python".into());
        }
        if m.get("codec_pads_end").and_then(Value::as_bool).unwrap_or(false) {
            return Err("meta.codec_pads_end: a codec that pads at the sequence end (final chunks past the \
                        lookahead) is not supported by the Rust runtime yet; serve this model with --runtime python"
                .into());
        }
        let slot_fields = match layout.get("slot_fields") {
            Some(Value::Array(items)) => items.iter().map(|f| -> Result<SlotField, String> {
                let shape = get(f, "meta.layout.slot_fields[].", "shape")?.as_array()
                    .ok_or("meta.layout.slot_fields[].shape is not a list")?
                    .iter().map(|d| d.as_u64().map(|d| d as usize).ok_or("a slot field dimension is not a size"))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(SlotField { name: string(f, "meta.layout.slot_fields[].", "name")?, shape })
            }).collect::<Result<Vec<_>, String>>()?,
            _ => Vec::new(),
        };
        let stop = get(m, p, "stop_rule")?;
        Ok(ProgramMeta {
            name: string(m, p, "name")?,
            sample_rate: int(m, p, "sample_rate")?,
            input_columns: int(m, p, "input_columns")? as usize,
            codes_per_step: int(m, p, "codes_per_step")?,
            codes_per_frame: int(m, p, "codes_per_frame")?,
            samples_per_frame: int(m, p, "samples_per_frame")?,
            frames_per_chunk: int(m, p, "frames_per_chunk")?,
            codec_lookback_frames: int(m, p, "codec_lookback_frames")?,
            codec_lookahead_frames: int(m, p, "codec_lookahead_frames")?,
            skip_leading_frames: int(m, p, "skip_leading_frames")?,
            max_model_len: int(m, p, "max_model_len")?,
            max_text_chars: int(m, p, "max_text_chars")?,
            stop_rule: StopRule { token: int(stop, "meta.stop_rule.", "token")?,
                                  keeps_frame: boolean(stop, "meta.stop_rule.", "keeps_frame")? },
            default_sampling: m.get("default_sampling").cloned().unwrap_or_else(|| Value::Object(Default::default())),
            accepted_fields: strings(m, p, "accepted_fields")?,
            voices: strings(m, p, "voices")?,
            default_voice: m.get("default_voice").and_then(Value::as_str).map(str::to_string),
            streamed_text_column: m.get("streamed_text_column").and_then(Value::as_u64).map(|c| c as usize),
            stateful_codec: boolean(m, p, "stateful_codec")?,
            prompt_vector_dim: layout.get("prompt_vector_dim").and_then(Value::as_u64).unwrap_or(0) as usize,
            slot_fields,
            prompt_builder: m.get("prompt_builder").cloned().unwrap_or(Value::Null),
            raw: m.clone(),
        })
    }
}

/// Static sizes of the arenas and the KV cache, with the derived limits of `EngineLimits`.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineLimits {
    pub max_batch: usize,
    pub max_prefill_tokens: i64,
    pub max_prefill_seqs: usize,
    pub max_codec_batch: usize,
    pub frames_per_chunk: i64,
    pub num_pages: usize,
    pub page_size: i64,
    pub max_model_len: i64,
    pub repetition_window: i64,
    pub num_slots: usize,
    pub first_chunk_frames: i64,
}

impl EngineLimits {
    pub fn from_json(l: &Value) -> Result<EngineLimits, String> {
        let p = "limits.";
        let size = |name: &str| -> Result<usize, String> {
            let v = int(l, p, name)?;
            usize::try_from(v).map_err(|_| format!("{p}{name} must be >= 0"))
        };
        Ok(EngineLimits {
            max_batch: size("max_batch")?,
            max_prefill_tokens: int(l, p, "max_prefill_tokens")?,
            max_prefill_seqs: size("max_prefill_seqs")?,
            max_codec_batch: size("max_codec_batch")?,
            frames_per_chunk: int(l, p, "frames_per_chunk")?,
            num_pages: size("num_pages")?,
            page_size: int(l, p, "page_size")?,
            max_model_len: int(l, p, "max_model_len")?,
            repetition_window: int_or(l, p, "repetition_window", 64)?,
            num_slots: int_or(l, p, "num_slots", 0)? as usize,
            first_chunk_frames: int_or(l, p, "first_chunk_frames", 0)?,
        })
    }

    pub fn first_frames(&self) -> i64 {
        if self.first_chunk_frames > 0 { self.first_chunk_frames } else { self.frames_per_chunk }
    }

    pub fn has_first_chunks(&self) -> bool {
        self.first_frames() < self.frames_per_chunk
    }

    pub fn slots(&self) -> usize {
        if self.num_slots > 0 { self.num_slots } else { 2 * self.max_batch }
    }

    pub fn max_page_updates(&self) -> usize {
        let pages = (self.max_prefill_tokens + self.page_size - 1) / self.page_size;
        pages as usize + self.max_prefill_seqs + self.max_batch
    }

    pub fn max_admits(&self) -> usize {
        self.max_prefill_seqs
    }
}

/// The scheduling policy of `--scheduler-type` (`input_streaming` is a name of `base`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyKind {
    Base,
    Online,
    Offline,
    Deadline,
}

impl PolicyKind {
    pub fn parse(name: &str) -> Result<PolicyKind, String> {
        match name {
            "base" | "input_streaming" => Ok(PolicyKind::Base),
            "online" => Ok(PolicyKind::Online),
            "offline" => Ok(PolicyKind::Offline),
            "deadline" => Ok(PolicyKind::Deadline),
            other => Err(format!("unknown scheduler type {other:?}; expected one of base, input_streaming, online, \
                                  offline, deadline")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Base => "base",
            PolicyKind::Online => "online",
            PolicyKind::Offline => "offline",
            PolicyKind::Deadline => "deadline",
        }
    }
}

#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    pub policy: PolicyKind,
    pub max_queued_requests: usize,
    pub deadline_startup_ms: f64,
    pub deadline_max_prefill_deferral_ms: f64,
    pub deadline_lm_step_ms: f64,
    pub deadline_codec_ms: f64,
    pub deadline_prefill_ms: f64,
    pub trace_dir: Option<String>,
    /// The settings as given (trace headers echo them).
    pub raw: Value,
}

impl SchedulerConfig {
    pub fn from_json(s: &Value) -> Result<SchedulerConfig, String> {
        let p = "scheduler.";
        let ms = |name: &str, default: f64| -> Result<f64, String> {
            match s.get(name) {
                None | Some(Value::Null) => Ok(default),
                Some(_) => float(s, p, name),
            }
        };
        let policy = match s.get("scheduler_type") {
            None | Some(Value::Null) => PolicyKind::Base,
            Some(_) => PolicyKind::parse(&string(s, p, "scheduler_type")?)?,
        };
        Ok(SchedulerConfig {
            policy,
            max_queued_requests: int_or(s, p, "max_queued_requests", 1024)?.max(0) as usize,
            deadline_startup_ms: ms("deadline_startup_ms", 500.0)?,
            deadline_max_prefill_deferral_ms: ms("deadline_max_prefill_deferral_ms", 500.0)?,
            deadline_lm_step_ms: ms("deadline_lm_step_ms", 10.0)?,
            deadline_codec_ms: ms("deadline_codec_ms", 3.0)?,
            deadline_prefill_ms: ms("deadline_prefill_ms", 20.0)?,
            trace_dir: s.get("trace_dir").and_then(Value::as_str).map(str::to_string),
            raw: s.clone(),
        })
    }
}
