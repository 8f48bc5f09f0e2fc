//! Plain request data of the Rust scheduler, as vox_serve/core/request.py and core/plan.py define
//! it: out kinds, statuses, sampling parameters, prompts, streamed text and statistics.

/// The slot of a padded row: the engine maps it to its scratch slot.
pub const NO_SLOT: i32 = -1;
/// An input id the host does not give: generated positions take it from the slot's history.
pub const ABSENT_ID: i32 = -1;
/// A frame count no chunk ever needs (core/slot_table.py `NEVER`).
pub const NEVER: i64 = i64::MAX / 4;
/// Generated rows an ended text feed may feed (core/request.py `TextFeed.limit`).
pub const ENDED_TEXT_LIMIT: i64 = 1 << 40;

/// What a sampled LM row means (decided inside the stages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutKind {
    Audio,
    Stop,
    Other,
    AudioStop,
}

impl OutKind {
    pub fn from_i32(value: i32) -> OutKind {
        match value {
            0 => OutKind::Audio,
            1 => OutKind::Stop,
            3 => OutKind::AudioStop,
            _ => OutKind::Other,
        }
    }

    pub fn code(self) -> i32 {
        match self {
            OutKind::Audio => 0,
            OutKind::Stop => 1,
            OutKind::Other => 2,
            OutKind::AudioStop => 3,
        }
    }

    pub fn is_audio(self) -> bool {
        matches!(self, OutKind::Audio | OutKind::AudioStop)
    }

    pub fn stops(self) -> bool {
        matches!(self, OutKind::Stop | OutKind::AudioStop)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestStatus {
    Waiting,
    Running,
    Draining,
    Finished,
    Aborted,
    Failed,
}

impl RequestStatus {
    pub fn is_done(self) -> bool {
        matches!(self, RequestStatus::Finished | RequestStatus::Aborted | RequestStatus::Failed)
    }

    pub fn name(self) -> &'static str {
        match self {
            RequestStatus::Waiting => "waiting",
            RequestStatus::Running => "running",
            RequestStatus::Draining => "draining",
            RequestStatus::Finished => "finished",
            RequestStatus::Aborted => "aborted",
            RequestStatus::Failed => "failed",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    pub temperature: f64,
    pub top_k: i64,
    pub top_p: f64,
    pub min_p: f64,
    pub repetition_penalty: f64,
    pub repetition_window: i64,
    pub max_tokens: i64,
    pub ignore_eos: bool,
    pub seed: i64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, repetition_penalty: 1.0,
                         repetition_window: 64, max_tokens: 2048, ignore_eos: false, seed: 0 }
    }
}

/// A per-slot input the program declared (`Prompt.conditioning[name]`): `rows` entries of the
/// field's first dimension, flattened.
#[derive(Debug, Clone, PartialEq)]
pub struct Conditioning {
    pub name: String,
    pub rows: usize,
    pub values: Vec<f32>,
}

/// A prompt: ids `[len][columns]` (flattened), vectors added at positions (in the builder's
/// order), and the declared slot fields.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Prompt {
    pub ids: Vec<i32>,
    pub columns: usize,
    pub vectors: Vec<(usize, Vec<f32>)>,
    pub conditioning: Vec<Conditioning>,
}

impl Prompt {
    /// A prompt from rows of ids; errors name what is wrong.
    pub fn from_rows(rows: &[Vec<i64>]) -> Result<Prompt, String> {
        let columns = rows.first().map_or(0, Vec::len);
        if rows.is_empty() || columns == 0 {
            return Err("a prompt needs at least one position of input ids".into());
        }
        let mut ids = Vec::with_capacity(rows.len() * columns);
        for row in rows {
            if row.len() != columns {
                return Err(format!("prompt rows have {} and {} ids", columns, row.len()));
            }
            for &id in row {
                ids.push(i32::try_from(id).map_err(|_| format!("prompt id {id} does not fit in int32"))?);
            }
        }
        Ok(Prompt { ids, columns, vectors: Vec::new(), conditioning: Vec::new() })
    }

    pub fn len(&self) -> usize {
        if self.columns == 0 {
            0
        } else {
            self.ids.len() / self.columns
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn row(&self, pos: usize) -> &[i32] {
        &self.ids[pos * self.columns..(pos + 1) * self.columns]
    }
}

/// Text ids that arrive while an input-streaming request generates (core/request.py `TextFeed`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TextFeed {
    pub ids: Vec<i32>,
    pub ended: bool,
}

impl TextFeed {
    pub fn has(&self, row: i64) -> bool {
        row < self.ids.len() as i64 || self.ended
    }

    pub fn limit(&self) -> i64 {
        if self.ended {
            ENDED_TEXT_LIMIT
        } else {
            self.ids.len() as i64
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestStats {
    pub arrival: f64,
    pub first_token: Option<f64>,
    pub first_audio: Option<f64>,
    pub finished: Option<f64>,
    pub num_audio_samples: i64,
    pub last_chunk_samples: i64,
}

/// Counters of a request that holds no slot (core/request.py `Counters`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub num_computed: i64,
    pub num_generated: i64,
    pub num_pending: i64,
    pub num_codes: i64,
    pub next_chunk: i64,
}

#[derive(Debug, Clone)]
pub struct Request {
    pub req_id: String,
    pub prompt: Prompt,
    pub sampling: SamplingParams,
    pub streaming: bool,
    pub status: RequestStatus,
    pub slot: Option<usize>,
    pub finish_reason: Option<String>,
    pub error: Option<String>,
    pub stats: RequestStats,
    pub text_feed: Option<TextFeed>,
    pub counters: Counters,
}

impl Request {
    pub fn new(req_id: impl Into<String>, prompt: Prompt, sampling: SamplingParams, streaming: bool) -> Request {
        Request { req_id: req_id.into(), prompt, sampling, streaming, status: RequestStatus::Waiting, slot: None,
                  finish_reason: None, error: None, stats: RequestStats::default(), text_feed: None,
                  counters: Counters::default() }
    }

    pub fn prompt_len(&self) -> i64 {
        self.prompt.len() as i64
    }
}

/// A request's handle inside one scheduler: its place and the generation of that place, so a
/// handle of an ended request never names the request that reuses its place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReqKey {
    pub index: u32,
    pub generation: u32,
}
