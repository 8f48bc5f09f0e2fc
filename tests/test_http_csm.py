"""CSM over HTTP end to end: a real server (csm-tiny on CPU, greedy) takes an integer `speaker` and earlier
`context` turns (a base64 WAV clip, codes, text only), in JSON and in a form; /info and the OpenAPI document
say so, and bad turns get a 422 naming the field (`context[1].codes[0]`).

The expected audio comes from this process: the same seeded csm-tiny weights, part 1's eager loop
(test_csm_serving.eager_frames) for the frames, and Mimi decoding them in one chunk.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from csm_helpers import wav_bytes
from http_harness import Server, error_of, generate, parse_wav, running_server, wait_until
from test_csm_equivalence import clip
from test_csm_serving import AUDIO_LSB, as_pcm, eager_frames

from vox_serve.codecs.slots import CodecSlots
from vox_serve.models.csm.loader import load_csm

MAX_MODEL_LEN = 256
FRAMES = 4
CODES = [[(11 * f + 5 * k) % 2048 for k in range(32)] for f in range(2)]
CONTEXT = [{"text": "Earlier, from a clip.", "speaker": 1, "audio": base64.b64encode(wav_bytes(clip(0.5, 3))).decode()},
           {"text": "Only text.", "speaker": 0}, {"text": "Codes given.", "speaker": 1, "codes": CODES}]
REQUEST = {"text": "And the answer.", "speaker": 1, "context": CONTEXT, "max_tokens": FRAMES}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    flags = ("--model", "csm-tiny", "--greedy", "--seed", "0", "--max-model-len", str(MAX_MODEL_LEN))
    with running_server(tmp_path_factory.mktemp("http-csm"), *flags) as srv:
        yield srv


@pytest.fixture(scope="module")
def program():  # noqa: ANN201
    return load_csm("csm-tiny", "dummy", torch.device("cpu"), torch.float32, seed=0, max_model_len=MAX_MODEL_LEN)


def expected_pcm(program, fields: dict[str, Any]) -> np.ndarray:  # noqa: ANN001
    """The eager loop's greedy frames of `fields` (base64 clips decoded as the API does), decoded in one chunk."""
    turns = [{**t, "audio": base64.b64decode(t["audio"])} if "audio" in t else t for t in fields.get("context", [])]
    [frames] = eager_frames(program, [{**fields, "context": turns}], fields["max_tokens"])
    codes = torch.tensor(frames).clamp(max=program.ids.codebook_size - 1)
    with torch.inference_mode():
        audio = CodecSlots(program.m.codec, 1).decode_chunk(codes[None], torch.zeros(1, dtype=torch.long))[0]
    return as_pcm(audio)


def served_pcm(response) -> np.ndarray:  # noqa: ANN001
    assert response.status_code == 200, response.text
    wav = parse_wav(response.content)
    assert wav.sample_rate == 24000
    return np.frombuffer(wav.pcm, dtype="<i2").astype(np.int32)


def assert_close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape == (FRAMES * 1920,)
    assert np.abs(got - want).max() <= AUDIO_LSB and np.abs(want).max() > 0


def test_info_and_openapi_say_what_csm_takes(server: Server) -> None:
    info = server.client.get("/info").json()
    assert info["model"] == "csm-tiny" and info["sample_rate"] == 24000
    assert info["aliases"] == {}  # `speaker` is CSM's own field, not an alias of `voice`
    assert {"speaker", "context", "depth_decoder_temperature"} <= set(info["accepted_fields"])
    assert "voice" not in info["accepted_fields"] and info["supports_reference_audio"] is False
    turn = info["field_schemas"]["context"]["items"]
    assert info["field_schemas"]["speaker"]["type"] == "integer" and set(turn["properties"]) == {
        "text", "speaker", "audio", "codes"}
    assert info["default_sampling"]["depth_decoder_temperature"] == 0.9
    body = server.client.get("/openapi.json").json()["paths"]["/generate"]["post"]["requestBody"]["content"]
    props = body["application/json"]["schema"]["properties"]
    assert props["speaker"]["type"] == "integer" and props["context"]["type"] == "array"
    assert props["context"]["items"]["properties"]["codes"]["items"]["maxItems"] == 32
    form = body["multipart/form-data"]["schema"]["properties"]["context"]
    assert form["type"] == "string" and form["contentSchema"]["type"] == "array"  # JSON text in a form


