"""The WebSocket session of /v1/audio/speech/stream: text pieces in, audio chunks (with metadata) out."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

from vox_serve.client.errors import VoxError

STREAM_PATH = "/v1/audio/speech/stream"


def ws_url(base_url: str) -> str:
    scheme, rest = base_url.split("://", 1)
    return f"{'wss' if scheme == 'https' else 'ws'}://{rest}{STREAM_PATH}"


@dataclass(frozen=True)
class AudioChunk:
    data: bytes  # encoded audio (raw PCM16 for format pcm)
    index: int | None  # None for the encoder's tail
    segment: int | None
    num_samples: int  # PCM samples at the model's rate
    start_s: float
    duration_s: float
    final: bool = False


def _start_message(fields: dict[str, Any]) -> str:
    return json.dumps({"type": "start", **{k: v for k, v in fields.items() if v is not None}})


def _error(message: dict[str, Any]) -> VoxError:
    error = message.get("error") or {}
    return VoxError(None, error.get("message", "the session failed"), error.get("type"), error.get("field"))


def _chunk(meta: dict[str, Any], data: bytes) -> AudioChunk:
    return AudioChunk(data, meta["index"], meta["segment"], meta["num_samples"], meta["start_s"],
                      meta["duration_s"], bool(meta.get("final")))


class SpeechSession:
    """A synchronous session: `send` pieces (from any thread), `end()`, then iterate over the chunks.
    `started` and, at the end, `done` hold the server's messages."""

    def __init__(self, connection: Any, started: dict[str, Any]) -> None:
        self.connection, self.started = connection, started
        self.done: dict[str, Any] | None = None

    @classmethod
    def connect(cls, url: str, fields: dict[str, Any]) -> SpeechSession:
        from websockets.sync.client import connect

        connection = connect(url, max_size=None).__enter__()  # closed by close(), as `with` would
        connection.send(_start_message(fields))
        started = json.loads(connection.recv())
        if started.get("type") == "error":
            connection.close()
            raise _error(started)
        return cls(connection, started)

    def __enter__(self) -> SpeechSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, text: str) -> None:
        self.connection.send(json.dumps({"type": "text", "text": text}))

    def end(self) -> None:
        self.connection.send(json.dumps({"type": "end"}))

    def close(self) -> None:
        """Close the socket; before the end this aborts the speech."""
        self.connection.close()

    def __iter__(self) -> Iterator[AudioChunk]:
        from websockets.exceptions import ConnectionClosedOK

        while self.done is None:
            try:
                message = json.loads(self.connection.recv())
            except ConnectionClosedOK:
                raise VoxError(None, "the server closed the session before it was done") from None
            if message["type"] == "audio":
                yield _chunk(message, self.connection.recv())
            elif message["type"] == "done":
                self.done = message
            elif message["type"] == "error":
                raise _error(message)


class AsyncSpeechSession:
    """`async with AsyncSpeechSession(url, fields) as session`: `await send(...)`, `await end()`, then
    `async for chunk in session`."""

    def __init__(self, url: str, fields: dict[str, Any]) -> None:
        self.url, self.fields = url, fields
        self.connection: Any = None
        self.started: dict[str, Any] = {}
        self.done: dict[str, Any] | None = None

    async def __aenter__(self) -> AsyncSpeechSession:
        from websockets.asyncio.client import connect

        self.connection = await connect(self.url, max_size=None)
        await self.connection.send(_start_message(self.fields))
        self.started = json.loads(await self.connection.recv())
        if self.started.get("type") == "error":
            await self.connection.close()
            raise _error(self.started)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.connection.close()

    async def send(self, text: str) -> None:
        await self.connection.send(json.dumps({"type": "text", "text": text}))

    async def end(self) -> None:
        await self.connection.send(json.dumps({"type": "end"}))

    async def __aiter__(self) -> AsyncIterator[AudioChunk]:
        while self.done is None:
            message = json.loads(await self.connection.recv())
            if message["type"] == "audio":
                yield _chunk(message, await self.connection.recv())
            elif message["type"] == "done":
                self.done = message
            elif message["type"] == "error":
                raise _error(message)
