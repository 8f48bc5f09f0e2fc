"""Saved voices: POST /v1/audio/voices, GET /v1/audio/voices[/{id}], DELETE /v1/audio/voices/{id}.

POST takes multipart form data as OpenAI's `client.audio.voices.create(name=..., audio_sample=file,
consent=...)` sends it (the clip as `audio_sample` or `audio`), plus `ref_text`, the clip's transcript:
with it the voice clones in context, without it from the speaker embedding only. A replica computes
the prompt once with the model's own encoders (through the replica manager, like every request);
the server stores it under --data-dir, and a request naming the voice (`voice`, or OpenAI's
`{"id": name}`) skips the encoders. GET lists the model's built-in voices and its saved ones.
"""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
from fastapi import APIRouter, Request
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException
from starlette.requests import Request as StarletteRequest
from starlette.types import Message

from vox_serve.api.body import body_timeout, check_audio
from vox_serve.api.errors import ApiError
from vox_serve.api.generate import context, max_upload_bytes
from vox_serve.api.openai_compat import OpenAIRoute, openai_error_responses
from vox_serve.api.voices_store import NAME_PATTERN, SavedVoice, VoiceExists, VoiceStore, VoiceStoreError, check_name
from vox_serve.core.meta import ProgramMeta
from vox_serve.request_builder import FieldError

router = APIRouter(prefix="/v1/audio/voices", route_class=OpenAIRoute, tags=["Saved voices"])
AUDIO_KEYS = ("audio_sample", "audio")
TEXT_KEYS = ("name", "ref_text", "consent", "type")
FORM_OVERHEAD_BYTES = 64 << 10


def _store(request: Request) -> VoiceStore:
    store = request.app.state.voices
    if store is None:
        raise ApiError(400, "saved voices need a data directory: start the server with --data-dir", None,
                       "unsupported")
    return store


def _clones(meta: ProgramMeta) -> bool:
    return "audio" in meta.accepted_fields


def saves_voices(meta: ProgramMeta | None, store: VoiceStore | None) -> bool:
    """Whether POST / DELETE can succeed here: a store (--data-dir) and a model that clones voices.
    Without, they only answer 400 and the OpenAPI document leaves them out."""
    return store is not None and (meta is None or _clones(meta))


def _builtin(meta: ProgramMeta, name: str) -> dict[str, Any]:
    return {"id": name, "name": name, "object": "audio.voice", "type": "builtin", "model": meta.name}


def _saved(voice: SavedVoice) -> dict[str, Any]:
    return {"id": voice.name, "name": voice.name, "object": "audio.voice", "type": "audio_sample",
            "model": voice.model, "created_at": voice.created_at, "mode": voice.mode, "ref_text": voice.ref_text}


@router.get("", summary="The model's built-in and saved voices", responses=openai_error_responses(401, 503))
async def list_voices(request: Request) -> dict[str, Any]:
    manager, _ = context(request)
    meta = manager.require_meta()
    store = request.app.state.voices
    saved = [_saved(v) for v in store.list(meta.name)] if store is not None else []
    return {"object": "list", "model": meta.name, "clones_voices": _clones(meta),
            "data": [_builtin(meta, v) for v in meta.voices] + saved}


@router.get("/{voice_id}", summary="One voice", responses=openai_error_responses(400, 401, 404, 503))
async def get_voice(voice_id: str, request: Request) -> dict[str, Any]:
    manager, _ = context(request)
    meta = manager.require_meta()
    if voice_id in meta.voices:
        return _builtin(meta, voice_id)
    store = request.app.state.voices
    voice = store.get(meta.name, voice_id) if store is not None else None
    if voice is None:
        raise ApiError(404, f"voice: no voice {voice_id!r} for model {meta.name}", "voice", "not_found")
    return _saved(voice)


@router.delete("/{voice_id}", summary="Delete a saved voice",
                responses=openai_error_responses(400, 401, 404, 409, 503))
async def delete_voice(voice_id: str, request: Request) -> dict[str, Any]:
    manager, _ = context(request)
    meta = manager.require_meta()
    if voice_id in meta.voices:
        raise ApiError(409, f"voice: {voice_id!r} is a built-in voice of model {meta.name}; it cannot be deleted",
                       "voice", "conflict")
    store = _store(request)
    if not await asyncio.to_thread(store.delete, meta.name, voice_id):
        raise ApiError(404, f"voice: no saved voice {voice_id!r} for model {meta.name}", "voice", "not_found")
    return {"id": voice_id, "object": "audio.voice.deleted", "deleted": True}


