"""The Rust tokenizer (`_rt.Tokenizer`) gives HF tokenizers' ids, word ids and offsets.

Checked on tokenizer.json files built here with `tokenizers` in the configurations our checkpoints
use (Llama-3's split regex with ignore_merges and a BOS template, Qwen2's with NFC, GPT-2's
ByteLevel regex), on the tiny models' tokenizers, on a corpus of unicode, numbers, punctuation and
whitespace runs, and on every Unicode code point.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest
import unicodedata2 as unicodedata  # the Unicode version the tables are generated from (16.0)
from rust_helpers import require_rt
from tokenizer_helpers import BUILDERS, CORPUS
from tokenizers import Tokenizer

from vox_serve.models.tokenizers.qwen2 import load_qwen2_tokenizer, save_tokenizer_files, tiny_qwen2_tokenizer
from vox_serve.models.tokenizers.user_text import for_user_text


@pytest.fixture(scope="module")
def tokenizers() -> dict[str, tuple[Tokenizer, object]]:
    rt = require_rt()
    built = {name: build() for name, build in BUILDERS.items()}
    return {name: (hf, rt.Tokenizer.from_str(hf.to_str())) for name, hf in built.items()}


def _assert_same(hf: Tokenizer, rs: object, text: str, add_special_tokens: bool = True) -> None:
    want = hf.encode(text, add_special_tokens=add_special_tokens)
    ids, word_ids, offsets = rs.encode_full(text, add_special_tokens)
    assert ids == want.ids, text
    assert word_ids == want.word_ids, text
    assert offsets == [tuple(o) for o in want.offsets], text


@pytest.mark.parametrize("name", list(BUILDERS))
def test_corpus_matches_hf(tokenizers: dict, name: str) -> None:
    hf, rs = tokenizers[name]
    for text in CORPUS:
        _assert_same(hf, rs, text)
        assert rs.encode(text, False) == hf.encode(text, add_special_tokens=False).ids
    assert rs.vocab_size == hf.get_vocab_size()


@pytest.mark.parametrize("name", list(BUILDERS))
def test_user_text_reads_special_token_strings_as_text_as_hf_does(name: str) -> None:
    """`encode_user_text` equals HF with `encode_special_tokens` (tokenizers/user_text.py), and the corpus
    has special-token strings it reads differently from a plain encode."""
    hf = for_user_text(BUILDERS[name]())
    rs = require_rt().Tokenizer.from_str(hf.to_str())
    differs = 0
    for text in CORPUS:
        want = hf.encode(text)
        ids, word_ids, offsets = rs.encode_user_text(text)
        assert (ids, word_ids, offsets) == (want.ids, want.word_ids, [tuple(o) for o in want.offsets]), text
        differs += ids != rs.encode(text)
    assert differs or name == "orpheus_tiny"  # the tiny byte-level tokenizer has no special-token strings


@pytest.mark.parametrize("name", ["llama3", "qwen2"])
def test_random_mixtures_match_hf(tokenizers: dict, name: str) -> None:
    """Random concatenations of corpus fragments, so pieces meet at every kind of boundary."""
    hf, rs = tokenizers[name]
    gen = random.Random(name)
    fragments = [t[i:i + n] for t in CORPUS for i in range(0, len(t), 7) for n in (3, 11)]
    for _ in range(300):
        _assert_same(hf, rs, "".join(gen.choice(fragments) for _ in range(gen.randint(1, 12))))


def _all_code_points() -> list[str]:
    return [chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF]


def _class_samples() -> list[str]:
    """Every assigned code point outside private use, and every 64th of the others."""
    return [c for i, c in enumerate(_all_code_points()) if unicodedata.category(c) not in ("Cn", "Co") or i % 64 == 0]


@pytest.mark.parametrize("name", ["llama3", "qwen2"])
def test_every_code_point_matches_hf(tokenizers: dict, name: str) -> None:
    r"""Each code point between letters and between spaces (which tell \p{L}, \p{N}, \s and the rest
    apart): the regex classes and NFC agree with HF's (Oniguruma's Unicode 16 tables)."""
    hf, rs = tokenizers[name]
    chars = _class_samples()
    for context in ("a{}b", " {} "):
        for start in range(0, len(chars), 4096):
            block = chars[start:start + 4096]
            text = "".join(context.format(c) for c in block)
            want = hf.encode(text)
            got_ids, got_words, got_offsets = rs.encode_full(text)
            if got_ids != want.ids or got_words != want.word_ids:
                bad = [c for c in block
                       if rs.encode_full(context.format(c))[1] != hf.encode(context.format(c)).word_ids]
                pytest.fail(f"{len(bad)} code points split differently in {context!r}, e.g. "
                            f"{[f'U+{ord(c):04X}' for c in bad[:10]]}")
            assert got_offsets == [tuple(o) for o in want.offsets]


def test_nfc_equals_unicodedata() -> None:
    """NFC from the generated tables equals unicodedata's (the version they were generated from)."""
    rt = require_rt()
    assert rt.UNICODE_VERSION == unicodedata.unidata_version
    chars = _all_code_points()
    for start in range(0, len(chars), 8192):
        block = "".join(chars[start:start + 8192])
        assert rt.nfc(block) == unicodedata.normalize("NFC", block)
    # Starters followed by runs of combining marks in random order (reordering and blocking).
    marks = [c for c in chars if unicodedata.combining(c)]
    starters = "aeiouAEIOUnNcCsSzZ\u1100\u1161\u11a8\uac00\u0915\u05d0"
    gen = random.Random(0)
    for _ in range(2000):
        text = "".join(gen.choice(starters) + "".join(gen.choice(marks) for _ in range(gen.randint(0, 4)))
                       for _ in range(4))
        assert rt.nfc(text) == unicodedata.normalize("NFC", text), [hex(ord(c)) for c in text]