def test_a_request_with_context_turns_equals_the_eager_loop(server: Server, program) -> None:  # noqa: ANN001
    want = expected_pcm(program, REQUEST)
    assert_close(served_pcm(generate(server, **REQUEST, streaming=False)), want)
    streamed = server.client.post("/generate", json={**REQUEST, "streaming": True})
    assert_close(served_pcm(streamed), want)
    form = {**REQUEST, "context": json.dumps(CONTEXT), "speaker": "1", "max_tokens": str(FRAMES)}
    assert_close(served_pcm(server.client.post("/generate", files={k: (None, v) for k, v in form.items()})), want)
    other = served_pcm(generate(server, **{**REQUEST, "speaker": 2}))  # the speaker steers the audio
    assert other.shape == want.shape and np.abs(other - want).max() > 100


def test_no_context_and_the_default_speaker(server: Server, program) -> None:  # noqa: ANN001
    fields = {"text": "Hello there.", "max_tokens": FRAMES}
    want = expected_pcm(program, fields)
    assert_close(served_pcm(generate(server, **fields)), want)
    assert_close(served_pcm(generate(server, **fields, speaker=0, context=[])), want)


BAD = {
    "speaker a string": ({"speaker": "one"}, "speaker"),
    "speaker negative": ({"speaker": -1}, "speaker"),
    "voice not taken": ({"voice": "tara"}, "voice"),
    "context not a list": ({"context": {"text": "x"}}, "context"),
    "turn without text": ({"context": [{"speaker": 1}]}, "context[0].text"),
    "turn with an unknown field": ({"context": [{"text": "a", "voice": "x"}]}, "context[0].voice"),
    "turn speaker negative": ({"context": [{"text": "a"}, {"text": "b", "speaker": -2}]}, "context[1].speaker"),
    "frame of the wrong width": ({"context": [{"text": "a"}, {"text": "b", "codes": [[1, 2, 3]]}]},
                                 "context[1].codes[0]"),
    "code out of range": ({"context": [{"text": "a", "codes": [[0] * 31 + [2048]]}]}, "context[0].codes[0]"),
    "clip not base64": ({"context": [{"text": "a", "audio": "%%%"}]}, "context[0].audio"),
    "clip not audio": ({"context": [{"text": "a", "audio": base64.b64encode(b"no audio" * 40).decode()}]},
                       "context[0].audio"),
    "audio and codes": ({"context": [{"text": "a", "audio": CONTEXT[0]["audio"], "codes": CODES}]}, "context[0].codes"),
    "prompt over the model length": ({"context": [{"text": "a", "codes": [CODES[0]] * MAX_MODEL_LEN}]}, "context"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_fields_get_a_422_naming_the_field(server: Server, case: str) -> None:
    fields, field = BAD[case]
    response = generate(server, text="Hi.", max_tokens=2, **fields)
    assert response.status_code == 422, response.text
    error = error_of(response)
    assert error["field"] == field and field in error["message"], error


def test_the_server_still_serves_and_pools_are_full(server: Server, program) -> None:  # noqa: ANN001
    [replica] = server.replicas()
    assert replica["restarts"] == 0 and replica["state"] == "ready"
    wait_until(server.pools_full, 10.0)
    fields = {"text": "Still here.", "max_tokens": FRAMES, "speaker": 3}
    assert_close(served_pcm(generate(server, **fields)), expected_pcm(program, fields))
