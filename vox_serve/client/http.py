"""HTTP routes of vox-serve: speech through the OpenAI-compatible /v1/audio/speech, saved voices."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx

from vox_serve.client.errors import VoxError
from vox_serve.client.ws import AsyncSpeechSession, SpeechSession, ws_url

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_TIMEOUT_S = 300.0


def speech_body(text: str, model: str | None, voice: str | None, format: str, speed: float | None,
                sample_rate: int | None, fields: dict[str, Any]) -> dict[str, Any]:
    """The JSON body of POST /v1/audio/speech; `fields` are vox-serve's own (sampling, seed, language, ...)."""
    body: dict[str, Any] = {"model": model, "input": text, "voice": voice, "response_format": format,
                            "speed": speed, "sample_rate": sample_rate, **fields}
    return {k: v for k, v in body.items() if v is not None}


def voice_form(name: str, audio: bytes | str | Path, ref_text: str | None) -> tuple[dict[str, str], dict[str, Any]]:
    data = audio if isinstance(audio, bytes) else Path(audio).read_bytes()
    form = {"name": name, **({"ref_text": ref_text} if ref_text else {})}
    return form, {"audio_sample": ("reference", data)}


def _headers(api_key: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {api_key}"} if api_key else {}


def _check(response: httpx.Response) -> httpx.Response:
    if response.status_code >= 400:
        raise VoxError.from_body(response.status_code, response.read())
    return response


class VoxClient:
    def __init__(self, base_url: str = DEFAULT_URL, timeout: float = DEFAULT_TIMEOUT_S, model: str | None = None,
                 api_key: str | None = None) -> None:
        self.base_url, self.model = base_url.rstrip("/"), model
        self.http = httpx.Client(base_url=self.base_url, timeout=timeout, headers=_headers(api_key))

    def __enter__(self) -> VoxClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def info(self) -> dict[str, Any]:
        return _check(self.http.get("/info")).json()

    def speech(self, text: str, voice: str | None = None, format: str = "wav", speed: float | None = None,
               sample_rate: int | None = None, **fields: Any) -> bytes:
        """The whole audio of `text`, encoded as `format` (wav, pcm, mp3, opus, aac, flac, mulaw)."""
        return b"".join(self.stream_speech(text, voice, format, speed, sample_rate, **fields))

    def stream_speech(self, text: str, voice: str | None = None, format: str = "pcm", speed: float | None = None,
                      sample_rate: int | None = None, **fields: Any) -> Iterator[bytes]:
        """The encoded audio of `text` piece by piece, as the server sends it."""
        body = speech_body(text, self.model, voice, format, speed, sample_rate, fields)
        body.setdefault("model", self.model or self._served_model())
        with self.http.stream("POST", "/v1/audio/speech", json=body) as response:
            _check(response)
            yield from response.iter_bytes()

    def _served_model(self) -> str:
        self.model = self.models()[0]
        return self.model

    def models(self) -> list[str]:
        return [m["id"] for m in _check(self.http.get("/v1/models")).json()["data"]]

    def voices(self) -> list[dict[str, Any]]:
        """Built-in and saved voices of the served model."""
        return _check(self.http.get("/v1/audio/voices")).json()["data"]

    def create_voice(self, name: str, audio: bytes | str | Path, ref_text: str | None = None) -> dict[str, Any]:
        """Save a voice from a reference clip (and its transcript, for in-context cloning)."""
        form, files = voice_form(name, audio, ref_text)
        return _check(self.http.post("/v1/audio/voices", data=form, files=files)).json()

    def delete_voice(self, name: str) -> None:
        _check(self.http.delete(f"/v1/audio/voices/{name}"))

    def session(self, voice: str | None = None, format: str = "pcm", **fields: Any) -> SpeechSession:
        """A WebSocket session: send text in pieces, iterate over the audio chunks."""
        return SpeechSession.connect(ws_url(self.base_url), {"voice": voice, "response_format": format, **fields})


class AsyncVoxClient:
    def __init__(self, base_url: str = DEFAULT_URL, timeout: float = DEFAULT_TIMEOUT_S, model: str | None = None,
                 api_key: str | None = None) -> None:
        self.base_url, self.model = base_url.rstrip("/"), model
        self.http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout, headers=_headers(api_key))

    async def __aenter__(self) -> AsyncVoxClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    async def speech(self, text: str, voice: str | None = None, format: str = "wav", speed: float | None = None,
                     sample_rate: int | None = None, **fields: Any) -> bytes:
        return b"".join([p async for p in self.stream_speech(text, voice, format, speed, sample_rate, **fields)])

    async def stream_speech(self, text: str, voice: str | None = None, format: str = "pcm",
                            speed: float | None = None, sample_rate: int | None = None,
                            **fields: Any) -> AsyncIterator[bytes]:
        body = speech_body(text, self.model, voice, format, speed, sample_rate, fields)
        if "model" not in body:
            body["model"] = self.model = (await self.models())[0]
        async with self.http.stream("POST", "/v1/audio/speech", json=body) as response:
            if response.status_code >= 400:
                raise VoxError.from_body(response.status_code, await response.aread())
            async for piece in response.aiter_bytes():
                yield piece

    async def models(self) -> list[str]:
        return [m["id"] for m in (await self._get("/v1/models"))["data"]]

    async def voices(self) -> list[dict[str, Any]]:
        return (await self._get("/v1/audio/voices"))["data"]

    async def create_voice(self, name: str, audio: bytes | str | Path, ref_text: str | None = None) -> dict[str, Any]:
        form, files = voice_form(name, audio, ref_text)
        response = await self.http.post("/v1/audio/voices", data=form, files=files)
        return _check(response).json()

    async def delete_voice(self, name: str) -> None:
        _check(await self.http.delete(f"/v1/audio/voices/{name}"))

    async def _get(self, path: str) -> Any:
        return _check(await self.http.get(path)).json()

    def session(self, voice: str | None = None, format: str = "pcm", **fields: Any) -> AsyncSpeechSession:
        """`async with client.session(...) as session:` a WebSocket session."""
        return AsyncSpeechSession(ws_url(self.base_url), {"voice": voice, "response_format": format, **fields})
