"""The worker: step plans in, step results out. Fills the program's arenas and runs its stages.

Per launch: fill the host arena, one host->device copy, the stage, a device->host copy of the
outputs into the step's own pinned buffers. Rows are padded to the stage's bucket; padded rows
write only into the null KV page.

`launch(plan)` enqueues a step and returns at once on a GPU; `collect(handle)` waits for its
outputs (`execute` does both). With asynchronous scheduling step k+1 is launched before step k is
collected: its decode rows marked `pending_input` take their input token (and its history and
code-count contribution) on the device from step k's sampled outputs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from vox_serve.core.plan import NO_SLOT, CodecOut, CodecRow, LmOut, LmRow, StepPlan, StepResult
from vox_serve.core.request import OutKind
from vox_serve.engine.build import bucket_sizes, pick_bucket
from vox_serve.rt.attention import AttentionPlan, paged_kv_csr
from vox_serve.rt.graphs import StageGraphs, run_stage
from vox_serve.rt.nvtx import nvtx_range
from vox_serve.rt.program import Program, attention_buffers

NULL_SLOT = 0  # token slot 0 lies in the reserved null page


@dataclass
class _Samples:
    """Sampled outputs of one LM launch: device snapshots and their host copies."""

    rows: list[LmRow]
    dev: dict[str, torch.Tensor]  # tokens [n, codes_per_step], codes [n, codes_per_step], out_kind [n]
    host: dict[str, torch.Tensor]


@dataclass
class StepHandle:
    plan: StepPlan
    lm: dict[str, _Samples] = field(default_factory=dict)  # "prefill" / "decode"
    codec: list[tuple[list[CodecRow], torch.Tensor]] = field(default_factory=list)  # (rows, host pcm [n, samples])
    timers: dict[str, tuple] = field(default_factory=dict)  # stage -> (start, end) events or seconds
    done: torch.cuda.Event | None = None


class ProgramWorker:
    def __init__(self, program: Program, use_cuda_graphs: bool = False, nvtx: bool = False) -> None:
        self.program = program
        self.nvtx = nvtx and program.device.type == "cuda"
        lim = program.limits
        self.decode_buckets = bucket_sizes(lim.max_batch)
        self.prefill_buckets = bucket_sizes(lim.max_prefill_tokens, min(16, lim.max_prefill_tokens))
        self.codec_buckets = bucket_sizes(lim.max_codec_batch)
        self.on_cuda = program.device.type == "cuda"
        self.timer = "cuda" if self.on_cuda else "wall"
        self._last: StepHandle | None = None  # the step launched last (source of pending inputs)
        self._uploaded: dict[str, torch.cuda.Event] = {}  # arena -> event after its last upload
        self._timers: dict[str, tuple] = {}  # stage -> (start, end) of the step being launched
        self.graphs: StageGraphs | None = None
        if program.device.type == "cuda":
            with torch.inference_mode():
                self._warm_up_prefill()
        if use_cuda_graphs and program.device.type == "cuda":
            self.graphs = StageGraphs(program)
            with torch.inference_mode():
                buckets = {"decode": self.decode_buckets, "codec": self.codec_buckets}
                if program.attention.prefill_graphs:
                    buckets["prefill"] = self.prefill_buckets
                if program.limits.has_first_chunks:
                    buckets["codec_first"] = self.codec_buckets
                self.graphs.capture(buckets, self._prepare_capture)

    def _warm_up_prefill(self) -> None:
        """One dummy prefill into the null page before serving, so kernels that compile just in
        time (FlashInfer's prefill) compile now and not under the first request."""
        prog = self.program
        n = min(prog.limits.page_size, prog.limits.max_prefill_tokens)
        row = self._dummy_row("warm-up", n, [0])
        bucket = pick_bucket(n, self.prefill_buckets)
        arena = prog.arenas["prefill_in"]
        self._fill_lm(arena.host, [row], bucket, 1)
        arena.upload()
        prog.attention.plan(AttentionPlan(1, [n], [n], [[0]], None), attention_buffers(arena))
        prog.prefill(bucket, 1)
        torch.cuda.synchronize(prog.device)

    def _dummy_row(self, req_id: str, num_tokens: int, pages: list[int]) -> LmRow:
        """A greedy prompt row of zero ids on the given (null) pages: warm-up and graph capture."""
        width = self.program.meta.input_columns
        return LmRow(req_id, [[0] * width] * num_tokens, 0, pages, True, 0.0, 0, 1.0, 0.0, 1.0, [], 0, 0, False, 0)

    def _prepare_capture(self, stage: str, bucket: int) -> None:
        """Dummy inputs for capturing `stage` at `bucket` rows: every row padded (null page)."""
        prog = self.program
        arena = prog.arenas[f"{stage}_in"]
        if stage == "decode":
            self._fill_lm(arena.host, [], bucket, bucket)
            arena.upload()
            prog.attention.plan(AttentionPlan(bucket, [1] * bucket, [1] * bucket, [[0]] * bucket, bucket),
                                attention_buffers(arena))
        elif stage == "prefill":  # sequences on the null page filling the bucket; the rest empty
            lim = prog.limits
            longest = lim.max_pages_per_seq * lim.page_size
            sizes = [min(longest, bucket - start) for start in range(0, bucket, longest)]
            rows = [self._dummy_row("capture", n, [0] * -(-n // lim.page_size)) for n in sizes]
            self._fill_lm(arena.host, rows, bucket, lim.max_prefill_seqs)
            arena.upload()
            plan = AttentionPlan(len(rows), sizes, sizes, [r.pages for r in rows], lim.max_prefill_seqs,
                                 graph_tokens=bucket)
            prog.attention.plan(plan, attention_buffers(arena))
        else:
            arena.host["codes"].zero_()
            arena.host["slot"].fill_(NO_SLOT)
            arena.upload()

    def _launch(self, stage: str, bucket: int, *args: int) -> None:
        """Replay the captured graph of (stage, bucket), or run the stage eagerly; time it on the device."""
        if self.on_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        else:
            start = time.perf_counter()
        with nvtx_range(f"{stage}[{bucket}]", self.nvtx):
            if self.graphs is not None and self.graphs.has(stage, bucket):
                self.graphs.replay(stage, bucket)
            else:
                run_stage(self.program, stage, bucket, *args)
        if self.on_cuda:
            end.record()
        else:
            end = time.perf_counter()
        self._timers[stage] = (start, end)

    def execute(self, plan: StepPlan) -> StepResult:
        """Run one step: codec chunks first (their audio is due soonest), then prefill, then decode."""
        return self.collect(self.launch(plan))

    def launch(self, plan: StepPlan) -> StepHandle:
        handle = StepHandle(plan)
        self._timers = handle.timers
        with torch.inference_mode():
            carry = self._carry(plan.decode)  # before this step's stages overwrite anything
            for slot in plan.released_slots:
                self.program.release_codec_slot(slot)
            if plan.codec:
                self._run_codec(handle, plan.codec)
            if plan.prefill:
                self._run_lm(handle, "prefill", plan.prefill, None)
            if plan.decode:
                self._run_lm(handle, "decode", plan.decode, carry)
            if self.on_cuda:
                handle.done = torch.cuda.Event()
                handle.done.record()
        self._last = handle
        return handle

    def collect(self, handle: StepHandle) -> StepResult:
        if handle.done is not None:
            handle.done.synchronize()
        result = StepResult(handle.plan.step_id)
        for stage, samples in handle.lm.items():
            setattr(result, stage, self._lm_outs(samples))
        spf = self.program.meta.samples_per_frame
        for rows, pcm in handle.codec:
            result.codec += [CodecOut(r.req_id, r.chunk_index, pcm[i, : r.num_frames * spf].numpy().tobytes())
                             for i, r in enumerate(rows)]
        for stage, (start, end) in handle.timers.items():
            result.stage_seconds[stage] = start.elapsed_time(end) / 1000 if self.on_cuda else end - start
        return result

    @staticmethod
    def _lm_outs(samples: _Samples) -> list[LmOut]:
        n = len(samples.rows)
        tokens = samples.host["tokens"][:n].tolist()
        codes = samples.host["codes"][:n].tolist()
        kinds = samples.host["out_kind"][:n].tolist()
        return [LmOut(r.req_id, tokens[i], codes[i], kinds[i]) for i, r in enumerate(samples.rows) if r.sample]

    def _to_device(self, values: list[int]) -> torch.Tensor:
        t = torch.tensor(values, dtype=torch.int64)
        return t.pin_memory().to(self.program.device, non_blocking=True) if self.on_cuda else t

    def _mark_uploaded(self, name: str) -> None:
        """Remember when the copies out of an input arena's host view have run, so the host may
        write it again (`_host_arena` waits for this point)."""
        if self.on_cuda:
            event = torch.cuda.Event()
            event.record()
            self._uploaded[name] = event

    def _host_arena(self, name: str) -> dict[str, torch.Tensor]:
        """The host view of an input arena, once the device has read its previous contents."""
        event = self._uploaded.pop(name, None)
        if event is not None:
            event.synchronize()
        return self.program.arenas[name].host

    # ---- pending inputs (asynchronous scheduling) ----------------------------------------
    def _carry(self, rows: list[LmRow]) -> tuple[list[int], torch.Tensor, torch.Tensor] | None:
        """(destination rows, tokens [m, codes_per_step], out_kind [m]) sampled last step for pending rows."""
        pending = [i for i, r in enumerate(rows) if r.pending_input]
        if not pending:
            return None
        last = self._last
        sources: dict[str, int] = {}
        parts_tok, parts_kind = [], []
        offset = 0
        for samples in (last.lm.values() if last is not None else ()):
            for j, r in enumerate(samples.rows):
                if r.sample:
                    sources[r.req_id] = offset + j
            parts_tok.append(samples.dev["tokens"])
            parts_kind.append(samples.dev["out_kind"])
            offset += len(samples.rows)
        missing = [rows[i].req_id for i in pending if rows[i].req_id not in sources]
        if missing:
            raise ValueError(f"pending inputs of {missing} were not sampled by the previous step")
        index = self._to_device([sources[rows[i].req_id] for i in pending])
        tokens = torch.cat(parts_tok).index_select(0, index)
        kinds = torch.cat(parts_kind).index_select(0, index)
        return pending, tokens, kinds

    def _patch_pending(self, rows: list[LmRow], carry: tuple[list[int], torch.Tensor, torch.Tensor]) -> None:
        """Write last step's sampled tokens into this step's device inputs (no host round trip)."""
        pending, tokens, kinds = carry
        a = self.program.arenas["decode_in"]
        dst = self._to_device(pending)
        if a["input_ids"].shape[1] < tokens.shape[1]:
            raise ValueError("pending inputs need input rows at least as wide as the sampled token rows")
        a["input_ids"][:, : tokens.shape[1]].index_copy_(0, dst, tokens)  # the rest stays ABSENT_ID
        audio = (kinds == int(OutKind.AUDIO)).to(a["num_codes"].dtype) * tokens.shape[1]
        a["num_codes"].index_add_(0, dst, audio)
        window = a["history"].shape[1]
        if window:
            cols = self._to_device([min(len(rows[i].history), window - 1) for i in pending])
            a["history"].index_put_((dst, cols), tokens[:, 0])

    # ---- LM ------------------------------------------------------------------------------
    def _run_lm(self, handle: StepHandle, stage: str, rows: list[LmRow],
                carry: tuple[list[int], torch.Tensor, torch.Tensor] | None) -> None:
        prog, lim = self.program, self.program.limits
        num_tokens = sum(r.num_tokens for r in rows)
        captured = False
        if stage == "prefill":
            if len(rows) > lim.max_prefill_seqs or num_tokens > lim.max_prefill_tokens:
                raise ValueError(f"prefill of {len(rows)} seqs / {num_tokens} tokens exceeds the arena")
            if any(r.pending_input for r in rows):
                raise ValueError("prefill rows have no pending inputs")
            token_bucket = pick_bucket(num_tokens, self.prefill_buckets)
            captured = self.graphs is not None and self.graphs.has("prefill", token_bucket)
            seq_bucket = lim.max_prefill_seqs if captured else len(rows)
        else:
            if any(r.num_tokens != 1 for r in rows):
                raise ValueError("decode rows carry exactly one token")
            token_bucket = seq_bucket = pick_bucket(len(rows), self.decode_buckets)
        arena_in, arena_out = prog.arenas[f"{stage}_in"], prog.arenas[f"{stage}_out"]
        self._fill_lm(self._host_arena(f"{stage}_in"), rows, token_bucket, seq_bucket)
        arena_in.upload()
        if carry is not None:
            self._patch_pending(rows, carry)
        plan = AttentionPlan(len(rows), [r.num_tokens for r in rows], [r.kv_len for r in rows],
                             [r.pages for r in rows], seq_bucket,
                             graph_tokens=token_bucket if captured else None)
        prog.attention.plan(plan, attention_buffers(arena_in))
        self._mark_uploaded(f"{stage}_in")  # after the plan: planners copy from the host arena too
        if stage == "prefill":
            self._launch("prefill", token_bucket, seq_bucket)
        else:
            self._launch("decode", token_bucket)
        n = len(rows)
        dev, host = arena_out.snapshot()  # one copy out per launch; the next step may overwrite the arena
        outs = ("tokens", "codes", "out_kind")
        handle.lm[stage] = _Samples(rows, {k: dev[k][:n] for k in outs}, {k: host[k][:n] for k in outs})
    def _fill_lm(self, h: dict[str, torch.Tensor], rows: list[LmRow], token_bucket: int, seq_bucket: int) -> None:
        """Write rows into the host arena; pad tokens to token_bucket and sequences to seq_bucket.

        Everything goes through numpy views of the (pinned) host arena: one array per field, no
        per-row tensor construction, so a 256-row decode step costs well under a millisecond.
        """
        page_size = self.program.limits.page_size
        n_seq = len(rows)
        qo = np.fromiter((r.num_tokens for r in rows), dtype=np.int64, count=n_seq)
        indptr = np.zeros(seq_bucket + 1, dtype=np.int64)
        np.cumsum(qo, out=indptr[1 : n_seq + 1])
        n_tok = int(indptr[n_seq])
        indptr[n_seq + 1 :] = n_tok
        positions = np.zeros(token_bucket, dtype=np.int64)  # padded tokens: position 0, slot 0 (null page)
        slots = np.zeros(token_bucket, dtype=np.int64)
        ids = h["input_ids"].numpy()
        ids[:token_bucket] = 0
        table = h["page_table"].numpy()
        table[:seq_bucket] = 0
        for i, r in enumerate(rows):
            lo = int(indptr[i])
            table[i, : len(r.pages)] = r.pages
            if r.num_tokens == 1:  # decode rows: scalar arithmetic beats building tiny arrays
                pos = r.start_pos
                ids[lo] = r.input_ids[0]
                positions[lo] = pos
                slots[lo] = r.pages[pos // page_size] * page_size + pos % page_size
                continue
            hi = lo + r.num_tokens
            ids[lo:hi] = r.input_ids
            pos = np.arange(r.start_pos, r.kv_len)
            positions[lo:hi] = pos
            slots[lo:hi] = np.asarray(r.pages, dtype=np.int64)[pos // page_size] * page_size + pos % page_size
        h["positions"].numpy()[:token_bucket] = positions
        h["slot_mapping"].numpy()[:token_bucket] = slots
        h["qo_indptr"].numpy()[: seq_bucket + 1] = indptr
        kv = h["kv_lens"].numpy()
        kv[:seq_bucket] = 1  # padded sequences: one null-page entry
        kv[:n_seq] = [r.kv_len for r in rows]
        logits_index = h["logits_index"].numpy()
        logits_index[:seq_bucket] = 0
        logits_index[:n_seq] = indptr[1 : n_seq + 1] - 1
        paged_kv_csr(table[:seq_bucket], kv[:seq_bucket], page_size, h["kv_indptr"].numpy(),
                     h["kv_indices"].numpy(), h["kv_last_page_len"].numpy())
        if "embeds" in h:
            self._fill_embeds(h, rows, indptr)
        elif any(r.embeds for r in rows):
            raise ValueError("rows carry prompt embeddings, which this arena has no room for")
        self._fill_sampling(h, rows, seq_bucket - n_seq)

    @staticmethod
    def _fill_embeds(h: dict[str, torch.Tensor], rows: list[LmRow], indptr: np.ndarray) -> None:
        """The launch's prompt vectors; unused entries add zeros to token 0."""
        items = [(int(indptr[i]) + offset, vec) for i, r in enumerate(rows) for offset, vec in r.embeds]
        index, vectors = h["embed_rows"].numpy(), h["embeds"].numpy()
        if len(items) > len(index):
            raise ValueError(f"{len(items)} prompt embeddings in one launch; the arena holds {len(index)}")
        index[:] = 0
        vectors[:] = 0.0
        if items:
            index[: len(items)] = [token for token, _ in items]
            vectors[: len(items)] = [vec for _, vec in items]

    @staticmethod
    def _fill_sampling(h: dict[str, torch.Tensor], rows: list[LmRow], pad: int) -> None:
        n_seq = len(rows)
        n = n_seq + pad
        fields = {  # name: (value of a row, value of a padded row)
            "temperature": (lambda r: r.temperature, 0.0),
            "top_k": (lambda r: r.top_k, 0),
            "top_p": (lambda r: r.top_p, 1.0),
            "min_p": (lambda r: r.min_p, 0.0),
            "repetition_penalty": (lambda r: r.repetition_penalty, 1.0),
            "seed": (lambda r: r.seed, 0),
            "gen_index": (lambda r: r.gen_index, 0),
            "num_codes": (lambda r: r.num_codes, 0),
            "allow_stop": (lambda r: r.allow_stop, False),
        }
        for name, (get, pad_value) in fields.items():
            view = h[name].numpy()
            view[n_seq:n] = pad_value
            view[:n_seq] = [get(r) for r in rows]
        hist = h["history"].numpy()
        window = hist.shape[1]
        hist[n_seq:n] = -1
        if window and n_seq:
            # A pending row leaves the last column free for the token the device fills in.
            keeps = [window - 1 if r.pending_input else window for r in rows]
            tails = [r.history[len(r.history) - k:] if k > 0 else [] for r, k in zip(rows, keeps, strict=True)]
            hist[:n_seq] = [t + [-1] * (window - len(t)) for t in tails]

    # ---- codec ---------------------------------------------------------------------------
    def _run_codec(self, handle: StepHandle, rows: list[CodecRow]) -> None:
        """One codec launch, or two when smaller first chunks (their own arenas) are in the step."""
        lim = self.program.limits
        if len(rows) > lim.max_codec_batch:
            raise ValueError(f"{len(rows)} codec rows exceed --max-codec-batch {lim.max_codec_batch}")
        first = [r for r in rows if r.chunk_index == 0] if lim.has_first_chunks else []
        rest = [r for r in rows if r.chunk_index != 0] if first else rows
        for stage, group in (("codec_first", first), ("codec", rest)):
            if group:
                self._run_codec_launch(handle, stage, group)

    def _run_codec_launch(self, handle: StepHandle, stage: str, rows: list[CodecRow]) -> None:
        prog = self.program
        h = self._host_arena(f"{stage}_in")
        n = len(rows)
        bucket = pick_bucket(n, self.codec_buckets)
        window = h["codes"].shape[1]
        codes = h["codes"].numpy()
        codes[n:bucket] = 0
        # A short final chunk fills its window by repeating its last frame.
        codes[:n] = [(r.frames + [r.frames[-1]] * (window - len(r.frames)))[:window] for r in rows]
        for name, get, pad in (("first_frame", lambda r: r.first_frame, 0), ("seed", lambda r: r.seed, 0),
                               ("slot", lambda r: r.slot, NO_SLOT)):
            view = h[name].numpy()
            view[:n] = [get(r) for r in rows]
            view[n:bucket] = pad
        prog.arenas[f"{stage}_in"].upload()
        self._mark_uploaded(f"{stage}_in")
        self._launch(stage, bucket)
        handle.codec.append((rows, prog.arenas[f"{stage}_out"].snapshot()[1]["pcm"][:n]))


def startup_report(program: Program, worker: ProgramWorker) -> str:
    """Where the memory went and how many tokens fit: printed once at start-up."""
    att, lim = program.attention, program.limits
    graphs = worker.graphs
    mib = 2**20
    return (
        f"model {program.meta.name} on {program.device} ({str(program.dtype).removeprefix('torch.')}): "
        f"weights {program.weights_bytes() / mib:.0f} MiB, KV cache {att.memory_bytes() / mib:.0f} MiB "
        f"({lim.num_pages - 1} pages of {lim.page_size} tokens = {(lim.num_pages - 1) * lim.page_size} "
        f"concurrent tokens), attention {att.name}, "
        + (f"{len(graphs.graphs)} CUDA graphs {graphs.memory_bytes / mib:.0f} MiB" if graphs else "eager stages")
    )
