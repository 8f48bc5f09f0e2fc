"""Qwen3-TTS input streaming end to end on a real server (qwen3-tts-tiny): audio starts while the text
is still arriving, the result does not depend on how the text was cut, and a session whose text runs
dry and never ends is cut by --request-timeout-s with everything it held freed."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from http_harness import Server, parse_wav, running_server, wait_until

from vox_serve.audio import STREAMING_SIZE

TIMEOUT_S = 12.0
FIELDS = {"voice": "ryan", "language": "english", "max_tokens": 60, "ignore_eos": True}
TEXT = "Hello there, this is a streaming test of the system."
PIECES = ["Hello there, this is a stream", "ing test of ", "the system."]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("http-qwen3-stream"), "--model", "qwen3-tts-tiny", "--greedy",
                        "--detokenize-interval", "4", "--request-timeout-s", str(TIMEOUT_S)) as srv:
        yield srv


class AudioReader(threading.Thread):
    """Reads a session's audio stream, noting when its first samples (past the WAV header) arrive."""

    def __init__(self, server: Server, session: str) -> None:
        super().__init__(daemon=True)
        self.url, self.session = server.url, session
        self.body, self.first_audio_at, self.error = b"", None, None
        self.start()

    def run(self) -> None:
        try:
            with httpx.Client(base_url=self.url, timeout=60.0) as client:
                with client.stream("GET", f"/generate/stream/{self.session}/audio") as response:
                    assert response.status_code == 200
                    for piece in response.iter_raw():
                        self.body += piece
                        if self.first_audio_at is None and len(self.body) > 44:
                            self.first_audio_at = time.monotonic()
        except httpx.HTTPError as exc:  # a stream cut short
            self.error = exc


def start(server: Server, text: str, **fields: Any) -> str:
    response = server.client.post("/generate/stream/start", json={"text": text, **fields})
    assert response.status_code == 200, response.text
    return response.json()["id"]


def send(server: Server, session: str, path: str, **body: Any) -> None:
    response = server.client.post(f"/generate/stream/{session}/{path}", json=body or None)
    assert response.status_code == 200, response.text


def test_audio_starts_before_the_text_ends_and_equals_the_text_sent_whole(server: Server) -> None:
    assert server.client.get("/info").json()["supports_input_streaming"] is True
    session = start(server, PIECES[0], **FIELDS)
    reader = AudioReader(server, session)
    for piece in PIECES[1:]:
        time.sleep(0.7)
        send(server, session, "text", text=piece)
    # Audio must start from the text sent so far: a server that waited for "end" would time out here.
    wait_until(lambda: reader.first_audio_at is not None, 60.0)
    end_sent_at = time.monotonic()
    send(server, session, "end")
    reader.join(60.0)
    assert reader.error is None and reader.first_audio_at is not None
    assert reader.first_audio_at < end_sent_at, "audio should stream while the text is still arriving"
    wav = parse_wav(reader.body)
    assert wav.data_size == STREAMING_SIZE and len(wav.pcm) == 60 * 1920 * 2

    whole = start(server, TEXT, **FIELDS)
    send(server, whole, "end")
    one_piece = AudioReader(server, whole)
    one_piece.join(60.0)
    assert parse_wav(one_piece.body).pcm == wav.pcm
    wait_until(server.pools_full, 10.0)


def test_a_session_whose_text_never_ends_times_out_and_frees_its_pages(server: Server) -> None:
    wait_until(server.pools_full, 10.0)
    started = time.monotonic()
    session = start(server, "Hello there, and then nothing more", **FIELDS)
    reader = AudioReader(server, session)
    wait_until(lambda: reader.first_audio_at is not None, 10.0)
    assert not server.pools_full()  # waiting for text, with its pages and codec slot
    reader.join(TIMEOUT_S + 10.0)
    assert not reader.is_alive() and reader.error is not None  # the stream ends without its final chunk
    assert time.monotonic() - started >= TIMEOUT_S
    wait_until(server.pools_full, 10.0)
