//! The split regexes of byte-level BPE tokenizers, as hand-written matchers (the regex crate has
//! no look-ahead, which `\s+(?!\S)` needs). Each matcher returns the length of the match at a
//! position, trying the regex's alternatives in order as a backtracking engine (Oniguruma, which
//! HF tokenizers uses) does.

use super::unicode::{is_letter, is_number, is_space};

/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
pub const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's: Llama-3's with single digits.
pub const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// GPT-2's, used by the ByteLevel pre-tokenizer with `use_regex`.
pub const GPT2_PATTERN: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitPattern {
    /// Llama-3 (`max_digits` 3) and Qwen2 (`max_digits` 1).
    Llama3 { max_digits: usize },
    Gpt2,
}

impl SplitPattern {
    /// The matcher of a tokenizer.json regex, or None for a regex this module does not implement.
    pub fn from_regex(regex: &str) -> Option<SplitPattern> {
        match regex {
            LLAMA3_PATTERN => Some(SplitPattern::Llama3 { max_digits: 3 }),
            QWEN2_PATTERN => Some(SplitPattern::Llama3 { max_digits: 1 }),
            GPT2_PATTERN => Some(SplitPattern::Gpt2),
            _ => None,
        }
    }

    /// Split `chars` into consecutive pieces (the regex's matches, which cover every character):
    /// returns the end index of each piece.
    pub fn split(&self, chars: &[char]) -> Vec<usize> {
        let mut ends = Vec::new();
        let mut i = 0;
        while i < chars.len() {
            let len = match self {
                SplitPattern::Llama3 { max_digits } => llama3_match(chars, i, *max_digits),
                SplitPattern::Gpt2 => gpt2_match(chars, i),
            };
            // Every character matches some alternative; one character is the safe fallback.
            i += len.max(1);
            ends.push(i);
        }
        ends
    }
}

fn is_other(c: char) -> bool {
    !is_space(c) && !is_letter(c) && !is_number(c)
}

fn is_newline(c: char) -> bool {
    c == '\r' || c == '\n'
}

fn run(chars: &[char], from: usize, pred: impl Fn(char) -> bool) -> usize {
    chars[from..].iter().take_while(|&&c| pred(c)).count()
}

/// `'s|'t|'re|'ve|'m|'ll|'d`, case-insensitively when `fold` (Oniguruma folds U+017F to s).
fn contraction(chars: &[char], i: usize, fold: bool) -> usize {
    if chars[i] != '\'' {
        return 0;
    }
    let at = |k: usize| -> Option<char> {
        let c = *chars.get(i + k)?;
        Some(if !fold {
            c
        } else if c == '\u{17F}' {
            's'
        } else {
            c.to_ascii_lowercase()
        })
    };
    for word in ["s", "t", "re", "ve", "m", "ll", "d"] {
        if word.chars().enumerate().all(|(k, w)| at(k + 1) == Some(w)) {
            return 1 + word.len();
        }
    }
    0
}

/// The whitespace alternatives shared by both patterns: `\s+(?!\S)|\s+` (after Llama-3's
/// `\s*[\r\n]+`, tried by the caller).
fn trailing_space(chars: &[char], i: usize) -> usize {
    let n = run(chars, i, is_space);
    if i + n == chars.len() || n == 1 {
        n
    } else {
        n - 1 // leave the last space to prefix the next word
    }
}

fn llama3_match(chars: &[char], i: usize, max_digits: usize) -> usize {
    let c = chars[i];
    let n = contraction(chars, i, true);
    if n > 0 {
        return n;
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if is_letter(c) {
        return run(chars, i, is_letter);
    }
    if !is_newline(c) && !is_number(c) && chars.get(i + 1).map_or(false, |&d| is_letter(d)) {
        return 1 + run(chars, i + 1, is_letter);
    }
    // \p{N}{1,3}
    if is_number(c) {
        return run(chars, i, is_number).min(max_digits);
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    let lead = usize::from(c == ' ' && chars.get(i + 1).map_or(false, |&d| is_other(d)));
    let others = run(chars, i + lead, is_other);
    if others > 0 {
        let j = i + lead + others;
        return lead + others + run(chars, j, is_newline);
    }
    // \s*[\r\n]+ : the whitespace run up to and including its last newline.
    let spaces = run(chars, i, is_space);
    if let Some(last) = chars[i..i + spaces].iter().rposition(|&d| is_newline(d)) {
        return last + 1;
    }
    trailing_space(chars, i)
}

fn gpt2_match(chars: &[char], i: usize) -> usize {
    let n = contraction(chars, i, false);
    if n > 0 {
        return n;
    }
    let lead = usize::from(chars[i] == ' ');
    if let Some(&d) = chars.get(i + lead) {
        for class in [is_letter as fn(char) -> bool, is_number, is_other] {
            if class(d) {
                return lead + run(chars, i + lead, class);
            }
        }
    }
    trailing_space(chars, i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(pattern: SplitPattern, text: &str) -> Vec<String> {
        let chars: Vec<char> = text.chars().collect();
        let mut start = 0;
        pattern
            .split(&chars)
            .into_iter()
            .map(|end| {
                let piece: String = chars[start..end].iter().collect();
                start = end;
                piece
            })
            .collect()
    }

    #[test]
    fn llama3_splits_words_digits_and_spaces() {
        let p = SplitPattern::Llama3 { max_digits: 3 };
        assert_eq!(pieces(p, "Hello world's 12345!!\n\n  x  "), ["Hello", " world", "'s", " ", "123", "45", "!!\n\n", " ", " x", "  "]);
        assert_eq!(pieces(p, "a \n b"), ["a", " \n", " b"]);
        assert_eq!(pieces(SplitPattern::Llama3 { max_digits: 1 }, "42"), ["4", "2"]);
    }

    #[test]
    fn gpt2_keeps_a_leading_space() {
        assert_eq!(pieces(SplitPattern::Gpt2, "Hi  there 42?"), ["Hi", " ", " there", " 42", "?"]);
    }
}
