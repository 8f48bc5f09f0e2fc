"""The WebSocket /v1/audio/speech/stream and the Python client (vox_serve.client, `vox-serve say`) end to end:
sentence segments on orpheus-tiny (no input streaming), incremental input streaming on qwen3-tts-tiny."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from audio_checks import probe
from http_harness import REPO, Server, child_env, parse_wav, running_server, wait_until
from websockets.sync.client import connect

from vox_serve.client import AsyncVoxClient, VoxClient, VoxError

TOKENS = {"max_tokens": 70, "ignore_eos": True, "seed": 3}
QWEN_TOKENS = {"max_tokens": 6, "ignore_eos": True, "seed": 3}


@pytest.fixture(scope="module")
def orpheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("ws-orpheus"), "--greedy") as srv:
        yield srv


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    flags = ("--model", "qwen3-tts-tiny", "--greedy", "--max-num-pages", "128")
    with running_server(tmp_path_factory.mktemp("ws-qwen"), *flags) as srv:
        yield srv


def test_sentences_mode_plays_each_sentence_as_a_segment(orpheus: Server) -> None:
    with VoxClient(orpheus.url) as client:
        with client.session(voice="tara", **TOKENS) as session:
            assert session.started["mode"] == "sentences" and session.started["sample_rate"] == 24000
            for piece in ["Hello th", "ere. How are", " you today?"]:
                session.send(piece)
            session.end()
            chunks = list(session)
        expected = [client.speech(text, voice="tara", format="pcm", **TOKENS)
                    for text in ("Hello there. ", "How are you today?")]
    assert session.done["num_segments"] == 2 and session.done["finish_reason"] == "length"
    assert b"".join(c.data for c in chunks) == b"".join(expected)
    assert [c.segment for c in chunks] == sorted(c.segment for c in chunks) and chunks[-1].segment == 1
    assert all(len(c.data) == 2 * c.num_samples for c in chunks)  # pcm: the chunk itself
    starts = [c.start_s for c in chunks]
    assert starts == sorted(starts) and starts[0] == 0.0
    assert session.done["num_samples"] == sum(c.num_samples for c in chunks)


def stream_session_pcm(server: Server, pieces: list[str]) -> bytes:
    """The same text through the HTTP input-streaming routes (the reference for the WebSocket)."""
    session = server.client.post("/generate/stream/start", json={"voice": "ryan", **QWEN_TOKENS}).json()["id"]
    for piece in pieces:
        server.client.post(f"/generate/stream/{session}/text", json={"text": piece})
    server.client.post(f"/generate/stream/{session}/end")
    return parse_wav(server.client.get(f"/generate/stream/{session}/audio").content).pcm


def test_input_streaming_mode_feeds_the_pieces_to_one_request(qwen: Server) -> None:
    pieces = ["Hello th", "ere, in pie", "ces."]
    with VoxClient(qwen.url) as client, client.session(voice="ryan", **QWEN_TOKENS) as session:
        assert session.started["mode"] == "input_streaming"
        for piece in pieces:
            session.send(piece)
        session.end()
        pcm = b"".join(c.data for c in session)
    assert session.done["num_segments"] == 1 and len(pcm) == 6 * 1920 * 2
    assert pcm == stream_session_pcm(qwen, pieces)


def test_closing_the_socket_aborts_the_speech(orpheus: Server) -> None:
    url = orpheus.url.replace("http", "ws") + "/v1/audio/speech/stream"
    with connect(url) as ws:
        ws.send(json.dumps({"type": "start", "voice": "tara", "max_tokens": 1400, "ignore_eos": True}))
        assert json.loads(ws.recv())["type"] == "started"
        ws.send(json.dumps({"type": "text", "text": "One long sentence that will not be heard to its end. And more."}))
        assert json.loads(ws.recv())["type"] == "audio"
    wait_until(orpheus.pools_full, 15.0)


@pytest.mark.parametrize(("messages", "field"), [
    ([{"type": "start", "voice": "nobody"}], "voice"),
    ([{"type": "start", "response_format": "ogg"}], "response_format"),
    ([{"type": "start", "temperature": 99}], "temperature"),
    ([{"type": "text", "text": "hi"}], "type"),
    ([{"type": "start"}, {"type": "text", "text": ""}], "text"),
    ([{"type": "start"}, {"type": "end"}], "text"),
    ([{"type": "start"}, "not json"], "message"),
    ([{"type": "start", "model": "tts-9"}], "model"),
])
def test_bad_messages_get_an_error_naming_the_field_then_close(orpheus: Server, messages: list, field: str) -> None:
    url = orpheus.url.replace("http", "ws") + "/v1/audio/speech/stream"
    with connect(url) as ws:
        replies = []
        for message in messages:
            ws.send(message if isinstance(message, str) else json.dumps(message))
        for _ in range(3):
            reply = json.loads(ws.recv(timeout=30))
            replies.append(reply)
            if reply["type"] == "error":
                break
        assert replies[-1]["type"] == "error" and replies[-1]["error"]["field"] == field, replies
        with pytest.raises(Exception):  # noqa: B017, PT011 -- the server closes after the error
            ws.recv(timeout=10)
        assert ws.close_code == 1008
    wait_until(orpheus.pools_full, 10.0)


def test_async_client_streams_speech_and_a_session(orpheus: Server) -> None:
    async def run() -> tuple[bytes, bytes]:
        async with AsyncVoxClient(orpheus.url) as client:
            whole = await client.speech("Hello there.", voice="tara", format="pcm", **TOKENS)
            assert await client.models() == ["orpheus-tiny"]
            assert "tara" in [v["id"] for v in await client.voices()]
            async with client.session(voice="tara", **TOKENS) as session:
                await session.send("Hello there.")
                await session.end()
                streamed = b"".join([chunk.data async for chunk in session])
            return whole, streamed

    whole, streamed = asyncio.run(run())
    assert len(whole) == 2 * 7 * 2048 and streamed == whole


def test_client_errors_name_the_param(orpheus: Server) -> None:
    with VoxClient(orpheus.url) as client:
        assert "tara" in [v["id"] for v in client.voices()] and client.models() == ["orpheus-tiny"]
        with pytest.raises(VoxError) as exc:
            client.speech("Hi.", voice="nobody")
        assert exc.value.status == 400 and exc.value.param == "voice"
        with pytest.raises(VoxError) as exc:
            client.create_voice("x", b"RIFF")
        assert exc.value.status == 400  # saved voices need --data-dir (and this model does not clone)


def test_say_writes_a_playable_file(orpheus: Server, tmp_path: Path) -> None:
    out = tmp_path / "hello.mp3"
    cmd = [sys.executable, "-m", "vox_serve.launch", "say", "Hello there.", "-o", str(out), "--url", orpheus.url,
           "--voice", "tara", "--fields", json.dumps(TOKENS)]
    done = subprocess.run(cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert probe(out.read_bytes(), tmp_path, "mp3")["streams"][0]["codec_name"] == "mp3"
    bad = subprocess.run([*cmd[:-4], "--voice", "nobody"], cwd=REPO, env=child_env(), capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 1 and "voice" in bad.stderr
