"""Qwen3-TTS Base (voice cloning) without the reference: the tiny registry model served through the engine
and over HTTP with an uploaded reference clip (input streaming too), bad inputs, names, and the encoders at
the published shapes."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator

import numpy as np
import pytest
import soundfile
import torch
from http_harness import Server, parse_wav, running_server, wait_until
from qwen3_tts_helpers import run_requests

from tests.engine_helpers import build_program
from vox_serve.config import CacheConfig, ModelConfig, SchedulerConfig, VoxConfig
from vox_serve.models.qwen3_tts.clone import load_cloner
from vox_serve.models.qwen3_tts.loader import QWEN3_TTS_IDS, dummy_config
from vox_serve.models.registry import FAMILIES, family_of
from vox_serve.request_builder import FieldError, build_request


def clip(rate: int = 24000, seconds: float = 1.2, freq: float = 220.0) -> bytes:
    t = np.arange(int(rate * seconds)) / rate
    buf = io.BytesIO()
    soundfile.write(buf, (0.4 * np.sin(2 * np.pi * freq * t)).astype(np.float32), rate, subtype="PCM_16",
                    format="WAV")
    return buf.getvalue()


def tiny(name: str):
    config = VoxConfig(model=ModelConfig(model=name, device="cpu"), cache=CacheConfig(page_size=16, max_num_pages=64),
                       scheduler=SchedulerConfig(max_batch_size=4, max_prefill_tokens=256, detokenize_interval=3))
    return build_program(config), config


@pytest.fixture(scope="module")
def base():
    return tiny("qwen3-tts-base-tiny")


def test_tiny_base_clones_a_voice_through_the_engine(base) -> None:
    program, config = base
    meta = program.meta
    assert {"audio", "ref_text", "x_vector_only_mode"} <= set(meta.accepted_fields)
    assert "voice" not in meta.accepted_fields and "instruct" not in meta.accepted_fields
    assert meta.voices == () and meta.layout.prompt_vector_dim == program.talker.cfg.hidden_size
    fields = [  # in-context and x-vector-only, from 24 kHz and 16 kHz (resampled) uploads
        {"text": "Hello there.", "audio": clip(), "ref_text": "A clip.", "max_tokens": 7, "ignore_eos": True},
        {"text": "Hello there.", "audio": clip(16000, freq=330.0), "max_tokens": 7, "ignore_eos": True},
    ]
    reqs, _ = run_requests(program, config, fields)
    for req in reqs:
        assert req.num_generated == 7 and all(0 <= c < 2048 for c in req.codes)
        assert sum(len(c) for c in req.extra["chunks"]) == 7 * 1920 * 2
    assert len(reqs[0].prompt.ids.tolist()) > len(reqs[1].prompt.ids.tolist())  # the reference frames and transcript
    assert reqs[0].tokens != reqs[1].tokens


def test_the_reference_voice_changes_the_output(base) -> None:
    """Same text and mode, another clip: another speaker embedding, other greedy codes."""
    program, config = base
    fields = [{"text": "Hello there.", "audio": clip(freq=f), "max_tokens": 5, "ignore_eos": True} for f in (150, 900)]
    a, b = run_requests(program, config, fields)[0]
    assert a.tokens != b.tokens


BAD = {
    "Base without reference audio": ("base", {}, "audio"),
    "Base in-context without transcript": ("base", {"audio": clip(), "x_vector_only_mode": False}, "ref_text"),
    "Base given a voice": ("base", {"audio": clip(), "voice": "ryan"}, "voice"),
    "Base given unreadable audio": ("base", {"audio": b"not audio at all" * 64}, "audio"),
    "Base given a too short clip": ("base", {"audio": clip(seconds=0.05)}, "audio"),
    "x_vector_only_mode not a boolean": ("base", {"audio": clip(), "x_vector_only_mode": "yes"}, "x_vector_only_mode"),
    "CustomVoice given reference audio": ("custom", {"audio": clip()}, "audio"),
    "CustomVoice given a transcript": ("custom", {"ref_text": "A clip."}, "ref_text"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_clone_inputs_name_the_field(base, case: str) -> None:
    which, extra, field = BAD[case]
    program = base[0] if which == "base" else tiny("qwen3-tts-tiny")[0]
    with pytest.raises(FieldError) as err:
        build_request(program.meta, program.preprocess, {"text": "Hi.", **extra}, "r0")
    assert err.value.field == field


def test_names_resolve_to_the_published_variants() -> None:
    for name, repo in QWEN3_TTS_IDS.items():
        assert family_of(name) is FAMILIES["qwen3-tts"] and family_of(repo) is FAMILIES["qwen3-tts"]
    kinds = {name: dummy_config(repo)["tts_model_type"] for name, repo in QWEN3_TTS_IDS.items()}
    assert kinds == {"qwen3-tts": "custom_voice", "qwen3-tts-base": "base", "qwen3-tts-voice-design": "voice_design",
                     "qwen3-tts-0.6b": "custom_voice", "qwen3-tts-base-0.6b": "base"}


@pytest.mark.parametrize("name", ["qwen3-tts-base", "qwen3-tts-base-0.6b"])
def test_dummy_encoders_run_at_the_published_shapes(name: str) -> None:
    """--load-format dummy: random speaker and codec encoders of the released geometry work end to end."""
    cfg = dummy_config(QWEN3_TTS_IDS[name])
    cloner = load_cloner(cfg, None, None, None, 16, torch.device("cpu"), seed=0)
    audio = torch.from_numpy(soundfile.read(io.BytesIO(clip()), dtype="float32")[0])
    with torch.inference_mode():
        speaker = cloner.speaker_encoder(audio)
        codes = cloner.codec_encoder(audio)
    assert speaker.shape == (cfg["talker_config"]["hidden_size"],) and torch.isfinite(speaker).all()
    assert codes.shape == (-(-audio.numel() // 1920), 16) and 0 <= codes.min() and codes.max() < 2048


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    flags = ("--model", "qwen3-tts-base-tiny", "--greedy", "--max-num-pages", "128")
    with running_server(tmp_path_factory.mktemp("http-base"), *flags) as srv:
        yield srv


def test_http_clone_with_an_uploaded_clip(server: Server) -> None:
    info = server.client.get("/info").json()
    assert info["supports_reference_audio"] is True
    form = {"text": "Hello there.", "ref_text": "A clip.", "max_tokens": "6", "ignore_eos": "true",
            "streaming": "false"}
    response = server.client.post("/generate", data=form, files={"audio": ("ref.wav", clip(16000))})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "audio/wav" and len(response.content) == 44 + 6 * 1920 * 2
    body = {"text": "Hello there.", "audio": base64.b64encode(clip()).decode(), "max_tokens": 3, "ignore_eos": True,
            "streaming": False}
    response = server.client.post("/generate", json=body)
    assert response.status_code == 200 and len(response.content) == 44 + 3 * 1920 * 2


@pytest.mark.parametrize("body,field", [({"text": "Hi."}, "audio"),
                                        ({"text": "Hi.", "voice": "ryan"}, "voice")])
def test_http_clone_without_reference_audio_is_a_422_naming_the_field(server: Server, body: dict,
                                                                      field: str) -> None:
    response = server.client.post("/generate", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field


def test_http_unreadable_upload_is_a_422(server: Server) -> None:
    response = server.client.post("/generate", data={"text": "Hi."}, files={"audio": ("x.wav", b"garbage" * 100)})
    assert response.status_code == 422 and response.json()["error"]["field"] == "audio"


def test_http_an_hour_long_clip_is_refused_before_anything_decodes_it(server: Server) -> None:
    """Issue 10, defect 1: a 546 KB FLAC of an hour of silence grew the API by 336 MB and the replica to
    2.5 GB, and stalled its other streams for 11 s, before the 422. Now the API reads the container's
    length first (and would stop decoding at the limit), so nothing reaches the replica."""
    buf = io.BytesIO()
    soundfile.write(buf, np.zeros((48000 * 3600, 1), np.int16), 48000, format="FLAC", subtype="PCM_16")
    [replica] = server.replicas()
    dispatched = replica["finished"] + replica["failed"]
    response = server.client.post("/generate", data={"text": "Hi."}, files={"audio": ("hour.flac", buf.getvalue())},
                                  timeout=10.0)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["field"] == "audio" and "3600.0 s long" in error["message"] and "60 s" in error["message"]
    wait_until(lambda: server.replicas()[0]["pid"] == replica["pid"], 2.0)
    [after] = server.replicas()
    assert after["finished"] + after["failed"] == dispatched  # the replica never saw it


def stream_session(server: Server, pieces: list[str], **fields: str) -> bytes:
    """A clone streamed over HTTP (x-vector only unless `fields` give `ref_text`): the clip uploaded with the
    session's start (multipart)."""
    form = {"text": pieces[0], "language": "english", "max_tokens": "6", "ignore_eos": "true", **fields}
    response = server.client.post("/generate/stream/start", data=form, files={"audio": ("ref.wav", clip())})
    assert response.status_code == 200, response.text
    session = response.json()["id"]
    for piece in pieces[1:]:
        assert server.client.post(f"/generate/stream/{session}/text", json={"text": piece}).status_code == 200
    assert server.client.post(f"/generate/stream/{session}/end").status_code == 200
    response = server.client.get(f"/generate/stream/{session}/audio")
    assert response.status_code == 200, response.text
    return parse_wav(response.content).pcm


