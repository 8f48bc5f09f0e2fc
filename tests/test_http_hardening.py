"""Issue 10 (hardening), end to end on orpheus-tiny: each test reproduces one defect found by fuzzing,
soak tests or a first run, against a real server process started with the production-style flags
(API key, CORS, short header/body timeouts, a connection limit)."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile
from http_harness import Server, error_of, running_server, wait_until

API_KEY = "test-key-4f1c"
ORIGIN = "http://good.example"
HEADER_TIMEOUT_S, BODY_TIMEOUT_S, MAX_CONNECTIONS, REQUEST_TIMEOUT_S = 1.5, 2.0, 24, 4.0
FLAGS = ("--api-key", API_KEY, "--allowed-origins", ORIGIN, "--header-timeout-s", str(HEADER_TIMEOUT_S),
         "--body-timeout-s", str(BODY_TIMEOUT_S), "--max-connections", str(MAX_CONNECTIONS),
         "--request-timeout-s", str(REQUEST_TIMEOUT_S), "--max-upload-mb", "2")
SHORT = {"max_tokens": 35, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("http-hardening"), *FLAGS) as srv:
        srv.client.headers["authorization"] = f"Bearer {API_KEY}"
        yield srv


def in_flight(server: Server) -> int:
    return sum(r["in_flight"] for r in server.replicas())


def post(server: Server, **kwargs: object) -> httpx.Response:
    return server.client.post("/generate", **kwargs)


def raw_json(server: Server, body: str | bytes) -> httpx.Response:
    return post(server, content=body.encode() if isinstance(body, str) else body,
                headers={"content-type": "application/json"})


def assert_error(response: httpx.Response, status: int, field: str, fragment: str = "") -> None:
    assert response.status_code == status, response.text
    error = error_of(response)
    assert error["field"] == field and fragment in error["message"], error


# ---- defect 3: lone surrogates -------------------------------------------------------------------
@pytest.mark.parametrize("field", ["text", "voice"])
def test_a_lone_surrogate_is_a_422_naming_the_field_and_leaks_no_handle(server: Server, field: str) -> None:
    body = json.dumps({"text": "hi", **SHORT, field: "a\ud800b"})  # ASCII JSON: "\\ud800"
    for _ in range(20):  # every one used to be a 500 that left a phantom request in flight
        assert_error(raw_json(server, body), 422, field, "lone surrogate")
    assert in_flight(server) == 0


# ---- defect 4: bodies the JSON parser rejects ------------------------------------------------------
@pytest.mark.parametrize("body,fragment", [
    ("[" * 100_000, "nested too deeply"),
    ('{"text": "hi", "seed": ' + "9" * 5001 + "}", "digits"),
    ('{"text": "hi", "temperature": NaN}', "NaN"),
    ('{"text": "hi", "temperature": 1e999}', "out of range"),
    (b'{"text": "\xff"}', "not valid JSON"),
])
def test_every_body_the_parser_rejects_is_a_400_naming_the_body(server: Server, body: str, fragment: str) -> None:
    assert_error(raw_json(server, body), 400, "body", fragment)


def test_a_field_given_twice_in_json_is_refused(server: Server) -> None:
    assert_error(raw_json(server, '{"text": "a", "text": "b"}'), 422, "text", "more than once")


# ---- defect 8: silent or lenient input -------------------------------------------------------------
@pytest.mark.parametrize("text", ["\u200b", "\ufeff", "\x00", "\u200b \ufeff\n\u00a0\u2060"])
def test_text_of_only_invisible_characters_is_refused(server: Server, text: str) -> None:
    assert_error(post(server, json={"text": text, **SHORT}), 422, "text", "no visible character")


def test_voice_and_speaker_together_are_refused(server: Server) -> None:
    assert_error(post(server, json={"text": "hi", "voice": "tara", "speaker": "leo"}), 422, "speaker", "not both")


@pytest.mark.parametrize("value", ["1_000", " 14 ", "14 ", "0x10", "1e5000", "9" * 60, "١٤"])
def test_form_numbers_must_be_written_as_json_writes_them(server: Server, value: str) -> None:
    assert_error(post(server, files={"text": (None, "hi"), "top_k": (None, value)}), 422, "top_k")


@pytest.mark.parametrize("field", ["text", "voice", "temperature", "streaming"])
def test_null_is_refused_for_every_field(server: Server, field: str) -> None:
    body = {"text": "hi", field: None}
    assert_error(post(server, json=body), 422, field, "null")


def test_an_unknown_voice_is_refused_before_it_reaches_a_replica(server: Server) -> None:
    assert_error(post(server, json={"text": "hi", "voice": "nobody"}), 422, "voice", "not one of")


# ---- defect 9: multipart problems get the one error shape -------------------------------------------
def multipart(body: bytes, boundary: str | None = "XyZ") -> dict[str, object]:
    media = "multipart/form-data" + (f"; boundary={boundary}" if boundary else "")
    return {"content": body, "headers": {"content-type": media}}


def part(name: str, value: bytes, filename: str | None = None) -> bytes:
    disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
    return b"--XyZ\r\nContent-Disposition: " + disposition.encode() + b"\r\n\r\n" + value + b"\r\n"


@pytest.mark.parametrize("case", ["no boundary", "two files", "field too large", "no closing boundary"])
def test_multipart_problems_are_400_naming_the_body(server: Server, case: str) -> None:
    text = part("text", b"hi")
    clip = part("audio", b"RIFF....", "a.wav")
    bodies = {
        "no boundary": multipart(text + b"--XyZ--\r\n", boundary=None),
        "two files": multipart(text + clip + clip + b"--XyZ--\r\n"),
        "field too large": multipart(part("text", b"a" * (1 << 20) + b"a") + b"--XyZ--\r\n"),
        "no closing boundary": multipart(text + clip),  # used to drop the audio part silently
    }
    assert_error(post(server, **bodies[case]), 400, "body", "malformed form data")


# ---- defect 1: uploads bounded before decoding ------------------------------------------------------
def hour_of_flac_silence() -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, np.zeros((48000 * 3600, 1), np.int16), 48000, format="FLAC", subtype="PCM_16")
    return buf.getvalue()


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_an_hour_of_audio_for_a_model_without_audio_is_refused_without_decoding(server: Server) -> None:
    flac = hour_of_flac_silence()
    assert len(flac) < 1 << 20
    before = peak_rss_mb(server.proc.pid)
    response = post(server, files={"text": (None, "hi"), "audio": ("a.flac", flac, "audio/flac")})
    assert_error(response, 422, "audio", "takes no reference audio")
    assert peak_rss_mb(server.proc.pid) - before < 60  # decoding it all took 336 MB


# ---- defect 7: the OpenAPI document says what the server does ---------------------------------------
def test_openapi_matches_what_the_server_accepts(server: Server) -> None:
    doc = server.client.get("/openapi.json").json()
    assert not [p for p in doc["paths"] if p.startswith("/generate/stream")]  # orpheus has no input streaming
    schema = doc["paths"]["/generate"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    text = schema["properties"]["text"]
    assert text["minLength"] == 1 and text["maxLength"] == server.client.get("/info").json()["limits"][
        "max_text_chars"] and text["pattern"]
    assert {"not": {"required": ["speaker", "voice"]}} in schema["allOf"]
    assert all("null" not in str(p.get("type")) for p in schema["properties"].values())
    assert_error(post(server, json={"text": ""}), 422, "text")


# ---- API key and CORS ---------------------------------------------------------------------------------
def test_the_api_key_is_required_everywhere_but_health(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=10.0) as anonymous:
        assert anonymous.get("/health").status_code == 200
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": f"Basic {API_KEY}"}):
            for method, path in (("GET", "/info"), ("POST", "/generate")):
                response = anonymous.request(method, path, headers=headers, json={"text": "hi"})
                assert_error(response, 401, "authorization", "Bearer")
                assert response.headers["www-authenticate"].startswith("Bearer")
        assert anonymous.get("/info", headers={"authorization": f"Bearer {API_KEY}"}).status_code == 200
    doc = server.client.get("/openapi.json").json()
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert "401" in doc["paths"]["/generate"]["post"]["responses"]


def test_the_api_key_never_reaches_a_replica_command_line(server: Server) -> None:
    [replica] = server.replicas()
    assert API_KEY.encode() not in Path(f"/proc/{replica['pid']}/cmdline").read_bytes()


def test_cors_allows_only_the_allowed_origins(server: Server) -> None:
    preflight = {"access-control-request-method": "POST", "access-control-request-headers": "authorization"}
    good = server.client.options("/generate", headers={"origin": ORIGIN, **preflight})
    assert good.status_code == 200 and good.headers["access-control-allow-origin"] == ORIGIN
    bad = server.client.options("/generate", headers={"origin": "http://evil.example", **preflight})
    assert "access-control-allow-origin" not in bad.headers
    simple = server.client.get("/info", headers={"origin": ORIGIN})
    assert simple.headers["access-control-allow-origin"] == ORIGIN


# ---- defect 11: header and body timeouts, connection limit -----------------------------------------
def connect(server: Server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10.0)


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes the connection within `seconds` (reading whatever it sends)."""
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
        return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_a_connection_that_never_finishes_its_headers_is_closed(server: Server) -> None:
    sock = connect(server)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # slowloris: the head never ends
    start = time.monotonic()
    assert closed_within(sock, HEADER_TIMEOUT_S + 5.0)
    assert HEADER_TIMEOUT_S - 0.2 <= time.monotonic() - start
    sock.close()


