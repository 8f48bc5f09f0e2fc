"""The OpenAI-compatible speech API end to end: a real server (orpheus-tiny on CPU) and the official
`openai` Python package as its client; audio checked with FFmpeg's tools; long text as segments."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from audio_checks import decode, probe
from http_harness import Server, generate, parse_wav, running_server, wait_until

from vox_serve.api.segments import plan_segments, segment_chars
from vox_serve.audio import STREAMING_SIZE
from vox_serve.models.orpheus.program import orpheus_meta

# A short context makes segments short (~90 characters), so a few sentences are "long text".
SERVER_FLAGS = ("--greedy", "--max-model-len", "1024", "--max-input-chars", "1500")
SAMPLES_PER_FRAME = 2048
TOKENS = {"max_tokens": 70, "ignore_eos": True, "seed": 3}  # 10 frames -> 7 emitted (skip 1, lookahead 2)
SAMPLES = 7 * SAMPLES_PER_FRAME
RATE = 24000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("openai-api"), *SERVER_FLAGS) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120.0) as c:
        yield c


def speech(client: openai.OpenAI, text: str = "Hello there.", **kwargs: object) -> bytes:
    extra = {**TOKENS, **kwargs.pop("extra_body", {})}  # type: ignore[dict-item]
    response = client.audio.speech.create(model="orpheus-tiny", input=text, voice=kwargs.pop("voice", "tara"),
                                          extra_body=extra, **kwargs)  # type: ignore[arg-type]
    return response.content


def generate_pcm(server: Server, text: str) -> bytes:
    response = generate(server, text=text, voice="tara", streaming=False, **TOKENS)
    assert response.status_code == 200, response.text
    return parse_wav(response.content).pcm


def test_models_list_names_the_served_model(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["orpheus-tiny"]


def test_openapi_documents_the_speech_body(server: Server) -> None:
    paths = server.client.get("/openapi.json").json()["paths"]
    schema = paths["/v1/audio/speech"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert schema["required"] == ["model", "input"] and "mulaw" in schema["properties"]["response_format"]["enum"]
    assert set(paths["/v1/audio/speech"]["post"]["responses"]) >= {"200", "400", "401", "404", "503"}
    error = paths["/v1/audio/speech"]["post"]["responses"]["400"]["content"]["application/json"]["schema"]
    assert error == {"$ref": "#/components/schemas/OpenAIErrorResponse"}
    # orpheus-tiny has built-in voices and clones none: saving and deleting voices are not offered
    assert list(paths["/v1/audio/voices"]) == ["get"] and list(paths["/v1/audio/voices/{voice_id}"]) == ["get"]


def test_pcm_equals_generate_and_official_model_names_are_accepted(server: Server, client: openai.OpenAI) -> None:
    expected = generate_pcm(server, "Hello there.")
    assert len(expected) == 2 * SAMPLES
    assert speech(client, response_format="pcm") == expected
    response = client.audio.speech.create(model="tts-1", input="Hello there.", voice="tara", response_format="pcm",
                                          extra_body=TOKENS)
    assert response.content == expected


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "wav"])
def test_every_format_decodes_to_the_requests_audio(client: openai.OpenAI, fmt: str, tmp_path: Path) -> None:
    data = speech(client, response_format=fmt)
    [stream] = probe(data, tmp_path, fmt)["streams"]
    assert stream["codec_name"] == {"wav": "pcm_s16le", "opus": "opus"}.get(fmt, fmt)
    rate = 48000 if fmt == "opus" else RATE
    samples = decode(data, tmp_path, fmt)
    assert abs(len(samples) / rate - SAMPLES / RATE) < 0.08


def test_default_format_is_mp3_and_mulaw_is_8khz(client: openai.OpenAI, tmp_path: Path) -> None:
    assert probe(speech(client), tmp_path, "mp3")["streams"][0]["codec_name"] == "mp3"
    pcm8k = speech(client, response_format="pcm", extra_body={"sample_rate": 8000})
    assert abs(len(pcm8k) / 2 - SAMPLES / 3) <= 2  # the resampler rounds the end
    telephony = client.audio.speech.create(model="orpheus-tiny", input="Hello there.", voice="tara",
                                           extra_body={**TOKENS, "response_format": "mulaw"})
    assert telephony.response.headers["content-type"] == "audio/basic"
    assert abs(len(telephony.content) - SAMPLES / 3) <= 2  # one byte per sample at 8 kHz


def test_speed_shortens_the_audio(client: openai.OpenAI) -> None:
    fast = speech(client, response_format="pcm", speed=2.0)
    assert abs(len(fast) / 2 - SAMPLES / 2) < 0.03 * RATE


def test_streamed_wav_has_the_sentinel_and_a_whole_one_exact_sizes(client: openai.OpenAI) -> None:
    streamed = speech(client, response_format="wav")
    assert parse_wav(streamed).data_size == STREAMING_SIZE
    whole = speech(client, response_format="wav", extra_body={"streaming": False})
    assert parse_wav(whole).data_size == 2 * SAMPLES and parse_wav(whole).pcm == parse_wav(streamed).pcm


def test_with_streaming_response_yields_audio_as_it_is_produced(client: openai.OpenAI) -> None:
    pieces: list[bytes] = []
    with client.audio.speech.with_streaming_response.create(
            model="orpheus-tiny", input="Streaming, piece by piece.", voice="tara", response_format="opus",
            extra_body={**TOKENS, "max_tokens": 210}) as response:
        assert response.headers["content-type"] == "audio/ogg"
        for piece in response.iter_bytes():
            pieces.append(piece)
    data = b"".join(pieces)
    assert len(pieces) > 5 and data.startswith(b"OggS")


def test_sse_deltas_hold_the_audio_then_done_has_usage(client: openai.OpenAI) -> None:
    response = client.audio.speech.create(model="orpheus-tiny", input="Hello there.", voice="tara",
                                          response_format="pcm", stream_format="sse", extra_body=TOKENS)
    assert response.response.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[len("data: "):]) for line in response.text.split("\n\n") if line.startswith("data: ")]
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1)
    assert events[-1]["type"] == "speech.audio.done"
    usage = events[-1]["usage"]
    assert usage["output_tokens"] == 70 and usage["input_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert audio == speech(client, response_format="pcm")


@pytest.mark.parametrize(("kwargs", "status", "param"), [
    ({"voice": "alloy"}, 400, "voice"),
    ({"model": "gpt-5"}, 404, "model"),
    ({"response_format": "ogg"}, 400, "response_format"),
    ({"speed": 5.0}, 400, "speed"),
    ({"input": ""}, 400, "input"),
    ({"instructions": "cheerful"}, 400, "instructions"),
    ({"extra_body": {"temperature": 11}}, 400, "temperature"),
    ({"extra_body": {"bogus": 1}}, 400, "bogus"),
    ({"extra_body": {"text": "hi"}}, 400, "text"),
    ({"extra_body": {"stream_format": "sse", "streaming": False}}, 400, "streaming"),
    ({"extra_body": {"sample_rate": 44100, "response_format": "opus"}}, 400, "sample_rate"),
    ({"input": "x" * 1501}, 400, "input"),
    ({"model": None}, 400, "model"),
])
def test_errors_are_openai_errors_naming_the_param(client: openai.OpenAI, kwargs: dict, status: int,
                                                   param: str) -> None:
    args = {"model": "orpheus-tiny", "input": "Hello.", "voice": "tara", **kwargs}
    if args["model"] is None:  # the openai client always sends a model: send the body without one
        del args["model"]
        response = httpx.post(f"{client.base_url}audio/speech", json=args, timeout=60)
        exc_status, error = response.status_code, response.json()["error"]
        assert exc_status == status and error["param"] == param and "required" in error["message"]
        return
    with pytest.raises(openai.APIStatusError) as exc:
        client.audio.speech.create(**args)
    assert exc.value.status_code == status
    error = exc.value.body
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param, error
    assert error["type"] == "invalid_request_error" and param in error["message"]


def test_long_text_is_consecutive_segments_of_one_stream(server: Server, client: openai.OpenAI) -> None:
    text = " ".join(f"This is sentence number {i}, which is here to make the text long." for i in range(4))
    parts = plan_segments(text, segment_chars(orpheus_meta("orpheus-tiny", 1024, True), 1024))
    assert len(parts) >= 2
    response = client.audio.speech.with_raw_response.create(model="orpheus-tiny", input=text, voice="tara",
                                                            response_format="pcm", extra_body=TOKENS)
    assert int(response.headers["x-num-segments"]) == len(parts)
    # Each segment is a request of its own with the same voice and seed: the stream is their audio in order.
    # The next segment is prefilled while the one before it plays, so the segments ran batched together
    # here and alone below; on a CPU another batch shape may round the codec's float output differently
    # by one PCM step (greedy tokens are the same), so the audio is compared to within 2 steps.
    got = np.frombuffer(response.content, dtype=np.int16).astype(np.int32)
    want = np.frombuffer(b"".join(generate_pcm(server, part) for part in parts), dtype=np.int16).astype(np.int32)
    assert len(got) == len(want) and np.abs(got - want).max() <= 2


def test_client_disconnect_aborts_every_segment(server: Server) -> None:
    body = {"model": "orpheus-tiny", "input": "One sentence here. " * 12, "voice": "tara", "response_format": "pcm",
            "max_tokens": 700, "ignore_eos": True}
    with httpx.Client(base_url=server.url, timeout=60.0) as http, http.stream("POST", "/v1/audio/speech",
                                                                             json=body) as response:
        assert response.status_code == 200 and int(response.headers["x-num-segments"]) > 1
        next(response.iter_raw())
    wait_until(server.pools_full, 15.0)


def test_metrics_report_requests_audio_pools_and_stage_times(server: Server, client: openai.OpenAI) -> None:
    speech(client, response_format="pcm")
    text = wait_until(lambda: (t := server.client.get("/metrics").text) and 'stage="decode"' in t and t, 5.0)
    values = _samples(text)
    assert values['vox_ttfa_seconds_count{replica="0"}'] >= 1
    assert values['vox_requests_total{outcome="finished",replica="0"}'] >= 1
    assert values['vox_audio_seconds_total{replica="0"}'] >= SAMPLES / RATE
    assert values['vox_pool_size{pool="kv_pages",replica="0"}'] == 512
    assert values['vox_replica_up{replica="0"}'] == 1
    assert values['vox_step_stage_seconds_count{replica="0",stage="prefill"}'] >= 1
    assert 'vox_underruns_total{replica="0"}' in values and 'vox_queue_depth{replica="0"}' in values
    assert 'vox_chunk_gap_seconds_count{replica="0"}' in values and 'vox_rtf{replica="0"}' in values


def _samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out
