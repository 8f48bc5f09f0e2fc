//! Prompt builders of the programs, so the Rust runtime builds prompts without Python: the same
//! rows as each program's `preprocess` (and, for Qwen3-TTS, its input-streaming text ids).

pub mod orpheus;
pub mod qwen3_tts;
mod qwen3_stream;

use serde_json::Value;

pub use qwen3_stream::stable_text_ids;

/// A prompt the user's fields cannot build; `field` names the request field at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptError {
    pub field: Option<String>,
    pub message: String,
}

impl PromptError {
    pub fn field(name: &str, message: impl Into<String>) -> PromptError {
        PromptError { field: Some(name.to_string()), message: message.into() }
    }

    pub fn other(message: impl Into<String>) -> PromptError {
        PromptError { field: None, message: message.into() }
    }
}

impl std::fmt::Display for PromptError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Request fields as JSON: an optional string field (null and absent are the same).
pub fn text_field<'a>(fields: &'a Value, name: &str) -> Result<Option<&'a str>, PromptError> {
    match fields.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(PromptError::field(name, format!("{name}: must be a string"))),
    }
}

pub fn required_text<'a>(fields: &'a Value, name: &str) -> Result<&'a str, PromptError> {
    text_field(fields, name)?.ok_or_else(|| PromptError::field(name, format!("{name}: missing")))
}

/// Python's slice `v[start:stop]` (negative bounds count from the end, out-of-range ones clamp).
pub fn py_slice<T: Clone>(v: &[T], start: isize, stop: isize) -> Vec<T> {
    let n = v.len() as isize;
    let clamp = |i: isize| if i < 0 { (n + i).max(0) } else { i.min(n) };
    let (a, b) = (clamp(start), clamp(stop));
    if a < b {
        v[a as usize..b as usize].to_vec()
    } else {
        Vec::new()
    }
}

