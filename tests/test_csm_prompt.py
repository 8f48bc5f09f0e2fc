"""CSM request fields and prompt rows (torch-free parts), and the context-clip hook's errors."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from csm_helpers import csm_tokenizer, wav_bytes

from vox_serve.codecs.mimi.config import MimiConfig
from vox_serve.codecs.mimi.encoder import MimiEncoder
from vox_serve.models.csm.context import encode_context
from vox_serve.models.csm.loader import CSM_TINY_CONFIG
from vox_serve.models.csm.prompt import (
    ContextTurn,
    PromptIds,
    audio_frame_count,
    audio_frames,
    build_prompt,
    parse_fields,
)
from vox_serve.request_builder import FieldError

K = 32


@pytest.fixture(scope="module")
def ids() -> PromptIds:
    return PromptIds.from_tokenizer(csm_tokenizer(), bos=128000, num_codebooks=K, codebook_size=2048, codebook_eos=0)


def text_rows(tokens: list[int]) -> list[list[int]]:
    return [[-1] * K + [t] for t in tokens]


def test_a_turn_is_bos_speaker_text_eos(ids: PromptIds) -> None:
    tok = csm_tokenizer()
    rows = build_prompt(tok, ids, parse_fields({"text": "Hi!", "speaker": 12}, ids))
    assert rows == text_rows([128000] + tok.encode("[12]Hi!", add_special_tokens=False).ids + [128001])
    assert ids.eos == 128001
    default = build_prompt(tok, ids, parse_fields({"text": "Hi!"}, ids))
    assert default[1:4] == text_rows(tok.encode("[0]", add_special_tokens=False).ids)  # speaker 0 by default


def test_context_codes_then_an_all_eos_frame(ids: PromptIds) -> None:
    tok = csm_tokenizer()
    frames = [[i + k for k in range(K)] for i in range(3)]
    fields = parse_fields({"text": "Now.", "speaker": 1,
                           "context": [{"text": "Before.", "speaker": 4, "codes": frames}, {"text": "Plain."}]}, ids)
    rows = build_prompt(tok, ids, fields)
    first = 2 + len(tok.encode("[4]Before.", add_special_tokens=False).ids)
    assert rows[first:first + 4] == [f + [-1] for f in frames] + [[0] * K + [-1]]
    assert rows[first - 1] == text_rows([128001])[0] and rows[first + 4] == text_rows([128000])[0]
    assert len(rows) == first + 4 + 2 * 2 + len(tok.encode("[0]Plain.[1]Now.", add_special_tokens=False).ids)


def test_audio_frames_round_up() -> None:
    assert [audio_frames(n, 1920) for n in (1, 1920, 1921, 3840, 24000)] == [1, 1, 2, 2, 13]


def test_audio_frame_count_cuts_at_the_first_all_eos_frame() -> None:
    keep_last = [[5] * K, [0] * 31 + [7]]  # the stop frame (codebooks 0..30 eos) with a code in the last
    assert audio_frame_count(keep_last, 0) == 2
    assert audio_frame_count([[5] * K, [0] * K], 0) == 1
    assert audio_frame_count([[5] * K], 0) == 1 and audio_frame_count([], 0) == 0


@pytest.mark.parametrize("fields,field,message", [
    ({"speaker": "0"}, "speaker", "must be an integer speaker id, got str"),
    ({"speaker": True}, "speaker", "must be an integer"),
    ({"speaker": -1}, "speaker", "must be in"),
    ({"context": "hi"}, "context", "must be a list"),
    ({"context": [{"text": "a"}] * 65}, "context", "at most 64"),
    ({"context": ["hi"]}, "context[0]", "must be an object"),
    ({"context": [{"text": " "}]}, "context[0].text", "is required"),
    ({"context": [{"text": "a", "voice": "x"}]}, "context[0].voice", "is not a field of a context turn"),
    ({"context": [{"text": "a", "speaker": 1.5}]}, "context[0].speaker", "must be an integer"),
    ({"context": [{"text": "a"}, {"text": "b", "codes": [], "audio": "AAAA"}]}, "context[1].codes", "not both"),
    ({"context": [{"text": "a", "codes": []}]}, "context[0].codes", "non-empty list of frames"),
    ({"context": [{"text": "a", "codes": [[0] * 31]}]}, "context[0].codes[0]", "list of 32 codes"),
    ({"context": [{"text": "a", "codes": [[0] * 31 + [2048]]}]}, "context[0].codes[0]", r"integers in \[0, 2048\)"),
    ({"context": [{"text": "a", "audio": "not base64!"}]}, "context[0].audio", "is not valid base64"),
    ({"context": [{"text": "a", "audio": b""}]}, "context[0].audio", "must be a non-empty audio file"),
])
def test_bad_fields_name_the_field(ids: PromptIds, fields: dict, field: str, message: str) -> None:
    with pytest.raises(FieldError, match=message) as err:
        parse_fields({"text": "Hello.", **fields}, ids)
    assert err.value.field == field


def test_integral_numbers_are_integers_as_json_schema_says(ids: PromptIds) -> None:
    """`2.0` is an integer in JSON (the common fields take it so): a turn's speaker and codes, as ints."""
    parsed = parse_fields({"text": "Hi.", "context": [{"text": "a", "speaker": 2.0, "codes": [[1.0] * K]}]}, ids)
    [turn] = parsed.context
    assert turn.speaker == 2 and type(turn.speaker) is int
    assert turn.codes == ((1,) * K,) and all(type(c) is int for c in turn.codes[0])
    with pytest.raises(FieldError, match="integers in"):
        parse_fields({"text": "Hi.", "context": [{"text": "a", "codes": [[1.5] * K]}]}, ids)


