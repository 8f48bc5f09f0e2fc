//! Reading `tokenizer.json` (and Qwen2's slow files) into a `Tokenizer`. Only configurations the
//! pipeline implements load; anything else fails with the JSON field that is not supported, so
//! a checkpoint never silently tokenizes differently from HF tokenizers.

use std::collections::HashMap;
use std::path::Path;

use serde_json::{Map, Value};

use super::added::{AddedToken, AddedVocab};
use super::bpe::{byte_chars, Bpe};
use super::pretokenize::{SplitPattern, GPT2_PATTERN, QWEN2_PATTERN};
use super::unicode;
use super::{PreStep, TemplatePiece, Tokenizer};

type Result<T> = std::result::Result<T, String>;

fn field<'a>(obj: &'a Value, name: &str, path: &str) -> Result<&'a Value> {
    obj.get(name).ok_or_else(|| format!("{path}.{name}: missing"))
}

fn flag(obj: &Value, name: &str, default: bool) -> bool {
    obj.get(name).and_then(Value::as_bool).unwrap_or(default)
}

fn kind<'a>(obj: &'a Value, path: &str) -> Result<&'a str> {
    field(obj, "type", path)?.as_str().ok_or_else(|| format!("{path}.type: not a string"))
}

/// The items of a Sequence's list field, each with its JSON path.
fn items<'a>(value: &'a Value, name: &str, path: &str) -> Result<Vec<(String, &'a Value)>> {
    let list = field(value, name, path)?.as_array().ok_or_else(|| format!("{path}.{name}: not a list"))?;
    Ok(list.iter().enumerate().map(|(i, item)| (format!("{path}.{name}[{i}]"), item)).collect())
}

fn unsupported(path: &str, what: &str) -> String {
    format!("{path}: {what} is not supported by the Rust tokenizer")
}

/// A tokenizer from the text of a `tokenizer.json`.
pub fn from_json(text: &str) -> Result<Tokenizer> {
    let root: Value = serde_json::from_str(text).map_err(|e| format!("tokenizer.json: {e}"))?;
    for name in ["truncation", "padding"] {
        if !root.get(name).map_or(true, Value::is_null) {
            return Err(unsupported(name, "a non-null setting"));
        }
    }
    let nfc = normalizer(root.get("normalizer").unwrap_or(&Value::Null), "normalizer")?;
    let mut pre = Vec::new();
    pre_tokenizer(root.get("pre_tokenizer").unwrap_or(&Value::Null), "pre_tokenizer", &mut pre)?;
    if pre.iter().rev().skip(1).any(|s| matches!(s, PreStep::ByteLevel { .. })) {
        return Err(unsupported("pre_tokenizer", "a step after ByteLevel"));
    }
    let bpe = model(field(&root, "model", "tokenizer")?)?;
    let tokens = added_tokens(root.get("added_tokens").unwrap_or(&Value::Null))?;
    let mut tok = Tokenizer { nfc, pre, bpe, added: AddedVocab::new(Vec::new(), |s| s.to_string()), template: None,
                              trim_offsets: None, byte_chars: byte_chars() };
    post_processor(root.get("post_processor").unwrap_or(&Value::Null), "post_processor", &mut tok)?;
    tok.added = AddedVocab::new(tokens, |s| normalize_content(nfc, s));
    Ok(tok)
}

fn normalize_content(nfc: bool, s: &str) -> String {
    if nfc {
        unicode::nfc_aligned(s, 0).into_iter().map(|a| a.c).collect()
    } else {
        s.to_string()
    }
}

/// Whether text is NFC-normalised (null: no normaliser).
fn normalizer(value: &Value, path: &str) -> Result<bool> {
    if value.is_null() {
        return Ok(false);
    }
    match kind(value, path)? {
        "NFC" => Ok(true),
        "Sequence" => {
            let mut nfc = false;
            for (at, item) in items(value, "normalizers", path)? {
                nfc |= normalizer(item, &at)?;
            }
            Ok(nfc)
        }
        other => Err(unsupported(path, &format!("normalizer type {other:?}"))),
    }
}

