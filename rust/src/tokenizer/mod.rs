//! Byte-level BPE tokenizers from a checkpoint's `tokenizer.json`, with the encoding pipeline of
//! HF tokenizers (`Tokenizer.encode`): added tokens, NFC, the split regex, the byte alphabet, BPE,
//! and the template post-processor. `load` reads the configurations this pipeline covers and
//! refuses every other with the field it does not support.

mod added;
mod bpe;
mod load;
mod pretokenize;
pub mod unicode;
mod unicode_tables;

use added::AddedVocab;
use bpe::Bpe;
use pretokenize::SplitPattern;
use unicode::Aligned;

pub use load::{from_json, from_qwen2_files};
pub use unicode_tables::UNICODE_VERSION;

/// One pre-tokenizer step, in order.
#[derive(Debug, Clone, Copy)]
enum PreStep {
    Split(SplitPattern),
    ByteLevel { add_prefix_space: bool, split: Option<SplitPattern> },
}

#[derive(Debug, Clone)]
enum TemplatePiece {
    Special(Vec<u32>),
    Sequence,
}

pub struct Tokenizer {
    nfc: bool,
    pre: Vec<PreStep>,
    bpe: Bpe,
    added: AddedVocab,
    /// The `single` template of a TemplateProcessing post-processor.
    template: Option<Vec<TemplatePiece>>,
    /// A ByteLevel post-processor's `trim_offsets` (with its `add_prefix_space`).
    trim_offsets: Option<bool>,
    byte_chars: [char; 256],
}

/// Token ids with, per token, its word (pre-tokenized piece, counted over the whole text; None for
/// template tokens) and the range of original characters it covers (as HF's char offsets).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Encoding {
    pub ids: Vec<u32>,
    pub word_ids: Vec<Option<u32>>,
    pub offsets: Vec<(usize, usize)>,
}

impl Encoding {
    fn push(&mut self, id: u32, word: Option<u32>, offsets: (usize, usize)) {
        self.ids.push(id);
        self.word_ids.push(word);
        self.offsets.push(offsets);
    }
}

impl Tokenizer {
    /// Distinct tokens: the vocabulary and the added tokens it lacks (HF's `get_vocab_size()`).
    pub fn vocab_size(&self) -> usize {
        self.bpe.vocab.len() + self.added.tokens.iter().filter(|t| !self.bpe.vocab.contains_key(&t.content)).count()
    }

