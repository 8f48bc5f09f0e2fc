"""The program abstraction: one model = meta + static arenas + three stages + a prompt builder.

A program owns its weights, its KV cache (through an attention backend) and six arenas:
`prefill_in/out`, `decode_in/out` (the standard LM-step schema below) and `codec_in/out`.
Stages read and write only arena views, with sizes given as Python ints (the bucket), so each
(stage, bucket) pair is capturable as a CUDA graph.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from vox_serve.core.meta import EngineLimits, ProgramMeta
from vox_serve.core.request import EmbeddedPrompt
from vox_serve.rt.arena import Arena, FieldSpec
from vox_serve.rt.attention import AttentionBackend, AttentionBuffers


def lm_input_fields(tokens: int, seqs: int, limits: EngineLimits, columns: int) -> list[FieldSpec]:
    """The standard LM-step input schema (shared by prefill and decode)."""
    i32, i64, f32 = torch.int32, torch.int64, torch.float32
    return [
        FieldSpec("input_ids", (tokens, columns), i64),
        FieldSpec("positions", (tokens,), i64),
        FieldSpec("slot_mapping", (tokens,), i64),
        FieldSpec("qo_indptr", (seqs + 1,), i32),
        FieldSpec("kv_lens", (seqs,), i32),
        FieldSpec("page_table", (seqs, limits.max_pages_per_seq), i32),
        FieldSpec("kv_indptr", (seqs + 1,), i32),  # the page table in CSR form, for host planners
        FieldSpec("kv_indices", (seqs * limits.max_pages_per_seq,), i32),
        FieldSpec("kv_last_page_len", (seqs,), i32),
        FieldSpec("logits_index", (seqs,), i64),
        FieldSpec("temperature", (seqs,), f32),
        FieldSpec("top_k", (seqs,), i64),
        FieldSpec("top_p", (seqs,), f32),
        FieldSpec("min_p", (seqs,), f32),
        FieldSpec("repetition_penalty", (seqs,), f32),
        FieldSpec("seed", (seqs,), i64),
        FieldSpec("gen_index", (seqs,), i64),  # tokens generated so far: the RNG offset
        FieldSpec("num_codes", (seqs,), i64),  # audio codes so far: position inside the frame
        FieldSpec("allow_stop", (seqs,), torch.bool),  # False: ignore_eos / not at a frame boundary yet
        FieldSpec("history", (seqs, limits.repetition_window), i64),
    ]


def prompt_embed_fields(seqs: int, dim: int) -> list[FieldSpec]:
    """Vectors added to prompt positions' input embeddings (a speaker embedding): at most one per sequence
    of a prefill launch. `embed_rows` indexes the launch's flattened tokens; unused entries hold zeros."""
    return [FieldSpec("embed_rows", (seqs,), torch.int64), FieldSpec("embeds", (seqs, dim), torch.float32)]


def lm_output_fields(seqs: int, codes_per_step: int) -> list[FieldSpec]:
    return [
        FieldSpec("tokens", (seqs, codes_per_step), torch.int64),
        FieldSpec("codes", (seqs, codes_per_step), torch.int64),
        FieldSpec("out_kind", (seqs,), torch.int32),
    ]


def codec_fields(batch: int, window: int, meta: ProgramMeta, frames_per_chunk: int) -> tuple[list, list]:
    inputs = [
        FieldSpec("codes", (batch, window, meta.codes_per_frame), torch.int64),
        FieldSpec("first_frame", (batch,), torch.int64),
        FieldSpec("seed", (batch,), torch.int64),
        FieldSpec("slot", (batch,), torch.int64),  # codec slot; -1 (NO_SLOT) on padded rows
    ]
    outputs = [FieldSpec("pcm", (batch, frames_per_chunk * meta.samples_per_frame), torch.int16)]
    return inputs, outputs


