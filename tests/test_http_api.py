"""The HTTP API end to end: a real server process (orpheus-tiny on CPU) and a real HTTP client."""

from __future__ import annotations

import base64
import io
import time
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from http_harness import (
    Server,
    bench_pcm,
    error_of,
    generate,
    generate_concurrently,
    parse_wav,
    running_server,
    wait_until,
)

from vox_serve.audio import STREAMING_SIZE

SERVER_FLAGS = ("--greedy", "--max-upload-mb", "1", "--max-batch-size", "16")
SAMPLES_PER_FRAME = 2048  # Orpheus/SNAC: one frame of 7 codes
MAX_UPLOAD_BYTES = 1 << 20


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("http-api"), *SERVER_FLAGS) as srv:
        yield srv


@pytest.fixture(scope="module")
def first_pid(server: Server) -> int:
    return server.replicas()[0]["pid"]


def expected_samples(max_tokens: int) -> int:
    """Audio of `max_tokens` tokens (ignore_eos): frames 1 .. frames-3 are emitted (skip 1, lookahead 2)."""
    frames = max_tokens // 7
    return (frames - 3) * SAMPLES_PER_FRAME


def test_health_and_info_describe_the_served_model(server: Server, first_pid: int) -> None:
    status, health = server.health()
    assert status == 200 and health["status"] == "ok" and health["reason"] is None
    [replica] = health["replicas"]
    assert replica["state"] == "ready" and replica["pid"] == first_pid and replica["device"] == "cpu"
    assert replica["pools"]["kv_pages"]["total"] == 512
    info = server.client.get("/info").json()
    assert info["model"] == "orpheus-tiny" and info["sample_rate"] == 24000
    assert "tara" in info["voices"] and info["default_voice"] == "tara"
    assert info["aliases"] == {"speaker": "voice"}
    assert {"text", "voice", "temperature", "seed", "streaming"} <= set(info["accepted_fields"])
    assert "language" not in info["accepted_fields"]
    assert info["supports_input_streaming"] is False and info["supports_reference_audio"] is False
    assert info["limits"]["max_text_chars"] == 2000 and info["limits"]["max_upload_mb"] == 1


def test_streamed_wav_is_header_then_pcm_in_pieces(server: Server) -> None:
    fields = {"text": "Streaming, chunk by chunk.", "max_tokens": 140, "ignore_eos": True, "seed": 5}
    pieces: list[bytes] = []
    with server.client.stream("POST", "/generate", json=fields) as response:
        assert response.status_code == 200 and response.headers["content-type"] == "audio/wav"
        assert "content-length" not in response.headers
        pieces.extend(response.iter_raw())
    wav = parse_wav(b"".join(pieces))
    assert (wav.sample_rate, wav.channels, wav.bits) == (24000, 1, 16)
    assert wav.riff_size == wav.data_size == STREAMING_SIZE
    assert len(wav.pcm) == 2 * expected_samples(140)
    assert len(pieces) >= 2


def test_first_audio_arrives_while_the_request_is_still_generating(server: Server) -> None:
    """Ordering, not timing: the client hangs up on its first PCM bytes, so the request ends aborted; a
    server that buffered the stream would send them only after all 3000 tokens, and the request would
    already have finished."""
    wait_until(server.pools_full, 10.0)
    time.sleep(0.5)  # replica stats refresh every 0.2 s: read the counts after a heartbeat from now
    before = server.replicas()[0]
    fields = {"text": "The first chunk comes long before the last.", "max_tokens": 3000, "ignore_eos": True}
    with httpx.Client(base_url=server.url, timeout=httpx.Timeout(60.0)) as client:
        with client.stream("POST", "/generate", json=fields) as response:
            assert response.status_code == 200
            pieces = response.iter_raw()  # kept: a discarded iterator closes the connection at once
            received = 0
            while received <= 44:
                received += len(next(pieces))
    wait_until(lambda: server.replicas()[0]["aborted"] == before["aborted"] + 1, 10.0)
    wait_until(server.pools_full, 10.0)
    assert server.replicas()[0]["finished"] == before["finished"]


def test_greedy_audio_is_identical_streamed_whole_and_in_bench(server: Server, tmp_path: Path) -> None:
    text = "Same request, same audio."
    fields = {"voice": "leo", "max_tokens": 42, "seed": 11, "ignore_eos": True}
    streamed = generate(server, text=text, **fields)
    whole = generate(server, text=text, streaming=False, **fields)
    assert streamed.status_code == whole.status_code == 200
    stream_wav, whole_wav = parse_wav(streamed.content), parse_wav(whole.content)
    assert whole_wav.data_size == len(whole_wav.pcm) and whole_wav.riff_size == 36 + len(whole_wav.pcm)
    assert whole.headers["content-length"] == str(len(whole.content))
    assert whole.headers["x-finish-reason"] == "length" and whole.headers["x-num-tokens"] == "42"
    assert len(stream_wav.pcm) == 2 * expected_samples(42) and any(stream_wav.pcm)
    assert stream_wav.pcm == whole_wav.pcm
    bench = bench_pcm(tmp_path, text, fields, "--greedy", "--max-batch-size", "16")
    assert bench == whole.content


