"""Zonos request fields, checked at the edge with errors naming the field, and the prompt that preprocess
builds from them (espeak-ng phonemes, speaker from a clip or a saved voice, conditioning, guidance scale),
through the registry's zonos-tiny; bench mode end to end."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from tests.test_bench_e2e import read_wav
from vox_serve.api.body import _form_value, validate_fields
from vox_serve.api.schemas import request_schema
from vox_serve.models.registry import BuildArgs, build_program, family_of
from vox_serve.models.zonos import phonemes
from vox_serve.models.zonos.conditioning import condition_inputs
from vox_serve.request_builder import FieldError, build_request
from vox_serve.voice_prompt import SAVED_VOICE_FIELD, VoicePrompt

pytestmark = pytest.mark.skipif(phonemes.espeak_available() is not None, reason="espeak-ng unavailable")


@pytest.fixture(scope="module")
def program():
    return build_program(BuildArgs("zonos-tiny", "auto", torch.device("cpu"), torch.float32, 0, 512, None))


def _clip(freq: float = 0.05, seconds: float = 1.0) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(np.arange(int(16000 * seconds)) * freq)).astype(np.float32), 16000, format="WAV")
    return buf.getvalue()


def test_family_detection(tmp_path: Path) -> None:
    assert family_of("zonos-tiny").name == family_of("Zyphra/Zonos-v0.1-transformer").name == "zonos"
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text((Path(__file__).parent / "fixtures/zonos/checkpoint/config.json").read_text())
    assert family_of(str(ckpt)).name == "zonos"


def test_prompt_is_the_guidance_pair_of_the_conditioning(program) -> None:
    """Prefix rows carry conditional | unconditional vectors (phonemes, then one row per conditioner), then
    delayed column 0; the slot fields carry cfg_scale, the unified sampler and the frame budget."""
    fields = {"text": "Guten Tag.", "language": "de", "emotion": [0.5, 0, 0, 0, 0, 0, 0, 0.5], "fmax": 22050.0,
              "pitch_std": 30.0, "speaking_rate": 12.0, "cfg_scale": 3.0, "linear": 0.5, "max_tokens": 40}
    req = build_request(program.meta, program.preprocess, fields, "r", greedy=True)
    ids = phonemes.phoneme_ids(phonemes.phonemize("Guten Tag.", "de"))
    inputs = condition_inputs(program.lm.cfg, ids, phonemes.language_id("de"),
                              values={k: fields[k] for k in ("emotion", "fmax", "pitch_std", "speaking_rate")})
    with torch.no_grad():
        pair = program.lm.prefix_conditioner.guidance_pair(inputs)
    p = req.prompt
    length = pair.shape[1]
    assert p.ids.shape == (length + 1, 9) and (p.ids[:length] == -1).all() and (p.ids[length] == 1025).all()
    got = np.stack([p.vectors[i] for i in range(length)])
    assert np.array_equal(got, torch.cat([pair[0], pair[1]], dim=-1).numpy())
    assert not np.array_equal(got[:, :128], got[:, 128:])  # the streams differ: conditioning vs none
    assert p.conditioning["cfg_scale"].tolist() == [3.0] and p.conditioning["unified"].tolist() == [0.5, 0, 0]
    assert p.conditioning["num_frames"].tolist() == [32]  # max_tokens counts LM steps: 8 of delay


def test_speaker_from_a_clip_or_a_saved_voice(program) -> None:
    clip = _clip()
    saved = program.encode_voice(clip, None)
    assert len(saved.speaker) == 128
    from_clip = program.preprocess({"text": "Hi.", "audio": clip})
    from_saved = program.preprocess({"text": "Hi.", SAVED_VOICE_FIELD: saved})
    other = program.preprocess({"text": "Hi.", "audio": _clip(0.2)})
    plain = program.preprocess({"text": "Hi."})
    speaker_row = len(plain.vectors) - 6  # the row after the phonemes
    assert np.array_equal(from_clip.vectors[speaker_row], from_saved.vectors[speaker_row])
    assert not np.array_equal(from_clip.vectors[speaker_row], other.vectors[speaker_row])
    assert not np.array_equal(from_clip.vectors[speaker_row], plain.vectors[speaker_row])
    with pytest.raises(FieldError, match="another model") as err:
        program.preprocess({"text": "Hi.", SAVED_VOICE_FIELD: VoicePrompt([0.0] * 64)})
    assert err.value.field == "voice"
    with pytest.raises(FieldError) as err:
        program.encode_voice(clip, "a transcript")
    assert err.value.field == "ref_text"
    with pytest.raises(FieldError) as err:
        program.preprocess({"text": "Hi.", "audio": b"not audio"})
    assert err.value.field == "audio"


@pytest.mark.parametrize("fields,field,message", [
    ({"language": "ja"}, "language", "not supported"),
    ({"language": "xx"}, "language", "not one of"),
    ({"emotion": [0.5] * 7}, "emotion", "7 items; 8 are taken"),
    ({"emotion": [0.5] * 7 + [1.5]}, "emotion", "item 7 must be <= 1"),
    ({"emotion": [0.5] * 7 + ["a"]}, "emotion", "item 7 must be a number"),
    ({"emotion": [0.0] * 8}, "emotion", "positive sum"),
    ({"emotion": "happy"}, "emotion", "must be a list"),
    ({"cfg_scale": 0}, "cfg_scale", "must be > 0"),
    ({"cfg_scale": 11}, "cfg_scale", "must be <= 10"),
    ({"fmax": 30000}, "fmax", "must be <= 24000"),
    ({"pitch_std": -1}, "pitch_std", "must be >= 0"),
    ({"speaking_rate": "fast"}, "speaking_rate", "number"),
    ({"max_tokens": 8}, "max_tokens", "LM steps"),
    ({"instruct": "calm"}, "instruct", "not accepted"),
])
def test_bad_fields_are_refused_naming_the_field(program, fields: dict, field: str, message: str) -> None:
    with pytest.raises(FieldError, match=message) as err:
        clean = validate_fields(program.meta, {"text": "Hello.", **fields})
        program.preprocess(clean)
    assert err.value.field == field


def test_fields_are_documented_for_the_model(program) -> None:
    schema = request_schema(program.meta, "json")
    props = schema["properties"]
    assert set(program.meta.accepted_fields) <= set(props)
    assert props["emotion"]["type"] == "array" and props["emotion"]["minItems"] == props["emotion"]["maxItems"] == 8
    assert props["cfg_scale"]["exclusiveMinimum"] == 0 and props["cfg_scale"]["default"] == 2.0
    assert "ja" not in props["language"]["enum"] and "en-us" in props["language"]["enum"]
    assert _form_value("emotion", "0.5, 0.25,0,0,0,0,0,0.25", "array") == [0.5, 0.25, 0, 0, 0, 0, 0, 0.25]
    with pytest.raises(FieldError):
        _form_value("emotion", "0.5;0.5", "array")
    assert _form_value("emotion", "[0.5, 0.5]", "array") == [0.5, 0.5]  # JSON text, as CSM's context is sent


def test_bench_mode(tmp_path: Path) -> None:
    """`vox-serve --model zonos-tiny --device cpu --bench-requests 2 --greedy` writes 44.1 kHz WAVs: with
    ignore_eos every request makes max_tokens - 8 frames."""
    cmd = [sys.executable, "-m", "vox_serve.launch", "--model", "zonos-tiny", "--device", "cpu", "--bench-requests",
           "2", "--greedy", "--bench-out", str(tmp_path), "--bench-kwargs",
           json.dumps({"max_tokens": 28, "ignore_eos": True, "language": "en-us"})]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for i in range(2):
        rate, pcm = read_wav(tmp_path / f"bench-{i:03d}.wav")
        assert rate == 44100 and len(pcm) == 20 * 512 and np.abs(pcm.astype(np.int32)).max() > 100
