"""The simulated worker: the real worker's `launch` / `collect` / `execute`, timed by a cost model.

It keeps a simulated engine's device state per slot (page table, prompt length, sampling seed, token
history, codes) from the plans' slot inits and page updates, produces plausible outputs -- audio
codes, then a stop at a frame boundary once a request has its scripted number of frames (unless
`allow_stop` is off), and silent PCM of the right length for each chunk -- and moves the virtual
clock: a launch first spends the plan's host time, then the device runs the step after the
previous one; `collect` waits for the step's end. So synchronous scheduling pays host + device per
step, and asynchronous scheduling hides the host time.

It also checks the plan contract the real engine relies on and raises `PlanError` (which fails
the step's requests) when a scheduler breaks it: rows name admitted slots; KV positions contiguous
and covered by the slot's pages, which no other slot holds; one token per decode row; every chunk
decoded once, in order, from frames that exist; a stateful codec's chunks of one request never
together in a batch; with a streamed text column, generated frame k of an input-streaming request
fed text id k, then the end-of-text id, then none.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from vox_serve.core.meta import EngineLimits, ProgramMeta
from vox_serve.core.plan import ABSENT_ID, CodecLaunch, LmLaunch, StepPlan, StepResult
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


@dataclass
class SimSlot:
    """A slot's simulated device state."""

    req_id: str
    prompt_len: int
    seed: int
    allow_stop: bool
    pages: dict[int, int] = field(default_factory=dict)  # page-table index -> page
    kv_len: int = 0
    tokens: list[list[int]] = field(default_factory=list)  # history: token g at index g
    codes: list[int] = field(default_factory=list)
    next_chunk: int = 0


