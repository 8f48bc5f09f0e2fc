"""The `offline` policy, for batch jobs: audio is decoded only while no admitted request is
generating tokens, so the LM keeps the device to itself and the codec later runs in full batches.
Streams get their audio late; throughput of non-streaming batches is highest. Requests waiting
for streamed text are not generating: while only they are admitted, audio is decoded.
"""

from __future__ import annotations

from vox_serve.core.plan import CodecRow
from vox_serve.scheduler.base import Scheduler
from vox_serve.scheduler.text_input import waits_for_text


class OfflineScheduler(Scheduler):
    name = "offline"

    def select_codec(self) -> list[CodecRow]:
        generating = [r for r in self.running if not waits_for_text(r)]
        if generating:
            if any(self.has_ready_chunk(r) for r in self.running + self.draining):
                self.notes.append(f"codec held: {len(generating)} requests generating tokens")
            return []
        idle = [r for r in self.running if self.has_ready_chunk(r)] + self.draining
        return self.take_chunks(sorted(idle, key=lambda r: r.stats.arrival), "LM idle")
