"""The audio of one request as an HTTP response: a WAV stream, or one complete WAV.

The response runs beside a listener for the client's disconnect: a client that goes away aborts
its request, so the replica frees its KV pages and request slot at once. Nothing is sent before
the first audio (or the end), so a request that fails early still gets its JSON error status. A
request that fails after its stream began ends without the final chunk of the chunked body,
which HTTP clients report as an error; the server log says why.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from vox_serve import ipc
from vox_serve.api.disconnect import until_disconnect
from vox_serve.api.errors import ApiError
from vox_serve.api.replica_state import RequestHandle
from vox_serve.api.replicas import ReplicaManager
from vox_serve.audio import wav_bytes, wav_header

log = logging.getLogger("vox_serve.api")
# Set in the task that serves a request whose stream is cut on purpose (a failure after the first audio):
# uvicorn then logs an incomplete response as an error in the same task, which StreamCutFilter drops.
STREAM_CUT: contextvars.ContextVar[bool] = contextvars.ContextVar("vox_serve_stream_cut", default=False)
INCOMPLETE_RESPONSE = "ASGI callable returned without completing response"


class StreamCutFilter(logging.Filter):
    """Drops uvicorn's error for a stream vox-serve cut on purpose (already logged with its reason)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (STREAM_CUT.get() and record.getMessage().startswith(INCOMPLETE_RESPONSE))


class AudioResponse(Response):
    media_type = "audio/wav"

    def __init__(self, manager: ReplicaManager, handle: RequestHandle, sample_rate: int, streaming: bool,
                 on_close: Callable[[], None] | None = None) -> None:
        self.manager, self.handle, self.sample_rate, self.streaming = manager, handle, sample_rate, streaming
        self.on_close = on_close
        self.status_code = 200
        self.background = None
        self.init_headers({"x-request-id": handle.req_id, "x-replica": str(handle.replica),
                           "cache-control": "no-store"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            body = self._stream if self.streaming else self._whole
            await until_disconnect(receive, lambda: body(scope, receive, send))
        finally:
            if not self.handle.done:
                self.manager.abort(self.handle, "the client disconnected")
            if self.on_close is not None:
                self.on_close()

    async def _next_audio_event(self) -> ipc.Audio | ipc.Finished | ipc.Failed:
        while True:
            event = await self.handle.get()
            if not isinstance(event, ipc.Started):
                return event

    async def _stream(self, scope: Scope, receive: Receive, send: Send) -> None:
        event = await self._next_audio_event()
        if isinstance(event, ipc.Failed):
            await ApiError.from_failed(event).response()(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        header = wav_header(self.sample_rate, None)  # the streaming size sentinel: length unknown
        while isinstance(event, ipc.Audio):
            await send({"type": "http.response.body", "body": header + event.pcm, "more_body": True})
            header = b""
            event = await self._next_audio_event()
        if isinstance(event, ipc.Failed):
            log.warning("request %s failed mid-stream (%s): %s", self.handle.req_id, event.code, event.message)
            STREAM_CUT.set(True)  # the server's "returned without completing response" error is this, logged
            return  # no final chunk: the client sees an incomplete body
        await send({"type": "http.response.body", "body": header, "more_body": False})

    async def _whole(self, scope: Scope, receive: Receive, send: Send) -> None:
        chunks: list[bytes] = []
        event = await self._next_audio_event()
        while isinstance(event, ipc.Audio):
            chunks.append(event.pcm)
            event = await self._next_audio_event()
        if isinstance(event, ipc.Failed):
            await ApiError.from_failed(event).response()(scope, receive, send)
            return
        body = wav_bytes(b"".join(chunks), self.sample_rate)
        headers = [*self.raw_headers, (b"content-length", str(len(body)).encode()),
                   (b"x-finish-reason", event.reason.encode()), (b"x-num-tokens", str(event.num_tokens).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})
