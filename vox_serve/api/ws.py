"""WebSocket /v1/audio/speech/stream: text pieces in (as an LLM produces them), audio chunks out.

Client -> server (JSON text messages):
    {"type": "start", "voice": ..., "response_format": "pcm", ...}   first: the request's fields, as
        /v1/audio/speech's (no `input`; `text` may carry a first piece); default format pcm
    {"type": "text", "text": "..."}                                   any number of pieces
    {"type": "end"}                                                   no more text
Server -> client:
    {"type": "started", "id", "mode", "model", "sample_rate", "response_format"}
    {"type": "audio", "index", "segment", "num_samples", "start_s", "duration_s", "num_bytes"}, then one
        binary message of `num_bytes` encoded bytes (mp3 and opus may hold audio back: num_bytes can be 0;
        the tail comes with `{"type": "audio", ..., "final": true}`)
    {"type": "done", "num_samples", "audio_seconds", "num_segments", "finish_reason", "usage"}, then close
    {"type": "error", "error": {"type", "field", "message"}}, then close (1008 the client's error, 1011 ours)

Mode `input_streaming` (models that have it, e.g. Qwen3-TTS): one session, each piece goes straight to
the replica, which starts generating before the text is complete. Mode `sentences` (the others): the
text is cut into sentences as they complete, each a request of its own, played back to back as one
stream. Both go through the replica manager and validation of POST /generate. Closing the socket
aborts everything the session started.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import anyio
from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from starlette.websockets import WebSocketState

from vox_serve.api.body import validate_fields, validate_session_fields
from vox_serve.api.errors import ApiError
from vox_serve.api.openai_compat import as_api_error
from vox_serve.api.openai_speech import check_model
from vox_serve.api.replicas import ReplicaManager
from vox_serve.api.segments import SentenceBuffer, segment_chars
from vox_serve.api.speech_request import resolve_voice
from vox_serve.api.speech_stream import SpeechSource, run_encoder
from vox_serve.config import VoxConfig
from vox_serve.core.meta import ProgramMeta
from vox_serve.formats import AudioFormat, EncodeOptions
from vox_serve.formats.encoders import Encoder, make_encoder
from vox_serve.request_builder import FieldError

router = APIRouter()
log = logging.getLogger("vox_serve.api")
MAX_MESSAGE_CHARS = 1 << 16
CONTROL_FIELDS = ("type", "model", "voice", "instructions", "response_format", "sample_rate", "speed", "text")


class Session:
    """One WebSocket's speech: the source, its encoder, and where its text goes."""

    def __init__(self, manager: ReplicaManager, config: VoxConfig, meta: ProgramMeta, start: dict[str, Any],
                 store: Any) -> None:
        self.manager, self.config, self.meta = manager, config, meta
        voice = resolve_voice(meta, store, start.get("voice"))
        fields = {k: v for k, v in start.items() if k not in CONTROL_FIELDS}
        if start.get("instructions") is not None:
            fields["instruct"] = start["instructions"]
        if voice.name is not None:
            fields["voice"] = voice.name
        self.options = EncodeOptions.parse(start.get("response_format") or AudioFormat.PCM, start.get("sample_rate"),
                                           1.0 if start.get("speed") is None else start["speed"])
        self.encoder: Encoder = make_encoder(self.options, meta.sample_rate)
        self.incremental = meta.supports_input_streaming
        self.fields, self.num_chars = fields, 0
        assert manager.limits is not None
        self.buffer = SentenceBuffer(segment_chars(meta, manager.limits.max_model_len))
        if self.incremental:
            self.source = SpeechSource(manager, [validate_session_fields(meta, fields)], voice_prompt=voice.prompt,
                                       input_streaming=True)
        else:
            validate_fields(meta, {**fields, "text": "check"})  # the fields of every segment, before any text
            self.source = SpeechSource(manager, [], voice_prompt=voice.prompt, open_ended=True)

    @property
    def mode(self) -> str:
        return "input_streaming" if self.incremental else "sentences"

    async def add_text(self, text: Any) -> None:
        if not isinstance(text, str) or not text:
            raise FieldError("text", "must be a non-empty string")
        limit = self.meta.max_text_chars if self.incremental else self.config.server.max_input_chars
        self.num_chars += len(text)
        if self.num_chars > limit:
            raise FieldError("text", f"the session's text is {self.num_chars} characters; the limit is {limit}")
        if self.incremental:
            if not self.manager.send_text(self.source.handles[0], text):
                raise ApiError(409, "the session has already ended (finished, failed or timed out)", None, "conflict")
            return
        for segment in self.buffer.push(text):
            await self._add_segment(segment)

    async def end(self) -> None:
        if self.num_chars == 0:
            raise FieldError("text", "is required and must not be empty: the session received no text")
        if self.incremental:
            self.manager.end_text(self.source.handles[0])
            return
        for segment in self.buffer.flush():
            await self._add_segment(segment)
        self.source.end()

    async def _add_segment(self, text: str) -> None:
        self.source.add_segment(validate_fields(self.meta, {**self.fields, "text": text}))
        if not self.source.handles:
            await self.source.start()


def _error_message(error: ApiError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error.type, "field": error.field, "message": error.message}}