class SimWorker:
    timer = "sim"

    def __init__(self, meta: ProgramMeta, limits: EngineLimits, costs: CostModel, clock: VirtualClock,
                 lengths: dict[str, int] | None = None, check_pages: bool = True) -> None:
        self.meta, self.limits, self.costs, self.clock = meta, limits, costs, clock
        self.check_pages = check_pages  # page disjointness costs O(pages) a step: tests on, sweeps off
        self.lengths = lengths if lengths is not None else {}  # req_id -> audio frames before its stop
        self.stats = SimStats()
        self.device_free_at = clock.now()
        self.slots: dict[int, SimSlot] = {}
        self._text_ids: dict[str, int] = {}  # input-streaming req_id -> text ids it gets in all

    def set_text(self, req_id: str, num_ids: int) -> None:
        self._text_ids[req_id] = num_ids

    def set_length(self, req_id: str, num_frames: int) -> None:
        self.lengths[req_id] = num_frames

    def execute(self, plan: StepPlan) -> StepResult:
        return self.collect(self.launch(plan))

    def launch(self, plan: StepPlan) -> SimHandle:
        names = self._apply_admits(plan)
        self._apply_pages(plan)
        pcm = self._codec(plan.codec)
        prefill = self._lm(plan.prefill, "prefill", names)
        decode = self._lm(plan.decode, "decode", names)
        self._check_batch(plan)
        host = self.costs.host_seconds(plan)
        self.clock.advance(host)
        stages = self.costs.stage_seconds(plan)
        start = max(self.clock.now(), self.device_free_at)
        self.device_free_at = start + sum(stages.values())
        result = StepResult(plan.step_id, prefill_kind=prefill, decode_kind=decode, pcm=pcm, stage_seconds=stages)
        self._account(plan, stages, host)
        return SimHandle(plan, result, self.device_free_at)

    def collect(self, handle: SimHandle) -> StepResult:
        self.clock.advance_to(handle.done)
        return handle.result

    def read_outputs(self, slot: int, num_tokens: int, num_codes: int) -> tuple[list[list[int]], list[int]]:
        """A slot's token history and codes (what an engine recording outputs reads back)."""
        s = self.slots[slot]
        return [list(t) for t in s.tokens[:num_tokens]], list(s.codes[:num_codes])

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

    # ---- device state ----------------------------------------------------------------------
    def _apply_admits(self, plan: StepPlan) -> dict[int, str]:
        names = {}
        for launch in (plan.prefill, plan.decode, plan.codec):
            names.update(zip(launch.slot.tolist(), launch.req_ids, strict=True))
        if len(plan.admits) > self.limits.max_admits:
            raise PlanError(f"{len(plan.admits)} admissions in one step; the engine takes {self.limits.max_admits}")
        for init in plan.admits:
            if not 0 <= init.slot < self.limits.slots:
                raise PlanError(f"slot {init.slot} outside the {self.limits.slots} slots")
            self.slots[init.slot] = SimSlot(names.get(init.slot, "?"), init.prompt_len, init.seed, init.allow_stop)
        return names

    def _apply_pages(self, plan: StepPlan) -> None:
        if len(plan.pages) > self.limits.max_page_updates:
            raise PlanError(f"{len(plan.pages)} page updates exceed {self.limits.max_page_updates}")
        for slot, index, page in zip(plan.pages.slot.tolist(), plan.pages.index.tolist(), plan.pages.page.tolist(),
                                     strict=True):
            if slot not in self.slots or not 1 <= page < self.limits.num_pages:
                raise PlanError(f"page update ({slot}, {index}, {page}) names no admitted slot or no usable page")
            self.slots[slot].pages[index] = page

    # ---- LM rows -----------------------------------------------------------------------------
    def _lm(self, launch: LmLaunch, stage: str, names: dict[int, str]) -> np.ndarray:
        if stage == "decode" and (len(launch) > self.limits.max_batch or (launch.num_tokens != 1).any()):
            raise PlanError("a decode launch has one token per row, at most max_batch rows")
        if stage == "prefill" and (launch.total_tokens > self.limits.max_prefill_tokens
                                   or len(launch) > self.limits.max_prefill_seqs):
            raise PlanError("prefill exceeds max_prefill_tokens or max_prefill_seqs")
        kinds = np.full(len(launch), int(OutKind.OTHER), dtype=np.int32)
        offset = 0
        for i, slot in enumerate(launch.slot.tolist()):
            s = self._slot(slot, names)
            start, n = int(launch.start[i]), int(launch.num_tokens[i])
            self._check_positions(s, start, n)
            self._check_text(s, start, launch.input_ids[offset : offset + n])
            offset += n
            s.kv_len = start + n
            if launch.sample[i]:
                kinds[i] = self._sample(s, s.kv_len - s.prompt_len)
        return kinds

    def _slot(self, slot: int, names: dict[int, str]) -> SimSlot:
        s = self.slots.get(slot)
        if s is None:
            raise PlanError(f"a row names slot {slot}, which was never admitted")
        s.req_id = names.get(slot, s.req_id)
        return s

    def _check_positions(self, s: SimSlot, start: int, n: int) -> None:
        if start not in (s.kv_len, 0):
            raise PlanError(f"{s.req_id} starts at {start} but has {s.kv_len} positions written")
        pages_needed = -(-(start + n) // self.limits.page_size)
        if any(i not in s.pages for i in range(pages_needed)):
            raise PlanError(f"{s.req_id}: its pages cannot hold {start + n} tokens")

    def _check_batch(self, plan: StepPlan) -> None:
        """No two requests of a step's rows share a page; a request has one LM row per step."""
        rows = [*plan.prefill.slot.tolist(), *plan.decode.slot.tolist()]
        if len(set(rows)) != len(rows):
            raise PlanError(f"a slot has two LM rows in step {plan.step_id}")
        if not self.check_pages:
            return
        owner: dict[int, int] = {}
        for slot in rows:
            s = self.slots[slot]
            for index in range(-(-s.kv_len // self.limits.page_size)):
                page = s.pages[index]
                if owner.setdefault(page, slot) != slot:
                    raise PlanError(f"page {page} of {s.req_id} is held by {self.slots[owner[page]].req_id}")

    def _check_text(self, s: SimSlot, start: int, ids: np.ndarray) -> None:
        column, num_ids = self.meta.streamed_text_column, self._text_ids.get(s.req_id)
        if column is None or num_ids is None:
            return
        for i, row in enumerate(ids):
            frame = start + i - s.prompt_len
            want = TEXT_ID_BASE + frame if frame < num_ids else TEXT_END_ID if frame == num_ids else ABSENT_ID
            if frame >= 0 and int(row[column]) != want:
                raise PlanError(f"{s.req_id}: frame {frame} fed text id {int(row[column])}, expected {want}")

    def _sample(self, s: SimSlot, gen_index: int) -> int:
        """The kind of generated token `gen_index` (it lands in the history at that index)."""
        cps, cpf = self.meta.codes_per_step, self.meta.codes_per_frame
        del s.tokens[gen_index:]  # a recomputed or discarded future is overwritten
        frames = self.lengths.get(s.req_id, DEFAULT_FRAMES)
        at_boundary = (gen_index * cps) % cpf == 0
        stops = s.allow_stop and at_boundary and gen_index * cps >= frames * cpf
        keeps = self.meta.stop_rule.keeps_frame
        if stops and not keeps:
            s.tokens.append([0] * cps)
            return int(OutKind.STOP)
        codes = [(s.seed * 7919 + (gen_index * cps + i) * 104729) % 4096 for i in range(cps)]
        s.tokens.append(codes)
        s.codes.extend(codes)
        return int(OutKind.AUDIO_STOP if stops else OutKind.AUDIO)

    # ---- codec -------------------------------------------------------------------------------
    def _codec(self, launch: CodecLaunch) -> list[bytes]:
        if len(launch) > self.limits.max_codec_batch:
            raise PlanError(f"{len(launch)} chunks exceed max_codec_batch {self.limits.max_codec_batch}")
        slots = launch.slot.tolist()
        if self.meta.stateful_codec and len(set(slots)) != len(slots):
            raise PlanError("a stateful codec batch has two chunks of one request")
        expected = {}
        for i, slot in enumerate(slots):
            s = self.slots.get(slot)
            if s is None:
                raise PlanError(f"a chunk names slot {slot}, which was never admitted")
            want = expected.get(slot, s.next_chunk)
            if int(launch.chunk_index[i]) != want:
                raise PlanError(f"{s.req_id}: chunk {int(launch.chunk_index[i])} decoded, expected chunk {want}")
            if int(launch.window_end[i]) * self.meta.codes_per_frame > len(s.codes):
                raise PlanError(f"{s.req_id}: chunk {want} reads frames that do not exist yet")
            expected[slot] = want + 1
        for slot, nxt in expected.items():
            self.slots[slot].next_chunk = nxt
        spf_bytes = 2 * self.meta.samples_per_frame
        return [bytes(spf_bytes * int(n)) for n in launch.num_frames]