VOICE_BODY = {"required": True, "content": {"multipart/form-data": {"schema": {
    "type": "object", "required": ["name", "audio_sample"], "properties": {
        "name": {"type": "string", "pattern": NAME_PATTERN.pattern},
        "audio_sample": {"type": "string", "format": "binary", "description": "The reference clip (WAV, FLAC, OGG "
                                                                              "or MP3; `audio` works too)."},
        "ref_text": {"type": "string", "description": "The clip's transcript: in-context cloning."},
        "consent": {"type": "string", "description": "Accepted for OpenAI's clients; not used."},
    }}}}}


@router.post("", summary="Save a voice from a reference clip", openapi_extra={"requestBody": VOICE_BODY},
             responses=openai_error_responses(400, 401, 408, 409, 413, 415, 500, 503, 504))
async def create_voice(request: Request) -> dict[str, Any]:
    manager, config = context(request)
    meta = manager.require_meta()
    store = _store(request)
    if not _clones(meta):
        raise ApiError(400, f"model {meta.name} does not clone voices (it has built-in voices: "
                            f"{', '.join(meta.voices) or 'none'})", None, "unsupported")
    fields, audio = await _read_form(request, max_upload_bytes(config), config.server.body_timeout_s)
    name = _new_name(meta, store, fields.get("name"))
    ref_text = fields.get("ref_text") or None
    await check_audio(meta, audio)
    data = await manager.encode_voice(name, audio, ref_text)
    try:
        voice = await asyncio.to_thread(store.add, meta.name, name, data)
    except VoiceExists:
        raise ApiError(409, f"name: a voice {name!r} is already saved for model {meta.name}", "name",
                       "conflict") from None
    except VoiceStoreError as exc:
        raise ApiError(507, str(exc), None, "storage") from exc
    return _saved(voice)


def _new_name(meta: ProgramMeta, store: VoiceStore, name: Any) -> str:
    if name is None:
        raise FieldError("name", "is required")
    try:
        check_name(name)
    except ValueError as exc:
        raise FieldError("name", str(exc)) from None
    if name.lower() in (v.lower() for v in meta.voices):
        raise FieldError("name", f"{name!r} is a built-in voice of model {meta.name}")
    if store.get(meta.name, name) is not None:
        raise ApiError(409, f"name: a voice {name!r} is already saved for model {meta.name}", "name", "conflict")
    return name


async def _read_form(request: Request, max_upload_bytes: int, body_timeout_s: float) -> tuple[dict[str, str], bytes]:
    """The form's text fields and its one audio file; the body is read through a byte limit, and must
    arrive within body_timeout_s (408 after that)."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != "multipart/form-data":
        raise ApiError(415, "body: send multipart/form-data with the clip as `audio_sample` (or `audio`)",
                       "body", "unsupported_media_type")
    try:
        with anyio.fail_after(body_timeout_s):
            body = await _limited_body(request, max_upload_bytes + FORM_OVERHEAD_BYTES)
    except TimeoutError:
        raise body_timeout(body_timeout_s) from None
    replay = _replay(body)
    try:
        form = await StarletteRequest(request.scope, replay).form(max_files=1, max_fields=len(TEXT_KEYS))
    except MultiPartException as exc:
        raise ApiError(400, f"body: malformed form data ({exc.message})", "body") from exc
    try:
        fields, audio = {}, None
        for key, value in form.multi_items():
            if isinstance(value, UploadFile) and key in AUDIO_KEYS:
                audio = await value.read()
            elif key in TEXT_KEYS and isinstance(value, str):
                fields[key] = value
            else:
                raise FieldError(key, f"not a field of a voice (fields: {', '.join(TEXT_KEYS + AUDIO_KEYS)})")
    finally:
        await form.close()
    if audio is None:
        raise FieldError("audio_sample", "is required: the reference clip, as a file")
    return fields, audio


async def _limited_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    too_large = ApiError(413, "audio_sample: the upload is larger than --max-upload-mb allows", "audio_sample",
                         "too_large")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_large
    return bytes(body)


def _replay(body: bytes):  # noqa: ANN202
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive
