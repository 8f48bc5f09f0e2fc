"""The simulated worker: the real worker's `launch` / `collect` / `execute`, timed by a cost model.

It produces plausible outputs -- audio codes, then a stop at a frame boundary once a request has
its scripted number of tokens (unless `allow_stop` is off), and silent PCM of the right length for
each chunk -- and moves the virtual clock: a launch first spends the plan's host time, then the
device runs the step after the previous one; `collect` waits for the step's end. So synchronous
scheduling pays host + device per step, and asynchronous scheduling hides the host time.

It also checks the plan contract the real engine relies on and raises `PlanError` (which fails
the step's requests) when a scheduler breaks it: KV positions contiguous and covered by pages no
other request in the step holds; one token per decode row; pending inputs only after a step that
sampled them; every chunk decoded once, in order; a stateful codec's chunks of one request never
together in a batch and always on the request's own slot; with a streamed text column, generated
frame k of an input-streaming request fed text id k, then the end-of-text id, then none (so no frame
ran before its text arrived, and none was skipped or fed twice).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vox_serve.core.meta import EngineLimits, ProgramMeta
from vox_serve.core.plan import ABSENT_ID, CodecOut, CodecRow, LmOut, LmRow, StepPlan, StepResult
from vox_serve.core.request import OutKind
from vox_serve.sim.clock import VirtualClock
from vox_serve.sim.cost import CostModel

DEFAULT_FRAMES = 60  # audio frames of a request without a scripted length
TEXT_ID_BASE = 100_000  # streamed text id k of a simulated request is TEXT_ID_BASE + k
TEXT_END_ID = 99_999  # then this end-of-text id


class PlanError(AssertionError):
    """A plan breaks the contract between the scheduler and the engine."""


@dataclass
class SimHandle:
    plan: StepPlan
    result: StepResult
    done: float  # virtual time at which the device finishes the step


@dataclass
class SimStats:
    steps: int = 0
    device_seconds: float = 0.0
    host_seconds: float = 0.0
    codec_launches: int = 0
    codec_rows: int = 0
    stage_seconds: dict[str, float] = field(default_factory=dict)


class SimWorker:
    timer = "sim"

    def __init__(self, meta: ProgramMeta, limits: EngineLimits, costs: CostModel, clock: VirtualClock,
                 lengths: dict[str, int] | None = None, check_pages: bool = True) -> None:
        self.meta, self.limits, self.costs, self.clock = meta, limits, costs, clock
        self.check_pages = check_pages  # page disjointness costs O(pages) a step: tests on, sweeps off
        self.lengths = lengths if lengths is not None else {}  # req_id -> audio frames before its stop
        self.stats = SimStats()
        self.device_free_at = clock.now()
        self._kv: dict[str, int] = {}  # req_id -> KV positions written
        self._next_chunk: dict[str, int] = {}
        self._slot_owner: dict[int, str] = {}
        self._last_sampled: set[str] = set()
        self._text_ids: dict[str, int] = {}  # input-streaming req_id -> text ids it gets in all

    def set_text(self, req_id: str, num_ids: int) -> None:
        self._text_ids[req_id] = num_ids

    def set_length(self, req_id: str, num_frames: int) -> None:
        self.lengths[req_id] = num_frames

    def execute(self, plan: StepPlan) -> StepResult:
        return self.collect(self.launch(plan))

    def launch(self, plan: StepPlan) -> SimHandle:
        self._check_lm(plan)
        for slot in plan.released_slots:
            self._slot_owner.pop(slot, None)
        self._check_codec(plan.codec)
        host = self.costs.host_seconds(plan)
        self.clock.advance(host)
        stages = self.costs.stage_seconds(plan)
        start = max(self.clock.now(), self.device_free_at)
        self.device_free_at = start + sum(stages.values())
        result = StepResult(plan.step_id, stage_seconds=stages)
        result.prefill = [self._sample(r) for r in plan.prefill if r.sample]
        result.decode = [self._sample(r) for r in plan.decode]
        spf_bytes = 2 * self.meta.samples_per_frame
        result.codec = [CodecOut(r.req_id, r.chunk_index, bytes(spf_bytes * r.num_frames)) for r in plan.codec]
        self._last_sampled = {r.req_id for r in plan.prefill + plan.decode if r.sample}
        self._account(plan, stages, host)
        return SimHandle(plan, result, self.device_free_at)

    def collect(self, handle: SimHandle) -> StepResult:
        self.clock.advance_to(handle.done)
        return handle.result

    def _account(self, plan: StepPlan, stages: dict[str, float], host: float) -> None:
        s = self.stats
        s.steps += 1
        s.host_seconds += host
        s.device_seconds += sum(stages.values())
        for name, seconds in stages.items():
            s.stage_seconds[name] = s.stage_seconds.get(name, 0.0) + seconds
        if plan.codec:
            s.codec_launches += 1
            s.codec_rows += len(plan.codec)

    # ---- outputs -------------------------------------------------------------------------
    def _sample(self, row: LmRow) -> LmOut:
        cps, cpf = self.meta.codes_per_step, self.meta.codes_per_frame
        frames = self.lengths.get(row.req_id, DEFAULT_FRAMES)
        at_boundary = (row.gen_index * cps) % cpf == 0
        if row.allow_stop and at_boundary and row.gen_index * cps >= frames * cpf:
            return LmOut(row.req_id, [0] * cps, [0] * cps, int(OutKind.STOP))
        codes = [(row.seed * 7919 + (row.gen_index * cps + i) * 104729) % 4096 for i in range(cps)]
        return LmOut(row.req_id, codes, codes, int(OutKind.AUDIO))

    # ---- the plan contract ---------------------------------------------------------------
    def _check_lm(self, plan: StepPlan) -> None:
        seen: set[str] = set()
        page_owner: dict[int, str] = {}
        for stage, rows in (("prefill", plan.prefill), ("decode", plan.decode)):
            if stage == "decode" and len(rows) > self.limits.max_batch:
                raise PlanError(f"decode batch of {len(rows)} exceeds max_batch {self.limits.max_batch}")
            for r in rows:
                if r.req_id in seen:
                    raise PlanError(f"{r.req_id} has two LM rows in step {plan.step_id}")
                seen.add(r.req_id)
                self._check_row(stage, r, page_owner)
        if sum(r.num_tokens for r in plan.prefill) > self.limits.max_prefill_tokens:
            raise PlanError("prefill exceeds max_prefill_tokens")

    def _check_row(self, stage: str, r: LmRow, page_owner: dict[int, str]) -> None:
        if stage == "decode" and r.num_tokens != 1:
            raise PlanError(f"decode row of {r.req_id} carries {r.num_tokens} tokens")
        written = self._kv.get(r.req_id, 0)
        if r.start_pos not in (written, 0):
            raise PlanError(f"{r.req_id} starts at {r.start_pos} but has {written} positions written")
        if len(r.pages) * self.limits.page_size < r.kv_len:
            raise PlanError(f"{r.req_id}: {len(r.pages)} pages cannot hold {r.kv_len} tokens")
        for page in r.pages if self.check_pages else ():
            if page < 1 or page_owner.setdefault(page, r.req_id) != r.req_id:
                raise PlanError(f"page {page} of {r.req_id} is reserved or held by {page_owner[page]}")
        if r.pending_input and r.req_id not in self._last_sampled:
            raise PlanError(f"{r.req_id} has a pending input that the previous step did not sample")
        self._check_text(r)
        self._kv[r.req_id] = r.kv_len

    def _check_text(self, r: LmRow) -> None:
        column, num_ids = self.meta.streamed_text_column, self._text_ids.get(r.req_id)
        if column is None or num_ids is None or not r.sample:
            return
        prompt_len = r.kv_len - r.gen_index  # a sampling row's last input is its last generated frame
        for i, row in enumerate(r.input_ids):
            frame = r.start_pos + i - prompt_len
            want = TEXT_ID_BASE + frame if frame < num_ids else TEXT_END_ID if frame == num_ids else ABSENT_ID
            if frame >= 0 and row[column] != want:
                raise PlanError(f"{r.req_id}: frame {frame} fed text id {row[column]}, expected {want}")

    def _check_codec(self, rows: list[CodecRow]) -> None:
        if len(rows) > self.limits.max_codec_batch:
            raise PlanError(f"{len(rows)} chunks exceed max_codec_batch {self.limits.max_codec_batch}")
        in_batch: set[str] = set()
        next_chunk, owners = {}, dict(self._slot_owner)  # applied only when the whole batch is valid
        for r in rows:
            expected = next_chunk.get(r.req_id, self._next_chunk.get(r.req_id, 0))
            if r.chunk_index != expected:
                raise PlanError(f"{r.req_id}: chunk {r.chunk_index} decoded, expected chunk {expected}")
            next_chunk[r.req_id] = expected + 1
            if self.meta.stateful_codec:
                if r.req_id in in_batch:
                    raise PlanError(f"{r.req_id} has two chunks in one batch of a stateful codec")
                owner = owners.setdefault(r.slot, r.req_id)
                if owner != r.req_id:
                    raise PlanError(f"codec slot {r.slot} of {r.req_id} holds the state of {owner}")
            in_batch.add(r.req_id)
        self._next_chunk.update(next_chunk)
        self._slot_owner = owners
