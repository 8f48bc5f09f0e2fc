"""Serve over HTTP: the FastAPI app under uvicorn, which starts and stops the scheduler processes."""

from __future__ import annotations

import logging

import uvicorn

from vox_serve.api.app import create_asgi_app
from vox_serve.api.audio_response import StreamCutFilter
from vox_serve.api.connections import guarded_protocol
from vox_serve.api.replicas import ReplicaManager
from vox_serve.api.voices_store import VoiceStoreError
from vox_serve.config import VoxConfig

log = logging.getLogger("vox_serve.api")
GRACEFUL_SHUTDOWN_S = 5  # open streams may finish this long after SIGTERM / Ctrl-C


def serve(config: VoxConfig) -> int:
    """Run until SIGTERM / Ctrl-C (0), or until a replica cannot start (1); 2 for a damaged voice store."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s [api] %(levelname)s %(name)s: %(message)s")
    logging.getLogger("uvicorn.error").addFilter(StreamCutFilter())
    manager = ReplicaManager(config)
    try:
        app = create_asgi_app(config, manager)
    except VoiceStoreError as exc:
        log.error("cannot start: %s", exc)
        return 2
    limits = config.server
    server = uvicorn.Server(uvicorn.Config(
        app, host=limits.host, port=limits.port, log_level="info",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        http=guarded_protocol(limits.header_timeout_s, limits.max_connections),
    ))

    def stop(reason: str) -> None:
        log.error("stopping the server: %s", reason)
        server.should_exit = True

    manager.on_fatal = stop
    manager.is_stopping = lambda: server.should_exit
    log.info("serving %s on http://%s:%d with %d replica(s)", config.model.model, config.server.host,
             config.server.port, config.server.dp_size)
    server.run()
    return 1 if manager.fatal_error is not None or not server.started else 0
