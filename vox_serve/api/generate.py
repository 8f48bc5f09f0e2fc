"""POST /generate: text (and request fields) in, WAV out, streamed or whole."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from vox_serve.api.audio_response import AudioResponse
from vox_serve.api.body import read_fields, validate_fields
from vox_serve.api.replicas import ReplicaManager
from vox_serve.api.schemas import error_responses
from vox_serve.api.speech_request import check_upload, take_saved_voice
from vox_serve.config import VoxConfig

router = APIRouter()

WAV_RESPONSE: dict[str, Any] = {
    "description": "A WAV file (PCM16 mono at the model's sample rate, GET /info). Streaming: the header "
                   "carries the size sentinel 0xFFFFFFFF and PCM chunks follow as they are decoded; a "
                   "stream cut off without its final chunk failed. Non-streaming: one complete WAV.",
    "content": {"audio/wav": {"schema": {"type": "string", "format": "binary"}}},
}


def context(request: Request) -> tuple[ReplicaManager, VoxConfig]:
    return request.app.state.manager, request.app.state.config


def max_upload_bytes(config: VoxConfig) -> int:
    return int(config.server.max_upload_mb * 2**20)


@router.post("/generate", summary="Synthesize speech", response_class=Response,
             responses={200: WAV_RESPONSE, **error_responses(400, 408, 413, 415, 422, 500, 503, 504)})
async def generate(request: Request) -> Response:
    """Speak `text`. Send the fields as a JSON object, or as multipart form data (with an optional
    `audio` file for models that take reference audio). Fields a model does not take are refused."""
    manager, config = context(request)
    meta = manager.require_meta()
    fields, audio = await read_fields(request, max_upload_bytes(config), config.server.body_timeout_s, meta)
    voice_prompt = take_saved_voice(meta, request.app.state.voices, fields)
    await check_upload(meta, audio, voice_prompt)
    clean = validate_fields(meta, fields)
    handle = await manager.submit(clean, audio or b"", voice_prompt=voice_prompt)
    return AudioResponse(manager, handle, meta.sample_rate, streaming=clean.get("streaming", True))
