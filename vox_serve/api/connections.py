"""Connection limits the HTTP server enforces before a request reaches the app (uvicorn's h11 protocol).

uvicorn has no timeout for a request's headers and counts its concurrency limit only once headers
have arrived, so connections that send their headers a byte at a time (slowloris) would be held
open without bound. Here a connection beyond --max-connections is closed at once, and one that has
not sent a complete request head within --header-timeout-s (after connecting, or after its previous
response on a kept-alive connection) is closed. Bodies are bounded by the app (--body-timeout-s).
"""

from __future__ import annotations

import asyncio
import logging

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("vox_serve.api")


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a connection limit and a request-head timeout (set by a subclass)."""

    header_timeout_s: float = 10.0
    max_connections: int = 1024
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            log.warning("refusing a connection: --max-connections (%d) are open", self.max_connections)
            transport.close()
            return
        self._arm()

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is not h11.IDLE:  # the request head is complete
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()  # the next request's head is due within the timeout too

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._on_header_timeout)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _on_header_timeout(self) -> None:
        self._header_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


def guarded_protocol(header_timeout_s: float, max_connections: int) -> type[H11Protocol]:
    """The protocol class for uvicorn's `http` setting, with these limits."""
    limits = {"header_timeout_s": header_timeout_s, "max_connections": max_connections}
    return type("GuardedH11Protocol", (GuardedH11Protocol,), limits)
