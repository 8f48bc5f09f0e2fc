//! Character classes of the pre-tokenizer regexes and NFC normalisation, from the tables that
//! rust/scripts/gen_unicode_tables.py generates out of Python's unicodedata.

use super::unicode_tables as tables;

fn in_ranges(ranges: &[(u32, u32)], cp: u32) -> bool {
    ranges
        .binary_search_by(|&(lo, hi)| {
            if hi < cp {
                std::cmp::Ordering::Less
            } else if lo > cp {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_ok()
}

/// `\p{L}`
pub fn is_letter(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_alphabetic();
    }
    in_ranges(tables::LETTER, c as u32)
}

/// `\p{N}`
pub fn is_number(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_digit();
    }
    in_ranges(tables::NUMBER, c as u32)
}

/// `\s` (Unicode White_Space).
pub fn is_space(c: char) -> bool {
    if c.is_ascii() {
        return matches!(c, ' ' | '\t' | '\n' | '\x0B' | '\x0C' | '\r');
    }
    in_ranges(tables::WHITE_SPACE, c as u32)
}

/// `\w` as the Rust regex crate defines it, close enough for added tokens' `single_word`.
pub fn is_word(c: char) -> bool {
    is_letter(c)
        || is_number(c)
        || c == '\u{200C}'
        || c == '\u{200D}'
        || in_ranges(tables::MARK, c as u32)
        || in_ranges(tables::CONNECTOR, c as u32)
}

fn ccc(c: char) -> u8 {
    let cp = c as u32;
    if cp < 0x300 {
        return 0;
    }
    match tables::CCC.binary_search_by_key(&cp, |&(k, _)| k) {
        Ok(i) => tables::CCC[i].1,
        Err(_) => 0,
    }
}

const HANGUL_S: u32 = 0xAC00;
const HANGUL_L: u32 = 0x1100;
const HANGUL_V: u32 = 0x1161;
const HANGUL_T: u32 = 0x11A7;
const HANGUL_V_COUNT: u32 = 21;
const HANGUL_T_COUNT: u32 = 28;
const HANGUL_N: u32 = HANGUL_V_COUNT * HANGUL_T_COUNT;
const HANGUL_COUNT: u32 = 19 * HANGUL_N;

/// One normalised character and the range of original characters it is aligned to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Aligned {
    pub c: char,
    pub start: usize,
    pub end: usize,
}

/// A character of the normalisation in progress and its change in length, as HF tokenizers'
/// `unicode-normalization-alignments` counts it: 0 replaces one original character, +1 is
/// inserted (a decomposition's further characters), -n also consumes n more originals.
#[derive(Debug, Clone, Copy)]
struct Changed {
    c: char,
    change: isize,
}

fn decompose_into(c: char, first: bool, out: &mut Vec<Changed>) {
    let cp = c as u32;
    let mut push = |cp: u32, first: bool| {
        out.push(Changed { c: char::from_u32(cp).unwrap_or(c), change: if first { 0 } else { 1 } })
    };
    if (HANGUL_S..HANGUL_S + HANGUL_COUNT).contains(&cp) {
        let s = cp - HANGUL_S;
        push(HANGUL_L + s / HANGUL_N, first);
        push(HANGUL_V + (s % HANGUL_N) / HANGUL_T_COUNT, false);
        if s % HANGUL_T_COUNT != 0 {
            push(HANGUL_T + s % HANGUL_T_COUNT, false);
        }
        return;
    }
    match tables::DECOMPOSITION.binary_search_by_key(&cp, |&(k, _, _)| k) {
        Ok(i) => {
            let (_, head, tail) = tables::DECOMPOSITION[i];
            decompose_into(char::from_u32(head).unwrap_or(c), first, out);
            if tail != 0 {
                decompose_into(char::from_u32(tail).unwrap_or(c), false, out);
            }
        }
        Err(_) => push(cp, first),
    }
}

