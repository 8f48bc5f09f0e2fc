"""The worker: step plans in, step results out. Fills the program's arenas and runs its stages.

Per launch: fill the host arena, one host->device copy, the stage, one device->host copy of the
outputs. Rows are padded to the stage's bucket; padded rows write only into the null KV page.
"""

from __future__ import annotations

import time

import torch

from vox_serve.rt.attention import AttentionPlan
from vox_serve.rt.engine import bucket_sizes, pick_bucket
from vox_serve.rt.graphs import StageGraphs
from vox_serve.rt.program import Program, attention_buffers
from vox_serve.scheduler.plan import CodecOut, CodecRow, LmOut, LmRow, StepPlan, StepResult

NULL_SLOT = 0  # token slot 0 lies in the reserved null page


class ProgramWorker:
    def __init__(self, program: Program, use_cuda_graphs: bool = False) -> None:
        self.program = program
        lim = program.limits
        self.decode_buckets = bucket_sizes(lim.max_batch)
        self.prefill_buckets = bucket_sizes(lim.max_prefill_tokens, min(16, lim.max_prefill_tokens))
        self.codec_buckets = bucket_sizes(lim.max_codec_batch)
        self.graphs: StageGraphs | None = None
        if use_cuda_graphs and program.device.type == "cuda":
            self.graphs = StageGraphs(program)
            with torch.inference_mode():
                self.graphs.capture({"decode": self.decode_buckets, "codec": self.codec_buckets},
                                    self._prepare_capture)

    def _prepare_capture(self, stage: str, bucket: int) -> None:
        """Dummy inputs for capturing `stage` at `bucket` rows: every row padded (null page)."""
        prog = self.program
        arena = prog.arenas[f"{stage}_in"]
        if stage == "decode":
            self._fill_lm(arena.host, [], bucket, bucket)
            arena.upload()
            prog.attention.plan(AttentionPlan(bucket, [1] * bucket, [1] * bucket, [[0]] * bucket, bucket),
                                attention_buffers(arena))
        else:
            arena.host["codes"].zero_()
            arena.upload()

    def _launch(self, stage: str, bucket: int, *args: int) -> None:
        """Replay the captured graph of (stage, bucket), or run the stage eagerly."""
        if self.graphs is not None and self.graphs.has(stage, bucket):
            self.graphs.replay(stage, bucket)
        else:
            getattr(self.program, stage)(bucket, *args)

    def execute(self, plan: StepPlan) -> StepResult:
        """Run one step: codec chunks first (their audio is due soonest), then prefill, then decode."""
        result = StepResult(plan.step_id)
        with torch.inference_mode():
            if plan.codec:
                result.codec = self._timed(result, "codec", self._run_codec, plan.codec)
            if plan.prefill:
                result.prefill = self._timed(result, "prefill", self._run_lm, "prefill", plan.prefill)
            if plan.decode:
                result.decode = self._timed(result, "decode", self._run_lm, "decode", plan.decode)
        return result

    @staticmethod
    def _timed(result: StepResult, name: str, fn, *args):  # noqa: ANN001, ANN205
        start = time.perf_counter()
        out = fn(*args)
        result.stage_seconds[name] = time.perf_counter() - start
        return out

    # ---- LM ------------------------------------------------------------------------------
    def _run_lm(self, stage: str, rows: list[LmRow]) -> list[LmOut]:
        prog, lim = self.program, self.program.limits
        num_tokens = sum(r.num_tokens for r in rows)
        if stage == "prefill":
            if len(rows) > lim.max_prefill_seqs or num_tokens > lim.max_prefill_tokens:
                raise ValueError(f"prefill of {len(rows)} seqs / {num_tokens} tokens exceeds the arena")
            token_bucket, seq_bucket = pick_bucket(num_tokens, self.prefill_buckets), len(rows)
        else:
            if any(r.num_tokens != 1 for r in rows):
                raise ValueError("decode rows carry exactly one token")
            token_bucket = seq_bucket = pick_bucket(len(rows), self.decode_buckets)
        arena_in, arena_out = prog.arenas[f"{stage}_in"], prog.arenas[f"{stage}_out"]
        self._fill_lm(arena_in.host, rows, token_bucket, seq_bucket)
        arena_in.upload()
        plan = AttentionPlan(len(rows), [r.num_tokens for r in rows], [r.kv_len for r in rows],
                             [r.pages for r in rows], token_bucket if stage == "decode" else None)
        prog.attention.plan(plan, attention_buffers(arena_in))
        if stage == "prefill":
            self._launch("prefill", token_bucket, seq_bucket)
        else:
            self._launch("decode", token_bucket)
        arena_out.download()
        n = len(rows)
        tokens = arena_out.host["tokens"][:n].tolist()
        codes = arena_out.host["codes"][:n].tolist()
        kinds = arena_out.host["out_kind"][:n].tolist()
        return [LmOut(r.req_id, tokens[i], codes[i], kinds[i]) for i, r in enumerate(rows) if r.sample]

    def _fill_lm(self, h: dict[str, torch.Tensor], rows: list[LmRow], token_bucket: int, seq_bucket: int) -> None:
        """Write rows into the host arena; pad tokens to token_bucket and sequences to seq_bucket."""
        page_size = self.program.limits.page_size
        ids, positions, slots, indptr, page_table = [], [], [], [0], h["page_table"]
        page_table[:seq_bucket].zero_()
        for i, r in enumerate(rows):
            ids.extend(r.input_ids)
            for pos in range(r.start_pos, r.kv_len):
                positions.append(pos)
                slots.append(r.pages[pos // page_size] * page_size + pos % page_size)
            indptr.append(len(positions))
            page_table[i, : len(r.pages)] = torch.tensor(r.pages, dtype=torch.int32)
        n_tok, n_seq = len(positions), len(rows)
        pad_tok, pad_seq = token_bucket - n_tok, seq_bucket - n_seq
        cols = h["input_ids"].shape[1]
        h["input_ids"][:token_bucket] = torch.tensor(ids + [[0] * cols] * pad_tok, dtype=torch.int64)
        h["positions"][:token_bucket] = torch.tensor(positions + [0] * pad_tok)
        h["slot_mapping"][:token_bucket] = torch.tensor(slots + [NULL_SLOT] * pad_tok)
        h["qo_indptr"][: seq_bucket + 1] = torch.tensor(indptr + [n_tok] * pad_seq, dtype=torch.int32)
        h["kv_lens"][:seq_bucket] = torch.tensor([r.kv_len for r in rows] + [1] * pad_seq, dtype=torch.int32)
        h["logits_index"][:seq_bucket] = torch.tensor(indptr[1:] + [1] * pad_seq) - 1
        self._fill_sampling(h, rows, pad_seq)

    @staticmethod
    def _fill_sampling(h: dict[str, torch.Tensor], rows: list[LmRow], pad: int) -> None:
        n = len(rows) + pad
        fields = {
            "temperature": [r.temperature for r in rows] + [0.0] * pad,
            "top_k": [r.top_k for r in rows] + [0] * pad,
            "top_p": [r.top_p for r in rows] + [1.0] * pad,
            "min_p": [r.min_p for r in rows] + [0.0] * pad,
            "repetition_penalty": [r.repetition_penalty for r in rows] + [1.0] * pad,
            "seed": [r.seed for r in rows] + [0] * pad,
            "gen_index": [r.gen_index for r in rows] + [0] * pad,
            "num_codes": [r.num_codes for r in rows] + [0] * pad,
            "allow_stop": [r.allow_stop for r in rows] + [False] * pad,
        }
        for name, values in fields.items():
            h[name][:n] = torch.tensor(values, dtype=h[name].dtype)
        window = h["history"].shape[1]
        hist = torch.full((n, window), -1, dtype=torch.int64)
        for i, r in enumerate(rows):
            if r.history and window:
                tail = r.history[-window:]
                hist[i, : len(tail)] = torch.tensor(tail, dtype=torch.int64)
        h["history"][:n] = hist

    # ---- codec ---------------------------------------------------------------------------
    def _run_codec(self, rows: list[CodecRow]) -> list[CodecOut]:
        prog = self.program
        arena_in, arena_out = prog.arenas["codec_in"], prog.arenas["codec_out"]
        h = arena_in.host
        n = len(rows)
        if n > prog.limits.max_codec_batch:
            raise ValueError(f"{n} codec rows exceed --max-codec-batch {prog.limits.max_codec_batch}")
        bucket = pick_bucket(n, self.codec_buckets)
        window, cpf = h["codes"].shape[1], h["codes"].shape[2]
        codes = torch.zeros((bucket, window, cpf), dtype=torch.int64)
        for i, r in enumerate(rows):
            frames = r.frames + [r.frames[-1]] * (window - len(r.frames))
            codes[i] = torch.tensor(frames[:window], dtype=torch.int64)
        h["codes"][:bucket] = codes
        h["first_frame"][:bucket] = torch.tensor([r.first_frame for r in rows] + [0] * (bucket - n))
        h["seed"][:bucket] = torch.tensor([r.seed for r in rows] + [0] * (bucket - n))
        h["slot"][:bucket] = torch.tensor([r.slot for r in rows] + [0] * (bucket - n))
        arena_in.upload()
        self._launch("codec", bucket)
        arena_out.download()
        spf = prog.meta.samples_per_frame
        pcm = arena_out.host["pcm"]
        return [CodecOut(r.req_id, r.chunk_index, pcm[i, : r.num_frames * spf].numpy().tobytes())
                for i, r in enumerate(rows)]


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
