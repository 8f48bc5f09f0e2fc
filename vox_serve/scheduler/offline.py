"""The `offline` policy, for batch jobs: audio is decoded only while no admitted request is
generating tokens, so the LM keeps the device to itself and the codec later runs in full batches.
Streams get their audio late; throughput of non-streaming batches is highest.
"""

from __future__ import annotations

from vox_serve.scheduler.base import Scheduler
from vox_serve.scheduler.plan import CodecRow


class OfflineScheduler(Scheduler):
    name = "offline"

    def select_codec(self) -> list[CodecRow]:
        if self.running:
            if any(self.has_ready_chunk(r) for r in self.running + self.draining):
                self.notes.append(f"codec held: {len(self.running)} requests generating tokens")
            return []
        return self.take_chunks(sorted(self.draining, key=lambda r: r.stats.arrival), "LM idle")
