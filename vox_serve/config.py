"""Frozen configuration, built once from the command line and read by both runtimes.

Nothing mutates a config after start-up; components receive the part they need.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any


class ConfigError(ValueError):
    """A setting that does not fit the model being served (found once the model is known)."""


@dataclass(frozen=True)
class ModelConfig:
    """Which program to build and how to load its weights."""

    model: str = "orpheus"
    load_format: str = "auto"  # auto | safetensors | dummy
    dtype: str = "auto"  # auto | bfloat16 | float16 | float32
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    seed: int = 0  # seed of dummy weights and of requests that bring none
    codec_path: str | None = None  # codec checkpoint directory, when not inside the model's
    codec_dtype: str = "auto"  # auto (the model's --dtype) | bfloat16 | float16 | float32 (Orpheus' SNAC only)
    quantization: str = "none"  # none | fp8: the decoder layers' projections in float8 e4m3 (layers/fp8)


QUANTIZATIONS = ("none", "fp8")  # --quantization: the decoder layers' weights as loaded, or float8 (layers/fp8)
KV_CACHE_DTYPES = ("auto", "fp8")  # --kv-cache-dtype: the model's dtype, or float8 e4m3 (rt/attention/kv_write)


@dataclass(frozen=True)
class CacheConfig:
    """Paged KV cache geometry."""

    page_size: int = 16
    max_num_pages: int | None = None  # None: sized from free memory (GPU) or a CPU default
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None  # None: the program's default
    kv_cache_dtype: str = "auto"  # auto (the model's dtype) | fp8 (float8 e4m3, rt/attention/kv_write)


@dataclass(frozen=True)
class SchedulerConfig:
    """Scheduling policy and batch limits."""

    scheduler_type: str = "base"
    max_batch_size: int = 64
    max_prefill_tokens: int = 2048
    max_prefill_seqs: int = 16
    max_codec_batch: int = 64
    detokenize_interval: int | None = None  # frames per audio chunk; None: the program's default
    max_queued_requests: int = 1024
    async_scheduling: bool = False  # plan step k+1 while the device runs step k
    trace_dir: str | None = None  # JSON-lines traces of stage launches and scheduling decisions
    first_chunk_frames: int | None = None  # frames of the first chunk (sooner first audio); None: the interval
    # `deadline` policy: the first-audio deadline of a new stream, the longest a prefill may be
    # deferred for running streams, and cost estimates (per model and GPU) of one LM decode step,
    # one codec launch and one prefill launch.
    deadline_startup_ms: float = 500.0
    deadline_max_prefill_deferral_ms: float = 500.0
    deadline_lm_step_ms: float = 10.0
    deadline_codec_ms: float = 3.0
    deadline_prefill_ms: float = 20.0


@dataclass(frozen=True)
class BenchConfig:
    """`--bench-requests` mode: requests through the scheduler without HTTP."""

    num_requests: int = 0
    out_dir: str | None = None
    text: str = "Hello there! This is a short test of streaming speech synthesis."
    kwargs_json: str = "{}"  # kept as text so the config stays hashable and frozen
    greedy: bool = False
    audio: str | None = None  # a reference audio file sent as every request's `audio` field (voice clones)
    rates: tuple[float, ...] = ()  # one phase of num_requests per rate (requests/s; 0: all at once); (): one, at once
    duration_s: float | None = None  # with rates: a Poisson phase sends rate x duration_s requests, not num_requests
    json_path: str | None = None  # the phases' summaries as one JSON file

    def __post_init__(self) -> None:
        object.__setattr__(self, "rates", tuple(self.rates))  # a list after JSON

    @property
    def kwargs(self) -> dict[str, Any]:
        return json.loads(self.kwargs_json)


@dataclass(frozen=True)
class ServerConfig:
    """The HTTP server and its scheduler processes (Python runtime)."""

    host: str = "127.0.0.1"
    port: int = 8000
    dp_size: int = 1  # replicas (scheduler processes), one per GPU
    request_timeout_s: float = 300.0  # a request still running after this is aborted
    max_upload_mb: float = 10.0  # largest reference-audio upload
    data_dir: str | None = None  # saved voices live here (None: no saved voices)
    max_input_chars: int = 100_000  # longest text of one speech request, split into segments that fit the model
    header_timeout_s: float = 10.0  # a connection must send a request's headers within this
    body_timeout_s: float = 60.0  # ... and its whole body within this
    max_connections: int = 1024  # open HTTP connections (and requests) before new ones get 503
    api_key: str | None = None  # a bearer token every route but /health requires; never sent to replicas
    allowed_origins: tuple[str, ...] = ()  # CORS: browser origins allowed to call the API (none: CORS off)
    max_sessions: int = 64  # open input-streaming sessions per replica (the CLI's default: --max-batch-size)
    session_idle_timeout_s: float = 30.0  # a session without new text (or, unread, without a reader) ends

    def __post_init__(self) -> None:
        object.__setattr__(self, "allowed_origins", tuple(self.allowed_origins))  # a list after JSON


@dataclass(frozen=True)
class EngineConfig:
    """How stages execute on the device."""

    attention_backend: str = "auto"  # auto | torch | flashinfer | triton
    disable_cuda_graph: bool = False
    enable_nvtx: bool = False  # NVTX ranges around stage launches and scheduling (for nsys)
    prompt_builder: str | None = None  # Rust runtime: "python" builds prompts with the program's preprocess
    enable_disaggregation: bool = False  # the LM on one device, the codec on the next (engine/disagg.py)
    codec_gpu: int | None = None  # Rust runtime: every replica's codec half on this GPU (engine/placement.py)
    codec_sms: int | None = None  # with codec_gpu: the codec halves on a partition of this many SMs (rt/partition.py)
    overlap_detok: bool = False  # Rust runtime: each replica's codec half on its own GPU, on its own stream
    async_engines: bool = False  # Rust runtime: overlap_detok, and each LM step launched before the last is collected

    @property
    def splits(self) -> bool:
        """Whether each replica's engine is split into an LM half and a codec half (engine/disagg.py)."""
        return self.enable_disaggregation or self.codec_gpu is not None or self.overlap_detok or self.async_engines


@dataclass(frozen=True)
class VoxConfig:
    runtime: str = "python"
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    bench: BenchConfig = field(default_factory=BenchConfig)
    server: ServerConfig = field(default_factory=ServerConfig)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VoxConfig:
        """The inverse of `to_dict` (a scheduler process receives its config this way)."""
        parts = {f.name: f.default_factory for f in fields(cls) if f.default_factory is not MISSING}
        return cls(**{key: parts[key](**value) if key in parts else value for key, value in data.items()})
