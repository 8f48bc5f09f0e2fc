"""Input streaming end to end: /generate/stream/{start,text,audio,end} on a real server whose model
claims input streaming (tests/input_streaming_site patches the meta in the server's processes)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from http_harness import Server, error_of, generate, parse_wav, running_server, wait_until

from vox_serve.audio import STREAMING_SIZE

SITE = Path(__file__).parent / "input_streaming_site"
FIELDS = {"voice": "zoe", "max_tokens": 42, "ignore_eos": True, "seed": 21}
PIECES = ["Streaming ", "text, piece | by", " piece;\n", "as it comes."]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("http-sessions"), "--greedy", paths=(SITE,)) as srv:
        yield srv


def start(server: Server, **fields: Any) -> str:
    response = server.client.post("/generate/stream/start", json=fields)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["sample_rate"] == 24000
    return body["id"]


def test_session_audio_equals_the_whole_text_sent_at_once(server: Server) -> None:
    assert server.client.get("/info").json()["supports_input_streaming"] is True
    session = start(server, text=PIECES[0], **FIELDS)
    audio: dict[str, Any] = {}

    def read_audio() -> None:  # opened before the text ends, as a live client would
        with httpx.Client(base_url=server.url, timeout=60.0) as client:
            response = client.get(f"/generate/stream/{session}/audio")
            audio["status"], audio["body"] = response.status_code, response.content

    reader = threading.Thread(target=read_audio, daemon=True)
    reader.start()
    time.sleep(0.3)
    text = server.client.post(f"/generate/stream/{session}/text", json={"text": PIECES[1]})
    assert text.status_code == 200 and text.json()["num_chars"] == len(PIECES[0] + PIECES[1])
    for piece in PIECES[2:]:
        response = server.client.post(f"/generate/stream/{session}/text", content=piece.encode(),
                                      headers={"content-type": "text/plain; charset=utf-8"})
        assert response.status_code == 200
    assert server.client.post(f"/generate/stream/{session}/end").json()["num_chars"] == len("".join(PIECES))
    reader.join(60.0)
    assert audio["status"] == 200
    wav = parse_wav(audio["body"])
    assert wav.data_size == STREAMING_SIZE and len(wav.pcm) > 0
    whole = generate(server, text="".join(PIECES), **FIELDS)
    assert whole.status_code == 200 and parse_wav(whole.content).pcm == wav.pcm
    wait_until(server.pools_full, 10.0)


def test_session_calls_out_of_order_get_clear_errors(server: Server) -> None:
    assert server.client.post("/generate/stream/nope/text", json={"text": "x"}).status_code == 404
    session = start(server, **FIELDS)
    empty_end = server.client.post(f"/generate/stream/{session}/end")
    assert empty_end.status_code == 422 and error_of(empty_end)["field"] == "text"
    for body, field in (({"text": ""}, "text"), ({"text": 5}, "text"), ({"words": "x"}, "body")):
        response = server.client.post(f"/generate/stream/{session}/text", json=body)
        assert response.status_code in (400, 422) and error_of(response)["field"] == field, response.text
    too_long = server.client.post(f"/generate/stream/{session}/text", json={"text": "a" * 2001})
    assert too_long.status_code == 422 and error_of(too_long)["field"] == "text"
    assert server.client.post(f"/generate/stream/{session}/text", json={"text": "Hi."}).status_code == 200
    assert server.client.post(f"/generate/stream/{session}/end").status_code == 200
    assert server.client.post(f"/generate/stream/{session}/end").status_code == 409
    assert server.client.post(f"/generate/stream/{session}/text", json={"text": "more"}).status_code == 409
    with server.client.stream("GET", f"/generate/stream/{session}/audio") as audio:
        assert audio.status_code == 200
        second = server.client.get(f"/generate/stream/{session}/audio")
        assert second.status_code == 409 and "already being read" in error_of(second)["message"]
        assert len(parse_wav(audio.read()).pcm) > 0
    assert server.client.get(f"/generate/stream/{session}/audio").status_code == 404  # read once, then gone
    bad_start = server.client.post("/generate/stream/start", json={"temperature": 99})
    assert bad_start.status_code == 422 and error_of(bad_start)["field"] == "temperature"
    wait_until(server.pools_full, 10.0)


def test_closing_the_session_audio_aborts_it_and_frees_the_pools(server: Server) -> None:
    wait_until(server.pools_full, 10.0)
    time.sleep(0.5)  # replica stats refresh every 0.2 s: read the abort count after one has surely arrived
    aborted = server.replicas()[0]["aborted"]
    session = start(server, text="A long one.", voice="zoe", max_tokens=3000, ignore_eos=True)
    assert server.client.post(f"/generate/stream/{session}/end").status_code == 200
    with server.client.stream("GET", f"/generate/stream/{session}/audio") as response:
        assert response.status_code == 200
        next(response.iter_raw())
    wait_until(server.pools_full, 10.0)
    wait_until(lambda: server.replicas()[0]["aborted"] == aborted + 1, 5.0)
    assert server.client.post(f"/generate/stream/{session}/text", json={"text": "x"}).status_code == 404
