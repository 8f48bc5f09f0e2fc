"""Saved voices end to end (qwen3-tts-base-tiny on CPU): created once through a replica's encoders, used by
name on every route with the audio an upload of the same clip gives, listed, deleted, kept across a
restart; a damaged store stops the server at start-up. In-process: a saved voice runs no encoder."""

from __future__ import annotations

import base64
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from http_harness import REPO, TINY_FLAGS, Server, child_env, parse_wav, running_server
from test_qwen3_tts_base_serving import clip, tiny

from tests.engine_helpers import engine_worker
from vox_serve import ipc
from vox_serve.engine_loop import EngineLoop
from vox_serve.scheduler.base import Scheduler
from vox_serve.scheduler_entry import SchedulerService

MODEL = "qwen3-tts-base-tiny"
TOKENS = {"max_tokens": 6, "ignore_eos": True, "seed": 1}


def base_flags(data_dir: Path) -> tuple[str, ...]:
    return ("--model", MODEL, "--greedy", "--max-num-pages", "128", "--data-dir", str(data_dir))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("voices-data")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("voices"), *base_flags(data_dir)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120.0) as c:
        yield c


def uploaded_clone(server: Server, **fields: Any) -> bytes:
    """POST /generate with the clip uploaded: the audio a saved voice must reproduce."""
    body = {"text": "Hello there.", "audio": base64.b64encode(clip()).decode(), "streaming": False, **TOKENS,
            **fields}
    response = server.client.post("/generate", json=body)
    assert response.status_code == 200, response.text
    return parse_wav(response.content).pcm


def saved_clone(server: Server, voice: str, **fields: Any) -> bytes:
    response = server.client.post("/generate", json={"text": "Hello there.", "voice": voice, "streaming": False,
                                                     **TOKENS, **fields})
    assert response.status_code == 200, response.text
    return parse_wav(response.content).pcm


def test_openai_client_saves_a_voice_and_speech_uses_it(server: Server, client: openai.OpenAI) -> None:
    voice = client.audio.voices.create(name="alice", audio_sample=("ref.wav", clip()), consent="granted")
    assert (voice.id, voice.name, voice.object, voice.type) == ("alice", "alice", "audio.voice", "audio_sample")
    expected = uploaded_clone(server)  # no transcript: x-vector only
    assert saved_clone(server, "alice") == expected
    response = client.audio.speech.create(model=MODEL, input="Hello there.", voice={"id": "alice"},
                                          response_format="pcm", extra_body=TOKENS)
    assert response.content == expected


def test_a_voice_saved_with_its_transcript_clones_in_context(server: Server) -> None:
    response = server.client.post("/v1/audio/voices", data={"name": "bob", "ref_text": "A clip."},
                                  files={"audio": ("ref.wav", clip())})
    assert response.status_code == 200, response.text
    assert response.json()["mode"] == "in_context" and response.json()["ref_text"] == "A clip."
    in_context = uploaded_clone(server, ref_text="A clip.")
    assert saved_clone(server, "bob") == in_context
    assert saved_clone(server, "bob", x_vector_only_mode=True) == uploaded_clone(server)
    assert in_context != uploaded_clone(server)


def test_input_streaming_session_with_a_saved_voice(server: Server) -> None:
    start = server.client.post("/generate/stream/start", json={"text": "Hello there.", "voice": "alice", **TOKENS})
    assert start.status_code == 200, start.text
    session = start.json()["id"]
    assert server.client.post(f"/generate/stream/{session}/end").status_code == 200
    streamed = parse_wav(server.client.get(f"/generate/stream/{session}/audio").content).pcm
    upload = server.client.post("/generate/stream/start", json={
        "text": "Hello there.", "audio": base64.b64encode(clip()).decode(), **TOKENS}).json()["id"]
    server.client.post(f"/generate/stream/{upload}/end")
    assert streamed == parse_wav(server.client.get(f"/generate/stream/{upload}/audio").content).pcm


def test_input_streaming_session_with_a_voice_saved_with_its_transcript(server: Server) -> None:
    """In context ("bob", saved above): the session's audio is that of the whole text on POST /generate."""
    start = server.client.post("/generate/stream/start", json={"text": "Hello th", "voice": "bob", **TOKENS})
    assert start.status_code == 200, start.text
    session = start.json()["id"]
    assert server.client.post(f"/generate/stream/{session}/text", json={"text": "ere."}).status_code == 200
    assert server.client.post(f"/generate/stream/{session}/end").status_code == 200
    streamed = parse_wav(server.client.get(f"/generate/stream/{session}/audio").content).pcm
    assert streamed == saved_clone(server, "bob") and streamed == uploaded_clone(server, ref_text="A clip.")