fn compose_pair(first: char, second: char) -> Option<char> {
    let (a, b) = (first as u32, second as u32);
    if (HANGUL_L..HANGUL_L + 19).contains(&a) && (HANGUL_V..HANGUL_V + HANGUL_V_COUNT).contains(&b) {
        return char::from_u32(HANGUL_S + ((a - HANGUL_L) * HANGUL_V_COUNT + (b - HANGUL_V)) * HANGUL_T_COUNT);
    }
    let lv = a.wrapping_sub(HANGUL_S);
    if a >= HANGUL_S && lv < HANGUL_COUNT && lv % HANGUL_T_COUNT == 0 && b > HANGUL_T && b < HANGUL_T + HANGUL_T_COUNT {
        return char::from_u32(a + (b - HANGUL_T));
    }
    tables::COMPOSITION
        .binary_search_by_key(&(a, b), |&(x, y, _)| (x, y))
        .ok()
        .and_then(|i| char::from_u32(tables::COMPOSITION[i].2))
}

/// Whether NFC leaves `text` unchanged for certain without computing it (every character below
/// U+0300 is a starter that nothing before it composes with).
pub fn is_nfc_quick(text: &str) -> bool {
    text.chars().all(|c| (c as u32) < 0x300)
}

/// NFC of `text`, whose first character is original character `base`, each output character
/// aligned as HF tokenizers aligns it: by position in the original, counting the changes.
pub fn nfc_aligned(text: &str, base: usize) -> Vec<Aligned> {
    let mut seq = Vec::with_capacity(text.len());
    for c in text.chars() {
        decompose_into(c, true, &mut seq);
    }
    reorder(&mut seq);
    let mut offset = 0usize;
    let mut out = Vec::with_capacity(seq.len());
    for Changed { c, change } in compose(seq) {
        let at = if change > 0 { offset.saturating_sub(1) } else { offset };
        out.push(Aligned { c, start: base + at, end: base + at + 1 });
        if change <= 0 {
            offset += 1 + change.unsigned_abs();
        }
    }
    out
}

/// Canonical ordering: stable sort of every run of non-starters by combining class.
fn reorder(seq: &mut [Changed]) {
    let mut i = 0;
    while i < seq.len() {
        if ccc(seq[i].c) == 0 {
            i += 1;
            continue;
        }
        let start = i;
        while i < seq.len() && ccc(seq[i].c) != 0 {
            i += 1;
        }
        seq[start..i].sort_by_key(|a| ccc(a.c));
    }
}

/// Canonical composition (UAX #15): each character joins the last starter unless blocked; a
/// composite's change is its parts' changes minus one.
fn compose(seq: Vec<Changed>) -> Vec<Changed> {
    let mut out: Vec<Changed> = Vec::with_capacity(seq.len());
    let mut starter: Option<usize> = None;
    let mut last_ccc: i32 = -1;
    for item in seq {
        let class = ccc(item.c) as i32;
        if let Some(s) = starter {
            let blocked = last_ccc != -1 && (last_ccc == 0 || last_ccc >= class);
            if !blocked {
                if let Some(composite) = compose_pair(out[s].c, item.c) {
                    out[s] = Changed { c: composite, change: out[s].change + item.change - 1 };
                    continue;
                }
            }
        }
        if class == 0 {
            starter = Some(out.len());
            last_ccc = -1;
        } else {
            last_ccc = class;
        }
        out.push(item);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nfc(text: &str) -> String {
        nfc_aligned(text, 0).into_iter().map(|a| a.c).collect()
    }

    #[test]
    fn composes_decomposed_latin_and_hangul() {
        assert_eq!(nfc("e\u{301}"), "\u{e9}");
        assert_eq!(nfc("\u{1100}\u{1161}\u{11A8}"), "\u{AC01}");
        assert_eq!(nfc("\u{212B}"), "\u{C5}"); // singleton decomposition (Angstrom sign)
        let aligned = nfc_aligned("ae\u{301}b", 5);
        assert_eq!(aligned[1], Aligned { c: '\u{e9}', start: 6, end: 7 });
        assert_eq!(aligned[2], Aligned { c: 'b', start: 8, end: 9 });
    }

    #[test]
    fn reorders_marks_and_respects_blocking() {
        // dot below (220) sorts before acute (230); acute then composes with the dot-below form.
        assert_eq!(nfc("a\u{301}\u{323}"), nfc("a\u{323}\u{301}"));
        assert!(is_nfc_quick("plain ascii"));
        assert!(!is_nfc_quick("e\u{301}"));
    }

    #[test]
    fn classes() {
        assert!(is_letter('é') && is_letter('漢') && !is_letter('1'));
        assert!(is_number('٣') && is_number('½') && !is_number('a'));
        assert!(is_space('\u{3000}') && is_space('\u{85}') && !is_space('\u{1C}'));
    }
}