/// Python's truthiness of a JSON value.
fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().map_or(true, |x| x != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

fn present(fields: &Value, name: &str) -> bool {
    fields.get(name).map_or(false, truthy)
}

/// Whether a Base (voice clone) request clones from the speaker embedding only (else in context),
/// as vox_serve/models/qwen3_tts/clone.py `clone_mode`.
pub fn clone_mode(fields: &Value) -> Result<bool, PromptError> {
    for name in ["voice", "instruct"] {
        if present(fields, name) {
            return Err(PromptError::field(name, format!(
                "{name}: a Base (voice clone) model takes its voice from the reference `audio`")));
        }
    }
    if !present(fields, "audio") {
        return Err(PromptError::field("audio", "audio: this Base (voice clone) model needs reference audio: upload it as `audio`"));
    }
    let has_transcript = present(fields, "ref_text");
    let x_vector_only = fields.get("x_vector_only_mode").map_or(!has_transcript, truthy);
    if !x_vector_only && !has_transcript {
        return Err(PromptError::field("ref_text", "ref_text: is required for in-context cloning (x_vector_only_mode false)"));
    }
    Ok(x_vector_only)
}

/// The prompt builder of one model family.
pub enum PromptBuilder {
    Orpheus(orpheus::OrpheusPrompt),
    Qwen3(qwen3_tts::Qwen3Prompt),
}

impl PromptBuilder {
    pub fn kind(&self) -> &'static str {
        match self {
            PromptBuilder::Orpheus(_) => "orpheus",
            PromptBuilder::Qwen3(_) => "qwen3_tts",
        }
    }

    fn qwen3(&self, what: &str) -> Result<&qwen3_tts::Qwen3Prompt, PromptError> {
        match self {
            PromptBuilder::Qwen3(q) => Ok(q),
            PromptBuilder::Orpheus(_) => Err(PromptError::other(format!("{what}: Orpheus has no such prompt"))),
        }
    }

    fn qwen3_request<'a>(q: &'a qwen3_tts::Qwen3Prompt, fields: &'a Value) -> Result<qwen3_tts::Qwen3Request<'a>, PromptError> {
        let voice = text_field(fields, "voice")?.filter(|v| !v.is_empty()).or_else(|| q.ids.default_voice());
        Ok(qwen3_tts::Qwen3Request {
            text: text_field(fields, "text")?.unwrap_or(""),
            voice,
            language: text_field(fields, "language")?,
            instruct: text_field(fields, "instruct")?,
        })
    }

    /// The prompt rows of a request, as the program's `preprocess` (not for voice clones).
    pub fn build(&self, fields: &Value) -> Result<Vec<Vec<i64>>, PromptError> {
        match self {
            PromptBuilder::Orpheus(o) => o.build(required_text(fields, "text")?, text_field(fields, "voice")?),
            PromptBuilder::Qwen3(q) => {
                if q.ids.model_type == "base" {
                    return Err(PromptError::other("a Base (voice clone) prompt needs the reference audio's codes: use build_clone"));
                }
                required_text(fields, "text")?;
                q.build(&Self::qwen3_request(q, fields)?)
            }
        }
    }

    /// The prompt rows of a request and its trailing text ids, as the program's `preprocess` (not
    /// for voice clones): Qwen3-TTS CustomVoice / VoiceDesign with `non_streaming_mode` false end
    /// the prompt with the first text id and feed the rest one per generated frame
    /// (`Prompt.trailing_text`); every other prompt has none.
    pub fn build_with_trailing(&self, fields: &Value) -> Result<(Vec<Vec<i64>>, Vec<i64>), PromptError> {
        let streaming_text = match self {
            PromptBuilder::Qwen3(q) if q.ids.model_type != "base" => {
                fields.get("non_streaming_mode").and_then(Value::as_bool) == Some(false)
            }
            _ => false,
        };
        if !streaming_text {
            return Ok((self.build(fields)?, Vec::new()));
        }
        let q = self.qwen3("build_with_trailing")?;
        let mut texts = q.text_ids(required_text(fields, "text")?);
        let trailing = texts.split_off(1);
        Ok((q.streaming(&Self::qwen3_request(q, fields)?, texts[0])?, trailing))
    }

    /// A Base request's (rows, speaker row); `ref_codes` (the reference audio's frames) are needed
    /// for in-context cloning and ignored in x-vector-only mode.
    pub fn build_clone(&self, fields: &Value, ref_codes: Option<&[Vec<i64>]>) -> Result<(Vec<Vec<i64>>, usize), PromptError> {
        let q = self.qwen3("build_clone")?;
        let x_vector_only = clone_mode(fields)?;
        let text = required_text(fields, "text")?;
        let language = text_field(fields, "language")?;
        if x_vector_only {
            return q.build_clone(text, language, None, None);
        }
        let codes = ref_codes.ok_or_else(|| PromptError::other("ref_codes: in-context cloning needs the reference codes"))?;
        q.build_clone(text, language, text_field(fields, "ref_text")?, Some(codes))
    }

    pub fn stable_text_ids(&self, text: &str, start: usize, ended: bool) -> Result<(Vec<i64>, usize), PromptError> {
        let q = self.qwen3("stable_text_ids")?;
        stable_text_ids(&q.tokenizer, text, start, ended, q.ids.tts_eos)
    }

    /// An input-streaming request's rows (and a clone's speaker row).
    pub fn streaming_prompt(&self, fields: &Value, first_text_id: i64) -> Result<(Vec<Vec<i64>>, Option<usize>), PromptError> {
        let q = self.qwen3("streaming_prompt")?;
        if q.ids.model_type != "base" {
            return Ok((q.streaming(&Self::qwen3_request(q, fields)?, first_text_id)?, None));
        }
        if !clone_mode(fields)? {
            return Err(PromptError::field("ref_text", "ref_text: in-context cloning is not available with input streaming; send the whole text to POST /generate or use x_vector_only_mode"));
        }
        let (rows, speaker_row) = q.clone_streaming(text_field(fields, "language")?, first_text_id)?;
        Ok((rows, Some(speaker_row)))
    }
}
