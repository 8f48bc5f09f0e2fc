"""OpenAI-compatible speech: POST /v1/audio/speech and GET /v1/models.

Works unchanged with OpenAI's clients (`client.audio.speech.create(...)`, `.with_streaming_response`).
A request is translated into POST /generate's fields (`input` -> `text`, `instructions` -> `instruct`,
`voice` a built-in or saved voice) and validated and submitted exactly as /generate's; every other
body field is one of vox-serve's own (sampling, `max_tokens`, `seed`, `language`, cloning fields,
`sample_rate`, `streaming`), sent by OpenAI's clients as `extra_body`. Text longer than the model
takes is spoken as consecutive segments of one stream (segments.py), up to --max-input-chars.

    stream_format "audio" (default): the encoded audio, streamed as it is produced
    stream_format "sse": `speech.audio.delta` events (base64 audio), then `speech.audio.done` with usage
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from vox_serve.api.body import read_fields
from vox_serve.api.errors import ApiError
from vox_serve.api.generate import context, max_upload_bytes
from vox_serve.api.openai_compat import UNKNOWN_FIELD, OpenAIRoute, openai_error, openai_error_responses
from vox_serve.api.speech_request import check_upload, resolve_voice, segment_fields
from vox_serve.api.speech_stream import SpeechResponse, SpeechSource, encoded_audio, run_encoder
from vox_serve.config import VoxConfig
from vox_serve.core.meta import ProgramMeta
from vox_serve.formats import AudioFormat, EncodeOptions
from vox_serve.formats.encoders import Encoder, make_encoder
from vox_serve.request_builder import FieldError

router = APIRouter(prefix="/v1", route_class=OpenAIRoute, tags=["OpenAI-compatible"])
OPENAI_MODEL_NAMES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")  # accepted as names of the served model
STREAM_FORMATS = ("audio", "sse")
DEFAULT_FORMAT = AudioFormat.MP3  # OpenAI's default
_OPENAI_FIELDS = ("model", "input", "voice", "instructions", "response_format", "speed", "stream_format",
                  "sample_rate")
SSE_MEDIA_TYPE = "text/event-stream"


def check_model(meta: ProgramMeta, config: VoxConfig, model: Any) -> None:
    """`model` must name the served model (its name, its --model, or one of OpenAI's TTS model names)."""
    if model is None:
        raise FieldError("model", f"is required: the served model is {meta.name!r} (GET /v1/models)")
    if model not in (meta.name, config.model.model, *OPENAI_MODEL_NAMES):
        raise ApiError(404, f"model: {model!r} is not served here; this server serves {meta.name!r} "
                            f"(GET /v1/models)", "model", "model_not_found")


@router.get("/models", summary="The served model, as OpenAI's model list", responses=openai_error_responses(401, 503))
async def list_models(request: Request) -> dict[str, Any]:
    manager, _ = context(request)
    meta = manager.require_meta()
    return {"object": "list", "data": [{"id": meta.name, "object": "model", "created": int(request.app.state.started),
                                        "owned_by": "vox-serve"}]}


SPEECH_BODY = {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "required": ["model", "input"],
    "description": "OpenAI's speech request; any other field is one of POST /generate's (sampling, seed, ...).",
    "properties": {
        "model": {"type": "string", "description": "The served model (GET /v1/models), or tts-1 / tts-1-hd / "
                                                   "gpt-4o-mini-tts, which name it too."},
        "input": {"type": "string", "description": "Text to speak, at most --max-input-chars; longer than the "
                                                   "model takes is split at sentences."},
        "voice": {"oneOf": [{"type": "string"}, {"type": "object", "properties": {"id": {"type": "string"}}}],
                  "description": "A built-in or saved voice (GET /v1/audio/voices)."},
        "instructions": {"type": "string", "description": "A style instruction, for models that take one."},
        "response_format": {"enum": [f.value for f in AudioFormat], "default": DEFAULT_FORMAT.value},
        "speed": {"type": "number", "minimum": 0.25, "maximum": 4.0, "default": 1.0},
        "stream_format": {"enum": list(STREAM_FORMATS), "default": "audio"},
        "sample_rate": {"type": "integer", "description": "Output rate in Hz (default: the model's; mulaw 8000)."},
        "streaming": {"type": "boolean", "default": True, "description": "false: one complete file."},
    }}}}}


@router.post("/audio/speech", summary="Synthesize speech (OpenAI-compatible)", response_class=Response,
             openapi_extra={"requestBody": SPEECH_BODY},
             responses=openai_error_responses(400, 401, 404, 408, 413, 415, 500, 503, 504))
async def create_speech(request: Request) -> Response:
    manager, config = context(request)
    meta = manager.require_meta()
    body, audio = await read_fields(request, max_upload_bytes(config), config.server.body_timeout_s)
    check_model(meta, config, body.get("model"))
    if "text" in body:
        raise ApiError(400, "text: not a field of this route, which takes the text as `input`", "text", UNKNOWN_FIELD)
    voice = resolve_voice(meta, request.app.state.voices, body.get("voice"))
    fields = {k: v for k, v in body.items() if k not in _OPENAI_FIELDS}
    fields["text"] = body.get("input")
    if body.get("instructions") is not None:
        fields["instruct"] = body["instructions"]
    if voice.name is not None:
        fields["voice"] = voice.name
    options = EncodeOptions.parse(body.get("response_format") or DEFAULT_FORMAT, body.get("sample_rate"),
                                  1.0 if body.get("speed") is None else body["speed"])
    stream_format = body.get("stream_format") or "audio"
    if stream_format not in STREAM_FORMATS:
        raise FieldError("stream_format", f"{stream_format!r} is not one of {', '.join(STREAM_FORMATS)}")
    whole = fields.pop("streaming", True) is False
    if whole and stream_format == "sse":
        raise FieldError("streaming", "stream_format sse always streams")
    segments = segment_fields(manager, config, fields)
    await check_upload(meta, audio, voice.prompt)
    encoder = make_encoder(options, meta.sample_rate, streaming=not whole)  # before any request runs
    source = SpeechSource(manager, segments, audio or b"", voice.prompt)
    await source.start()
    headers = {"x-sample-rate": str(options.output_rate(meta.sample_rate)), "x-num-segments": str(len(segments))}
    if stream_format == "sse":
        return SpeechResponse(source, sse_events(source, encoder), SSE_MEDIA_TYPE, openai_error, headers)
    return SpeechResponse(source, encoded_audio(source, encoder), encoder.media_type, openai_error, headers, whole)


async def sse_events(source: SpeechSource, encoder: Encoder) -> AsyncIterator[bytes]:
    """OpenAI's speech events: `speech.audio.delta` per piece of encoded audio, then `speech.audio.done`."""
    async for chunk in source.chunks():
        yield _event({"type": "speech.audio.delta", "audio": _b64(await run_encoder(encoder, chunk.pcm))})
    tail = await run_encoder(encoder, None)
    if tail:
        yield _event({"type": "speech.audio.delta", "audio": _b64(tail)})
    totals = source.totals
    usage = {"input_tokens": totals.num_prompt_tokens, "output_tokens": totals.num_tokens,
             "total_tokens": totals.num_prompt_tokens + totals.num_tokens}
    yield _event({"type": "speech.audio.done", "usage": usage})


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _event(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()
