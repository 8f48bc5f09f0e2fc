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

/// One normalised character and the range of original characters it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Aligned {
    pub c: char,
    pub start: usize,
    pub end: usize,
}

fn decompose_into(c: char, source: usize, out: &mut Vec<Aligned>) {
    let cp = c as u32;
    let push = |out: &mut Vec<Aligned>, cp: u32| {
        out.push(Aligned { c: char::from_u32(cp).unwrap_or(c), start: source, end: source + 1 })
    };
    if (HANGUL_S..HANGUL_S + HANGUL_COUNT).contains(&cp) {
        let s = cp - HANGUL_S;
        push(out, HANGUL_L + s / HANGUL_N);
        push(out, HANGUL_V + (s % HANGUL_N) / HANGUL_T_COUNT);
        if s % HANGUL_T_COUNT != 0 {
            push(out, HANGUL_T + s % HANGUL_T_COUNT);
        }
        return;
    }
    match tables::DECOMPOSITION.binary_search_by_key(&cp, |&(k, _, _)| k) {
        Ok(i) => {
            let (_, first, second) = tables::DECOMPOSITION[i];
            decompose_into(char::from_u32(first).unwrap_or(c), source, out);
            if second != 0 {
                decompose_into(char::from_u32(second).unwrap_or(c), source, out);
            }
        }
        Err(_) => out.push(Aligned { c, start: source, end: source + 1 }),
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

/// NFC of `chars` (indices into the original text start at `base`), each output character with
/// the original range it came from: a composed character spans its parts.
pub fn nfc_aligned(text: &str, base: usize) -> Vec<Aligned> {
    let mut seq = Vec::with_capacity(text.len());
    for (i, c) in text.chars().enumerate() {
        decompose_into(c, base + i, &mut seq);
    }
    reorder(&mut seq);
    compose(seq)
}

/// Canonical ordering: stable sort of every run of non-starters by combining class.
fn reorder(seq: &mut [Aligned]) {
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

/// Canonical composition (UAX #15): each character joins the last starter unless blocked.
fn compose(seq: Vec<Aligned>) -> Vec<Aligned> {
    let mut out: Vec<Aligned> = Vec::with_capacity(seq.len());
    let mut starter: Option<usize> = None;
    let mut last_ccc: i32 = -1;
    for item in seq {
        let class = ccc(item.c) as i32;
        if let Some(s) = starter {
            let blocked = last_ccc != -1 && (last_ccc == 0 || last_ccc >= class);
            if !blocked {
                if let Some(composite) = compose_pair(out[s].c, item.c) {
                    let head = &mut out[s];
                    head.c = composite;
                    head.start = head.start.min(item.start);
                    head.end = head.end.max(item.end);
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
        let aligned = nfc_aligned("ae\u{301}", 5);
        assert_eq!(aligned[1], Aligned { c: '\u{e9}', start: 6, end: 8 });
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