fn pre_tokenizer(value: &Value, path: &str, steps: &mut Vec<PreStep>) -> Result<()> {
    if value.is_null() {
        return Ok(());
    }
    match kind(value, path)? {
        "Sequence" => {
            for (at, item) in items(value, "pretokenizers", path)? {
                pre_tokenizer(item, &at, steps)?;
            }
        }
        "Split" => {
            let behavior = value.get("behavior").and_then(Value::as_str).unwrap_or("");
            if behavior != "Isolated" || flag(value, "invert", false) {
                return Err(unsupported(path, &format!("Split with behavior {behavior:?} / invert")));
            }
            let regex = field(value, "pattern", path)?.get("Regex").and_then(Value::as_str)
                .ok_or_else(|| unsupported(&format!("{path}.pattern"), "a non-regex pattern"))?;
            let pattern = SplitPattern::from_regex(regex).ok_or_else(|| {
                unsupported(&format!("{path}.pattern"), &format!("the regex {regex:?} (known: Llama-3, Qwen2, GPT-2)"))
            })?;
            steps.push(PreStep::Split(pattern));
        }
        "ByteLevel" => {
            let split = if flag(value, "use_regex", true) { SplitPattern::from_regex(GPT2_PATTERN) } else { None };
            steps.push(PreStep::ByteLevel { add_prefix_space: flag(value, "add_prefix_space", true), split });
        }
        other => return Err(unsupported(path, &format!("pre-tokenizer type {other:?}"))),
    }
    Ok(())
}

fn model(value: &Value) -> Result<Bpe> {
    let path = "model";
    if value.get("type").and_then(Value::as_str).unwrap_or("BPE") != "BPE" {
        return Err(unsupported(path, "a model other than BPE"));
    }
    for name in ["dropout", "continuing_subword_prefix", "end_of_word_suffix"] {
        if !value.get(name).map_or(true, Value::is_null) {
            return Err(unsupported(&format!("{path}.{name}"), "a non-null value"));
        }
    }
    let vocab = vocab_map(field(value, "vocab", path)?, "model.vocab")?;
    let merges = field(value, "merges", path)?.as_array().ok_or("model.merges: not a list")?;
    let merges: Vec<(String, String)> = merges.iter().map(merge_pair).collect::<Result<_>>()?;
    let mut bpe = Bpe::new(vocab, &merges)?;
    bpe.unk_token = value.get("unk_token").and_then(Value::as_str).map(str::to_string);
    bpe.fuse_unk = flag(value, "fuse_unk", false);
    bpe.byte_fallback = flag(value, "byte_fallback", false);
    bpe.ignore_merges = flag(value, "ignore_merges", false);
    Ok(bpe)
}

fn vocab_map(value: &Value, path: &str) -> Result<HashMap<String, u32>> {
    let obj: &Map<String, Value> = value.as_object().ok_or_else(|| format!("{path}: not an object"))?;
    obj.iter()
        .map(|(k, v)| v.as_u64().map(|id| (k.clone(), id as u32)).ok_or_else(|| format!("{path}[{k:?}]: not an id")))
        .collect()
}

/// A merge as "left right" (older files) or ["left", "right"].
fn merge_pair(value: &Value) -> Result<(String, String)> {
    if let Some(text) = value.as_str() {
        let mut parts = text.splitn(2, ' ');
        if let (Some(l), Some(r)) = (parts.next(), parts.next()) {
            return Ok((l.to_string(), r.to_string()));
        }
    }
    if let Some([l, r]) = value.as_array().map(Vec::as_slice) {
        if let (Some(l), Some(r)) = (l.as_str(), r.as_str()) {
            return Ok((l.to_string(), r.to_string()));
        }
    }
    Err(format!("model.merges: {value} is not a pair"))
}

fn added_tokens(value: &Value) -> Result<Vec<AddedToken>> {
    let mut tokens = Vec::new();
    for (i, item) in value.as_array().into_iter().flatten().enumerate() {
        let path = format!("added_tokens[{i}]");
        let id = field(item, "id", &path)?.as_u64().ok_or_else(|| format!("{path}.id: not an id"))? as u32;
        let content = field(item, "content", &path)?.as_str().ok_or_else(|| format!("{path}.content: not text"))?;
        let special = flag(item, "special", false);
        tokens.push(AddedToken {
            id, content: content.to_string(), single_word: flag(item, "single_word", false),
            lstrip: flag(item, "lstrip", false), rstrip: flag(item, "rstrip", false),
            normalized: flag(item, "normalized", !special), special,
        });
    }
    Ok(tokens)
}

