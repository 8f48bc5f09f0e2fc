"""Responses that run beside a listener for the client's disconnect (which aborts their requests)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
from starlette.types import Receive


async def _wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(receive: Receive, send_body: Callable[[], Awaitable[None]]) -> None:
    """Run `send_body()`; a client that goes away first cancels it (the caller's `finally` cleans up)."""
    async with anyio.create_task_group() as tasks:

        async def watch() -> None:
            await _wait_for_disconnect(receive)
            tasks.cancel_scope.cancel()

        tasks.start_soon(watch)
        await send_body()
        tasks.cancel_scope.cancel()