def test_a_declared_body_that_never_arrives_gets_408(server: Server) -> None:
    sock = connect(server)
    sock.sendall(f"POST /generate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n"
                 "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{".encode())
    sock.settimeout(BODY_TIMEOUT_S + 5.0)
    answer = read_response(sock)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408") and b'"field":"body"' in answer, answer


def read_response(sock: socket.socket) -> bytes:
    """One whole HTTP response: the head and body may come in separate segments."""
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(4096)
        if not piece:
            return data
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    length = re.search(rb"content-length: *(\d+)", head, re.IGNORECASE)
    while length and len(body) < int(length.group(1)):
        piece = sock.recv(4096)
        if not piece:
            break
        body += piece
    return head + b"\r\n\r\n" + body


def test_connections_past_the_limit_are_closed_and_the_server_recovers(server: Server) -> None:
    socks = [connect(server) for _ in range(MAX_CONNECTIONS + 6)]
    try:
        refused = sum(closed_within(s, 0.5) for s in socks)
        assert refused >= 6, refused  # beyond the limit: closed at once, long before the header timeout
    finally:
        for s in socks:
            s.close()
    wait_until(lambda: server.client.get("/info").status_code == 200, 10.0)


# ---- defect 12: a stream cut on purpose is no server error -------------------------------------------
def test_a_stream_cut_by_the_request_timeout_is_not_logged_as_a_server_error(server: Server) -> None:
    with pytest.raises(httpx.RemoteProtocolError):
        with server.client.stream("POST", "/generate", json={"text": "Long.", "max_tokens": 5000,
                                                              "ignore_eos": True}) as response:
            assert response.status_code == 200
            for _ in response.iter_raw():
                pass
    time.sleep(0.5)
    log = server.log_path.read_text(errors="replace")
    assert "failed mid-stream (timeout)" in log
    assert "ASGI callable returned without completing response" not in log and " 500" not in log