def test_openapi_offers_saving_and_deleting_voices_with_a_data_dir(server: Server) -> None:
    paths = server.client.get("/openapi.json").json()["paths"]
    post = paths["/v1/audio/voices"]["post"]
    assert post["requestBody"]["content"]["multipart/form-data"]["schema"]["required"] == ["name", "audio_sample"]
    assert {"400", "409", "413"} <= set(post["responses"])
    assert {"404", "409"} <= set(paths["/v1/audio/voices/{voice_id}"]["delete"]["responses"])


def test_list_get_and_delete(server: Server, client: openai.OpenAI) -> None:
    server.client.post("/v1/audio/voices", data={"name": "temp"}, files={"audio_sample": ("r.wav", clip())})
    listing = server.client.get("/v1/audio/voices").json()
    assert listing["model"] == MODEL and listing["clones_voices"] is True
    assert {"alice", "temp"} <= {v["id"] for v in listing["data"]}
    assert server.client.get("/v1/audio/voices/temp").json()["mode"] == "x_vector"
    deleted = client.audio.voices.delete("temp")
    assert (deleted.id, deleted.deleted, deleted.object) == ("temp", True, "audio.voice.deleted")
    with pytest.raises(openai.NotFoundError):
        client.audio.voices.delete("temp")
    response = server.client.post("/generate", json={"text": "Hi.", "voice": "temp"})
    assert response.status_code == 422 and response.json()["error"]["field"] == "voice"


@pytest.mark.parametrize(("form", "files", "status", "param"), [
    ({"name": "alice"}, {"audio_sample": clip()}, 409, "name"),
    ({"name": "../x"}, {"audio_sample": clip()}, 400, "name"),
    ({}, {"audio_sample": clip()}, 400, "name"),
    ({"name": "nofile"}, {}, 400, "audio_sample"),
    ({"name": "junk"}, {"audio_sample": b"not audio" * 50}, 400, "audio"),
    ({"name": "short"}, {"audio_sample": clip(seconds=0.05)}, 400, "audio"),
    ({"name": "odd", "colour": "blue"}, {"audio_sample": clip()}, 400, "colour"),
])
def test_bad_voice_uploads_name_the_param(server: Server, form: dict, files: dict, status: int, param: str) -> None:
    parts = {**{k: (None, v) for k, v in form.items()}, **{k: ("r.wav", v) for k, v in files.items()}}
    response = server.client.post("/v1/audio/voices", files=parts)  # multipart, even without a file
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param


def test_saved_voice_with_an_upload_is_refused(server: Server) -> None:
    body = {"text": "Hi.", "voice": "alice", "audio": base64.b64encode(clip()).decode()}
    response = server.client.post("/generate", json=body)
    assert response.status_code == 422 and response.json()["error"]["field"] == "voice"


def test_voices_survive_a_restart_and_a_damaged_store_stops_the_start(server: Server, data_dir: Path,
                                                                      tmp_path: Path) -> None:
    expected = saved_clone(server, "alice")
    with running_server(tmp_path, *base_flags(data_dir)) as again:
        assert {"alice", "bob"} <= {v["id"] for v in again.client.get("/v1/audio/voices").json()["data"]}
        assert saved_clone(again, "alice") == expected
    damaged = tmp_path / "damaged"
    (damaged / "voices" / MODEL).mkdir(parents=True)
    (damaged / "voices" / MODEL / "eve.safetensors").write_bytes(b"\x10" + b"\0" * 7 + b"{}" * 8)
    cmd = [sys.executable, "-m", "vox_serve.launch", *TINY_FLAGS, *base_flags(damaged)]
    done = subprocess.run(cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "eve.safetensors is corrupt" in done.stderr


def test_a_saved_voice_runs_no_encoder_in_the_replica() -> None:
    program, config = tiny(MODEL)
    sent: list[Any] = []
    loop = EngineLoop(Scheduler(program.meta, program.limits, config.scheduler), engine_worker(program))
    service = SchedulerService(loop, program.preprocess, config, lambda m: sent.extend(ipc.request_events(m)),
                               voice_encoder=program.encode_voice)
    service.handle(ipc.EncodeVoice("v", "carol", 0, None, clip()))
    [encoded] = [m for m in sent if isinstance(m, ipc.VoiceEncoded)]
    cloner = program.cloner

    def refuse(*args: Any) -> None:
        raise AssertionError("an encoder ran for a saved voice")

    original = (cloner.speaker_encoder.forward, cloner.codec_encoder.forward)
    cloner.speaker_encoder.forward = cloner.codec_encoder.forward = refuse
    try:
        service.handle(ipc.Submit("r", {"text": "Hello there.", **TOKENS}, 0, voice_prompt=encoded.prompt))
        while service.busy:
            service.step()
    finally:
        cloner.speaker_encoder.forward, cloner.codec_encoder.forward = original
    events = [type(m).__name__ for m in sent if getattr(m, "req_id", None) == "r"]
    assert events[0] == "Started" and events[-1] == "Finished" and "Audio" in events
