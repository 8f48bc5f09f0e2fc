"""The FastAPI application: routes, error handlers, the replica manager's life cycle, OpenAPI.

The OpenAPI document describes the request fields of the served model (types, ranges, voices),
so it is built once a replica has reported the model's meta; before that it lists every field.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.types import ASGIApp

from vox_serve import __version__
from vox_serve.api import generate, metrics, openai_speech, playground, sessions, system, voices, ws
from vox_serve.api.errors import EXCEPTION_HANDLERS
from vox_serve.api.replicas import ReplicaManager
from vox_serve.api.schemas import AUDIO_FIELD, error_responses_doc, request_schema
from vox_serve.api.security import OPEN_PATHS, SECURITY_SCHEME, secure
from vox_serve.api.voices_store import VoiceStore
from vox_serve.config import VoxConfig

DESCRIPTION = """Streaming text-to-speech. POST /generate answers a WAV: streamed (PCM chunks as they are
decoded) or whole. Errors are JSON `{"error": {"type", "field", "message"}}`."""


def create_app(config: VoxConfig, manager: ReplicaManager | None = None) -> FastAPI:
    """The app; raises voices_store.VoiceStoreError when the saved voices under --data-dir are damaged."""
    manager = manager or ReplicaManager(config)
    store = VoiceStore.open(config.server.data_dir) if config.server.data_dir else None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await manager.start()
        try:
            yield
        finally:
            await manager.stop()

    app = FastAPI(title="vox-serve", version=__version__, description=DESCRIPTION, lifespan=lifespan,
                  exception_handlers=EXCEPTION_HANDLERS)
    app.state.manager, app.state.config = manager, config
    app.state.voices, app.state.started = store, time.time()
    app.state.metrics = metrics.ServerMetrics(manager)
    manager.on_event = app.state.metrics.on_event
    for module in (generate, sessions, system, openai_speech, voices, metrics, ws, playground):
        app.include_router(module.router)
    app.openapi = lambda: _openapi(app, manager)  # type: ignore[method-assign]
    return app


def create_asgi_app(config: VoxConfig, manager: ReplicaManager | None = None) -> ASGIApp:
    """The served application: the FastAPI app behind the API key check and CORS (security.py)."""
    return secure(create_app(config, manager), config.server)


def _generate_body(manager: ReplicaManager, text_required: bool) -> dict[str, Any]:
    meta = manager.meta
    content = {
        "application/json": {"schema": request_schema(meta, "json", text_required)},
        "multipart/form-data": {"schema": request_schema(meta, "multipart", text_required)},
    }
    needs_audio = meta is not None and AUDIO_FIELD in request_schema(meta, "json").get("required", [])
    if not needs_audio:  # an urlencoded form cannot carry a file: no way to call a model that needs audio
        content["application/x-www-form-urlencoded"] = {"schema": request_schema(meta, "urlencoded", text_required)}
    return {"required": text_required or needs_audio, "content": content}


def _text_body() -> dict[str, Any]:
    piece = {"type": "string", "minLength": 1, "description": "The next piece of text, sent as is."}
    return {"required": True, "content": {
        "application/json": {"schema": {"type": "object", "properties": {"text": piece}, "required": ["text"],
                                        "additionalProperties": False}},
        "text/plain": {"schema": piece},
    }}


def _openapi(app: FastAPI, manager: ReplicaManager) -> dict[str, Any]:
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    bodies = {
        "/generate": _generate_body(manager, text_required=True),
        "/generate/stream/start": _generate_body(manager, text_required=False),
        "/generate/stream/{session_id}/text": _text_body(),
    }
    for path, body in bodies.items():
        schema["paths"][path]["post"]["requestBody"] = body
    if manager.meta is not None and not manager.meta.supports_input_streaming:  # its routes only answer 400
        schema["paths"] = {p: ops for p, ops in schema["paths"].items() if not p.startswith(sessions.router.prefix)}
    if not voices.saves_voices(manager.meta, app.state.voices):  # saving and deleting only answer 400
        schema["paths"][voices.router.prefix].pop("post", None)
        schema["paths"][f"{voices.router.prefix}/{{voice_id}}"].pop("delete", None)
    if manager.config.server.api_key:
        _document_auth(schema)
    if manager.meta is not None:  # the model's fields are known from now on
        app.openapi_schema = schema
    return schema


def _document_auth(schema: dict[str, Any]) -> None:
    schema.setdefault("components", {})["securitySchemes"] = {"bearer": SECURITY_SCHEME}
    for path, operations in schema["paths"].items():
        if path in OPEN_PATHS:
            continue
        for operation in operations.values():
            operation["security"] = [{"bearer": []}]
            operation["responses"].setdefault("401", error_responses_doc(401))