def test_http_input_streaming_clones_from_the_speaker_embedding(server: Server) -> None:
    assert server.client.get("/info").json()["supports_input_streaming"] is True
    pcm = stream_session(server, ["Hello th", "ere, in the voi", "ce of the clip."])
    assert len(pcm) == 6 * 1920 * 2
    assert stream_session(server, ["Hello there, in the voice of the clip."]) == pcm  # --greedy
    wait_until(server.pools_full, 10.0)


def test_http_in_context_input_streaming_equals_the_whole_text(server: Server) -> None:
    """With `ref_text` a session clones in context: its audio is that of POST /generate with the whole text
    (the streaming layout, the default); `non_streaming_mode=true` cannot stream its text (422)."""
    text = "Hello there, in the voice of the clip."
    pcm = stream_session(server, ["Hello th", "ere, in the voi", "ce of the clip."], ref_text="A clip.")
    form = {"text": text, "language": "english", "max_tokens": "6", "ignore_eos": "true", "ref_text": "A clip.",
            "streaming": "false"}
    response = server.client.post("/generate", data=form, files={"audio": ("ref.wav", clip())})
    assert response.status_code == 200, response.text
    assert parse_wav(response.content).pcm == pcm and len(pcm) == 6 * 1920 * 2
    assert pcm != stream_session(server, [text])  # x-vector only
    body = {"text": "Hello.", "audio": base64.b64encode(clip()).decode(), "ref_text": "A clip.",
            "non_streaming_mode": True}
    response = server.client.post("/generate/stream/start", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == "non_streaming_mode"
    wait_until(server.pools_full, 10.0)
