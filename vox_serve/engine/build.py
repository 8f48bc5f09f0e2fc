"""build_engine: build a program for one device, size its KV cache last, capture its stages, publish its spec.

Order (docs/engine-contract.md): weights; request state, step arenas and the program's pools; an
eager warm-up of every stage at its largest bucket against a placeholder KV cache of one page,
which measures the activation peak (and compiles JIT kernels); then the KV cache, sized from the
memory actually left within `--gpu-memory-utilization`; then the CUDA graphs, captured largest
first into one pool. The engine (program, graphs, buffers) stays alive under its `engine_id`;
`engine/registry.py` resolves the spec's handles back to it.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from dataclasses import dataclass, field
from typing import Any

import torch

from vox_serve.config import ConfigError, VoxConfig
from vox_serve.core.meta import EngineLimits
from vox_serve.core.stages import EngineHalf
from vox_serve.engine.capture import StageGraphs, bucket_sizes, capture_all, warm_up
from vox_serve.layers.fp8 import PROJECTIONS, decoder_layers, quantize_decoder_layers
from vox_serve.models.registry import BuildArgs
from vox_serve.models.registry import build_program as build_model_program
from vox_serve.rt import fp8_gemm
from vox_serve.rt.attention import make_attention_backend
from vox_serve.rt.attention.kv_write import kv_cache_dtype
from vox_serve.rt.checkpoint import pick_device, pick_dtype
from vox_serve.rt.device import device_scope
from vox_serve.rt.program import Program, Stage

log = logging.getLogger(__name__)
CPU_KV_BUDGET_BYTES = 2 << 30
GPU_MARGIN_BYTES = 512 << 20  # the allocator's fragmentation and the CUDA context's growth
PLACEHOLDER_PAGES = 2  # the null page and one page: enough for the warm-up's padded rows


@dataclass
class Engine:
    """One built engine: its program, its captured graphs and what went where in memory."""

    engine_id: int
    program: Program
    config: VoxConfig
    buckets: dict[Stage, list[int]]
    graphs: StageGraphs | None = None
    memory: dict[str, int] = field(default_factory=dict)

    @property
    def limits(self) -> EngineLimits:
        return self.program.limits


def load_program(config: VoxConfig) -> Program:
    """The model's program with its weights (no KV cache or state yet)."""
    device = pick_device(config.model.device)
    dtype = pick_dtype(config.model.dtype, device)
    codec_dtype = dtype if config.model.codec_dtype == "auto" else pick_dtype(config.model.codec_dtype, device)
    args = BuildArgs(config.model.model, config.model.load_format, device, dtype, config.model.seed,
                     config.cache.max_model_len, config.model.codec_path, codec_dtype)
    program = build_model_program(args)
    if config.model.quantization != "none":
        quantize(program, config.model.quantization)
    return program


def quantize(program: Program, method: str) -> None:
    """`--quantization fp8`: the program's decoder layers with float8 weights (layers/fp8), their bfloat16 weights
    returned to the device before the KV cache is sized; ConfigError where the device or the model cannot."""
    layers = decoder_layers(program.quantizable_modules())
    if not layers:
        raise ConfigError(f"--quantization {method}: {program.meta.name} has no decoder layers it serves in float8 "
                          "(orpheus, qwen3-tts and csm have)")
    shapes = [tuple(getattr(layer, name).weight.shape) for layer in layers for name in PROJECTIONS]
    reason = fp8_gemm.unsupported(program.device, program.dtype, shapes)
    if reason is not None:
        raise ConfigError(reason)
    quantize_decoder_layers(layers)
    if program.device.type == "cuda":
        torch.cuda.empty_cache()