fn post_processor(value: &Value, path: &str, tok: &mut Tokenizer) -> Result<()> {
    if value.is_null() {
        return Ok(());
    }
    match kind(value, path)? {
        "Sequence" => {
            for (at, item) in items(value, "processors", path)? {
                post_processor(item, &at, tok)?;
            }
        }
        "ByteLevel" => {
            if flag(value, "trim_offsets", true) {
                tok.trim_offsets = Some(flag(value, "add_prefix_space", true));
            }
        }
        "TemplateProcessing" => tok.template = Some(template(value, path)?),
        other => return Err(unsupported(path, &format!("post-processor type {other:?}"))),
    }
    Ok(())
}

fn template(value: &Value, path: &str) -> Result<Vec<TemplatePiece>> {
    let specials = field(value, "special_tokens", path)?;
    let mut pieces = Vec::new();
    for (at, item) in items(value, "single", path)? {
        if let Some(special) = item.get("SpecialToken") {
            let name = field(special, "id", &at)?.as_str().unwrap_or_default();
            let entry = specials.get(name).ok_or_else(|| format!("{at}: {name:?} is not in special_tokens"))?;
            let ids = field(entry, "ids", &at)?.as_array().into_iter().flatten().filter_map(Value::as_u64);
            pieces.push(TemplatePiece::Special(ids.map(|id| id as u32).collect()));
        } else if item.get("Sequence").and_then(|s| s.get("id")).and_then(Value::as_str) == Some("A") {
            pieces.push(TemplatePiece::Sequence);
        } else {
            return Err(unsupported(&at, "a template piece other than a special token or sequence A"));
        }
    }
    Ok(pieces)
}

/// A Qwen2 tokenizer from its slow files (`vocab.json`, `merges.txt`, `tokenizer_config.json`), as
/// vox_serve.models.tokenizers.qwen2 (and transformers' converter) assembles it: NFC, the Qwen2
/// split regex, byte-level BPE, and the config's added tokens as special, unnormalised tokens.
pub fn from_qwen2_files(dir: &Path) -> Result<Tokenizer> {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).map_err(|e| format!("{}: {e}", dir.join(name).display()));
    let vocab_value: Value = serde_json::from_str(&read("vocab.json")?).map_err(|e| format!("vocab.json: {e}"))?;
    let mut vocab = vocab_map(&vocab_value, "vocab.json")?;
    let merges: Vec<(String, String)> = read("merges.txt")?
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with("#version"))
        .map(|l| merge_pair(&Value::String(l.to_string())))
        .collect::<Result<_>>()?;
    let mut tokens = Vec::new();
    if dir.join("tokenizer_config.json").exists() {
        let config: Value = serde_json::from_str(&read("tokenizer_config.json")?).map_err(|e| format!("tokenizer_config.json: {e}"))?;
        for (id, entry) in config.get("added_tokens_decoder").and_then(Value::as_object).into_iter().flatten() {
            let id: u32 = id.parse().map_err(|_| format!("tokenizer_config.json: added token id {id:?}"))?;
            let content = entry.get("content").and_then(Value::as_str).ok_or("tokenizer_config.json: added token content")?;
            tokens.push(AddedToken { id, content: content.to_string(), single_word: false, lstrip: false, rstrip: false,
                                     normalized: false, special: true });
        }
    }
    tokens.sort_by_key(|t| t.id);
    // As `_assemble`: the added tokens' ids replace the vocabulary's entries of the same text.
    for t in &tokens {
        vocab.insert(t.content.clone(), t.id);
    }
    let bpe = Bpe::new(vocab, &merges)?;
    let split = SplitPattern::from_regex(QWEN2_PATTERN).expect("the Qwen2 pattern is known");
    Ok(Tokenizer {
        nfc: true, pre: vec![PreStep::Split(split), PreStep::ByteLevel { add_prefix_space: false, split: None }],
        bpe, added: AddedVocab::new(tokens, |s| s.to_string()), template: None, trim_offsets: None,
        byte_chars: byte_chars(),
    })
}
