//! The BPE model and the GPT-2 byte alphabet, with the semantics of HF tokenizers' `BPE`:
//! characters to ids, then repeatedly the lowest-ranked merge (leftmost among equal ranks).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// The GPT-2 byte-to-character table: printable Latin-1 bytes map to themselves, the others to
/// U+0100 onwards in byte order, so every byte string becomes printable text.
pub fn byte_chars() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..256u32 {
        let printable = (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        let cp = if printable {
            b
        } else {
            next += 1;
            next - 1
        };
        table[b as usize] = char::from_u32(cp).expect("byte alphabet");
    }
    table
}

pub struct Bpe {
    pub vocab: HashMap<String, u32>,
    /// (left id, right id) -> (rank, merged id)
    merges: HashMap<(u32, u32), (u32, u32)>,
    pub unk_token: Option<String>,
    pub fuse_unk: bool,
    pub byte_fallback: bool,
    pub ignore_merges: bool,
}

/// One token of a word: its id and the word characters it covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub id: u32,
    pub start: usize,
    pub end: usize,
}

#[derive(Clone, Copy)]
struct Symbol {
    id: u32,
    start: usize,
    end: usize,
    prev: Option<usize>,
    next: Option<usize>,
    alive: bool,
}

impl Bpe {
    /// `merges`: pairs of token strings in rank order; each pair's concatenation must be in `vocab`.
    pub fn new(vocab: HashMap<String, u32>, merges: &[(String, String)]) -> Result<Bpe, String> {
        let mut table = HashMap::with_capacity(merges.len());
        for (rank, (left, right)) in merges.iter().enumerate() {
            let id = |s: &str| vocab.get(s).copied().ok_or_else(|| format!("merges: {s:?} is not in the vocabulary"));
            let entry = (rank as u32, id(&format!("{left}{right}"))?);
            table.entry((id(left)?, id(right)?)).or_insert(entry);
        }
        Ok(Bpe { vocab, merges: table, unk_token: None, fuse_unk: false, byte_fallback: false, ignore_merges: false })
    }

    fn initial_symbols(&self, chars: &[char]) -> Vec<Symbol> {
        let mut symbols: Vec<Symbol> = Vec::with_capacity(chars.len());
        let mut unk: Option<Symbol> = None;
        let unk_id = self.unk_token.as_ref().and_then(|t| self.vocab.get(t).copied());
        let mut buf = String::new();
        for (i, &c) in chars.iter().enumerate() {
            buf.clear();
            buf.push(c);
            let symbol = |id| Symbol { id, start: i, end: i + 1, prev: None, next: None, alive: true };
            if let Some(&id) = self.vocab.get(buf.as_str()) {
                symbols.extend(unk.take());
                symbols.push(symbol(id));
                continue;
            }
            if self.byte_fallback {
                let ids: Option<Vec<u32>> =
                    c.to_string().bytes().map(|b| self.vocab.get(&format!("<0x{b:02X}>")).copied()).collect();
                if let Some(ids) = ids {
                    symbols.extend(ids.into_iter().map(symbol));
                    continue;
                }
            }
            if let Some(id) = unk_id {
                unk = match unk {
                    Some(mut open) if self.fuse_unk => {
                        open.end = i + 1;
                        Some(open)
                    }
                    previous => {
                        symbols.extend(previous);
                        Some(symbol(id))
                    }
                };
            }
            // Without an unknown token an out-of-vocabulary character is dropped, as HF does.
        }
        symbols.extend(unk);
        let n = symbols.len();
        for (k, s) in symbols.iter_mut().enumerate() {
            s.prev = k.checked_sub(1);
            s.next = if k + 1 < n { Some(k + 1) } else { None };
        }
        symbols
    }

    /// The tokens of one pre-tokenized word.
    pub fn tokenize(&self, chars: &[char]) -> Vec<Piece> {
        if chars.is_empty() {
            return Vec::new();
        }
        if self.ignore_merges {
            let word: String = chars.iter().collect();
            if let Some(&id) = self.vocab.get(&word) {
                return vec![Piece { id, start: 0, end: chars.len() }];
            }
        }
        let mut symbols = self.initial_symbols(chars);
        // Min-heap on (rank, position): the lowest rank first, the leftmost among equal ranks.
        let mut queue = BinaryHeap::new();
        let pair = |symbols: &[Symbol], left: usize| -> Option<(u32, u32)> {
            let right = symbols[left].next?;
            self.merges.get(&(symbols[left].id, symbols[right].id)).copied()
        };
        for pos in 0..symbols.len() {
            if let Some((rank, id)) = pair(&symbols, pos) {
                queue.push(Reverse((rank, pos, id)));
            }
        }
        while let Some(Reverse((_, pos, id))) = queue.pop() {
            // Skip entries made stale by earlier merges.
            if !symbols[pos].alive || pair(&symbols, pos).map(|(_, merged)| merged) != Some(id) {
                continue;
            }
            let right = symbols[pos].next.expect("a pair has a right symbol");
            let after = symbols[right].next;
            symbols[right].alive = false;
            let right_end = symbols[right].end;
            let left = &mut symbols[pos];
            left.id = id;
            left.end = right_end;
            left.next = after;
            if let Some(a) = after {
                symbols[a].prev = Some(pos);
            }
            if let Some(p) = symbols[pos].prev {
                if let Some((rank, merged)) = pair(&symbols, p) {
                    queue.push(Reverse((rank, p, merged)));
                }
            }
            if let Some((rank, merged)) = pair(&symbols, pos) {
                queue.push(Reverse((rank, pos, merged)));
            }
        }
        symbols.into_iter().filter(|s| s.alive).map(|s| Piece { id: s.id, start: s.start, end: s.end }).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toy() -> Bpe {
        let vocab: HashMap<String, u32> =
            ["a", "b", "c", "ab", "bc", "abc"].iter().enumerate().map(|(i, s)| (s.to_string(), i as u32)).collect();
        let merges = [("b", "c"), ("a", "b"), ("a", "bc")].map(|(l, r)| (l.to_string(), r.to_string()));
        Bpe::new(vocab, &merges).unwrap()
    }

    #[test]
    fn lowest_rank_first() {
        let bpe = toy();
        let ids: Vec<u32> = bpe.tokenize(&['a', 'b', 'c']).iter().map(|p| p.id).collect();
        assert_eq!(ids, [5]); // b+c (rank 0), then a+bc (rank 2)
        let ids: Vec<u32> = bpe.tokenize(&['a', 'b', 'a', 'b']).iter().map(|p| p.id).collect();
        assert_eq!(ids, [3, 3]);
    }

    #[test]
    fn byte_alphabet_is_a_bijection() {
        let table = byte_chars();
        assert_eq!(table[b'A' as usize], 'A');
        assert_eq!(table[b' ' as usize], '\u{120}'); // 'Ġ'
        assert_eq!(table[b'\n' as usize], '\u{10A}'); // 'Ċ'
        let mut sorted = table.to_vec();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 256);
    }
}