def engine_limits(program: Program, config: VoxConfig, num_pages: int) -> EngineLimits:
    sched = config.scheduler
    frames_per_chunk = sched.detokenize_interval or program.meta.frames_per_chunk
    if (sched.first_chunk_frames or 0) > frames_per_chunk:
        raise ConfigError(f"--first-chunk-frames {sched.first_chunk_frames} exceeds the {frames_per_chunk} frames "
                          f"of {program.meta.name}'s audio chunks (--detokenize-interval)")
    return EngineLimits(
        max_batch=sched.max_batch_size, max_prefill_tokens=sched.max_prefill_tokens,
        max_prefill_seqs=min(sched.max_prefill_seqs, sched.max_batch_size), max_codec_batch=sched.max_codec_batch,
        frames_per_chunk=frames_per_chunk, first_chunk_frames=sched.first_chunk_frames or 0, num_pages=num_pages,
        page_size=config.cache.page_size, max_model_len=program.meta.max_model_len,
        repetition_window=int(program.meta.default_sampling.get("repetition_window", 64)),
        kv_streams=program.meta.layout.kv_streams,
    )


def _kv_dtype(program: Program, config: VoxConfig) -> torch.dtype:
    return kv_cache_dtype(config.cache.kv_cache_dtype, program.dtype)


def _bytes_per_page(program: Program, config: VoxConfig) -> int:
    layers, _, kv_heads, head_dim = program.kv_geometry()
    element = torch.empty((), dtype=_kv_dtype(program, config)).element_size()
    return layers * 2 * config.cache.page_size * kv_heads * head_dim * element


def _attention(program: Program, config: VoxConfig, num_pages: int) -> None:
    layers, q_heads, kv_heads, head_dim = program.kv_geometry()
    program.attention = make_attention_backend(
        config.engine.attention_backend, num_layers=layers, num_pages=num_pages, page_size=config.cache.page_size,
        num_q_heads=q_heads, num_kv_heads=kv_heads, head_dim=head_dim, dtype=program.dtype, device=program.device,
        kv_dtype=_kv_dtype(program, config),
    )


