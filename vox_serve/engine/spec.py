"""The engine spec: everything a runtime needs to drive an engine with no Python per step (JSON).

docs/engine-contract.md describes each part. In short: the step arenas' addresses and field layouts
(with their sections and padding conventions), the slot tables' addresses, per stage and bucket a
graph-exec handle (or a callable handle where nothing is captured), the attention configuration
with its planners' buffers and the handle that plans in this process, the codec window rules, the
program's meta as data, and where the memory went.

Paired rows (`meta.layout.kv_streams` = K > 1, also `limits.kv_streams` and `attention.kv_streams`):
a slot's page-table row holds K page lists of `max_pages_per_seq` columns each, and every LM launch
attends K sequences per row, stream by stream (attention row `j * R + i` = stream j of row i), so the
CSR offsets the host writes (`decode_kv_indptr`, `prefill_qo_indptr`, ...) have K * R rows, planners
plan K * R sequences, and FlashInfer's planner buffers are keyed by attention rows (decode) and
attention tokens (prefill: K * bucket). docs/engine-contract.md states it in full.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch

from vox_serve.core.plan import ABSENT_ID, NO_SLOT, NULL_PAGE
from vox_serve.core.request import OutKind
from vox_serve.core.stages import Stage
from vox_serve.engine.build import Engine
from vox_serve.engine.registry import callable_handle, planner_handle

SPEC_VERSION = 2
SECTIONS = {  # step_in field-name prefixes of each section, in arena order
    "admit": "admit_", "pages": "page_", "decode": "decode_", "codec": "codec_", "codec_first": "codec_first_",
    "prefill": "prefill_", "codec_prime": "codec_prime_",
}
PADDING = {  # the value of a padded row's field (fields not listed pad with 0)
    "admit_slot": NO_SLOT, "page_slot": NO_SLOT, "decode_slot": NO_SLOT, "codec_slot": NO_SLOT,
    "codec_first_slot": NO_SLOT, "prefill_slot": NO_SLOT, "prefill_tok_slot": NO_SLOT, "prefill_vec_token": -1,
    "codec_window_end": 1, "codec_first_window_end": 1, "prefill_kv_len": 1,
}


def _sections(names: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {name: [] for name in SECTIONS}
    for field in names:
        longest_first = sorted(SECTIONS.items(), key=lambda kv: -len(kv[1]))
        section = next(s for s, prefix in longest_first if field.startswith(prefix))
        out[section].append(field)
    return out


def _stages(engine: Engine) -> dict[str, Any]:
    out = {}
    graphs = engine.graphs
    stream = graphs.stream if graphs is not None else None
    for stage, buckets in engine.buckets.items():
        captured = {b: graphs.exec_handle(stage, b) for b in buckets if graphs is not None and graphs.has(stage, b)}
        entry = {
            "buckets": buckets,
            "graphs": {str(b): {"exec": h, "stream": stream.cuda_stream, "priority": stream.priority,
                                "pool": list(graphs.pool)} for b, h in captured.items()},
            "callables": {str(b): callable_handle(engine.engine_id, stage, b) for b in buckets if b not in captured},
        }
        if stage is Stage.PREFILL:  # a captured prefill always runs max_prefill_seqs sequences (padded ones empty)
            entry["captured_seqs"] = engine.limits.max_prefill_seqs if captured else None
        out[str(stage)] = entry
    return out


def _attention(engine: Engine) -> dict[str, Any]:
    att = engine.program.attention
    planners = att.planner_layout() if hasattr(att, "planner_layout") else {}
    return {
        "backend": att.name, "num_layers": att.num_layers, "num_q_heads": att.num_q_heads,
        "num_kv_heads": att.num_kv_heads, "head_dim": att.head_dim, "page_size": att.page_size,
        "num_pages": att.num_pages, "null_page": NULL_PAGE, "layout": "NHD",
        "dtype": str(att.dtype).removeprefix("torch."), "kv_dtype": str(att.kv_dtype).removeprefix("torch."),
        "kv_cache_ptrs": [c.data_ptr() for c in att.kv_caches], "kv_cache_bytes": att.memory_bytes(),
        "needs_kv_indices": att.needs_kv_indices, "kv_streams": engine.limits.kv_streams,
        "pages_per_stream": engine.limits.max_pages_per_seq,
        "kv_indices_ptrs": {k: v.data_ptr() for k, v in engine.program.kv_indices.items() if v is not None},
        "planner": planner_handle(engine.engine_id), "planners": planners,
        "plan_inputs": {"decode": ["decode_kv_indptr", "decode_last_page_len"],
                        "prefill": ["prefill_qo_indptr", "prefill_kv_indptr", "prefill_last_page_len"]},
    }


def engine_spec(engine: Engine) -> dict[str, Any]:
    """The JSON-serialisable spec of a built engine."""
    program, lim = engine.program, engine.limits
    meta = program.meta
    step_in = program.arenas["step_in"].layout()
    return {
        "version": SPEC_VERSION,
        "engine_id": engine.engine_id,
        "device": str(program.device),
        "dtype": str(program.dtype).removeprefix("torch."),
        "meta": {**meta.to_dict(), "prompt_builder": program.prompt_builder_spec()},
        "limits": {**asdict(lim), "slots": lim.slots, "max_admits": lim.max_admits,
                   "max_page_updates": lim.max_page_updates, "max_pages_per_seq": lim.max_pages_per_seq},
        "conventions": {"NO_SLOT": NO_SLOT, "ABSENT_ID": ABSENT_ID, "NULL_PAGE": NULL_PAGE,
                        "OUT_KIND": {k.name: int(k) for k in OutKind},
                        "padding": {k: v for k, v in PADDING.items() if k in program.arenas["step_in"]},
                        "stage_order": [str(s) for s in Stage], "host_buffers": 2},
        "arenas": {"step_in": step_in, "step_out": program.arenas["step_out"].layout()},
        "sections": _sections([f["name"] for f in step_in["fields"]]),
        "slot_state": program.state.layout(),
        "attention": _attention(engine),
        "stages": _stages(engine),
        "codec_window": {"lookback_frames": meta.codec_lookback_frames, "lookahead_frames": meta.codec_lookahead_frames,
                         "skip_leading_frames": meta.skip_leading_frames, "frames_per_chunk": lim.frames_per_chunk,
                         "first_chunk_frames": lim.first_frames,
                         "edges": "a frame before 0 repeats frame 0; a frame at or past window_end repeats the last"},
        "memory": engine.memory,
        "half": str(program.half),
        "handover": program.handover.layout() if program.handover is not None else None,
        # launch on this stream (a green context's: the graphs were captured on it), not on a new one
        "sm_partition": ({"sms": program.partition.sms, "stream": program.partition.stream.cuda_stream}
                         if program.partition is not None else None),
        "cuda": {"torch_cuda": torch.version.cuda} if program.device.type == "cuda" else {},
    }
