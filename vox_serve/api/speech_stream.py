"""One utterance as a stream of PCM chunks, and the HTTP response that sends it encoded.

`SpeechSource` runs the segments of one input (`segments.plan_segments`) as consecutive requests
through the replica manager, exactly as POST /generate submits one: the first is submitted before
anything is answered (so its errors get a status code), the next one as soon as the current one
has produced audio, so that its prefill overlaps the current one's playback and the join has no
gap. Its chunks are yielded in order: every chunk of segment k before any of segment k+1.

`SpeechResponse` sends what a body function makes of the source (encoded audio, or SSE events)
beside a listener for the client's disconnect, which aborts every request of the stream. Nothing
is sent before the first audio, so an early failure still gets its error status; a failure later
ends the body without its final chunk (the client sees an incomplete body).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from vox_serve import ipc
from vox_serve.api.disconnect import until_disconnect
from vox_serve.api.errors import ApiError
from vox_serve.api.replica_state import RequestHandle
from vox_serve.api.replicas import ReplicaManager
from vox_serve.formats.encoders import Encoder

log = logging.getLogger("vox_serve.api")


@dataclass(frozen=True)
class PcmChunk:
    pcm: bytes  # little-endian int16 mono at the model's rate
    index: int  # over the whole stream
    segment: int


@dataclass
class StreamTotals:
    num_samples: int = 0
    num_prompt_tokens: int = 0
    num_tokens: int = 0
    finish_reason: str | None = None


class SpeechSource:
    """The audio of `segments` (validated request fields, one dict per segment) in order.

    `open_ended`: more segments may follow (`add_segment`) until `end()`, for text that arrives while
    audio plays (the WebSocket's sentence mode). `input_streaming`: the one segment is an
    input-streaming session whose text the caller sends with the manager.
    """

    def __init__(self, manager: ReplicaManager, segments: list[dict[str, Any]], audio: bytes = b"",
                 voice_prompt: bytes = b"", open_ended: bool = False, input_streaming: bool = False) -> None:
        if not segments and not open_ended:
            raise ValueError("a speech stream needs at least one segment")
        self.manager, self.segments, self.audio, self.voice_prompt = manager, list(segments), audio, voice_prompt
        self.input_streaming = input_streaming
        self.handles: list[RequestHandle] = []
        self.totals = StreamTotals()
        self.ended = not open_ended
        self._changed = asyncio.Event()  # a segment was added or the stream ended
        self._submitting = asyncio.Lock()
        self._playing = -1  # the segment that has produced audio most recently

    async def start(self) -> None:
        """Submit the first segment; raises ApiError when it is refused."""
        await self._submit(0)

    def add_segment(self, fields: dict[str, Any]) -> None:
        self.segments.append(fields)
        self._changed.set()

    def end(self) -> None:
        self.ended = True
        self._changed.set()

    async def _submit(self, index: int) -> None:
        """Submit segments up to `index` (in order, once each)."""
        async with self._submitting:
            while len(self.handles) <= index:
                fields = self.segments[len(self.handles)]
                handle = await self.manager.submit(fields, self.audio, self.input_streaming, self.voice_prompt)
                self.handles.append(handle)
                self.totals.num_prompt_tokens += handle.prompt_len

    async def _prefetch(self) -> None:
        """The segment after the one playing prefills while that one plays (at most one ahead)."""
        following = self._playing + 1
        if following < len(self.segments) and len(self.handles) == following:
            await self._submit(following)

    @property
    def done(self) -> bool:
        return self.ended and len(self.handles) == len(self.segments) and all(h.done for h in self.handles)

    def abort(self, reason: str) -> None:
        for handle in self.handles:
            self.manager.abort(handle, reason)

    async def _next_segment(self, index: int) -> bool:
        """Wait until segment `index` exists (True) or the stream has ended without it (False)."""
        while index >= len(self.segments):
            if self.ended:
                return False
            self._changed.clear()
            await self._changed.wait()
        return True

    async def chunks(self) -> AsyncIterator[PcmChunk]:
        """Every chunk of every segment; raises ApiError when a segment fails."""
        index, segment = 0, 0
        while await self._next_segment(segment):
            await self._submit(segment)
            async for pcm in self._segment_audio(segment):
                yield PcmChunk(pcm, index, segment)
                index += 1
            segment += 1

    async def _segment_audio(self, segment: int) -> AsyncIterator[bytes]:
        handle = self.handles[segment]
        while True:
            event = await self._next_event(handle)
            if isinstance(event, ipc.Audio):
                self._playing = segment
                await self._prefetch()
                self.totals.num_samples += len(event.pcm) // 2
                yield event.pcm
            elif isinstance(event, ipc.Finished):
                self.totals.num_tokens += event.num_tokens
                self.totals.finish_reason = event.reason
                return
            elif isinstance(event, ipc.Failed):
                raise ApiError.from_failed(event)

    async def _next_event(self, handle: RequestHandle) -> Any:
        """The handle's next event; meanwhile a segment that arrives may be prefetched."""
        if self.ended:
            return await handle.get()
        while True:
            get = asyncio.ensure_future(handle.get())
            changed = asyncio.ensure_future(self._changed.wait())
            try:
                await asyncio.wait({get, changed}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                changed.cancel()
                if not get.done():
                    get.cancel()
            if get.done() and not get.cancelled():
                return get.result()
            self._changed.clear()
            if self._playing >= 0:
                await self._prefetch()


async def encoded_audio(source: SpeechSource, encoder: Encoder) -> AsyncIterator[bytes]:
    """The encoder's output for every chunk (possibly empty: the first still tells the response that
    audio has begun), then its tail. Codecs run in a worker thread, off the event loop."""
    async for chunk in source.chunks():
        yield await run_encoder(encoder, chunk.pcm)
    yield await run_encoder(encoder, None)


async def run_encoder(encoder: Encoder, pcm: bytes | None) -> bytes:
    """encode(pcm), or finish() for None; in a thread unless the encoder only copies bytes."""
    call: Callable[[], bytes] = encoder.finish if pcm is None else (lambda: encoder.encode(pcm))
    if not encoder.in_thread:
        return call()
    return await anyio.to_thread.run_sync(call)


class SpeechResponse(Response):
    """Sends `body` (an async iterator of bytes made from the source) as a chunked response."""

    def __init__(self, source: SpeechSource, body: AsyncIterator[bytes], media_type: str,
                 error_response: Callable[[ApiError], Response], headers: dict[str, str] | None = None,
                 whole: bool = False) -> None:
        self.source, self.body_iter, self.error_response, self.whole = source, body, error_response, whole
        self.status_code, self.background, self.media_type = 200, None, media_type
        first = source.handles[0] if source.handles else None
        base = {"cache-control": "no-store"}
        if first is not None:
            base |= {"x-request-id": first.req_id, "x-replica": str(first.replica)}
        self.init_headers({**base, **(headers or {})})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            body = self._send_whole if self.whole else self._send_stream
            await until_disconnect(receive, lambda: body(scope, receive, send))
        finally:
            if not self.source.done:
                self.source.abort("the client disconnected")

    async def _send_stream(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            first = await self.body_iter.__anext__()
        except ApiError as exc:
            await self.error_response(exc)(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": first, "more_body": True})
        try:
            async for data in self.body_iter:
                if data:
                    await send({"type": "http.response.body", "body": data, "more_body": True})
        except ApiError as exc:
            log.warning("speech stream failed mid-stream (%s): %s", exc.type, exc.message)
            return  # no final chunk: the client sees an incomplete body
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _send_whole(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            body = b"".join([data async for data in self.body_iter])
        except ApiError as exc:
            await self.error_response(exc)(scope, receive, send)
            return
        headers = [*self.raw_headers, (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})
