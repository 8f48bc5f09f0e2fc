"""The Rust prompt builders (`_rt.PromptBuilder`) give the Python builders' rows and errors.

Orpheus against `OrpheusProgram.preprocess`; Qwen3-TTS against vox_serve/models/qwen3_tts/prompt.py,
stream.py and clone.py, for every variant's config (CustomVoice 1.7B / 0.6B, VoiceDesign, Base, tiny),
on the tiny models' tokenizers and a tokenizer trained with the Qwen2 / Llama-3 configurations.
"""

from __future__ import annotations

import itertools
import json
import random
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from rust_helpers import require_rt
from tokenizer_helpers import BUILDERS, CORPUS

from vox_serve.core.request import Prompt
from vox_serve.models.orpheus.program import OrpheusProgram, orpheus_meta
from vox_serve.models.qwen3_tts import clone as py_clone
from vox_serve.models.qwen3_tts import prompt as py_prompt
from vox_serve.models.qwen3_tts import stream as py_stream
from vox_serve.models.qwen3_tts.loader import QWEN3_TTS_TINY_BASE_CONFIG, QWEN3_TTS_TINY_CONFIG, dummy_config
from vox_serve.models.registry import BuildArgs, build_program
from vox_serve.models.tokenizers.user_text import for_user_text
from vox_serve.request_builder import FieldError

TEXTS = CORPUS + ["assistant", "Hello test is the"]
QWEN3_CONFIGS = {
    "custom_voice_1b7": dummy_config("Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice"),
    "custom_voice_0b6": dummy_config("Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"),
    "voice_design": dummy_config("Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign"),
    "base": dummy_config("Qwen/Qwen3-TTS-12Hz-1.7B-Base"),
    "tiny": QWEN3_TTS_TINY_CONFIG,
    "tiny_base": QWEN3_TTS_TINY_BASE_CONFIG,
}


def _rows(result: Any) -> Any:
    """A program's Prompt as the Rust builders return it: its id rows (these prompts have nothing else)."""
    if not isinstance(result, Prompt):
        return result
    assert not result.vectors and not result.conditioning
    return result.ids.tolist()


def _outcome(build: Any, *args: Any) -> tuple[str, Any]:
    """('ok', result) or ('error', None) for `build(*args)`: both sides must agree on which."""
    try:
        return "ok", _rows(build(*args))
    except ValueError:
        return "error", None


def _rust(hf_tokenizer: Any) -> Any:
    return require_rt().Tokenizer.from_str(hf_tokenizer.to_str())


@pytest.mark.parametrize("tokenizer", ["orpheus_tiny", "llama3"])
def test_orpheus_prompts_match_preprocess(tokenizer: str) -> None:
    rt = require_rt()
    hf = for_user_text(BUILDERS[tokenizer]())  # as the Orpheus loader sets it
    meta = orpheus_meta("orpheus-tiny", 2048, True)
    program = SimpleNamespace(tokenizer=hf, meta=meta)
    builder = rt.PromptBuilder.orpheus(_rust(hf), list(meta.voices), meta.default_voice)
    outcomes = []
    for text, voice in itertools.product(TEXTS, [None, "", "tara", "zoe", "nobody"]):
        fields = {"text": text, "voice": voice}
        want = _outcome(OrpheusProgram.preprocess, program, fields)
        assert _outcome(builder.build, fields) == want, fields
        assert _outcome(rt.build_prompt, builder, fields) == want
        outcomes.append(want[0])
    assert outcomes.count("ok") == 4 * len(TEXTS) and outcomes.count("error") == len(TEXTS)


def _qwen3_fields(ids: py_prompt.PromptIds) -> list[dict[str, Any]]:
    voices = [None, "", *list(ids.speakers)[:3], "Eric", "nobody"]
    languages = [None, "auto", "English", "chinese", "klingon"]
    instructs = [None, "", "Speak slowly, with warmth."]
    gen = random.Random(0)
    combos = list(itertools.product(voices, languages, instructs))
    return [{"text": gen.choice(TEXTS), "voice": v, "language": lang, "instruct": i} for v, lang, i in combos]


