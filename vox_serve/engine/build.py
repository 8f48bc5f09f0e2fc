"""build_engine: build a program for one device, size its KV cache, and publish its engine spec."""

from __future__ import annotations

import itertools
from dataclasses import asdict
from typing import Any

import torch

from vox_serve.config import ConfigError, VoxConfig
from vox_serve.core.meta import EngineLimits
from vox_serve.models.checkpoint import pick_device, pick_dtype
from vox_serve.models.registry import BuildArgs
from vox_serve.models.registry import build_program as build_model_program
from vox_serve.rt.attention import make_attention_backend
from vox_serve.rt.program import Program

SPEC_VERSION = 1
CPU_KV_BUDGET_BYTES = 2 << 30
GPU_RESERVE_BYTES = 2 << 30  # activations, graphs and the codec's workspace

_ENGINES: dict[int, Program] = {}
_ids = itertools.count()


def bucket_sizes(maximum: int, smallest: int = 1) -> list[int]:
    """Powers of two from `smallest` up to `maximum`, plus `maximum` itself."""
    sizes, n = [], smallest
    while n < maximum:
        sizes.append(n)
        n *= 2
    return sizes + [maximum]


def pick_bucket(n: int, buckets: list[int]) -> int:
    """The smallest bucket holding n rows (buckets ascending)."""
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"{n} rows exceed the largest bucket {buckets[-1]}")


def _num_pages(config: VoxConfig, program: Program, max_model_len: int, bytes_per_page: int) -> int:
    if config.cache.max_num_pages is not None:
        return config.cache.max_num_pages + 1  # + the reserved null page
    per_seq = -(-max_model_len // config.cache.page_size)
    wanted = config.scheduler.max_batch_size * per_seq + 1
    if program.device.type == "cuda":
        free, total = torch.cuda.mem_get_info(program.device)
        budget = int(total * config.cache.gpu_memory_utilization) - (total - free) - GPU_RESERVE_BYTES
    else:
        budget = CPU_KV_BUDGET_BYTES
    affordable = max(budget // bytes_per_page, 0)
    if affordable < per_seq + 1:
        raise RuntimeError(f"not enough memory for one sequence of {max_model_len} tokens in the KV cache "
                           f"({affordable} pages affordable); lower --max-model-len or raise memory")
    return int(min(wanted, affordable))


def build_program(config: VoxConfig) -> Program:
    """Build, size and allocate the program for `config` (weights, KV cache, arenas)."""
    device = pick_device(config.model.device)
    dtype = pick_dtype(config.model.dtype, device)
    args = BuildArgs(config.model.model, config.model.load_format, device, dtype, config.model.seed,
                     config.cache.max_model_len, config.model.codec_path)
    return prepare_program(build_model_program(args), config)


def prepare_program(program: Program, config: VoxConfig) -> Program:
    """Give a freshly built program its KV cache (attention backend) and its arenas."""
    layers, q_heads, kv_heads, head_dim = program.kv_geometry()
    page_size, dtype, device = config.cache.page_size, program.dtype, program.device
    bytes_per_page = layers * 2 * page_size * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
    max_len = program.meta.max_model_len
    num_pages = _num_pages(config, program, max_len, bytes_per_page)
    program.attention = make_attention_backend(
        config.engine.attention_backend, num_layers=layers, num_pages=num_pages, page_size=page_size,
        num_q_heads=q_heads, num_kv_heads=kv_heads, head_dim=head_dim, dtype=dtype, device=device,
    )
    sched = config.scheduler
    frames_per_chunk = sched.detokenize_interval or program.meta.frames_per_chunk
    if (sched.first_chunk_frames or 0) > frames_per_chunk:
        raise ConfigError(f"--first-chunk-frames {sched.first_chunk_frames} exceeds the {frames_per_chunk} frames "
                         f"of {program.meta.name}'s audio chunks (--detokenize-interval)")
    limits = EngineLimits(
        max_batch=sched.max_batch_size, max_prefill_tokens=sched.max_prefill_tokens,
        max_prefill_seqs=min(sched.max_prefill_seqs, sched.max_batch_size),
        max_codec_batch=sched.max_codec_batch,
        frames_per_chunk=frames_per_chunk, first_chunk_frames=sched.first_chunk_frames or 0,
        num_pages=num_pages, page_size=page_size, max_model_len=max_len,
        repetition_window=int(program.meta.default_sampling.get("repetition_window", 64)),
    )
    program.setup_arenas(limits)
    return program


def engine_spec(program: Program, engine_id: int | None = None) -> dict[str, Any]:
    """The JSON-serialisable engine spec of a built program."""
    lim = program.limits
    att = program.attention
    return {
        "version": SPEC_VERSION,
        "engine_id": engine_id,
        "device": str(program.device),
        "dtype": str(program.dtype).removeprefix("torch."),
        "meta": program.meta.to_dict(),
        "limits": asdict(lim),
        "attention": {
            "backend": att.name, "num_layers": att.num_layers, "num_q_heads": att.num_q_heads,
            "num_kv_heads": att.num_kv_heads, "head_dim": att.head_dim, "page_size": att.page_size,
            "num_pages": att.num_pages, "num_reserved_pages": 1, "layout": "NHD",
            "kv_cache_ptrs": [c.data_ptr() for c in att.kv_caches],
            "kv_cache_bytes": att.memory_bytes(),
        },
        "arenas": {name: arena.layout() for name, arena in program.arenas.items()},
        "stages": {
            "prefill": {"buckets": bucket_sizes(lim.max_prefill_tokens, 16), "max_seqs": lim.max_prefill_seqs,
                        "inputs": "prefill_in", "outputs": "prefill_out", "graphs": {}},
            "decode": {"buckets": bucket_sizes(lim.max_batch), "inputs": "decode_in",
                       "outputs": "decode_out", "graphs": {}},
            "codec": {"buckets": bucket_sizes(lim.max_codec_batch), "inputs": "codec_in",
                      "outputs": "codec_out", "graphs": {}},
            **({"codec_first": {"buckets": bucket_sizes(lim.max_codec_batch), "inputs": "codec_first_in",
                                "outputs": "codec_first_out", "frames": lim.first_frames, "graphs": {}}}
               if lim.has_first_chunks else {}),
        },
        "memory": {"weights_bytes": program.weights_bytes(), "kv_bytes": att.memory_bytes()},
    }


def build_engine(config: VoxConfig) -> dict[str, Any]:
    """Build a program and return its engine spec; the program stays alive under `engine_id`."""
    program = build_program(config)
    engine_id = next(_ids)
    _ENGINES[engine_id] = program
    return engine_spec(program, engine_id)


def get_program(engine_id: int) -> Program:
    return _ENGINES[engine_id]