    /// The id of a token string (an added token or a vocabulary entry).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.added.tokens.iter().find(|t| t.content == token).map(|t| t.id).or_else(|| self.bpe.vocab.get(token).copied())
    }

    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Vec<u32> {
        self.encode_full(text, add_special_tokens).ids
    }

    pub fn encode_full(&self, text: &str, add_special_tokens: bool) -> Encoding {
        self.encode_with(text, add_special_tokens, false)
    }

    /// A request's text as prompts tokenize it (vox_serve/models/tokenizers/user_text.py): special
    /// tokens' strings in it are plain text, never their ids; the post-processor's template applies.
    pub fn encode_user_text(&self, text: &str) -> Encoding {
        self.encode_with(text, true, true)
    }

    fn encode_with(&self, text: &str, add_special_tokens: bool, special_as_text: bool) -> Encoding {
        let mut body = Encoding::default();
        let mut word = 0u32;
        let char_at = char_index_map(text);
        for (id, range) in self.added.split_raw(text, special_as_text) {
            let (start, end) = (char_at[range.start], char_at[range.end]);
            match id {
                Some(id) => {
                    body.push(id, Some(word), (start, end));
                    word += 1;
                }
                None => self.encode_piece(&text[range], start, &mut word, &mut body, special_as_text),
            }
        }
        match (&self.template, add_special_tokens) {
            (Some(template), true) => apply_template(template, body),
            _ => body,
        }
    }

    /// A piece between added tokens: normalise, split off normalised added tokens, pre-tokenize.
    fn encode_piece(&self, piece: &str, base: usize, word: &mut u32, out: &mut Encoding, special_as_text: bool) {
        let normalized: Vec<Aligned> = if self.nfc && !unicode::is_nfc_quick(piece) {
            unicode::nfc_aligned(piece, base)
        } else {
            piece.chars().enumerate().map(|(i, c)| Aligned { c, start: base + i, end: base + i + 1 }).collect()
        };
        let text: String = normalized.iter().map(|a| a.c).collect();
        let char_at = char_index_map(&text);
        for (id, range) in self.added.split_normalized(&text, special_as_text) {
            let chars = &normalized[char_at[range.start]..char_at[range.end]];
            match id {
                Some(id) => {
                    out.push(id, Some(*word), (chars[0].start, chars[chars.len() - 1].end));
                    *word += 1;
                }
                None => {
                    for split in self.pre_tokenize(chars.to_vec()) {
                        self.encode_word(&split, *word, out);
                        *word += 1;
                    }
                }
            }
        }
    }

    fn pre_tokenize(&self, chars: Vec<Aligned>) -> Vec<Vec<Aligned>> {
        let mut splits = vec![chars];
        for step in &self.pre {
            let mut next = Vec::with_capacity(splits.len());
            for mut split in splits {
                let pattern = match *step {
                    PreStep::Split(pattern) => Some(pattern),
                    PreStep::ByteLevel { add_prefix_space, split: pattern } => {
                        if add_prefix_space && split.first().map_or(false, |a| a.c != ' ') {
                            let first = split[0];
                            split.insert(0, Aligned { c: ' ', ..first });
                        }
                        pattern
                    }
                };
                match pattern {
                    Some(pattern) => {
                        let cs: Vec<char> = split.iter().map(|a| a.c).collect();
                        let mut start = 0;
                        for end in pattern.split(&cs) {
                            next.push(split[start..end].to_vec());
                            start = end;
                        }
                    }
                    None => next.push(split),
                }
            }
            splits = next;
        }
        splits.retain(|s| !s.is_empty());
        splits
    }

    fn is_byte_level(&self) -> bool {
        self.pre.iter().any(|s| matches!(s, PreStep::ByteLevel { .. }))
    }

    fn encode_word(&self, split: &[Aligned], word: u32, out: &mut Encoding) {
        let symbols: Vec<Aligned> = if self.is_byte_level() {
            let mut bytes = [0u8; 4];
            split
                .iter()
                .flat_map(|a| {
                    let encoded = a.c.encode_utf8(&mut bytes).as_bytes().to_vec();
                    encoded.into_iter().map(move |b| (b, *a))
                })
                .map(|(b, a)| Aligned { c: self.byte_chars[b as usize], ..a })
                .collect()
        } else {
            split.to_vec()
        };
        let chars: Vec<char> = symbols.iter().map(|a| a.c).collect();
        for piece in self.bpe.tokenize(&chars) {
            let mut offsets = (symbols[piece.start].start, symbols[piece.end - 1].end);
            if let Some(add_prefix_space) = self.trim_offsets {
                offsets = trim(&chars[piece.start..piece.end], offsets, add_prefix_space, out.ids.is_empty());
            }
            out.push(piece.id, Some(word), offsets);
        }
    }
}

/// Byte offset -> char index for every char boundary of `text` (and its end).
fn char_index_map(text: &str) -> Vec<usize> {
    let mut map = vec![0; text.len() + 1];
    let mut count = 0;
    for (i, c) in text.char_indices() {
        for slot in &mut map[i..i + c.len_utf8()] {
            *slot = count;
        }
        count += 1;
    }
    map[text.len()] = count;
    map
}

/// A ByteLevel post-processor's offset trimming: leading and trailing spaces ('Ġ') are left out.
fn trim(token: &[char], (start, end): (usize, usize), add_prefix_space: bool, first: bool) -> (usize, usize) {
    let is_space = |c: &&char| **c == '\u{120}' || c.is_whitespace();
    let mut leading = token.iter().take_while(is_space).count();
    let trailing = token.iter().rev().take_while(is_space).count();
    let (mut start, mut end) = (start, end);
    if leading > 0 {
        if (first || start == 0) && add_prefix_space && leading == 1 {
            leading = 0;
        }
        start = (start + leading).min(end);
    }
    if trailing > 0 && end >= trailing {
        end = (end - trailing).max(start);
    }
    (start, end)
}

fn apply_template(template: &[TemplatePiece], body: Encoding) -> Encoding {
    let mut out = Encoding::default();
    for piece in template {
        match piece {
            TemplatePiece::Special(ids) => ids.iter().for_each(|&id| out.push(id, None, (0, 0))),
            TemplatePiece::Sequence => {
                out.ids.extend(&body.ids);
                out.word_ids.extend(&body.word_ids);
                out.offsets.extend(&body.offsets);
            }
        }
    }
    out
}
