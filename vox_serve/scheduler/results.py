"""A step's results applied to its requests (the second half of `Scheduler`'s life cycle, base.py):
each LM row's out kind counts a token, ends its request's generation at a stop or at its length limit,
or is dropped when its request no longer holds the slot (a stop or an abort arrived meanwhile, with
asynchronous scheduling); each decoded chunk goes to its request's stats and sink; a request whose
tokens and chunks are all done is finished, and its slot and pages are released (pages only once no
step in flight writes them)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np

from vox_serve.core.plan import StepPlan, StepResult
from vox_serve.core.request import OutKind, Request, RequestStatus
from vox_serve.core.slot_table import SlotState, SlotTable
from vox_serve.scheduler.kv_pages import KvPages

# Out kind -> whether the row stops its request / is audio, so a launch's kinds are classified by one
# lookup each (comparing an array with IntEnum members is several times slower than indexing).
_IS_STOP = np.array([kind.stops for kind in sorted(OutKind)])
_IS_AUDIO = np.array([kind.is_audio for kind in sorted(OutKind)])
_IS_TOKEN = np.array([kind is not OutKind.STOP for kind in sorted(OutKind)], dtype=np.int64)  # counts as generated


def codes_of_kinds(codes_per_step: int) -> np.ndarray:
    """Out kind -> the codes a row of that kind adds."""
    return _IS_AUDIO * codes_per_step


class StepResults:
    """The results half of `Scheduler` (base.py), which owns the state below and provides `_ready_chunks`
    (chunk readiness) and `lm_in_flight` (whether a step on the device still writes a slot's pages)."""

    table: SlotTable
    pages: KvPages
    requests: dict[str, Request]
    waiting: deque[Request]
    running: list[Request]
    draining: list[Request]
    clock: Callable[[], float]
    on_release: Callable[[Request], None] | None
    _flights: dict
    _codes_of: np.ndarray

    def update(self, plan: StepPlan, result: StepResult) -> None:
        now = self.clock()
        flight = self._flights.pop(plan.step_id, None)
        if flight is not None:
            self._apply(flight.prefill_slots, flight.prefill_occupancy, flight.prefill_sample, result.prefill_kind,
                        now, flight.changes)
            self._apply(flight.decode_slots, flight.decode_occupancy, None, result.decode_kind, now, flight.changes)
        if plan.codec and not result.pcm_early:
            self._on_audio(plan.codec.req_ids, result.pcm, now)
        self._retire_drained()
        self.pages.free_landed(self._flights)

    def land_early(self, plan: StepPlan, pcm: list[bytes | memoryview]) -> None:
        """The PCM of a step's codec rows, handed over before the step is collected (the worker's `early_pcm`)."""
        self._on_audio(plan.codec.req_ids, pcm, self.clock())
        self._retire_drained()

    def fail_chunks(self, req_ids: list[str], error: str) -> None:
        """Codec rows whose PCM was lost: their requests fail."""
        for req_id in req_ids:
            req = self.requests.get(req_id)
            if req is not None:
                self._end(req, RequestStatus.FAILED, "error", error)

    def _apply(self, slots: np.ndarray, occupancy: np.ndarray, sample: np.ndarray | None, kinds: np.ndarray,
               now: float, changes: int) -> None:
        """Apply one launch's out kinds to the rows whose request still holds the slot (and that sampled;
        `sample` None: every row did, as in a decode launch). `changes`: the table's when the step was planned
        (the same now: every row's request still holds its slot and runs)."""
        if not len(slots):
            return
        t = self.table
        unchanged = t.changes == changes
        live = None if unchanged else t.occupancy[slots] == occupancy
        if sample is not None:
            live = sample if live is None else live & sample
        if live is not None and not live.all():
            slots, kinds = slots[live], kinds[live]
        t.num_pending[slots] -= 1
        running = None if unchanged else t.state[slots] == SlotState.RUNNING
        if running is not None and not running.all():
            slots, kinds = slots[running], kinds[running]
        generated = t.num_generated[slots]  # a launch's slots are distinct, so whole columns are written back
        for slot in slots[generated == 0]:
            stats = t.requests[slot].stats
            stats.first_token = stats.first_token or now
        stop = _IS_STOP[kinds]
        generated += _IS_TOKEN[kinds]
        t.num_generated[slots] = generated
        t.num_codes[slots] += self._codes_of[kinds]
        ends = stop | (generated >= t.gen_limit[slots])  # max_tokens, or max_model_len
        if ends.any():  # stops first, then lengths
            for slot in slots[stop]:
                self._finish_generation(t.requests[slot], "stop")
            for slot in slots[ends & ~stop]:
                self._finish_generation(t.requests[slot], "length")

    def _on_audio(self, req_ids: list[str], pcms: list[bytes | memoryview], now: float) -> None:
        """Each decoded chunk to its request's stats and sink (requests that ended meanwhile are skipped)."""
        requests = self.requests
        for req_id, pcm in zip(req_ids, pcms, strict=True):
            if (req := requests.get(req_id)) is None:
                continue
            stats = req.stats
            if stats.first_audio is None:
                stats.first_audio = now
            samples = len(pcm) // 2
            stats.num_audio_samples += samples
            stats.last_chunk_samples = samples
            if req.sink is not None:
                req.sink(req, pcm, False)

    def _finish_generation(self, req: Request, reason: str) -> None:
        req.finish_reason = reason
        req.status = RequestStatus.DRAINING
        self.table.set_state(req.slot, SlotState.DRAINING)
        self._free_pages(req)
        self.running.remove(req)
        self.draining.append(req)

    def _retire_drained(self) -> None:
        """Draining requests with no chunk left, and none on the device, are finished."""
        if not self.draining:
            return
        t = self.table
        slots = (t.state == SlotState.DRAINING).nonzero()[0]
        decoding = np.zeros(len(slots), dtype=np.bool_)  # a chunk still on the device
        for step in self._flights:
            decoding |= t.codec_step[slots] == step
        done = slots[(self._ready_chunks(slots)[0] == 0) & ~decoding]
        for req in t.requests[done]:
            self._end(req, RequestStatus.FINISHED, req.finish_reason)

    def fail(self, plan: StepPlan, error: str) -> None:
        """A step raised: fail exactly the requests it carried; the others go on."""
        self._flights.pop(plan.step_id, None)
        for req_id in [*plan.prefill.req_ids, *plan.decode.req_ids, *plan.codec.req_ids]:
            req = self.requests.get(req_id)
            if req is not None:
                self._end(req, RequestStatus.FAILED, "error", error)
        self.pages.free_landed(self._flights)

    def _end(self, req: Request, status: RequestStatus, reason: str | None, error: str | None = None) -> None:
        if req.slot is not None and self.on_release is not None:
            self.on_release(req)
        self._free_pages(req)
        self.table.release(req)
        for queue in (self.running, self.draining):
            if req in queue:
                queue.remove(req)
        if req in self.waiting:
            self.waiting.remove(req)
        self.requests.pop(req.req_id, None)
        req.status, req.finish_reason, req.error = status, reason, error
        req.stats.finished = self.clock()
        if req.sink is not None:
            req.sink(req, None, True)

    def _free_pages(self, req: Request) -> None:
        """req's pages back to the pool, or once the step in flight that still writes them lands."""
        writing = req.slot is not None and self.lm_in_flight(req.slot)
        self.pages.free(req, int(self.table.lm_step[req.slot]) if writing else None)
