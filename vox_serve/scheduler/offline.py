"""The `offline` policy, for batch jobs: audio is decoded only while no admitted request is
generating tokens, so the LM keeps the device to itself and the codec later runs in full batches.
Streams get their audio late; throughput of non-streaming batches is highest. Requests waiting
for streamed text are not generating: while only they are admitted, audio is decoded.
"""

from __future__ import annotations

from vox_serve.scheduler.base import Scheduler


class OfflineScheduler(Scheduler):
    name = "offline"

    def select_codec(self) -> None:
        generating = self.num_generating
        ready = self.ready_requests()
        if generating:
            if ready:
                self.notes.append(f"codec held: {generating} requests generating tokens")
            return
        self.take_chunks(ready, "LM idle")
