"""Input streaming: text arrives in pieces (e.g. from an LLM) while audio streams back.

    POST /generate/stream/start          request fields (text optional) -> {"id"}
    POST /generate/stream/{id}/text      more text
    GET  /generate/stream/{id}/audio     the WAV stream (one reader)
    POST /generate/stream/{id}/end       no more text

A session lives on one replica and is bounded by --request-timeout-s from its start; one that gets no
text (or, ended, no reader) for --session-idle-timeout-s ends, and at most --max-sessions exist per
replica. Models without input streaming answer every route with 400 (and the OpenAPI document of
such a model does not list these routes).
"""

from __future__ import annotations

import time
from typing import Any

import anyio
from fastapi import APIRouter, Request
from starlette.responses import Response

from vox_serve.api.audio_response import AudioResponse
from vox_serve.api.body import body_timeout, json_fields, read_fields, validate_session_fields
from vox_serve.api.errors import ApiError
from vox_serve.api.generate import WAV_RESPONSE, context, max_upload_bytes
from vox_serve.api.replica_state import Session
from vox_serve.api.replicas import ReplicaManager
from vox_serve.api.schemas import StreamStartResponse, StreamTextResponse, error_responses
from vox_serve.api.speech_request import check_upload, take_saved_voice
from vox_serve.core.meta import ProgramMeta
from vox_serve.request_builder import FieldError, check_encodable, has_visible

router = APIRouter(prefix="/generate/stream")
MAX_TEXT_BODY_BYTES = 1 << 20


def _meta(manager: ReplicaManager) -> ProgramMeta:
    meta = manager.require_meta()
    if not meta.supports_input_streaming:
        raise ApiError(400, f"model {meta.name} does not support input streaming; send the whole text to "
                            "POST /generate", None, "unsupported")
    return meta


def _session(manager: ReplicaManager, session_id: str) -> Session:
    session = manager.sessions.get(session_id)
    if session is None:
        raise ApiError(404, f"no input-streaming session {session_id!r} (ended, timed out or never started)",
                       None, "not_found")
    return session


def _check_piece(meta: ProgramMeta, num_chars: int, text: Any) -> int:
    """The session's length with `text` added; FieldError if the piece is not acceptable."""
    if not isinstance(text, str) or not text:
        raise FieldError("text", "must be a non-empty string (not null)")
    check_encodable("text", text)
    total = num_chars + len(text)
    if total > meta.max_text_chars:
        raise FieldError("text", f"the session's text would be {total} characters; the limit is {meta.max_text_chars}")
    return total


def _append(manager: ReplicaManager, meta: ProgramMeta, session: Session, text: Any) -> None:
    total = _check_piece(meta, session.num_chars, text)
    if not manager.send_text(session.handle, text):
        raise ApiError(409, "the session has already ended (finished, failed or timed out)", None, "conflict")
    session.num_chars, session.visible = total, session.visible or has_visible(text)
    session.last_activity = time.monotonic()


@router.post("/start", summary="Open an input-streaming session", response_model=StreamStartResponse,
             responses=error_responses(400, 408, 413, 415, 422, 500, 503, 504))
async def start(request: Request) -> StreamStartResponse:
    """Takes the fields of POST /generate (text optional: more follows in .../text), checked as
    POST /generate checks them."""
    manager, config = context(request)
    meta = _meta(manager)
    fields, audio = await read_fields(request, max_upload_bytes(config), config.server.body_timeout_s, meta)
    voice_prompt = take_saved_voice(meta, request.app.state.voices, fields)
    await check_upload(meta, audio, voice_prompt)
    has_text, text = "text" in fields, fields.pop("text", None)
    if has_text:  # null included: refused as POST /generate refuses it
        _check_piece(meta, 0, text)
    clean = validate_session_fields(meta, fields)
    if not manager.session_room():
        raise ApiError.unavailable(f"the server holds --max-sessions ({config.server.max_sessions}) sessions per "
                                   "replica; end or read one, or retry later")
    handle = await manager.submit(clean, audio or b"", input_streaming=True, voice_prompt=voice_prompt)
    session = Session(handle, last_activity=time.monotonic())
    manager.sessions[handle.req_id] = session
    if has_text:
        _append(manager, meta, session, text)
    return StreamStartResponse(id=handle.req_id, sample_rate=meta.sample_rate)


@router.post("/{session_id}/text", summary="Send more text", response_model=StreamTextResponse,
             responses=error_responses(400, 404, 408, 409, 413, 415, 422))
async def text(session_id: str, request: Request) -> StreamTextResponse:
    """The next piece of text, as JSON `{"text": ...}` or a text/plain body, sent as is (spaces kept)."""
    manager, config = context(request)
    meta = _meta(manager)
    session = _session(manager, session_id)
    if session.ended:
        raise ApiError(409, "the session's text has already ended", None, "conflict")
    try:
        with anyio.fail_after(config.server.body_timeout_s):
            piece = await _text_body(request)
    except TimeoutError:
        raise body_timeout(config.server.body_timeout_s) from None
    _append(manager, meta, session, piece)
    return StreamTextResponse(id=session_id, num_chars=session.num_chars)


async def _text_body(request: Request) -> Any:
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media not in ("text/plain", "application/json"):
        raise ApiError(415, f"body: content type {media or 'none'!r} is not supported; send application/json "
                            "or text/plain", "body", "unsupported_media_type")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_TEXT_BODY_BYTES:
            raise ApiError(413, f"body: larger than {MAX_TEXT_BODY_BYTES} bytes", "body", "too_large")
    if media == "text/plain":
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ApiError(400, f"body: not valid UTF-8 text ({exc})", "body") from exc
    data, audio = json_fields(body)
    if audio is not None or set(data) != {"text"}:
        raise ApiError(400, 'body: must be a JSON object {"text": "..."}', "body")
    return data["text"]


@router.post("/{session_id}/end", summary="End the session's text", response_model=StreamTextResponse,
             responses=error_responses(400, 404, 409, 422))
async def end(session_id: str, request: Request) -> StreamTextResponse:
    manager, _ = context(request)
    _meta(manager)
    session = _session(manager, session_id)
    if session.ended:
        raise ApiError(409, "the session's text has already ended", None, "conflict")
    if not session.visible:
        raise FieldError("text", "is required and must not be empty: the session received no visible text")
    if not manager.end_text(session.handle):
        raise ApiError(409, "the session has already ended (failed or timed out)", None, "conflict")
    session.ended, session.last_activity = True, time.monotonic()
    return StreamTextResponse(id=session_id, num_chars=session.num_chars)


@router.get("/{session_id}/audio", summary="Read the session's audio", response_class=Response,
            responses={200: WAV_RESPONSE, **error_responses(400, 404, 409, 422, 500, 503, 504)})
async def audio(session_id: str, request: Request) -> Response:
    """The session's WAV stream; it may be opened before the text has ended. One reader per session;
    closing it aborts the session."""
    manager, _ = context(request)
    meta = _meta(manager)
    session = _session(manager, session_id)
    if session.claimed:
        raise ApiError(409, "the session's audio is already being read", None, "conflict")
    session.claimed, session.last_activity = True, time.monotonic()
    return AudioResponse(manager, session.handle, meta.sample_rate, streaming=True,
                         on_close=lambda: manager.sessions.pop(session_id, None))
