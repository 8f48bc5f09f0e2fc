"""The `online` policy: decode audio in few, full codec batches, just in time for each client.

A streaming request is pressing until its first audio chunk, and again from a second before its
client starts playing the last chunk it has received; a non-streaming request is pressing once its
tokens are all generated. Pressing requests decode first, and audio is decoded only in steps that
have a pressing chunk, which other ready chunks join while the batch has room. Fewer codec
launches leave more of the device to the LM, which keeps more streams ahead of their clients.
"""

from __future__ import annotations

import math

from vox_serve.core.request import Request, RequestStatus
from vox_serve.scheduler.base import Scheduler
from vox_serve.scheduler.playback import PLAYBACK_MARGIN_S, last_chunk_play_start


class OnlineScheduler(Scheduler):
    name = "online"

    def pressing_from(self, req: Request) -> float | None:
        """When req becomes pressing (-inf: pressing now and until an event; None: not before an event)."""
        if not req.streaming:
            return -math.inf if req.status is RequestStatus.DRAINING else None
        start = last_chunk_play_start(req, self.meta.sample_rate)
        return -math.inf if start is None else start - PLAYBACK_MARGIN_S

    def is_pressing(self, req: Request) -> bool:
        since = self.pressing_from(req)
        return since is not None and since <= self.now

    def select_codec(self) -> None:
        ready = self.ready_requests()
        pressing = sorted((r for r in ready if self.is_pressing(r)), key=self.pressing_from)
        if not pressing:
            if ready:
                self.notes.append(f"codec held: {len(ready)} requests have ready chunks, none pressing")
            return
        self.take_chunks(pressing, "pressing")
        self.take_chunks([r for r in ready if not self.is_pressing(r)], "joins a pressing batch")

    def decode_order(self, candidates: list[Request]) -> list[Request]:
        pressing = [r for r in candidates if self.is_pressing(r)]
        for req in pressing:
            self.reasons["decode"][req.req_id] = "pressing"
        return pressing + [r for r in candidates if not self.is_pressing(r)]

    def next_wakeup(self) -> float | None:
        times = [t for r in self.ready_requests() if (t := self.pressing_from(r)) is not None and t > self.now]
        return min(times, default=None)
