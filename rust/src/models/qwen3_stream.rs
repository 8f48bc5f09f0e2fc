//! Qwen3-TTS input streaming (vox_serve/models/qwen3_tts/stream.py): the text ids that more text
//! cannot change, and the streaming prompts whose last row pairs the first text id with codec_bos.

use crate::tokenizer::Tokenizer;

use super::qwen3_tts::{Qwen3Prompt, Qwen3Request, ASSISTANT_HEAD, ASSISTANT_TAIL};
use super::{py_slice, PromptError};

/// The text after the turn's `<|im_start|>`: the special tokens around the text split the tokenizer's
/// input, so the text's ids are those of this plain text (stream.py).
const HEAD: &str = "assistant\n";

/// Python's `str.isspace()`: Unicode White_Space plus the information separators U+001C..001F.
fn py_isspace(chars: &[char]) -> bool {
    !chars.is_empty() && chars.iter().all(|&c| c.is_whitespace() || ('\u{1C}'..='\u{1F}').contains(&c))
}

/// `(ids, end)`: the ids of `text[start..]` (char indices; `start` is 0 or a previous `end`, a
/// word boundary) that more text cannot change, and where in `text` they end. Once `ended`, all
/// of them and `tts_eos`. Held back: the last word, and the one before it when both are
/// whitespace (stream.py explains why).
pub fn stable_text_ids(tokenizer: &Tokenizer, text: &str, start: usize, ended: bool, tts_eos: i64
                       ) -> Result<(Vec<i64>, usize), PromptError> {
    let text_chars: Vec<char> = text.chars().collect();
    if start > text_chars.len() {
        return Err(PromptError::other(format!("start {start} is past the text's {} characters", text_chars.len())));
    }
    let head = if start == 0 { HEAD } else { "" };
    let rest: String = text_chars[start..].iter().collect();
    let turn: Vec<char> = format!("{head}{rest}").chars().collect();
    let enc = tokenizer.encode_user_text(&turn.iter().collect::<String>());
    let first_id = if head.is_empty() { 0 } else { ASSISTANT_HEAD - 1 }; // <|im_start|> is not in `enc`
    let stop = enc.ids.len() as isize;
    let mut ids: Vec<i64> = py_slice(&enc.ids, first_id, stop).into_iter().map(i64::from).collect();
    if ended {
        ids.push(tts_eos);
        return Ok((ids, text_chars.len()));
    }
    let words = py_slice(&enc.word_ids, first_id, stop);
    let offsets = py_slice(&enc.offsets, first_id, stop);
    let mut keep = ids.len();
    for held in 0..2 {
        if keep == 0 {
            break;
        }
        let first = words.iter().position(|w| *w == words[keep - 1]).unwrap_or(keep - 1);
        let (from, to) = (offsets[first].0, offsets[keep - 1].1);
        let is_space = from < to && to <= turn.len() && py_isspace(&turn[from..to]);
        if held == 1 && !is_space {
            break;
        }
        keep = first;
        if !is_space {
            break;
        }
    }
    let head_len = head.chars().count();
    let end = if keep < ids.len() { (start + offsets[keep].0).saturating_sub(head_len) } else { start };
    ids.truncate(keep);
    Ok((ids, end))
}

impl Qwen3Prompt {
    /// An input-streaming request's prompt: the empty text's prompt with its two closing rows
    /// replaced by (first text id, codec_bos).
    pub fn streaming(&self, req: &Qwen3Request, first_text_id: i64) -> Result<Vec<Vec<i64>>, PromptError> {
        let rows = self.build(&Qwen3Request { text: "", ..req.clone() })?;
        Ok(self.first_text_row(rows, first_text_id))
    }

    /// A whole text's ids and tts_eos (stream.py `text_ids`): what the streaming-text layout
    /// (`non_streaming_mode` false) pairs with codec rows or trails, one per generated frame.
    pub fn text_ids(&self, text: &str) -> Vec<i64> {
        let mut ids = py_slice(&self.assistant_turn(text), ASSISTANT_HEAD, -ASSISTANT_TAIL);
        ids.push(self.ids.tts_eos);
        ids
    }

    /// An x-vector-only clone's input-streaming prompt and its speaker row.
    pub fn clone_streaming(&self, language: Option<&str>, first_text_id: i64
                           ) -> Result<(Vec<Vec<i64>>, usize), PromptError> {
        let (rows, speaker_row) = self.build_clone("", language, None, None)?;
        Ok((self.first_text_row(rows, first_text_id), speaker_row))
    }

    fn first_text_row(&self, mut rows: Vec<Vec<i64>>, first_text_id: i64) -> Vec<Vec<i64>> {
        rows.truncate(rows.len().saturating_sub(2));
        rows.push(self.ids.row(first_text_id, self.ids.codec_bos));
        rows
    }
}