def test_slow_qwen2_files_match_the_python_loader(tmp_path: Path) -> None:
    rt = require_rt()
    save_tokenizer_files(tiny_qwen2_tokenizer(contiguous_specials=True), tmp_path, fast=False)
    want = load_qwen2_tokenizer(tmp_path)
    got = rt.Tokenizer.from_qwen2_files(str(tmp_path))
    for text in CORPUS:
        assert got.encode(text) == want.encode(text).ids, text


def test_from_file_and_token_ids(tmp_path: Path, tokenizers: dict) -> None:
    rt = require_rt()
    hf, _ = tokenizers["llama3"]
    hf.save(str(tmp_path / "tokenizer.json"))
    tok = rt.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert tok.encode("Hello world") == hf.encode("Hello world").ids
    assert tok.token_to_id("<|im_end|>") == hf.token_to_id("<|im_end|>")
    with pytest.raises(ValueError, match="no-such"):
        rt.Tokenizer.from_file(str(tmp_path / "no-such.json"))


def _with(spec: dict, path: list[str], value: object) -> str:
    spec = json.loads(json.dumps(spec))
    node = spec
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return json.dumps(spec)


@pytest.mark.parametrize("path,value,field", [
    (["normalizer"], {"type": "Lowercase"}, "normalizer"),
    (["pre_tokenizer", "pretokenizers", 0, "pattern"], {"Regex": r"\w+"}, "pattern"),
    (["pre_tokenizer", "pretokenizers", 0, "behavior"], "Removed", r"pretokenizers\[0\]"),
    (["model", "type"], "WordPiece", "model"),
    (["model", "dropout"], 0.1, "model.dropout"),
    (["post_processor"], {"type": "BertProcessing", "sep": ["[SEP]", 1], "cls": ["[CLS]", 0]}, "post_processor"),
    (["truncation"], {"max_length": 8, "strategy": "LongestFirst", "stride": 0, "direction": "Right"}, "truncation"),
])
def test_unsupported_configurations_are_refused(tokenizers: dict, path: list, value: object, field: str) -> None:
    rt = require_rt()
    spec = json.loads(tokenizers["qwen2"][0].to_str())
    with pytest.raises(ValueError, match=rf"{field}.*not supported"):
        rt.Tokenizer.from_str(_with(spec, path, value))
