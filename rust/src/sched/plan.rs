//! A step plan in, a step result out (vox_serve/core/plan.py), as columns: one entry per row.

use super::types::{Conditioning, ReqKey};

/// A request admitted into a slot this step: the slot's device state is (re)set first.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotInit {
    pub slot: usize,
    pub prompt_len: i64,
    pub temperature: f64,
    pub top_k: i64,
    pub top_p: f64,
    pub min_p: f64,
    pub repetition_penalty: f64,
    pub repetition_window: i64,
    pub seed: i64,
    pub allow_stop: bool,
    pub conditioning: Vec<Conditioning>,
}

/// Page-table entries written this step: `page_table[slot[i], index[i]] = page[i]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PageUpdates {
    pub slot: Vec<i32>,
    pub index: Vec<i32>,
    pub page: Vec<i32>,
}

impl PageUpdates {
    pub fn len(&self) -> usize {
        self.slot.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slot.is_empty()
    }
}

/// The sequences of one prefill or decode launch: row i covers positions `start[i] ..
/// start[i] + num_tokens[i]` of the request in `slot[i]`; its ids are rows of `input_ids`
/// (`[total tokens][columns]`, flattened; ABSENT_ID where the device's history holds them).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LmLaunch {
    pub keys: Vec<ReqKey>,
    pub slot: Vec<i32>,
    pub start: Vec<i32>,
    pub num_tokens: Vec<i32>,
    pub sample: Vec<bool>,
    pub input_ids: Vec<i32>,
    pub columns: usize,
    /// Prompt vectors: the launch token each is added to, and the vectors (flattened).
    pub vector_token: Vec<i32>,
    pub vectors: Vec<f32>,
}

impl LmLaunch {
    pub fn empty(columns: usize) -> LmLaunch {
        LmLaunch { columns, ..LmLaunch::default() }
    }

    pub fn len(&self) -> usize {
        self.slot.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slot.is_empty()
    }

    pub fn total_tokens(&self) -> i64 {
        self.num_tokens.iter().map(|&n| i64::from(n)).sum()
    }

    /// KV length of row i after the launch.
    pub fn kv_len(&self, i: usize) -> i64 {
        i64::from(self.start[i]) + i64::from(self.num_tokens[i])
    }
}

/// Audio chunks to decode: row i turns frames `first_frame[i] .. window_end[i]` of its slot into
/// PCM and emits `num_frames[i]` frames after the lookback.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CodecLaunch {
    pub keys: Vec<ReqKey>,
    pub slot: Vec<i32>,
    pub chunk_index: Vec<i32>,
    pub first_frame: Vec<i32>,
    pub window_end: Vec<i32>,
    pub num_frames: Vec<i32>,
    pub is_last: Vec<bool>,
    /// When the most urgent of its rows' chunks must reach its client (monotonic seconds): a stream's
    /// playback deadline, or its first-audio deadline before its first chunk; None when no row is of a
    /// streaming request. A codec lane shared by replicas (`--codec-gpu`) serves the earliest first.
    pub deadline: Option<f64>,
}

impl CodecLaunch {
    pub fn len(&self) -> usize {
        self.slot.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slot.is_empty()
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepPlan {
    pub step_id: i64,
    pub admits: Vec<SlotInit>,
    pub pages: PageUpdates,
    pub codec: CodecLaunch,
    pub prefill: LmLaunch,
    pub decode: LmLaunch,
}

impl StepPlan {
    pub fn is_empty(&self) -> bool {
        self.prefill.is_empty() && self.decode.is_empty() && self.codec.is_empty() && self.admits.is_empty()
            && self.pages.is_empty()
    }

    pub fn num_lm_rows(&self) -> usize {
        self.prefill.len() + self.decode.len()
    }
}

/// What the host receives: an out kind per LM row and the PCM of every codec row
/// (little-endian int16 mono, `num_frames` frames), plus each launch's time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepResult {
    pub step_id: i64,
    pub prefill_kind: Vec<i32>,
    pub decode_kind: Vec<i32>,
    pub pcm: Vec<Vec<u8>>,
    /// (stage name, seconds) of each launch, in launch order.
    pub stage_seconds: Vec<(&'static str, f64)>,
    /// The codec rows' PCM comes later, as a `LandedCodec` (`--overlap-detok`: the codec batch is still
    /// on the device); `pcm` is then empty.
    pub codec_deferred: bool,
    /// The codec rows' PCM was handed over before the step was collected (`Worker::early_pcm`); `pcm` is
    /// then empty.
    pub pcm_early: bool,
}

/// A codec batch collected after its step (`--overlap-detok`): its PCM (one per codec row of step
/// `step_id`, in the `pcm` of a `StepResult` with the codec launches' times), or why it failed.
#[derive(Debug, Clone, PartialEq)]
pub struct LandedCodec {
    pub step_id: i64,
    pub result: Result<StepResult, String>,
}