@pytest.mark.parametrize("tokenizer", ["tiny_qwen2", "qwen2"])
@pytest.mark.parametrize("variant", ["custom_voice_1b7", "custom_voice_0b6", "voice_design", "tiny"])
def test_qwen3_prompts_match_build_prompt(variant: str, tokenizer: str) -> None:
    rt = require_rt()
    cfg = QWEN3_CONFIGS[variant]
    hf = BUILDERS[tokenizer]()
    ids = py_prompt.PromptIds.from_config(cfg)
    builder = rt.PromptBuilder.qwen3_tts(_rust(hf), json.dumps(cfg))
    default_voice = next(iter(ids.speakers), None) if ids.takes_speaker else None
    outcomes = []
    for fields in _qwen3_fields(ids):
        request = (fields["voice"] or default_voice, fields["language"], fields["instruct"])
        want = _outcome(py_prompt.build_prompt, hf, ids, fields["text"], *request)
        assert _outcome(builder.build, fields) == want, fields
        outcomes.append(want[0])
        for first_text_id in (0, 151672):
            want = _outcome(py_stream.streaming_prompt, hf, ids, first_text_id, *request)
            got = _outcome(builder.streaming_prompt, fields, first_text_id)
            assert (got[0], got[1][0] if got[1] else None) == want, fields
    assert "ok" in outcomes and "error" in outcomes


def _clone_fields() -> list[dict[str, Any]]:
    cases = []
    for ref_text, x_vector, audio, extra in itertools.product(
            [None, "", "The reference transcript, 42 words."], [None, True, False], [b"RIFF", b""],
            [{}, {"voice": "ryan"}, {"instruct": "calm"}]):
        fields = {"text": "Clone this voice, please.", "audio": audio, "ref_text": ref_text, "language": "english",
                  **extra}
        if x_vector is not None:
            fields["x_vector_only_mode"] = x_vector
        cases.append(fields)
    return cases


@pytest.mark.parametrize("variant", ["base", "tiny_base"])
def test_qwen3_clone_prompts_match(variant: str) -> None:
    rt = require_rt()
    cfg = QWEN3_CONFIGS[variant]
    hf = BUILDERS["tiny_qwen2"]()
    ids = py_prompt.PromptIds.from_config(cfg)
    builder = rt.PromptBuilder.qwen3_tts(_rust(hf), json.dumps(cfg))
    gen = torch.Generator().manual_seed(0)
    ref_codes = torch.randint(0, 2048, (7, ids.num_code_groups), generator=gen).tolist()

    def python_clone(fields: dict[str, Any]) -> tuple[list[list[int]], int]:
        x_vector_only = py_clone.clone_mode(fields)
        return py_prompt.build_clone_prompt(hf, ids, fields["text"], fields.get("language"),
                                            None if x_vector_only else fields["ref_text"],
                                            None if x_vector_only else ref_codes)

    def python_streaming(fields: dict[str, Any]) -> tuple[list[list[int]], int]:
        py_clone.check_streaming_fields(fields)
        if not py_clone.clone_mode(fields):  # the Rust builder streams x-vector-only clones; it refuses the others
            raise FieldError("ref_text", "an in-context streaming prompt is built in Python only")
        rows, speaker_row, _ = py_stream.clone_streaming_layout(hf, ids, [151672], fields.get("language"))
        return rows, speaker_row

    modes = []
    for fields in _clone_fields():
        mode = _outcome(py_clone.clone_mode, fields)
        assert _outcome(builder.clone_mode, fields) == mode, fields
        assert _outcome(builder.build_clone, fields, ref_codes) == _outcome(python_clone, fields), fields
        assert _outcome(builder.streaming_prompt, fields, 151672) == _outcome(python_streaming, fields), fields
        modes.append(mode)
    assert {("ok", True), ("ok", False), ("error", None)} <= set(modes)  # x-vector, in-context and refused
    with pytest.raises(ValueError, match="build_clone"):
        builder.build({"text": "a Base prompt needs its reference"})
    assert issubclass(FieldError, ValueError)