def test_clips_arrive_as_bytes_or_base64(ids: PromptIds) -> None:
    clip = wav_bytes(np.zeros(2000))
    for audio in (clip, base64.b64encode(clip).decode()):
        (turn,) = parse_fields({"text": "x", "context": [{"text": "y", "audio": audio}]}, ids).context
        assert turn.audio == clip and turn.needs_encoding
    fields = parse_fields({"text": "x", "context": [{"text": "y", "audio": clip}]}, ids)
    with pytest.raises(ValueError, match=r"context\[0\]\.audio has not been encoded"):
        build_prompt(csm_tokenizer(), ids, fields)


@pytest.fixture(scope="module")
def encoder() -> MimiEncoder:
    config = MimiConfig.from_dict(CSM_TINY_CONFIG["codec_config"])
    return MimiEncoder.random(config, seed=0, attention_window=config.sliding_window)


def test_context_clip_is_encoded_at_24khz(ids: PromptIds, encoder: MimiEncoder) -> None:
    """A 16 kHz clip is resampled to 24 kHz first: 0.5 s -> 12000 samples -> 7 frames of 32 codes."""
    clip = wav_bytes(np.sin(np.arange(8000) / 7.0) * 0.3, rate=16000)
    fields = encode_context(encoder, parse_fields({"text": "x", "context": [{"text": "y", "audio": clip},
                                                                            {"text": "z"}]}, ids))
    turn, plain = fields.context
    assert not turn.needs_encoding and len(turn.codes) == 7 and all(len(f) == K for f in turn.codes)
    assert plain == ContextTurn("z", 0)


@pytest.mark.parametrize("audio,message", [(b"not audio", "is not decodable audio"),
                                           (wav_bytes(np.zeros(0)), "the clip is 0.00 s long")])
def test_bad_clips_name_the_turn(ids: PromptIds, encoder: MimiEncoder, audio: bytes, message: str) -> None:
    fields = parse_fields({"text": "x", "context": [{"text": "a"}, {"text": "y", "audio": audio}]}, ids)
    with pytest.raises(FieldError, match=message) as err:
        encode_context(encoder, fields)
    assert err.value.field == "context[1].audio"
