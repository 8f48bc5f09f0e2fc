"""Zonos over HTTP: a real server process (zonos-tiny on CPU) and a real client: its fields in JSON and in
multipart forms (a speaker clip upload), errors naming the field, GET /info and the OpenAPI document."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator

import numpy as np
import pytest
import soundfile as sf
from http_harness import Server, error_of, generate, parse_wav, running_server

from vox_serve.models.zonos import phonemes

pytestmark = pytest.mark.skipif(phonemes.espeak_available() is not None, reason="espeak-ng unavailable")
HOP = 512
FIELDS = {"max_tokens": 24, "ignore_eos": True, "emotion": [0.2, 0, 0, 0, 0, 0, 0.3, 0.5], "cfg_scale": 2.5,
          "speaking_rate": 14.0, "language": "en-us"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    data_dir = tmp_path_factory.mktemp("zonos-voices")
    with running_server(tmp_path_factory.mktemp("zonos-http"), "--model", "zonos-tiny", "--greedy",
                        "--data-dir", str(data_dir)) as srv:
        yield srv


def _clip() -> bytes:
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(np.arange(16000) * 0.07)).astype(np.float32), 16000, format="WAV")
    return buf.getvalue()


def test_generate_with_zonos_fields(server: Server) -> None:
    for streaming in (True, False):
        response = generate(server, text="Hello there.", streaming=streaming, **FIELDS)
        assert response.status_code == 200, response.text
        wav = parse_wav(response.content)
        assert wav.sample_rate == 44100 and len(wav.pcm) == 2 * (FIELDS["max_tokens"] - 8) * HOP


def test_speaker_clip_upload_changes_the_voice(server: Server) -> None:
    form = {k: json.dumps(v) if isinstance(v, bool) else ",".join(map(str, v)) if isinstance(v, list) else str(v)
            for k, v in FIELDS.items()}
    plain = server.client.post("/generate", data={"text": "Hello there.", **form})
    cloned = server.client.post("/generate", data={"text": "Hello there.", **form},
                                files={"audio": ("ref.wav", _clip(), "audio/wav")})
    assert plain.status_code == cloned.status_code == 200, cloned.text
    assert len(plain.content) == len(cloned.content) and plain.content != cloned.content


def test_a_saved_voice_speaks_as_its_clip(server: Server) -> None:
    """POST /v1/audio/voices keeps the clip's speaker embedding; `voice` then gives the upload's audio."""
    saved = server.client.post("/v1/audio/voices", data={"name": "zed"}, files={"audio": ("ref.wav", _clip())})
    assert saved.status_code == 200, saved.text
    assert saved.json()["mode"] == "x_vector"
    body = {"text": "Hello there.", "streaming": False, **FIELDS}
    by_name = generate(server, voice="zed", **body)
    uploaded = server.client.post("/generate", json={**body, "audio": base64.b64encode(_clip()).decode()})
    assert by_name.status_code == uploaded.status_code == 200, by_name.text
    assert by_name.content == uploaded.content
    refused = server.client.post("/v1/audio/voices", data={"name": "amy", "ref_text": "A clip."},
                                 files={"audio": ("ref.wav", _clip())})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "ref_text", refused.text


@pytest.mark.parametrize("fields,field", [({"language": "ja"}, "language"), ({"emotion": [1.0] * 3}, "emotion"),
                                          ({"cfg_scale": 0}, "cfg_scale"), ({"max_tokens": 4}, "max_tokens")])
def test_bad_fields_name_the_field(server: Server, fields: dict, field: str) -> None:
    response = generate(server, text="Hello.", **fields)
    assert response.status_code == 422 and error_of(response)["field"] == field, response.text


def test_info_and_openapi_list_the_fields(server: Server) -> None:
    info = server.client.get("/info").json()
    assert info["sample_rate"] == 44100 and info["supports_reference_audio"]
    assert {"emotion", "cfg_scale", "fmax", "pitch_std", "speaking_rate", "language"} <= set(info["accepted_fields"])
    assert "ja" not in info["languages"] and info["default_sampling"]["min_p"] == 0.1
    doc = server.client.get("/openapi.json").json()
    body = doc["paths"]["/generate"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    if "$ref" in body:
        body = doc["components"]["schemas"][body["$ref"].split("/")[-1]]
    props = body["properties"]
    assert props["emotion"]["maxItems"] == 8 and props["cfg_scale"]["maximum"] == 10


def test_openai_speech_route(server: Server) -> None:
    """/v1/audio/speech takes Zonos without a voice (the unconditional speaker) or with a saved one."""
    body = {"model": "zonos-tiny", "input": "Hello there.", "response_format": "wav"}
    plain = server.client.post("/v1/audio/speech", json=body)
    assert plain.status_code == 200 and parse_wav(plain.content).sample_rate == 44100, plain.text
    unknown = server.client.post("/v1/audio/speech", json={**body, "voice": "alloy"})
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "voice"
