"""Writing a step plan into the step arenas' host views, and reading a step's outputs back (numpy only).

This is the host half of the engine contract (docs/engine-contract.md): what a runtime writes into
`step_in` for a plan -- every row padded to its launch's bucket with the padding conventions
(`NO_SLOT`, position 0, a null-page KV of one entry) -- which launches follow, how many bytes to
upload, how many to download, and how `step_out` turns back into a `StepResult`. Every field is
written with array operations, one per field, never a Python loop over rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from vox_serve.core.meta import CODEC_PREFIX, EngineLimits, ProgramMeta
from vox_serve.core.plan import NO_SLOT, CodecLaunch, LmLaunch, SlotInit, StepPlan, StepResult, arange
from vox_serve.core.stages import Stage, pick_bucket
from vox_serve.rt.attention.base import AttentionPlan, paged_kv_offsets
from vox_serve.rt.slot_state import SAMPLING_FIELDS

HostViews = dict[str, np.ndarray]
_NO_PCM = memoryview(b"")


@dataclass
class Launch:
    """One stage launch of a step: the bucket its handle was captured for, and what the host needs
    around it (the attention plan before it; the plan's codec rows it covers, in output order)."""

    stage: Stage
    bucket: int
    num_seqs: int | None = None  # prefill: sequences of the launch (max_prefill_seqs when captured)
    attention: AttentionPlan | None = None
    rows: np.ndarray | None = None  # codec: indices into plan.codec


class StepWriter:
    def __init__(self, meta: ProgramMeta, limits: EngineLimits, buckets: dict[Stage, list[int]],
                 captured_prefill: bool, end_of: Callable[[str], int]) -> None:
        self.meta, self.limits, self.buckets = meta, limits, buckets
        self.captured_prefill = captured_prefill  # prefill runs graphs with max_prefill_seqs sequences
        self.end_of = end_of  # byte offset past a step_in field

    def write(self, h: HostViews, plan: StepPlan) -> tuple[list[Launch], int]:
        """Fill the host views for `plan`; returns its launches in order and the bytes to upload."""
        launches, end, primed_end = [], 0, 0
        if plan.admits or len(plan.pages):
            admits = sorted(plan.admits, key=lambda a: not _has_prefix(a))  # those with a codec prefix first
            self._admits(h, admits)
            self._pages(h, plan)
            launches.append(Launch(Stage.PROLOGUE, 1))
            end = self.end_of("page_id")
            num_primed = sum(map(_has_prefix, admits))
            if num_primed:
                self._codec_prefixes(h, admits[:num_primed])
                launches.append(Launch(Stage.CODEC_PRIME, pick_bucket(num_primed, self.buckets[Stage.CODEC_PRIME])))
                primed_end = self.end_of("codec_prime_len")
        if len(plan.codec):
            for launch in self._codec(h, plan.codec):
                launches.append(launch)
                end = max(end, self.end_of(f"{launch.stage}_window_end"))
        if len(plan.prefill):
            launches.append(self._prefill(h, plan.prefill))
            end = max(end, self.end_of(_last_prefill_field(h)))
        if len(plan.decode):
            launches.append(self._decode(h, plan.decode))
            end = max(end, self.end_of("decode_last_page_len"))
        return launches, max(end, primed_end)

    # ---- sections ----------------------------------------------------------------------------
    def _admits(self, h: HostViews, admits: list[SlotInit]) -> None:
        n, cap = len(admits), self.limits.max_admits
        if n > cap:
            raise ValueError(f"{n} admissions in one step; the engine takes {cap}")
        h["admit_slot"][n:] = NO_SLOT
        if not n:
            return  # a step with page updates only: every admit row is a no-op
        h["admit_slot"][:n] = [a.slot for a in admits]
        for name in SAMPLING_FIELDS:
            h[f"admit_{name}"][:n] = [getattr(a, name) for a in admits]
        for f in self.meta.layout.slot_fields:
            values, lengths = h[f"admit_{f.name}"], h[f"admit_{f.name}_len"]
            for i, a in enumerate(admits):
                value = a.conditioning.get(f.name)
                length = 0 if value is None else len(value)
                if length > f.shape[0]:
                    raise ValueError(f"{f.name} of {length} exceeds its declared {f.shape[0]}")
                if value is not None:
                    values[i, :length] = value
                lengths[i] = length

    def _codec_prefixes(self, h: HostViews, primed: list[SlotInit]) -> None:
        """The codec prefixes of admit rows 0..n-1 (the admissions that carry one come first, so that a
        `codec_prime` launch of bucket b primes rows 0..b-1; rows past n get length 0: no-ops)."""
        values, lengths = h["codec_prime_codes"], h["codec_prime_len"]
        for i, a in enumerate(primed):
            prefix = a.conditioning[CODEC_PREFIX]
            if len(prefix) > values.shape[1]:
                raise ValueError(f"{CODEC_PREFIX} of {len(prefix)} frames exceeds the declared {values.shape[1]}")
            values[i, :len(prefix)] = prefix
            lengths[i] = len(prefix)
        lengths[len(primed):] = 0

    def _pages(self, h: HostViews, plan: StepPlan) -> None:
        p, n = plan.pages, len(plan.pages)
        if n > self.limits.max_page_updates:
            raise ValueError(f"{n} page-table updates in one step; the engine takes {self.limits.max_page_updates}")
        h["page_slot"][:n], h["page_index"][:n], h["page_id"][:n] = p.slot, p.index, p.page
        h["page_slot"][n:] = NO_SLOT

    def _codec(self, h: HostViews, codec: CodecLaunch) -> list[Launch]:
        if len(codec) > self.limits.max_codec_batch:
            raise ValueError(f"{len(codec)} codec rows exceed --max-codec-batch {self.limits.max_codec_batch}")
        first = codec.chunk_index == 0 if self.limits.has_first_chunks else None
        if first is None or not first.any():  # one launch of every row
            return [self._codec_launch(h, Stage.CODEC, codec, None)]
        out = []
        for stage, rows in ((Stage.CODEC_FIRST, first.nonzero()[0]), (Stage.CODEC, (~first).nonzero()[0])):
            if len(rows):
                out.append(self._codec_launch(h, stage, codec, rows))
        return out

    def _codec_launch(self, h: HostViews, stage: Stage, codec: CodecLaunch, rows: np.ndarray | None) -> Launch:
        """The codec rows `rows` of the plan (None: all of them, in order) as one launch of `stage`."""
        pick = (lambda column: column) if rows is None else (lambda column: column[rows])  # noqa: E731
        n = len(codec) if rows is None else len(rows)
        bucket = pick_bucket(n, self.buckets[stage])
        _put(h[f"{stage}_slot"], pick(codec.slot), bucket, NO_SLOT)
        _put(h[f"{stage}_first_frame"], pick(codec.first_frame), bucket, 0)
        _put(h[f"{stage}_window_end"], pick(codec.window_end), bucket, 1)
        return Launch(stage, bucket, rows=arange(n) if rows is None else rows)

    def _decode(self, h: HostViews, rows: LmLaunch) -> Launch:
        n = len(rows)
        if n > self.limits.max_batch or (rows.num_tokens != 1).any():
            raise ValueError("a decode launch has one token per row and at most max_batch rows")
        bucket = pick_bucket(n, self.buckets[Stage.DECODE])
        _put(h["decode_slot"], rows.slot, bucket, NO_SLOT)
        _put(h["decode_pos"], rows.start, bucket, 0)
        _put(h["decode_ids"], rows.input_ids, bucket, 0)
        # Attention rows stream by stream: row j * bucket + i is stream j of decode row i.
        kv_len = _padded(rows.kv_len, bucket, 1)
        if self.limits.kv_streams > 1:
            kv_len = np.tile(kv_len, self.limits.kv_streams)
        paged_kv_offsets(kv_len, self.limits.page_size, h["decode_kv_indptr"], h["decode_last_page_len"])
        return Launch(Stage.DECODE, bucket, attention=AttentionPlan.decode_rows(kv_len))

    def _prefill(self, h: HostViews, rows: LmLaunch) -> Launch:
        lim, n, t = self.limits, len(rows), rows.total_tokens
        if n > lim.max_prefill_seqs or t > lim.max_prefill_tokens:
            raise ValueError(f"prefill of {n} seqs / {t} tokens exceeds the arena")
        bucket = pick_bucket(t, self.buckets[Stage.PREFILL])
        seqs = lim.max_prefill_seqs if self.captured_prefill else n
        kv_len = _padded(rows.kv_len, seqs, 1)  # padded sequences: no tokens, one null-page entry
        _put(h["prefill_slot"], rows.slot, seqs, NO_SLOT)
        _put(h["prefill_kv_len"], rows.kv_len, seqs, 1)
        _put(h["prefill_sample"], rows.sample, seqs, False)
        qo, streams = h["prefill_qo_indptr"], lim.kv_streams
        qo[0] = 0
        np.cumsum(_padded(rows.num_tokens, seqs, 0), out=qo[1 : seqs + 1])
        for j in range(1, streams):  # attention sequence j * seqs + i: stream j of sequence i, after stream j - 1
            qo[j * seqs + 1 : (j + 1) * seqs + 1] = j * t + qo[1 : seqs + 1]
        paged_kv_offsets(np.tile(kv_len, streams), lim.page_size, h["prefill_kv_indptr"], h["prefill_last_page_len"])
        offsets = np.repeat(rows.start - qo[:n], rows.num_tokens)
        _put(h["prefill_pos"], offsets + np.arange(t), bucket, 0)
        _put(h["prefill_tok_slot"], np.repeat(rows.slot, rows.num_tokens), bucket, NO_SLOT)
        _put(h["prefill_ids"], rows.input_ids, bucket, 0)
        if "prefill_vec_token" in h:
            e = len(rows.vector_token)
            if e > len(h["prefill_vec_token"]):
                raise ValueError(f"{e} prompt vectors in one prefill; the arena holds {len(h['prefill_vec_token'])}")
            _put(h["prefill_vec_token"], rows.vector_token, len(h["prefill_vec_token"]), -1)
            if e:
                width = h["prefill_vec"].shape[1]
                if rows.vectors.shape[1] != width:
                    raise ValueError(f"prompt vectors of {rows.vectors.shape[1]} values; the program takes {width} "
                                     f"({lim.kv_streams} stream(s) of {width // lim.kv_streams})")
                h["prefill_vec"][:e] = rows.vectors
        elif len(rows.vector_token):
            raise ValueError("rows carry prompt vectors, which this program does not declare")
        graph_tokens = streams * bucket if self.captured_prefill else None
        attention = AttentionPlan(streams * n, np.tile(rows.num_tokens, streams), np.tile(rows.kv_len, streams),
                                  num_rows=streams * seqs, graph_tokens=graph_tokens)
        return Launch(Stage.PREFILL, bucket, num_seqs=seqs, attention=attention)


def _has_prefix(admit: SlotInit) -> bool:
    prefix = admit.conditioning.get(CODEC_PREFIX)
    return prefix is not None and len(prefix) > 0


def _padded(values: np.ndarray, size: int, pad: int) -> np.ndarray:
    out = np.full(size, pad, dtype=np.int64)
    out[: len(values)] = values
    return out


def _put(view: np.ndarray, values: np.ndarray, bucket: int, pad: int | bool) -> None:
    """view[:len(values)] = values; view[len(values):bucket] = pad (the padded rows of the launch)."""
    n = len(values)
    view[:n] = values
    view[n:bucket] = pad


def _last_prefill_field(h: HostViews) -> str:
    return "prefill_vec" if "prefill_vec" in h else "prefill_tok_slot"


class StepReader:
    """Reads a step's outputs from `step_out`'s host views; `download_bytes` says how much to copy."""

    def __init__(self, meta: ProgramMeta, limits: EngineLimits, offsets: dict[str, int]) -> None:
        self.meta, self.limits, self.offsets = meta, limits, offsets
        self.kinds_end = min(v for k, v in offsets.items() if k.endswith("_pcm"))  # the out kinds come first

    def _pcm_row_bytes(self, stage: Stage) -> int:
        frames = self.limits.first_frames if stage is Stage.CODEC_FIRST else self.limits.frames_per_chunk
        return 2 * frames * self.meta.samples_per_frame

    def download_bytes(self, launches: list[Launch]) -> int:
        end = self.kinds_end
        for launch in launches:
            if launch.rows is not None:
                rows = len(launch.rows) * self._pcm_row_bytes(launch.stage)
                end = max(end, self.offsets[f"{launch.stage}_pcm"] + rows)
        return end

    def pcm_bytes(self, launches: list[Launch]) -> tuple[int, int] | None:
        """The bytes of `step_out` that hold the PCM of the step's codec rows, `[start, end)` (the out kinds end
        at the first PCM field); None for a step without codec rows."""
        starts = [self.offsets[f"{launch.stage}_pcm"] for launch in launches if launch.rows is not None]
        return (min(starts), self.download_bytes(launches)) if starts else None

    def read(self, h: HostViews, plan: StepPlan, launches: list[Launch], with_pcm: bool = True) -> StepResult:
        """The step's out kinds and (unless `with_pcm` is False: it was read early, `read_pcm`) its PCM."""
        result = StepResult(plan.step_id, prefill_kind=h["prefill_kind"][: len(plan.prefill)].copy(),
                            decode_kind=h["decode_kind"][: len(plan.decode)].copy(), pcm_early=not with_pcm)
        if with_pcm:
            result.pcm = self.read_pcm(h, plan, launches)
        return result

    def read_pcm(self, h: HostViews, plan: StepPlan, launches: list[Launch]) -> list[bytes | memoryview]:
        """The PCM of the step's codec rows (one per codec row of the plan)."""
        if not len(plan.codec):
            return []
        pcm: list[bytes | memoryview] = [_NO_PCM] * len(plan.codec)
        row_bytes = (plan.codec.num_frames.astype(np.int64) * (2 * self.meta.samples_per_frame)).tolist()
        for launch in launches:
            if launch.rows is None:
                continue
            # One copy of the launch's rows out of the step buffer (which the step after next reuses); each
            # row's PCM is a view of that copy, which lives as long as any of its rows' views.
            out = h[f"{launch.stage}_pcm"]
            rows = launch.rows.tolist()
            block, width = memoryview(out[: len(rows)].tobytes()), out.shape[1] * 2
            for i, row in enumerate(rows):
                pcm[row] = block[i * width : i * width + row_bytes[row]]
        return pcm
