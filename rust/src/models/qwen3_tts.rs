//! Qwen3-TTS prompts (CustomVoice, VoiceDesign, Base), row for row as
//! vox_serve/models/qwen3_tts/prompt.py builds them: each row is `[code_0 .. code_{G-1}, text]`
//! with -1 where absent (see that module for the layout and its reference).

use std::sync::Arc;

use serde_json::Value;

use crate::tokenizer::Tokenizer;

use super::{py_slice, PromptError};

pub const ABSENT: i64 = -1;
pub const ASSISTANT_HEAD: isize = 3;
pub const ASSISTANT_TAIL: isize = 5;
const REF_TAIL: isize = 2;

/// Token ids and vocabularies from a Qwen3-TTS `config.json` (prompt.py `PromptIds`); maps keep
/// the file's order (the first speaker is the default voice).
#[derive(Debug, Clone)]
pub struct PromptIds {
    pub model_type: String,
    pub model_size: String,
    pub num_code_groups: usize,
    pub tts_pad: i64,
    pub tts_bos: i64,
    pub tts_eos: i64,
    pub codec_pad: i64,
    pub codec_bos: i64,
    pub codec_eos: i64,
    pub codec_think: i64,
    pub codec_nothink: i64,
    pub codec_think_bos: i64,
    pub codec_think_eos: i64,
    pub languages: Vec<(String, i64)>,
    pub speakers: Vec<(String, i64)>,
    /// Speaker -> its dialect (a language name), for dialect speakers.
    pub speaker_dialects: Vec<(String, String)>,
}

fn id(obj: &Value, name: &str, path: &str) -> Result<i64, String> {
    obj.get(name).and_then(Value::as_i64).ok_or_else(|| format!("config.json: {path}{name} is missing or not an id"))
}

fn lower_map(obj: Option<&Value>) -> Vec<(String, i64)> {
    let entries = obj.and_then(Value::as_object).into_iter().flatten();
    entries.filter_map(|(k, v)| v.as_i64().map(|id| (k.to_lowercase(), id))).collect()
}

impl PromptIds {
    pub fn from_config(cfg: &Value) -> Result<PromptIds, String> {
        let t = cfg.get("talker_config").ok_or("config.json: talker_config is missing")?;
        let text = |name: &str, default: &str| -> String {
            cfg.get(name).and_then(Value::as_str).filter(|s| !s.is_empty()).unwrap_or(default).to_string()
        };
        let dialects = t.get("spk_is_dialect").and_then(Value::as_object).into_iter().flatten();
        Ok(PromptIds {
            model_type: text("tts_model_type", "custom_voice"),
            model_size: text("tts_model_size", ""),
            num_code_groups: id(t, "num_code_groups", "talker_config.")? as usize,
            tts_pad: id(cfg, "tts_pad_token_id", "")?,
            tts_bos: id(cfg, "tts_bos_token_id", "")?,
            tts_eos: id(cfg, "tts_eos_token_id", "")?,
            codec_pad: id(t, "codec_pad_id", "talker_config.")?,
            codec_bos: id(t, "codec_bos_id", "talker_config.")?,
            codec_eos: id(t, "codec_eos_token_id", "talker_config.")?,
            codec_think: id(t, "codec_think_id", "talker_config.")?,
            codec_nothink: id(t, "codec_nothink_id", "talker_config.")?,
            codec_think_bos: id(t, "codec_think_bos_id", "talker_config.")?,
            codec_think_eos: id(t, "codec_think_eos_id", "talker_config.")?,
            languages: lower_map(t.get("codec_language_id")),
            speakers: lower_map(t.get("spk_id")),
            speaker_dialects: dialects
                .filter_map(|(k, v)| v.as_str().map(|d| (k.to_lowercase(), d.to_string())))
                .collect(),
        })
    }

    pub fn supported_languages(&self) -> Vec<String> {
        let named = self.languages.iter().map(|(k, _)| k.clone()).filter(|k| !k.contains("dialect"));
        std::iter::once("auto".to_string()).chain(named).collect()
    }

    pub fn takes_speaker(&self) -> bool {
        self.model_type == "custom_voice"
    }

    /// The 0.6B CustomVoice model was not trained with instructions.
    pub fn takes_instruct(&self) -> bool {
        !(self.model_type == "custom_voice" && self.model_size == "0b6")
    }

    pub fn default_voice(&self) -> Option<&str> {
        if self.takes_speaker() {
            self.speakers.first().map(|(k, _)| k.as_str())
        } else {
            None
        }
    }