# ---- defect 5: a frozen replica is not ready ----------------------------------------------------------
def test_a_frozen_replica_turns_health_to_503_and_back(server: Server) -> None:
    [replica] = server.replicas()
    os.kill(replica["pid"], signal.SIGSTOP)
    try:
        start = time.monotonic()
        wait_until(lambda: server.health()[0] == 503, 5.0)
        assert time.monotonic() - start < 3.0  # ~1 s of silence, not the 30 s kill timeout
        status, body = server.health()
        assert "heartbeat" in body["reason"] and body["replicas"][0]["seconds_since_heartbeat"] > 1.0
        assert_error(post(server, json={"text": "hi", **SHORT}), 503, None)  # routed to no frozen replica
    finally:
        os.kill(replica["pid"], signal.SIGCONT)
    wait_until(lambda: server.health()[0] == 200, 5.0)
    assert post(server, json={"text": "Back.", **SHORT}).status_code == 200


# ---- defect 12: nothing left behind by a killed API process -------------------------------------------
def test_a_killed_api_process_leaves_no_socket_directory(tmp_path: Path) -> None:
    own_tmp = tmp_path / "tmp"
    own_tmp.mkdir()
    server = Server(tmp_path, env={"TMPDIR": str(own_tmp)})
    try:
        server.wait_healthy()
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(10)
    finally:
        server.stop()
    assert not [p.name for p in own_tmp.iterdir() if p.name.startswith("vox-serve-")]