def attention_buffers(arena: Arena) -> AttentionBuffers:
    return AttentionBuffers(
        page_table=arena["page_table"], kv_lens=arena["kv_lens"],
        qo_indptr=arena["qo_indptr"], slot_mapping=arena["slot_mapping"], kv_indices=arena["kv_indices"],
        kv_indptr_host=arena.host["kv_indptr"], kv_last_page_len_host=arena.host["kv_last_page_len"],
        qo_indptr_host=arena.host["qo_indptr"],
    )


class Program(ABC):
    """Base class of every model program. Subclasses set `meta` and implement the stages."""

    meta: ProgramMeta
    attention: AttentionBackend
    limits: EngineLimits
    arenas: dict[str, Arena]

    def __init__(self, device: torch.device, dtype: torch.dtype) -> None:
        self.device = torch.device(device)
        self.dtype = dtype

    def setup_arenas(self, limits: EngineLimits) -> None:
        """Allocate every arena at its maximum size (once, before any graph capture)."""
        self.limits = limits
        m, dev = self.meta, self.device
        window = m.codec_window(limits.frames_per_chunk)
        codec_in, codec_out = codec_fields(limits.max_codec_batch, window, m, limits.frames_per_chunk)
        pt, ps = limits.max_prefill_tokens, limits.max_prefill_seqs
        prefill_fields = lm_input_fields(pt, ps, limits, m.input_columns)
        if m.prompt_embed_dim:
            prefill_fields += prompt_embed_fields(ps, m.prompt_embed_dim)
        self.arenas = {
            "prefill_in": Arena("prefill_in", prefill_fields, dev),
            "prefill_out": Arena("prefill_out", lm_output_fields(ps, m.codes_per_step), dev),
            "decode_in": Arena("decode_in", lm_input_fields(limits.max_batch, limits.max_batch, limits,
                                                            m.input_columns), dev),
            "decode_out": Arena("decode_out", lm_output_fields(limits.max_batch, m.codes_per_step), dev),
            "codec_in": Arena("codec_in", codec_in, dev),
            "codec_out": Arena("codec_out", codec_out, dev),
        }
        if limits.has_first_chunks:  # first chunks are shorter: arenas (and graphs) of their own
            first_in, first_out = codec_fields(limits.max_codec_batch, m.codec_window(limits.first_frames), m,
                                               limits.first_frames)
            self.arenas["codec_first_in"] = Arena("codec_first_in", first_in, dev)
            self.arenas["codec_first_out"] = Arena("codec_first_out", first_out, dev)

    def codec_arenas(self, first: bool) -> tuple[Arena, Arena]:
        """(inputs, outputs) of the codec stage: the first-chunk pair or the regular one."""
        prefix = "codec_first" if first else "codec"
        return self.arenas[f"{prefix}_in"], self.arenas[f"{prefix}_out"]

    @abstractmethod
    def kv_geometry(self) -> tuple[int, int, int, int]:
        """(layers, query heads, KV heads, head dim) of the paged KV cache."""

    @abstractmethod
    def preprocess(self, fields: dict[str, Any]) -> list[list[int]] | EmbeddedPrompt:
        """Validated request fields -> prompt ids [prompt_len][input_columns] (with prompt vectors, for
        programs whose meta has a prompt_embed_dim). Raises ValueError."""

    @abstractmethod
    def prefill(self, num_tokens: int, num_seqs: int) -> None:
        """Run the first `num_tokens` rows of prefill_in; sample for the first `num_seqs` sequences."""

    @abstractmethod
    def decode(self, batch: int) -> None:
        """One decode step for the first `batch` rows of decode_in -> decode_out."""

    @abstractmethod
    def codec(self, batch: int, first: bool = False) -> None:
        """Turn the first `batch` windows of codec_in into PCM in codec_out (`first`: of the first-chunk
        arenas, whose windows are shorter; see `codec_arenas`)."""

    def release_codec_slot(self, slot: int) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Forget a stateful codec's state for `slot` (stateless codecs keep none)."""

    def weights_bytes(self) -> int:
        return 0