def size_kv_cache(program: Program, config: VoxConfig, activation_peak: int) -> int:
    """Pages (the null page included) for what is left after weights, state, arenas and the activation
    peak: `--max-num-pages` when given, else at most max_batch sequences of max_model_len."""
    page_size = config.cache.page_size
    per_seq = program.meta.layout.kv_streams * -(-program.meta.max_model_len // page_size)  # a request's pages
    if config.cache.max_num_pages is not None:
        return config.cache.max_num_pages + 1
    wanted = config.scheduler.max_batch_size * per_seq + 1
    if program.device.type == "cuda":
        free, total = torch.cuda.mem_get_info(program.device)
        used = total - free
        budget = int(total * config.cache.gpu_memory_utilization) - used - activation_peak - GPU_MARGIN_BYTES
    else:
        budget = CPU_KV_BUDGET_BYTES
    affordable = max(budget // _bytes_per_page(program, config), 0)
    if affordable < per_seq + 1:
        raise RuntimeError(f"not enough memory for one sequence of {program.meta.max_model_len} tokens in the KV "
                           f"cache ({affordable} pages affordable); lower --max-model-len or raise memory")
    return int(min(wanted, affordable))


def prepare_engine(program: Program, config: VoxConfig, engine_id: int) -> Engine:
    """Give a freshly loaded program its state, KV cache and (on a GPU) its CUDA graphs. A disaggregated
    engine's codec half keeps the placeholder KV cache: it runs no LM stage."""
    on_cuda = program.device.type == "cuda"
    _attention(program, config, PLACEHOLDER_PAGES)
    program.setup(engine_limits(program, config, PLACEHOLDER_PAGES))
    buckets = {s: b for s, b in stage_buckets(program).items() if program.half.runs(s)}
    peak = warm_up(program, buckets) if on_cuda else 0
    if program.half.has_lm:
        num_pages = size_kv_cache(program, config, peak)
        _attention(program, config, num_pages)
        program.limits = dataclasses.replace(program.limits, num_pages=num_pages)
    engine = Engine(engine_id, program, config, buckets)
    if on_cuda and not config.engine.disable_cuda_graph:
        engine.graphs = capture_all(program, _captured(program, buckets))
    arenas = [*program.arenas.values(), *([program.handover] if program.handover is not None else [])]
    engine.memory = {"weights_bytes": program.weights_bytes(), "state_bytes": program.state_bytes(),
                     "arena_bytes": sum(a.nbytes for a in arenas),
                     "kv_bytes": program.attention.memory_bytes(), "activation_peak_bytes": peak,
                     "graph_bytes": engine.graphs.memory_bytes if engine.graphs else 0}
    return engine


def stage_buckets(program: Program) -> dict[Stage, list[int]]:
    lim = program.limits
    buckets = {Stage.PROLOGUE: [1],
               Stage.PREFILL: bucket_sizes(lim.max_prefill_tokens, min(16, lim.max_prefill_tokens)),
               Stage.DECODE: bucket_sizes(lim.max_batch), Stage.CODEC: bucket_sizes(lim.max_codec_batch)}
    if lim.has_first_chunks:
        buckets[Stage.CODEC_FIRST] = bucket_sizes(lim.max_codec_batch)
    if program.meta.layout.codec_prefix_frames:
        buckets[Stage.CODEC_PRIME] = bucket_sizes(lim.max_admits)
    return buckets


def _captured(program: Program, buckets: dict[Stage, list[int]]) -> dict[Stage, list[int]]:
    """The stages captured as graphs: all, but prefill only where the attention backend plans it
    graph-statically (a fixed sequence count)."""
    return {s: b for s, b in buckets.items() if s is not Stage.PREFILL or program.attention.prefill_graphs}


def startup_report(engine: Engine) -> str:
    """Where the memory went and how many tokens fit: printed once at start-up."""
    p, lim, m = engine.program, engine.limits, engine.memory
    mib = 2**20
    graphs, streams = engine.graphs, lim.kv_streams
    stages = f"{len(graphs.graphs)} CUDA graphs {graphs.memory_bytes / mib:.0f} MiB" if graphs else "eager stages"
    half = "" if p.half is EngineHalf.WHOLE else f" ({p.half} half)"
    if not p.half.has_lm:  # a codec half: no KV cache, weights counted by the LM half (they are shared)
        where = f"{p.device}" if p.partition is None else p.partition.describe()
        return (f"model {p.meta.name}{half} on {where}: request state {m['state_bytes'] / mib:.0f} MiB, arenas "
                f"{m['arena_bytes'] / mib:.1f} MiB, activation peak {m['activation_peak_bytes'] / mib:.0f} MiB, "
                f"{stages}")
    kv = "" if p.attention.kv_dtype == p.dtype else f" in {str(p.attention.kv_dtype).removeprefix('torch.')}"
    return (
        f"model {p.meta.name}{half} on {p.device} ({str(p.dtype).removeprefix('torch.')}): weights "
        f"{m['weights_bytes'] / mib:.0f} MiB, request state {m['state_bytes'] / mib:.0f} MiB ({lim.slots} slots), "
        f"arenas {m['arena_bytes'] / mib:.1f} MiB,"
        f" activation peak {m['activation_peak_bytes'] / mib:.0f} MiB, KV cache {m['kv_bytes'] / mib:.0f} MiB{kv} "
        f"({lim.num_pages - 1} pages of {lim.page_size} tokens = {(lim.num_pages - 1) * lim.page_size // streams} "
        f"concurrent tokens{f' of {streams} KV streams each' if streams > 1 else ''}), attention {p.attention.name}, "
        + stages
    )


def build_engine(config: VoxConfig) -> dict[str, Any]:
    """Build, size and capture the engine for `config`; returns its JSON-serialisable spec. The engine
    stays alive (registry) for as long as the process, so the spec's addresses and handles stay valid."""
    return engine_of_program(load_program(config), config)


def engine_of_program(program: Program, config: VoxConfig, report: bool = True) -> dict[str, Any]:
    """`build_engine` for a program already loaded (tests load theirs from a reference checkpoint). With
    `--enable-disaggregation` or `--codec-gpu`, the spec of a disaggregated engine (`engine/disagg.py`)."""
    from vox_serve.engine.registry import register
    from vox_serve.engine.spec import engine_spec

    if config.engine.splits and program.half is EngineHalf.WHOLE:
        from vox_serve.engine.disagg import disaggregated_spec

        return disaggregated_spec(program, config)

    with device_scope(program.device):
        engine = register(lambda engine_id: prepare_engine(program, config, engine_id))
    if report:
        print(startup_report(engine), file=sys.stderr)
    return engine_spec(engine)