def _pieces(text: str, gen: random.Random) -> list[str]:
    cuts = sorted(gen.sample(range(1, len(text)), min(len(text) - 1, gen.randint(0, 8)))) if len(text) > 1 else []
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


@pytest.mark.parametrize("tokenizer", ["tiny_qwen2", "qwen2"])
def test_stable_text_ids_match_input_streaming(tokenizer: str) -> None:
    """A session's text arriving in random pieces: every call gives the Python ids and end, and the
    ids of all calls are the whole text's (for texts without special-token strings, which a cut can
    split)."""
    rt = require_rt()
    hf = BUILDERS[tokenizer]()
    cfg = QWEN3_TTS_TINY_CONFIG
    ids = py_prompt.PromptIds.from_config(cfg)
    builder = rt.PromptBuilder.qwen3_tts(_rust(hf), json.dumps(cfg))
    gen = random.Random(tokenizer)
    for text in TEXTS * 3:
        received, start, got_all = "", 0, []
        for piece in [*_pieces(text, gen), None]:
            ended = piece is None
            received += piece or ""
            want = py_stream.stable_text_ids(hf, received, start, ended, ids.tts_eos)
            got = builder.stable_text_ids(received, start, ended)
            assert got == want, (received, start)
            got_all += got[0]
            start = got[1]
        if "<" not in text:
            assert got_all == py_stream.stable_text_ids(hf, text, 0, True, ids.tts_eos)[0], text


def test_builders_match_the_tiny_programs() -> None:
    """Built from what the tiny programs load (their tokenizer, voices, config), the Rust builders give
    the programs' own `preprocess` rows."""
    rt = require_rt()
    orpheus = build_program(BuildArgs("orpheus-tiny", "dummy", torch.device("cpu"), torch.float32, 0, 512, None))
    builder = rt.PromptBuilder.orpheus(_rust(orpheus.tokenizer), list(orpheus.meta.voices), orpheus.meta.default_voice)
    qwen = build_program(BuildArgs("qwen3-tts-tiny", "dummy", torch.device("cpu"), torch.float32, 0, 512, None))
    qwen_builder = rt.PromptBuilder.qwen3_tts(_rust(qwen.tokenizer), json.dumps(QWEN3_TTS_TINY_CONFIG))
    for text in TEXTS[:8]:
        assert builder.build({"text": text}) == _rows(orpheus.preprocess({"text": text}))
        fields = {"text": text, "language": "english", "voice": None}
        assert qwen_builder.build(fields) == _rows(qwen.preprocess(fields))
        assert qwen_builder.stable_text_ids(text, 0, False) == qwen.stable_text_ids(text, 0, False)
        for layout in (True, False):  # non_streaming_mode false: the first text id ends the prompt, the rest trail
            fields = {"text": text, "language": "english", "non_streaming_mode": layout}
            want = qwen.preprocess(fields)
            assert bool(want.trailing_text) != layout, text
            assert qwen_builder.build_with_trailing(fields) == (_rows(want), list(want.trailing_text)), text


def test_bad_inputs_are_value_errors() -> None:
    rt = require_rt()
    tok = _rust(BUILDERS["tiny_qwen2"]())
    with pytest.raises(ValueError, match="talker_config"):
        rt.PromptBuilder.qwen3_tts(tok, json.dumps({"tts_pad_token_id": 1}))
    with pytest.raises(ValueError, match="config.json"):
        rt.PromptBuilder.qwen3_tts(tok, "{not json")
    builder = rt.PromptBuilder.qwen3_tts(tok, json.dumps(QWEN3_TTS_TINY_CONFIG))
    with pytest.raises(ValueError, match="text: missing"):
        builder.build({"voice": "ryan"})
    with pytest.raises(ValueError, match="text: must be a string"):
        builder.build({"text": 3})
    with pytest.raises(ValueError, match="start"):
        builder.stable_text_ids("abc", 9, False)
    with pytest.raises(TypeError, match="fields"):
        builder.build({"text": "x", "voice": object()})
    orpheus = rt.PromptBuilder.orpheus(tok, ["tara"], "tara")
    with pytest.raises(ValueError, match="Orpheus"):
        orpheus.stable_text_ids("abc", 0, False)
