"""GET /health and GET /info."""

from __future__ import annotations

import os

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from vox_serve.api.generate import context
from vox_serve.api.schemas import (
    HealthResponse,
    InfoResponse,
    Limits,
    SessionStatus,
    error_responses,
)
from vox_serve.request_builder import field_aliases

router = APIRouter()


@router.get("/health", summary="Readiness of every replica", response_model=HealthResponse,
            responses={503: {"model": HealthResponse, "description": "A replica is starting, restarting or "
                                                                     "dead; `reason` says which and why."}})
async def health(request: Request) -> JSONResponse:
    """200 only while every replica is alive, ready and heard from within the last second. The body
    also reports each replica's load and pool occupancy (free / total KV pages and request slots) and the
    input-streaming sessions. Never needs the API key."""
    manager, _ = context(request)
    reason = manager.unavailable_reason()
    server = manager.config.server
    sessions = SessionStatus(open=len(manager.sessions), max_per_replica=server.max_sessions,
                             idle_timeout_s=server.session_idle_timeout_s)
    body = HealthResponse(status="ok" if reason is None else "unavailable", reason=reason, server_pid=os.getpid(),
                          replicas=manager.status(), sessions=sessions)
    return JSONResponse(body.model_dump(), status_code=200 if reason is None else 503)


@router.get("/info", summary="The served model and the server's limits", response_model=InfoResponse,
            responses=error_responses(503))
async def info(request: Request) -> InfoResponse:
    manager, config = context(request)
    meta = manager.require_meta()
    limits = manager.limits
    assert limits is not None
    return InfoResponse(
        model=meta.name, sample_rate=meta.sample_rate,
        samples_per_chunk=limits.frames_per_chunk * meta.samples_per_frame,
        voices=list(meta.voices), default_voice=meta.default_voice, languages=list(meta.languages),
        accepted_fields=list(meta.accepted_fields),
        aliases=field_aliases(meta), field_schemas=meta.field_schemas,
        default_sampling=meta.default_sampling, supports_input_streaming=meta.supports_input_streaming,
        supports_reference_audio="audio" in meta.accepted_fields,
        limits=Limits(
            max_text_chars=meta.max_text_chars, max_model_len=limits.max_model_len,
            max_upload_mb=config.server.max_upload_mb, request_timeout_s=config.server.request_timeout_s,
            max_queued_requests=config.scheduler.max_queued_requests, max_batch_size=limits.max_batch,
            dp_size=config.server.dp_size, max_sessions=config.server.max_sessions,
            session_idle_timeout_s=config.server.session_idle_timeout_s,
        ),
    )
