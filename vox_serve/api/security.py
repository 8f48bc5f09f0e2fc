"""Who may call the API: an optional bearer token (--api-key) and CORS for browsers (--allowed-origins).

Both are plain ASGI middleware, so streamed responses and disconnects pass through untouched. The
token is compared in constant time. /health stays open (load balancers and the start-up recipe poll
it), and so do the API's own description (/openapi.json, /docs), which holds no secret.
"""

from __future__ import annotations

import hmac
import json

from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from vox_serve.api.errors import error_body
from vox_serve.config import ServerConfig

OPEN_PATHS = frozenset({"/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
SECURITY_SCHEME = {"type": "http", "scheme": "bearer", "description": "The key the server was started with "
                                                                     "(--api-key or $VOX_SERVE_API_KEY)."}


class BearerAuth:
    """Refuses (401) every HTTP request outside OPEN_PATHS without `Authorization: Bearer <key>`."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app, self.key = app, api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        body = json.dumps(error_body("unauthorized", "authorization: send 'Authorization: Bearer <key>' with the "
                                                     "server's --api-key", "authorization")).encode()
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b'Bearer realm="vox-serve"')]})
        await send({"type": "http.response.body", "body": body})

    def _authorized(self, scope: Scope) -> bool:
        values = [v for k, v in scope["headers"] if k == b"authorization"]
        if len(values) != 1:
            return False
        scheme, _, token = values[0].partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key)


def secure(app: ASGIApp, server: ServerConfig) -> ASGIApp:
    """`app` behind the API key check (if any), behind CORS (if any origin is allowed): a browser's
    preflight request carries no credentials, so CORS answers it before the key is checked."""
    if server.api_key:
        app = BearerAuth(app, server.api_key)
    if server.allowed_origins:
        app = CORSMiddleware(app, allow_origins=list(server.allowed_origins), allow_methods=["GET", "POST"],
                             allow_headers=["authorization", "content-type"],
                             expose_headers=["x-request-id", "x-replica", "x-finish-reason", "x-num-tokens"])
    return app
