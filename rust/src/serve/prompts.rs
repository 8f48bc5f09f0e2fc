//! Prompts built in Rust from the spec's `meta.prompt_builder` (each program's
//! `prompt_builder_spec()`): the tokenizer as loaded (`tokenizer_json`, or a `tokenizer_file`) and
//! what else the builder reads (Orpheus: voices; Qwen3-TTS: the checkpoint's config). Requests
//! whose fields only Python can turn into a prompt (reference audio: Qwen3-TTS Base's encoders)
//! go through the program's `preprocess` instead.

use std::sync::Arc;

use serde_json::Value;

use crate::models::orpheus::OrpheusPrompt;
use crate::models::qwen3_tts::{PromptIds, Qwen3Prompt};
use crate::models::{PromptBuilder, PromptError};
use crate::sched::types::{Prompt, Request};
use crate::tokenizer::{self, Tokenizer};

fn tokenizer_of(spec: &Value) -> Result<Tokenizer, String> {
    let p = "meta.prompt_builder.";
    if let Some(text) = spec.get("tokenizer_json").and_then(Value::as_str) {
        return tokenizer::from_json(text).map_err(|e| format!("{p}tokenizer_json: {e}"));
    }
    match spec.get("tokenizer_file").and_then(Value::as_str) {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| format!("{p}tokenizer_file {path}: {e}"))?;
            tokenizer::from_json(&text).map_err(|e| format!("{path}: {e}"))
        }
        None => Err(format!("{p}: neither tokenizer_json nor tokenizer_file")),
    }
}

/// The builder a spec describes; None when it describes none (prompts need the program's Python).
pub fn builder_of(spec: &Value) -> Result<Option<PromptBuilder>, String> {
    let p = "meta.prompt_builder.";
    let kind = match spec.get("kind").and_then(Value::as_str) {
        None => return Ok(None),
        Some(kind) => kind,
    };
    let tokenizer = Arc::new(tokenizer_of(spec)?);
    match kind {
        "orpheus" => {
            let voices = spec.get("voices").and_then(Value::as_array).ok_or(format!("{p}voices is not a list"))?
                .iter().map(|v| v.as_str().map(str::to_string).ok_or(format!("{p}voices holds a non-string")))
                .collect::<Result<Vec<_>, _>>()?;
            let default_voice = spec.get("default_voice").and_then(Value::as_str)
                .ok_or(format!("{p}default_voice is missing"))?.to_string();
            Ok(Some(PromptBuilder::Orpheus(OrpheusPrompt { tokenizer, voices, default_voice })))
        }
        "qwen3_tts" => {
            let config = spec.get("config").ok_or(format!("{p}config is missing"))?;
            let ids = PromptIds::from_config(config).map_err(|e| format!("{p}config: {e}"))?;
            Ok(Some(PromptBuilder::Qwen3(Qwen3Prompt { tokenizer, ids })))
        }
        other => Err(format!("{p}kind {other:?}: this runtime builds orpheus and qwen3_tts prompts")),
    }
}

/// Whether the builder can build this request's prompt (reference audio needs Python's encoders).
pub fn builds(spec: &Value, fields: &Value) -> bool {
    let clone = spec.get("clone").and_then(Value::as_bool).unwrap_or(false);
    let has_audio = fields.get("audio").map_or(false, |a| !a.is_null() && a != &Value::Bool(false));
    !clone && !has_audio
}

/// A prompt error as the Python request builder words it (`as_field_error`): the field the message
/// starts with when the request has it, else the text.
pub fn field_message(e: &PromptError, fields: &Value) -> String {
    let first = e.message.split(' ').next().unwrap_or("").trim_end_matches(':');
    let field = match &e.field {
        Some(f) => f.as_str(),
        None if fields.get(first).is_some() => first,
        None => "text",
    };
    format!("{field}: {}", e.message)
}

/// The request of validated fields (rust_host.py `bench_request_fields`), its prompt built here.
pub fn request(builder: &PromptBuilder, item: &Value) -> Result<Request, String> {
    let fields = item.get("fields").ok_or("request.fields is missing")?;
    let (rows, trailing) = builder.build_with_trailing(fields).map_err(|e| field_message(&e, fields))?;
    let prompt = Prompt::from_rows(&rows)?;
    let mut req = super::requests::request(&serde_json::json!({
        "req_id": item.get("req_id"), "streaming": item.get("streaming"), "ids": [[0]], "vectors": [],
        "conditioning": [], "sampling": item.get("sampling"),
    }))?;
    req.prompt = prompt;
    req.text_feed = super::requests::ended_feed(&trailing)?;
    Ok(req)
}
