//! Added (special) tokens: found in the text before normalisation and pre-tokenization, with
//! HF tokenizers' rules: leftmost-longest matches, `single_word`, `lstrip` and `rstrip`.

use std::collections::HashMap;
use std::ops::Range;

use super::unicode::{is_space, is_word};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddedToken {
    pub id: u32,
    pub content: String,
    pub single_word: bool,
    pub lstrip: bool,
    pub rstrip: bool,
    /// Matched in the normalised text (else in the original text).
    pub normalized: bool,
    pub special: bool,
}

/// Exact-string lookup of one set of tokens: a leftmost-longest scan tries each distinct token
/// length (longest first) at every position whose first byte starts some token.
#[derive(Default)]
struct Matcher {
    by_content: HashMap<String, usize>,
    lengths: Vec<usize>,
    first_bytes: Vec<bool>,
}

impl Matcher {
    fn new<'a>(tokens: impl Iterator<Item = (usize, &'a str)>) -> Matcher {
        let mut m = Matcher { first_bytes: vec![false; 256], ..Matcher::default() };
        for (index, content) in tokens {
            if content.is_empty() {
                continue;
            }
            m.first_bytes[content.as_bytes()[0] as usize] = true;
            m.lengths.push(content.len());
            m.by_content.entry(content.to_string()).or_insert(index);
        }
        m.lengths.sort_unstable_by(|a, b| b.cmp(a));
        m.lengths.dedup();
        m
    }

    /// The longest token starting at byte `at` of `text`.
    fn longest_at(&self, text: &str, at: usize) -> Option<(usize, usize)> {
        if !self.first_bytes[text.as_bytes()[at] as usize] {
            return None;
        }
        self.lengths.iter().find_map(|&len| {
            let end = at + len;
            let piece = text.get(at..end)?;
            self.by_content.get(piece).map(|&index| (index, end))
        })
    }
}

pub struct AddedVocab {
    pub tokens: Vec<AddedToken>,
    raw: Matcher,
    normalized: Matcher,
}

/// A piece of text: an added token's id, or None for text to tokenize; byte range in the text.
pub type Split = (Option<u32>, Range<usize>);

impl AddedVocab {
    /// `normalize` gives the normalised form a `normalized` token is matched in.
    pub fn new(tokens: Vec<AddedToken>, normalize: impl Fn(&str) -> String) -> AddedVocab {
        let forms: Vec<String> =
            tokens.iter().map(|t| if t.normalized { normalize(&t.content) } else { t.content.clone() }).collect();
        let raw = Matcher::new(tokens.iter().enumerate().filter(|(_, t)| !t.normalized).map(|(i, _)| (i, forms[i].as_str())));
        let normalized =
            Matcher::new(tokens.iter().enumerate().filter(|(_, t)| t.normalized).map(|(i, _)| (i, forms[i].as_str())));
        AddedVocab { tokens, raw, normalized }
    }

    /// With `special_as_text`, special tokens' strings are not matched (HF's `encode_special_tokens`):
    /// they stay text, to be tokenized as any other.
    pub fn split_raw(&self, text: &str, special_as_text: bool) -> Vec<Split> {
        self.find(text, &self.raw, special_as_text)
    }

    pub fn split_normalized(&self, text: &str, special_as_text: bool) -> Vec<Split> {
        self.find(text, &self.normalized, special_as_text)
    }

    fn find(&self, text: &str, matcher: &Matcher, special_as_text: bool) -> Vec<Split> {
        let mut splits = Vec::new();
        let mut done = 0; // end of the last split
        let mut at = 0; // where the scan resumes: a match's end (before rstrip), as HF's iterator
        while at < text.len() {
            if !text.is_char_boundary(at) {
                at += 1;
                continue;
            }
            let (index, end) = match matcher.longest_at(text, at) {
                Some(found) => found,
                None => {
                    at += 1;
                    continue;
                }
            };
            let token = &self.tokens[index];
            let (mut start, mut stop) = (at, end);
            at = end;
            if token.special && special_as_text {
                continue;
            }
            if token.single_word && !is_single_word(text, start, stop) {
                continue;
            }
            if token.lstrip {
                let spaces: usize = text[..start].chars().rev().take_while(|&c| is_space(c)).map(char::len_utf8).sum();
                start = (start - spaces).max(done);
            }
            if token.rstrip {
                stop += text[stop..].chars().take_while(|&c| is_space(c)).map(char::len_utf8).sum::<usize>();
            }
            if done < start {
                splits.push((None, done..start));
            }
            splits.push((Some(token.id), start..stop));
            done = stop;
        }
        if done < text.len() {
            splits.push((None, done..text.len()));
        }
        splits
    }
}

fn is_single_word(text: &str, start: usize, stop: usize) -> bool {
    let word_before = text[..start].chars().next_back().map_or(false, is_word);
    let word_after = text[stop..].chars().next().map_or(false, is_word);
    !word_before && !word_after
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(id: u32, content: &str) -> AddedToken {
        AddedToken { id, content: content.into(), single_word: false, lstrip: false, rstrip: false, normalized: false,
                     special: true }
    }

    #[test]
    fn leftmost_longest() {
        let vocab = AddedVocab::new(vec![token(1, "<a>"), token(2, "<a><b>"), token(3, "<b>")], |s| s.to_string());
        let splits = vocab.split_raw("x<a><b>y<b>", false);
        assert_eq!(splits, vec![(None, 0..1), (Some(2), 1..7), (None, 7..8), (Some(3), 8..11)]);
    }

    #[test]
    fn strips_and_single_words() {
        let mut t = token(7, "<m>");
        t.lstrip = true;
        t.rstrip = true;
        let vocab = AddedVocab::new(vec![t], |s| s.to_string());
        assert_eq!(vocab.split_raw("a  <m>  b", false), vec![(None, 0..1), (Some(7), 1..8), (None, 8..9)]);
        let mut w = token(8, "cat");
        w.single_word = true;
        let vocab = AddedVocab::new(vec![w], |s| s.to_string());
        assert_eq!(vocab.split_raw("cats cat", false), vec![(None, 0..5), (Some(8), 5..8)]);
    }
}