async def _receive_json(ws: WebSocket) -> dict[str, Any]:
    message = await ws.receive()
    if message["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(message.get("code", 1000))
    text = message.get("text")
    if text is None:
        raise ApiError(400, "message: send JSON text messages", "message")
    if len(text) > MAX_MESSAGE_CHARS:
        raise ApiError(413, f"message: longer than {MAX_MESSAGE_CHARS} characters", "message", "too_large")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"message: not valid JSON ({exc})", "message") from exc
    if not isinstance(data, dict) or data.get("type") not in ("start", "text", "end"):
        raise ApiError(400, 'message: must be a JSON object whose "type" is start, text or end', "type")
    return data


async def _read_text(ws: WebSocket, session: Session) -> None:
    """The client's pieces until its end message; a client silent for --request-timeout-s is dropped."""
    idle_s = session.config.server.request_timeout_s
    while True:
        try:
            with anyio.fail_after(idle_s):
                message = await _receive_json(ws)
        except TimeoutError:
            raise ApiError(504, f"text: no message for {idle_s:g} s (--request-timeout-s)", "text",
                           "timeout") from None
        if message["type"] == "text":
            await session.add_text(message.get("text"))
        elif message["type"] == "end":
            await session.end()
            return
        else:
            raise ApiError(409, "type: the session has already started", "type", "conflict")


async def _watch_close(ws: WebSocket) -> None:
    """After the end message nothing more is expected; a close (or anything) from the client stops it."""
    message = await ws.receive()
    if message["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(message.get("code", 1000))
    raise ApiError(409, "message: the session's text has already ended", "message", "conflict")


async def _send_audio(ws: WebSocket, session: Session) -> None:
    sent_samples, speed, rate = 0, session.options.speed, session.meta.sample_rate
    async for chunk in session.source.chunks():
        data = await run_encoder(session.encoder, chunk.pcm)
        num_samples = len(chunk.pcm) // 2
        await ws.send_json({"type": "audio", "index": chunk.index, "segment": chunk.segment,
                            "num_samples": num_samples, "start_s": sent_samples / rate / speed,
                            "duration_s": num_samples / rate / speed, "num_bytes": len(data)})
        await ws.send_bytes(data)
        sent_samples += num_samples
    tail = await run_encoder(session.encoder, None)
    if tail:
        await ws.send_json({"type": "audio", "index": None, "segment": None, "num_samples": 0,
                            "start_s": sent_samples / rate / speed, "duration_s": 0.0, "num_bytes": len(tail),
                            "final": True})
        await ws.send_bytes(tail)
    totals = session.source.totals
    usage = {"input_tokens": totals.num_prompt_tokens, "output_tokens": totals.num_tokens,
             "total_tokens": totals.num_prompt_tokens + totals.num_tokens}
    await ws.send_json({"type": "done", "num_samples": totals.num_samples, "audio_seconds": totals.num_samples / rate,
                        "num_segments": len(session.source.handles), "finish_reason": totals.finish_reason,
                        "usage": usage})


async def _run(ws: WebSocket, session: Session) -> None:
    """Text in and audio out at once; returns when the audio is done, raises on any error."""
    async with anyio.create_task_group() as tasks:

        async def text_then_watch() -> None:
            await _read_text(ws, session)
            await _watch_close(ws)

        tasks.start_soon(text_then_watch)
        await _send_audio(ws, session)
        tasks.cancel_scope.cancel()


@router.websocket("/v1/audio/speech/stream")
async def speech_stream(ws: WebSocket) -> None:
    await ws.accept()
    session: Session | None = None
    try:
        manager, config = ws.app.state.manager, ws.app.state.config
        meta = manager.require_meta()
        start = await _receive_json(ws)
        if start["type"] != "start":
            raise ApiError(400, 'type: the first message must be {"type": "start", ...}', "type")
        if start.get("model") is not None:
            check_model(meta, config, start["model"])
        session = Session(manager, config, meta, start, ws.app.state.voices)
        if session.incremental:
            await session.source.start()
        await ws.send_json({"type": "started", "id": session.source.handles[0].req_id if session.source.handles
                            else None, "mode": session.mode, "model": meta.name, "sample_rate":
                            session.options.output_rate(meta.sample_rate),
                            "response_format": session.options.format.value})
        if start.get("text"):
            await session.add_text(start["text"])
        await _run(ws, session)
        await ws.close(1000)
    except Exception as exc:  # noqa: BLE001 -- every error ends the session with a message, bugs logged
        exc = _first(exc)
        if not isinstance(exc, WebSocketDisconnect):
            await _fail(ws, exc)
    finally:
        if session is not None and not session.source.done:
            session.source.abort("the WebSocket closed")


def _first(exc: BaseException) -> BaseException:
    """The error itself, out of the exception groups of the session's tasks."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


async def _fail(ws: WebSocket, exc: BaseException) -> None:
    error = as_api_error(exc) if isinstance(exc, Exception) else None
    if error is None:
        log.exception("WebSocket session failed")
        error = ApiError(500, "internal server error (see the server log)", None, "internal")
    if ws.client_state is WebSocketState.CONNECTED:
        try:
            await ws.send_json(_error_message(error))
            await ws.close(1011 if error.status >= 500 else 1008)
        except (WebSocketDisconnect, RuntimeError):
            pass
