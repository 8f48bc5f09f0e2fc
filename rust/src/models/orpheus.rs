//! Orpheus prompts (vox_serve/models/orpheus/program.py `preprocess`):
//! `[128259] + tokens("{voice}: {text}") + [128009, 128260, 128261, 128257]`, one id per row.

use std::sync::Arc;

use crate::tokenizer::Tokenizer;

use super::PromptError;

pub const PROMPT_START: [i64; 1] = [128259];
pub const PROMPT_END: [i64; 4] = [128009, 128260, 128261, 128257];

pub struct OrpheusPrompt {
    pub tokenizer: Arc<Tokenizer>,
    pub voices: Vec<String>,
    pub default_voice: String,
}

impl OrpheusPrompt {
    /// The prompt rows `[positions][1]`; `voice` None (or empty) takes the default voice.
    pub fn build(&self, text: &str, voice: Option<&str>) -> Result<Vec<Vec<i64>>, PromptError> {
        let voice = voice.filter(|v| !v.is_empty()).unwrap_or(&self.default_voice);
        if !self.voices.iter().any(|v| v == voice) {
            return Err(PromptError::field("voice", format!("voice '{voice}' is not one of {}", self.voices.join(", "))));
        }
        let ids = self.tokenizer.encode_user_text(&format!("{voice}: {text}")).ids;
        let all = PROMPT_START.iter().copied().chain(ids.into_iter().map(i64::from)).chain(PROMPT_END.iter().copied());
        Ok(all.map(|id| vec![id]).collect())
    }
}