    fn language(&self, name: &str) -> Option<i64> {
        self.languages.iter().find(|(k, _)| k == name).map(|&(_, id)| id)
    }

    pub fn row(&self, text: i64, code: i64) -> Vec<i64> {
        let mut row = vec![ABSENT; self.num_code_groups + 1];
        row[0] = code;
        row[self.num_code_groups] = text;
        row
    }

    /// The codec language id (None: "auto"), with a dialect speaker's dialect for Chinese / auto.
    pub fn language_id(&self, language: Option<&str>, speaker: Option<&str>) -> Result<Option<i64>, PromptError> {
        let lang = language.filter(|l| !l.is_empty()).unwrap_or("auto").to_lowercase();
        let supported = self.supported_languages();
        if !supported.contains(&lang) {
            let shown = language.unwrap_or("auto");
            return Err(PromptError::field("language", format!(
                "language '{shown}' is not supported; choose one of {}", supported.join(", "))));
        }
        let mut chosen = if lang == "auto" { None } else { self.language(&lang) };
        let dialect = speaker.and_then(|s| self.speaker_dialects.iter().find(|(k, _)| k == s)).map(|(_, d)| d);
        if let (true, Some(dialect)) = (lang == "chinese" || lang == "auto", dialect) {
            chosen = Some(self.language(dialect).ok_or_else(|| PromptError::other(format!(
                "config.json: dialect {dialect:?} has no codec language id")))?);
        }
        Ok(chosen)
    }

    pub fn resolve_speaker(&self, voice: Option<&str>) -> Result<Option<String>, PromptError> {
        let voice = voice.filter(|v| !v.is_empty());
        if !self.takes_speaker() {
            return match voice {
                Some(_) => Err(PromptError::field("voice", format!(
                    "voice: this {} model has no named voices (describe the voice in `instruct`)", self.model_type))),
                None => Ok(None),
            };
        }
        let speaker = match voice {
            Some(v) => v.to_lowercase(),
            None => return Ok(None),
        };
        if !self.speakers.iter().any(|(k, _)| *k == speaker) {
            let names: Vec<&str> = self.speakers.iter().map(|(k, _)| k.as_str()).collect();
            return Err(PromptError::field("voice", format!("voice '{}' is not one of {}", voice.unwrap_or(""),
                                                           names.join(", "))));
        }
        Ok(Some(speaker))
    }
}

/// What a request asks of a Qwen3-TTS prompt.
#[derive(Debug, Clone, Default)]
pub struct Qwen3Request<'a> {
    pub text: &'a str,
    pub voice: Option<&'a str>,
    pub language: Option<&'a str>,
    pub instruct: Option<&'a str>,
}

pub struct Qwen3Prompt {
    pub tokenizer: Arc<Tokenizer>,
    pub ids: PromptIds,
}

const IM_START: &str = "<|im_start|>";
const IM_END: &str = "<|im_end|>";