def test_sixteen_concurrent_clients_all_succeed(server: Server) -> None:
    responses = generate_concurrently(server, [
        {"text": f"Client number {i}.", "max_tokens": 35, "seed": i, "ignore_eos": True, "streaming": i % 2 == 0}
        for i in range(16)
    ])
    assert [r.status_code for r in responses] == [200] * 16
    for r in responses:
        assert len(parse_wav(r.content).pcm) == 2 * expected_samples(35)
    assert len({r.content for r in responses}) == 16  # each request's own seed and text
    wait_until(server.pools_full, 10.0)


def _wav_file() -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\x01\x00" * 1600)
    return out.getvalue()


def _json(**fields: Any) -> dict[str, Any]:
    return {"json": fields}


def _form(files: dict[str, bytes] | None = None, **fields: str) -> dict[str, Any]:
    return {"data": fields, "files": {k: (f"{k}.bin", v) for k, v in (files or {}).items()}}


BAD_INPUTS = {
    "empty text": (_json(text=""), 422, "text"),
    "whitespace text": (_json(text=" \n\t "), 422, "text"),
    "missing text": (_json(voice="tara"), 422, "text"),
    "text over the limit": (_json(text="a" * 2001), 422, "text"),
    "field the model does not take": (_json(text="hi", language="en"), 422, "language"),
    "unknown field": (_json(text="hi", colour="red"), 422, "colour"),
    "unknown voice (alias)": (_json(text="hi", speaker="nobody"), 422, "voice"),
    "temperature below 0": (_json(text="hi", temperature=-1), 422, "temperature"),
    "temperature not a number": (_json(text="hi", temperature="hot"), 422, "temperature"),
    "top_p 0": (_json(text="hi", top_p=0), 422, "top_p"),
    "top_k negative": (_json(text="hi", top_k=-1), 422, "top_k"),
    "min_p 1": (_json(text="hi", min_p=1.0), 422, "min_p"),
    "repetition_penalty 0": (_json(text="hi", repetition_penalty=0), 422, "repetition_penalty"),
    "max_tokens 0": (_json(text="hi", max_tokens=0), 422, "max_tokens"),
    "max_tokens fractional": (_json(text="hi", max_tokens=2.5), 422, "max_tokens"),
    "seed negative": (_json(text="hi", seed=-1), 422, "seed"),
    "streaming not a boolean": (_json(text="hi", streaming="yes"), 422, "streaming"),
    "form streaming not a boolean": (_form(text="hi", streaming="maybe"), 422, "streaming"),
    "form top_k not a number": (_form(text="hi", top_k="abc"), 422, "top_k"),
    "audio the model does not take": (_form({"audio": _wav_file()}, text="hi"), 422, "audio"),
    "audio not decodable": (_form({"audio": b"not audio at all" * 64}, text="hi"), 422, "audio"),
    "audio empty": (_form({"audio": b""}, text="hi"), 422, "audio"),
    "audio not base64 in JSON": (_json(text="hi", audio="%%%"), 422, "audio"),
    "audio in JSON the model does not take": (_json(text="hi", audio=base64.b64encode(_wav_file()).decode()),
                                              422, "audio"),
    "text sent as a file": (_form({"text": b"hello"}), 422, "text"),
    "upload over --max-upload-mb": (_form({"audio": b"\0" * (MAX_UPLOAD_BYTES + 300_000)}, text="hi"), 413,
                                    "audio"),
    "JSON body over the limit": (_json(text="a" * (MAX_UPLOAD_BYTES * 2 + 10)), 413, "body"),
    "malformed JSON": ({"content": b"{not json", "headers": {"content-type": "application/json"}}, 400, "body"),
    "JSON not an object": ({"json": ["hi"]}, 400, "body"),
    "unsupported content type": ({"content": b"hi", "headers": {"content-type": "text/plain"}}, 415, "body"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_gets_a_4xx_naming_the_field(server: Server, case: str) -> None:
    kwargs, status, field = BAD_INPUTS[case]
    response = server.client.post("/generate", **kwargs)
    assert response.status_code == status, response.text
    error = error_of(response)
    assert error["field"] == field and field in error["message"], error


@pytest.mark.parametrize("method,path", [
    ("POST", "/generate/stream/start"), ("POST", "/generate/stream/abc/text"),
    ("GET", "/generate/stream/abc/audio"), ("POST", "/generate/stream/abc/end"),
])
def test_input_streaming_routes_answer_400_for_a_model_without_it(server: Server, method: str, path: str) -> None:
    response = server.client.request(method, path, json={"text": "hi"} if method == "POST" else None)
    assert response.status_code == 400
    error = error_of(response)
    assert error["type"] == "unsupported" and "input streaming" in error["message"]


def test_server_serves_correctly_after_bad_inputs(server: Server, first_pid: int) -> None:
    [replica] = server.replicas()
    assert replica["pid"] == first_pid and replica["restarts"] == 0 and replica["state"] == "ready"
    response = generate(server, text="Still here.", max_tokens=35, ignore_eos=True, seed=1)
    assert response.status_code == 200 and len(parse_wav(response.content).pcm) == 2 * expected_samples(35)
    wait_until(server.pools_full, 10.0)


@pytest.mark.parametrize("streaming", [True, False])
def test_client_disconnect_aborts_and_returns_the_pools_to_full(server: Server, streaming: bool) -> None:
    wait_until(server.pools_full, 10.0)
    aborted = server.replicas()[0]["aborted"]
    fields = {"text": "A long request nobody waits for.", "max_tokens": 3000, "ignore_eos": True,
              "streaming": streaming}
    with httpx.Client(base_url=server.url, timeout=httpx.Timeout(60.0, read=2.0)) as client:
        if streaming:
            with client.stream("POST", "/generate", json=fields) as response:
                assert response.status_code == 200
                # Keep the iterator: a discarded one is finalised at once, which closes the connection.
                pieces = response.iter_raw()
                next(pieces)  # audio is flowing: the request holds pages now
                # /health reports the replica's last heartbeat (every 0.2 s), which may predate the request
                wait_until(lambda: server.replicas()[0]["active_requests"] == 1, 5.0)
        else:
            with pytest.raises(httpx.ReadTimeout):  # 3000 tokens take far longer than 2 s
                client.post("/generate", json=fields)
    wait_until(server.pools_full, 10.0)
    assert server.replicas()[0]["aborted"] == aborted + 1


def test_openapi_documents_every_route_field_and_error(server: Server) -> None:
    doc = server.client.get("/openapi.json").json()
    paths = doc["paths"]
    # orpheus has no input streaming: its session routes only answer 400 and are not advertised
    assert {p: sorted(paths[p]) for p in paths} == {
        "/generate": ["post"], "/health": ["get"], "/info": ["get"],
        # the OpenAI-compatible speech API, saved voices and metrics (tests/test_openai_api.py)
        # (saving and deleting voices need --data-dir and a model that clones: tests/test_voices.py)
        "/v1/audio/speech": ["post"], "/v1/models": ["get"], "/v1/audio/voices": ["get"],
        "/v1/audio/voices/{voice_id}": ["get"], "/metrics": ["get"],
    }
    gen = paths["/generate"]["post"]
    content = gen["requestBody"]["content"]
    assert set(content) == {"application/json", "multipart/form-data", "application/x-www-form-urlencoded"}
    info = server.client.get("/info").json()
    props = content["application/json"]["schema"]["properties"]
    assert set(props) == set(info["accepted_fields"]) | {"speaker"}
    assert content["application/json"]["schema"]["required"] == ["text"]
    assert props["voice"]["enum"] == info["voices"] and props["temperature"]["type"] == "number"
    assert props["temperature"]["maximum"] == 10 and props["top_k"]["type"] == "integer"
    assert props["streaming"] == {**props["streaming"], "type": "boolean", "default": True}
    assert "audio/wav" in gen["responses"]["200"]["content"]
    assert {"400", "413", "415", "422", "500", "503", "504"} <= set(gen["responses"])
    assert "Retry-After" in gen["responses"]["503"]["headers"]
    error_ref = gen["responses"]["422"]["content"]["application/json"]["schema"]["$ref"]
    assert error_ref.endswith("/ErrorResponse") and "ErrorResponse" in doc["components"]["schemas"]
    assert paths["/health"]["get"]["responses"]["503"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/HealthResponse")


def test_api_process_never_loads_torch(server: Server) -> None:
    maps = Path(f"/proc/{server.proc.pid}/maps")
    if not maps.exists():
        pytest.skip("needs /proc")
    assert "libtorch" not in maps.read_text()
    [replica] = server.replicas()
    assert "libtorch" in Path(f"/proc/{replica['pid']}/maps").read_text()  # the check can see torch
