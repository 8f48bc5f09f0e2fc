"""Issue 10, defects 2, 3 and 6 on qwen3-tts-tiny (input streaming): sessions waiting for text leave the
decode batch to other requests, are limited in number and idle time (reported in /health), and are
checked at /start exactly as POST /generate checks its fields."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from http_harness import Server, error_of, running_server, wait_until

IDLE_S = 6.0
MAX_BATCH = 2  # and so --max-sessions 2, its default


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("http-session-limits"), "--model", "qwen3-tts-tiny", "--greedy",
                        "--max-batch-size", str(MAX_BATCH), "--session-idle-timeout-s", str(IDLE_S)) as srv:
        yield srv


def start(server: Server, **fields: object) -> str:
    response = server.client.post("/generate/stream/start", json=fields)
    assert response.status_code == 200, response.text
    return response.json()["id"]


def assert_error(response, status: int, field: str | None, fragment: str = "") -> None:  # noqa: ANN001
    assert response.status_code == status, response.text
    error = error_of(response)
    assert error["field"] == field and fragment in error["message"], error


def test_health_reports_the_session_limits(server: Server) -> None:
    assert server.health()[1]["sessions"] == {"open": 0, "max_per_replica": MAX_BATCH, "idle_timeout_s": IDLE_S}
    limits = server.client.get("/info").json()["limits"]
    assert limits["max_sessions"] == MAX_BATCH and limits["session_idle_timeout_s"] == IDLE_S
    paths = server.client.get("/openapi.json").json()["paths"]  # a model with input streaming lists its routes
    assert set(paths["/generate/stream/{session_id}/text"]["post"]["requestBody"]["content"]) == {
        "application/json", "text/plain"}
    start_schema = paths["/generate/stream/start"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert start_schema["properties"]["streaming"]["enum"] == [True] and "pattern" not in start_schema[
        "properties"]["text"]


def test_idle_sessions_block_no_request_and_end_after_the_idle_timeout(server: Server) -> None:
    """With a decode batch of 2, two sessions whose text ran dry made a 12-token request wait 46 s."""
    sessions = [start(server, text="Hello there, this is", voice="ryan") for _ in range(MAX_BATCH)]
    wait_until(lambda: server.replicas()[0]["active_requests"] == MAX_BATCH, 5.0)  # both run, out of text
    response = server.client.post("/generate", json={"text": "Hi.", "max_tokens": 12, "streaming": False},
                                  timeout=IDLE_S * 3)
    assert response.status_code == 200, response.text
    # done while the sessions still hold their place (a request that waited for them to time out would find
    # them ended): an ordering, not a wall-clock bound
    assert server.health()[1]["sessions"]["open"] == MAX_BATCH
    third = server.client.post("/generate/stream/start", json={"voice": "ryan"})
    assert_error(third, 503, None, "--max-sessions")
    assert int(third.headers["retry-after"]) >= 1
    time.sleep(IDLE_S + 1.0)  # no more text: the sessions end and free what they held
    late = server.client.post(f"/generate/stream/{sessions[0]}/text", json={"text": " more"})
    assert late.status_code in (404, 409), late.text
    wait_until(server.pools_full, 10.0)
    audio = server.client.get(f"/generate/stream/{sessions[1]}/audio")
    assert audio.status_code in (404, 504), audio.text
    if audio.status_code == 504:
        assert "--session-idle-timeout-s" in error_of(audio)["message"]
    again = start(server, voice="ryan", text="Room again.", max_tokens=12)
    assert server.client.post(f"/generate/stream/{again}/end").status_code == 200
    assert server.client.get(f"/generate/stream/{again}/audio").status_code == 200
    wait_until(lambda: server.health()[1]["sessions"]["open"] == 0 and server.pools_full(), 10.0)


@pytest.mark.parametrize("fields,field", [
    ({"voice": "nobody"}, "voice"),
    ({"language": "klingon"}, "language"),
    ({"voice": "ryan", "speaker": "ryan"}, "speaker"),
    ({"instruct": 5}, "instruct"),
    ({"temperature": None}, "temperature"),
    ({"text": None}, "text"),  # found by the long schemathesis run
])
def test_session_start_checks_its_fields_as_generate_does(server: Server, fields: dict, field: str) -> None:
    """`{"voice": "nobody"}` used to start a session (200) that failed only later."""
    assert_error(server.client.post("/generate/stream/start", json=fields), 422, field)
    whole = {**fields, "text": "Hello."} if field != "text" else fields
    assert_error(server.client.post("/generate", json=whole), 422, field)


def test_lone_surrogates_in_session_routes_are_422s_and_leak_nothing(server: Server) -> None:
    wait_until(server.pools_full, 15.0)
    start_body = json.dumps({"voice": "ryan", "text": "a\ud800"})
    for _ in range(10):
        response = server.client.post("/generate/stream/start", content=start_body,
                                      headers={"content-type": "application/json"})
        assert_error(response, 422, "text", "lone surrogate")
    session = start(server, voice="ryan")
    piece = server.client.post(f"/generate/stream/{session}/text", content=json.dumps({"text": "b\udfff"}),
                               headers={"content-type": "application/json"})
    assert_error(piece, 422, "text", "lone surrogate")
    assert server.client.post(f"/generate/stream/{session}/text", json={"text": "Fine."}).status_code == 200
    assert sum(r["in_flight"] for r in server.replicas()) == 1  # the one open session, nothing leaked