/// A piece of a prompt template (`chat_ids` in vox_serve/models/tokenizers/qwen2.py).
enum Part<'a> {
    /// A special token, put in by its id (tokenized as text when the tokenizer lacks it).
    Special(&'a str),
    /// Text, tokenized as plain text: special-token strings in it stay text.
    Text(&'a str),
}

fn chat_ids(tokenizer: &Tokenizer, parts: &[Part]) -> Vec<i64> {
    let mut ids = Vec::new();
    for part in parts {
        let (text, id) = match part {
            Part::Special(name) => (*name, tokenizer.token_to_id(name)),
            Part::Text(text) => (*text, None),
        };
        match id {
            Some(id) => ids.push(i64::from(id)),
            None => ids.extend(tokenizer.encode_user_text(text).ids.into_iter().map(i64::from)),
        }
    }
    ids
}

impl Qwen3Prompt {
    /// `<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n`, the text as plain text.
    pub fn assistant_turn(&self, text: &str) -> Vec<i64> {
        let body = format!("assistant\n{text}");
        let parts = [Part::Special(IM_START), Part::Text(&body), Part::Special(IM_END), Part::Text("\n"),
                     Part::Special(IM_START), Part::Text("assistant\n")];
        chat_ids(&self.tokenizer, &parts)
    }

    /// The prompt rows of a CustomVoice / VoiceDesign request (`build_prompt`).
    pub fn build(&self, req: &Qwen3Request) -> Result<Vec<Vec<i64>>, PromptError> {
        let speaker = self.ids.resolve_speaker(req.voice)?;
        let lang_id = self.ids.language_id(req.language, speaker.as_deref())?;
        let instruct = req.instruct.filter(|i| !i.is_empty());
        if instruct.is_some() && !self.ids.takes_instruct() {
            return Err(PromptError::field("instruct", "instruct: the 0.6B CustomVoice model does not take instructions"));
        }
        let turn = self.assistant_turn(req.text);
        let speaker_codes: Vec<i64> = speaker.iter().filter_map(|s| self.ids.speakers.iter().find(|(k, _)| k == s))
            .map(|&(_, id)| id).collect();
        let mut rows = self.head(&turn, lang_id, &speaker_codes, instruct);
        rows.extend(self.text_rows(&turn));
        Ok(rows)
    }

    /// A Base (voice clone) prompt and the index of its speaker row (`build_clone_prompt`):
    /// x-vector only without `ref_codes`, else in context with the reference transcript.
    pub fn build_clone(&self, text: &str, language: Option<&str>, ref_text: Option<&str>,
                       ref_codes: Option<&[Vec<i64>]>) -> Result<(Vec<Vec<i64>>, usize), PromptError> {
        let turn = self.assistant_turn(text);
        let mut rows = self.head(&turn, self.ids.language_id(language, None)?, &[ABSENT], None);
        let speaker_row = rows.len() - 2;
        let ref_codes = match ref_codes {
            None => {
                rows.extend(self.text_rows(&turn));
                return Ok((rows, speaker_row));
            }
            Some(codes) => codes,
        };
        let ref_text = ref_text.ok_or_else(|| {
            PromptError::field("ref_text", "ref_text: in-context cloning needs the reference audio's transcript")
        })?;
        let body = format!("assistant\n{ref_text}");
        let ref_turn = chat_ids(&self.tokenizer, &[Part::Special(IM_START), Part::Text(&body), Part::Special(IM_END),
                                                   Part::Text("\n")]);
        let mut texts = py_slice(&ref_turn, ASSISTANT_HEAD, -REF_TAIL);
        texts.extend(py_slice(&turn, ASSISTANT_HEAD, -ASSISTANT_TAIL));
        let ids = &self.ids;
        rows.extend(texts.into_iter().map(|t| ids.row(t, ids.codec_pad)));
        rows.push(ids.row(ids.tts_eos, ids.codec_pad));
        rows.push(ids.row(ids.tts_pad, ids.codec_bos));
        for frame in ref_codes {
            if frame.len() != ids.num_code_groups {
                return Err(PromptError::other(format!("ref_codes: a frame has {} codes, not {}", frame.len(),
                                                      ids.num_code_groups)));
            }
            rows.push(frame.iter().copied().chain(std::iter::once(ids.tts_pad)).collect());
        }
        Ok((rows, speaker_row))
    }

    /// Instruction turn, assistant role, codec prefix and speaker position, up to the tts_bos row.
    fn head(&self, turn: &[i64], lang_id: Option<i64>, speaker_codes: &[i64], instruct: Option<&str>) -> Vec<Vec<i64>> {
        let ids = &self.ids;
        let mut rows = Vec::new();
        if let Some(instruct) = instruct {
            let body = format!("user\n{instruct}");
            let turn = chat_ids(&self.tokenizer, &[Part::Special(IM_START), Part::Text(&body), Part::Special(IM_END),
                                                   Part::Text("\n")]);
            rows.extend(turn.into_iter().map(|t| ids.row(t, ABSENT)));
        }
        rows.extend(py_slice(turn, 0, ASSISTANT_HEAD).into_iter().map(|t| ids.row(t, ABSENT)));
        let mut prefix = match lang_id {
            None => vec![ids.codec_nothink, ids.codec_think_bos, ids.codec_think_eos],
            Some(lang) => vec![ids.codec_think, ids.codec_think_bos, lang, ids.codec_think_eos],
        };
        prefix.extend_from_slice(speaker_codes);
        prefix.push(ids.codec_pad);
        let last = prefix.len() - 1;
        rows.extend(prefix.iter().enumerate().map(|(i, &code)| ids.row(if i == last { ids.tts_bos } else { ids.tts_pad }, code)));
        rows
    }

    /// Every text token with codec_pad, tts_eos with codec_pad, then tts_pad with codec_bos.
    fn text_rows(&self, turn: &[i64]) -> Vec<Vec<i64>> {
        let ids = &self.ids;
        let mut rows: Vec<Vec<i64>> =
            py_slice(turn, ASSISTANT_HEAD, -ASSISTANT_TAIL).into_iter().map(|t| ids.row(t, ids.codec_pad)).collect();
        rows.push(ids.row(ids.tts_eos, ids.codec_pad));
        rows.push(ids.row(ids.tts_pad, ids.codec_bos));
        rows
    }
}
