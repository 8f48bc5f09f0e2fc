"""The fields of a step's two arenas: every input of one step in `step_in`, every output in `step_out`.

`step_in` is written on the host and copied to the device once per step, up to the end of the last
section the step uses; sections are ordered small and frequent first (admissions, page-table
updates, decode rows, codec rows) and large and rare last (prefill tokens, codec prefixes). `step_out`
holds what the host needs back -- an out kind per LM row, the PCM of the codec rows -- and is copied
back once, up to the end of the last output the step wrote. docs/engine-contract.md lists every field with its
padding convention.
"""

from __future__ import annotations

import torch

from vox_serve.core.meta import EngineLimits, ProgramMeta
from vox_serve.rt.arena import FieldSpec
from vox_serve.rt.slot_state import SAMPLING_FIELDS, slot_field_dtype

I32, I64, F32 = torch.int32, torch.int64, torch.float32


def admit_fields(meta: ProgramMeta, limits: EngineLimits) -> list[FieldSpec]:
    a = limits.max_admits
    fields = [FieldSpec("admit_slot", (a,), I32)]
    fields += [FieldSpec(f"admit_{name}", (a,), dtype) for name, dtype in SAMPLING_FIELDS.items()]
    for f in meta.layout.slot_fields:
        fields += [FieldSpec(f"admit_{f.name}", (a, *f.shape), slot_field_dtype(f.dtype)),
                   FieldSpec(f"admit_{f.name}_len", (a,), I64)]
    return fields


def page_fields(limits: EngineLimits) -> list[FieldSpec]:
    u = limits.max_page_updates
    return [FieldSpec("page_slot", (u,), I32), FieldSpec("page_index", (u,), I32), FieldSpec("page_id", (u,), I32)]


def decode_fields(meta: ProgramMeta, limits: EngineLimits) -> list[FieldSpec]:
    b = limits.max_batch
    rows = limits.kv_streams * b  # attention rows: each decode row attends each of its KV streams
    return [FieldSpec("decode_slot", (b,), I32), FieldSpec("decode_pos", (b,), I32),
            FieldSpec("decode_ids", (b, meta.input_columns), I32),
            FieldSpec("decode_kv_indptr", (rows + 1,), I32), FieldSpec("decode_last_page_len", (rows,), I32)]


def codec_fields(prefix: str, limits: EngineLimits) -> list[FieldSpec]:
    k = limits.max_codec_batch
    return [FieldSpec(f"{prefix}_slot", (k,), I32), FieldSpec(f"{prefix}_first_frame", (k,), I32),
            FieldSpec(f"{prefix}_window_end", (k,), I32)]


def max_prompt_vectors(meta: ProgramMeta, limits: EngineLimits) -> int:
    if not meta.layout.prompt_vector_dim:
        return 0
    return meta.layout.max_prompt_vectors or limits.max_prefill_tokens


def prefill_fields(meta: ProgramMeta, limits: EngineLimits) -> list[FieldSpec]:
    t, s = limits.max_prefill_tokens, limits.max_prefill_seqs
    rows = limits.kv_streams * s  # attention sequences: each prefill sequence once per KV stream
    fields = [FieldSpec("prefill_slot", (s,), I32), FieldSpec("prefill_kv_len", (s,), I32),
              FieldSpec("prefill_sample", (s,), torch.bool), FieldSpec("prefill_qo_indptr", (rows + 1,), I32),
              FieldSpec("prefill_kv_indptr", (rows + 1,), I32), FieldSpec("prefill_last_page_len", (rows,), I32),
              FieldSpec("prefill_ids", (t, meta.input_columns), I32), FieldSpec("prefill_pos", (t,), I32),
              FieldSpec("prefill_tok_slot", (t,), I32)]
    e = max_prompt_vectors(meta, limits)
    if e:
        width = limits.kv_streams * meta.layout.prompt_vector_dim  # stream j's vector in columns j * dim ..
        fields += [FieldSpec("prefill_vec_token", (e,), I32), FieldSpec("prefill_vec", (e, width), F32)]
    return fields


def codec_prefix_fields(meta: ProgramMeta, limits: EngineLimits) -> list[FieldSpec]:
    """The admissions' codec prefixes (`ProgramLayout.codec_prefix_frames`): large, uploaded only by the steps
    that prime, so they come last."""
    n = meta.layout.codec_prefix_frames
    if not n:
        return []
    a = limits.max_admits
    return [FieldSpec("codec_prime_codes", (a, n, meta.codes_per_frame), I32),
            FieldSpec("codec_prime_len", (a,), I64)]


def step_input_fields(meta: ProgramMeta, limits: EngineLimits) -> list[FieldSpec]:
    fields = admit_fields(meta, limits) + page_fields(limits) + decode_fields(meta, limits)
    fields += codec_fields("codec", limits)
    if limits.has_first_chunks:
        fields += codec_fields("codec_first", limits)
    return fields + prefill_fields(meta, limits) + codec_prefix_fields(meta, limits)


def step_output_fields(meta: ProgramMeta, limits: EngineLimits) -> list[FieldSpec]:
    k, spf = limits.max_codec_batch, meta.samples_per_frame
    fields = [FieldSpec("prefill_kind", (limits.max_prefill_seqs,), I32),
              FieldSpec("decode_kind", (limits.max_batch,), I32),
              FieldSpec("codec_pcm", (k, limits.frames_per_chunk * spf), torch.int16)]
    if limits.has_first_chunks:
        fields.append(FieldSpec("codec_first_pcm", (k, limits.first_frames * spf), torch.int16))
    return fields


def handover_fields(meta: ProgramMeta, limits: EngineLimits) -> list[FieldSpec]:
    """A disaggregated engine's hand-over arena (one on each device, the same layout): per codec stage the
    rows' windows as the LM half gathers them from its slots' codes (and frame latents), so one copy per step
    moves every codec row's LM-made input to the codec device. `<stage>_codes` [max_codec_batch, window,
    codes_per_frame] int32, `<stage>_latents` [max_codec_batch, window, frame_latent_dim] float32."""
    k, cpf, dim = limits.max_codec_batch, meta.codes_per_frame, meta.layout.frame_latent_dim
    stages = [("codec", limits.frames_per_chunk)]
    if limits.has_first_chunks:
        stages.append(("codec_first", limits.first_frames))
    fields = []
    for prefix, frames in stages:
        window = meta.codec_window(frames)
        fields.append(FieldSpec(f"{prefix}_codes", (k, window, cpf), I32))
        if dim:
            fields.append(FieldSpec(f"{prefix}_latents", (k, window, dim), F32))
    return fields
