"""The command line: one table of flags, a parser per runtime, and the frozen config built from it.

Every flag of the specification is listed here with the runtimes that have it and whether this
build implements it. A flag that is not implemented yet is rejected with a clear message; a
flag that only the Rust runtime has is dropped with a warning when the Python runtime serves
because the extension is missing (the specification's fallback rule).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vox_serve import __version__
from vox_serve.config import (
    KV_CACHE_DTYPES,
    QUANTIZATIONS,
    BenchConfig,
    CacheConfig,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
    ServerConfig,
    VoxConfig,
)
from vox_serve.models.names import NAMES, model_name_problem

PY, RS = "python", "rust"
BOTH = frozenset({PY, RS})
SCHEDULER_TYPES_PY = ("base", "online", "offline", "input_streaming", "deadline")
IMPLEMENTED_SCHEDULERS = SCHEDULER_TYPES_PY
API_KEY_ENV = "VOX_SERVE_API_KEY"


class CliError(Exception):
    """A command line the selected runtime cannot serve; the message says why."""


@dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    runtimes: frozenset[str] = BOTH
    implemented: bool = True
    implemented_in: frozenset[str] | None = None  # the runtimes (of `runtimes`) that serve it; None: all
    target: tuple[type, str] | None = None  # the config field it sets (section dataclass, field name)
    convert: Callable[[Any], Any] | None = None  # the flag's value -> the field's

    @property
    def dest(self) -> str:
        return self.names[0].lstrip("-").replace("-", "_")

    def serves(self, runtime: str) -> bool:
        """Whether `runtime` has this flag and serves it in this build."""
        return (runtime in self.runtimes and self.implemented
                and (self.implemented_in is None or runtime in self.implemented_in))


def _field_default(section: type, name: str) -> Any:
    f = next(f for f in dataclasses.fields(section) if f.name == name)
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def _f(*names: str, runtimes: frozenset[str] = BOTH, implemented: bool = True,
       implemented_in: frozenset[str] | None = None, to: type | None = None, name: str | None = None,
       convert: Callable[[Any], Any] | None = None, **kwargs: Any) -> Flag:
    """A flag; `to`: the config section whose field `name` (default: the flag's own name) it sets, and
    whose default it takes unless `default` is given."""
    target = None if to is None else (to, name or names[0].lstrip("-").replace("-", "_"))
    if target is not None and "default" not in kwargs and kwargs.get("action") != "store_true":
        kwargs["default"] = _field_default(*target)
    return Flag(names, kwargs, runtimes, implemented, implemented_in, target, convert)


def _scheduler_type(name: str) -> str:
    return "base" if name == "input_streaming" else name


def _api_key(key: str | None) -> str | None:
    return key or os.environ.get(API_KEY_ENV) or None


def _origins(text: str | None) -> tuple[str, ...]:
    return tuple(o.strip() for o in (text or "").split(",") if o.strip())


def parse_bench_rates(text: str | None) -> tuple[float, ...]:
    """--bench-rate's phases: requests per second, 0 for all at once (`0` or `inf`); () without the flag."""
    if text is None:
        return ()
    rates = []
    for item in text.split(","):
        try:
            rate = float(item)
        except ValueError:
            rate = math.nan
        if not rate >= 0:
            raise CliError(f"--bench-rate {text!r}: {item.strip()!r} is not a rate (requests per second >= 0, "
                           "or inf: all at once)")
        rates.append(0.0 if math.isinf(rate) else rate)
    return tuple(rates)


RUST_ONLY = frozenset({RS})
PY_ONLY = frozenset({PY})
RUST_LATER: dict[str, Any] = {"runtimes": RUST_ONLY, "implemented": False}  # Rust flags of later issues

FLAGS: tuple[Flag, ...] = (
    _f("--runtime", choices=["auto", "python", "rust"], default="auto",
       help="serving runtime: auto (Rust if available, else Python), python or rust"),
    # model
    _f("--model", to=ModelConfig,
       help=f"model name ({', '.join(NAMES)}), Hugging Face id (owner/name, local cache) or local directory"),
    _f("--load-format", to=ModelConfig, choices=["auto", "safetensors", "dummy"],
       help="dummy: random weights of the configured shapes (no checkpoint needed)"),
    _f("--dtype", to=ModelConfig, choices=["auto", "bfloat16", "float16", "float32"],
       help="weight/activation dtype (auto: bfloat16 on GPU, float32 on CPU)"),
    _f("--device", to=ModelConfig, help="auto (cuda if available, else cpu), cpu, cuda or cuda:N"),
    _f("--codec-path", to=ModelConfig, help="codec checkpoint directory (default: inside the model's)"),
    _f("--codec-dtype", to=ModelConfig, choices=["auto", "bfloat16", "float16", "float32"],
       help="the codec's dtype (auto: --dtype's); one other than --dtype only for Orpheus' SNAC (bfloat16 "
            "decodes within 30 dB SNR of float32)"),
    _f("--quantization", to=ModelConfig, choices=list(QUANTIZATIONS),
       help="fp8: the decoder layers' projections in float8 e4m3 with a scale per output channel, quantized at load "
            "(half the weight bytes a decode step reads; needs compute capability 8.9 on a GPU; orpheus, "
            "qwen3-tts, csm)"),
    _f("--seed", to=ModelConfig, type=int, help="seed of dummy weights and of requests without a seed"),
    # cache
    _f("--page-size", to=CacheConfig, type=int, help="tokens per KV page"),
    _f("--max-num-pages", to=CacheConfig, type=int, help="KV pages (default: sized from free memory)"),
    _f("--gpu-memory-utilization", to=CacheConfig, type=float,
       help="fraction of GPU memory for weights, graphs and KV"),
    _f("--max-model-len", to=CacheConfig, type=int, help="longest prompt + generation, in tokens"),
    _f("--kv-cache-dtype", to=CacheConfig, choices=list(KV_CACHE_DTYPES),
       help="KV cache storage: auto (the model's dtype) or fp8 (float8 e4m3, unscaled: twice the tokens per byte; "
            "read by the triton and flashinfer attention backends)"),
    # scheduling
    _f("--scheduler-type", to=SchedulerConfig, convert=_scheduler_type,
       help="base, online, offline, deadline, input_streaming (a name of base); see docs/scheduling.md"),
    _f("--max-batch-size", to=SchedulerConfig, type=int, help="largest decode batch"),
    _f("--max-prefill-tokens", to=SchedulerConfig, type=int, help="token budget of one prefill step"),
    _f("--max-prefill-seqs", to=SchedulerConfig, type=int, help="sequences in one prefill step"),
    _f("--max-codec-batch", to=SchedulerConfig, type=int, help="audio chunks decoded in one codec step"),
    _f("--detokenize-interval", to=SchedulerConfig, type=int, help="frames per audio chunk (default: model's)"),
    _f("--first-chunk-frames", to=SchedulerConfig, type=int,
       help="frames of each request's first audio chunk, at most the interval (sooner first audio)"),
    _f("--max-queued-requests", to=SchedulerConfig, type=int, help="waiting requests before new ones are refused"),
    # execution
    _f("--attention-backend", to=EngineConfig, choices=["auto", "torch", "flashinfer", "triton"],
       help="paged attention implementation (auto: flashinfer on a GPU, triton for an fp8 KV cache, else torch)"),
    _f("--disable-cuda-graph", to=EngineConfig, action="store_true",
       help="run stages eagerly instead of replaying CUDA graphs"),
    _f("--enable-nvtx", to=EngineConfig, action="store_true", runtimes=PY_ONLY,
       help="NVTX ranges around stages and scheduling"),
    _f("--async-scheduling", to=SchedulerConfig, action="store_true", runtimes=PY_ONLY,
       help="plan the next step while the GPU runs the current one"),
    # several GPUs
    _f("--dp-size", to=ServerConfig, type=int, help="replicas, one per GPU"),
    _f("--enable-disaggregation", to=EngineConfig, action="store_true",
       help="the LM on GPU 0 and the codec on GPU 1 (with --dp-size N: replica i on GPUs 2i and 2i+1; "
            "on a CPU both halves run on the CPU)"),
    # server
    _f("--host", to=ServerConfig, help="HTTP bind address"),
    _f("--port", to=ServerConfig, type=int, help="HTTP port"),
    _f("--request-timeout-s", to=ServerConfig, type=float,
       help="abort a request still running after this many seconds"),
    _f("--max-upload-mb", to=ServerConfig, type=float, help="largest audio upload, in MB"),
    _f("--data-dir", to=ServerConfig,
       help="directory of saved voices (POST /v1/audio/voices); kept across restarts"),
    _f("--max-input-chars", to=ServerConfig, type=int,
       help="longest text of one /v1/audio/speech request; longer than the model takes is split at sentences"),
    _f("--header-timeout-s", to=ServerConfig, type=float,
       help="close a connection that has not sent a request's headers within this many seconds"),
    _f("--body-timeout-s", to=ServerConfig, type=float,
       help="answer 408 to a request whose body has not arrived within this many seconds"),
    _f("--max-connections", to=ServerConfig, type=int,
       help="open HTTP connections; one beyond them is closed at once"),
    _f("--api-key", to=ServerConfig, convert=_api_key, default=None,
       help="require 'Authorization: Bearer KEY' on every route but /health (default: $VOX_SERVE_API_KEY, "
            "else none); the environment variable keeps the key out of the process list"),
    _f("--allowed-origins", to=ServerConfig, convert=_origins, default=None,
       help="comma-separated browser origins allowed to call the API (CORS); default: CORS off"),
    _f("--max-sessions", to=ServerConfig, type=int, default=None,
       help="open input-streaming sessions per replica (default: --max-batch-size)"),
    _f("--session-idle-timeout-s", to=ServerConfig, type=float,
       help="end an input-streaming session that receives no text (or, ended, is not read) for this long"),
    # bench mode
    _f("--bench-requests", to=BenchConfig, name="num_requests", type=int,
       help="run N (>= 1) concurrent requests without HTTP and exit; leave it out to serve HTTP"),
    _f("--bench-out", to=BenchConfig, name="out_dir", help="directory for one WAV per bench request"),
    _f("--bench-text", to=BenchConfig, name="text", help="text of each bench request"),
    _f("--bench-kwargs", to=BenchConfig, name="kwargs_json",
       help='JSON request fields: voice, sampling overrides, max_tokens, ignore_eos, seed'),
    _f("--bench-audio", to=BenchConfig, name="audio",
       help="reference audio file sent as every bench request's `audio` (voice clones)"),
    _f("--bench-rate", to=BenchConfig, name="rates", convert=parse_bench_rates, default=None,
       help="comma-separated request rates (per second): one phase of --bench-requests N per rate on the same "
            "engine, Poisson arrivals seeded by --seed; 0 or inf: all at once (the default)"),
    _f("--bench-duration", to=BenchConfig, name="duration_s", type=float,
       help="seconds of arrivals per --bench-rate phase: a phase at rate R sends R x S requests (at least 1) "
            "instead of --bench-requests N, so that every rate loads the engine for as long; phases at once keep N"),
    _f("--bench-json", to=BenchConfig, name="json_path",
       help="write each bench phase's summary and requests to this JSON file"),
    _f("--greedy", to=BenchConfig, action="store_true", help="greedy sampling: repeatable output"),
    _f("--trace-dir", to=SchedulerConfig,
       help="write JSON lines of every stage launch's device time and every scheduling decision here"),
    # Rust runtime only (the lanes, SM partitions and segments of later issues: refused until they exist)
    _f("--overlap-detok", to=EngineConfig, action="store_true", runtimes=RUST_ONLY,
       help="the codec on its own stream, asynchronously to the LM steps: each replica's engine split into an LM "
            "half and a codec half on its GPU (with --enable-disaggregation: the next GPU), each step waiting for "
            "its LM half only while up to two codec batches run in turn and land when done"),
    _f("--async-engines", to=EngineConfig, action="store_true", runtimes=RUST_ONLY,
       help="the LM and codec lanes each keep work in flight: --overlap-detok's codec lane, and each LM step "
            "launched before the one before it is collected, so the host plans while the GPU runs"),
    _f("--sm-modes", default=None, **RUST_LATER, help="codec SM partitions, e.g. 24,48"),
    _f("--sm-mode", default=None, **RUST_LATER, help="partition index or adaptive"),
    _f("--urgent-lane", action="store_true", **RUST_LATER, help="high-priority codec lane"),
    _f("--lm-segments", default=None, **RUST_LATER, help="depth or layers:<k>"),
    _f("--gate", action="store_true", **RUST_LATER, help="gate segments on codec batches"),
    _f("--codec-gpu", to=EngineConfig, type=int, runtimes=RUST_ONLY,
       help="GPU of every replica's codec: replica i's LM on GPU i, its codec half on GPU G, the replicas' codec "
            "batches taking turns on one lane (earliest deadline first)"),
    _f("--codec-sms", to=EngineConfig, type=int, runtimes=RUST_ONLY,
       help="with --codec-gpu: the replicas' codec halves share a partition of this many SMs of that GPU (a CUDA "
            "green context; rounded up to the GPU's granularity, 8 SMs on Hopper); the LMs keep the whole GPU. "
            "With --overlap-detok or --async-engines: each replica's codec half on such a partition of its codec "
            "device (its own GPU, or the next one with --enable-disaggregation)"),
    _f("--prompt-builder", to=EngineConfig, choices=["rust", "python"], runtimes=RUST_ONLY,
       help="rust (default where the model's spec allows): prompts built in Rust; python: the program's preprocess"),
    # deadline policy (both runtimes)
    _f("--deadline-startup-ms", to=SchedulerConfig, type=float,
       help="deadline policy: first audio of a new stream is due this long after its arrival"),
    _f("--deadline-max-prefill-deferral-ms", to=SchedulerConfig, type=float,
       help="deadline policy: longest a prefill waits for running streams about to underrun"),
    _f("--deadline-lm-step-ms", to=SchedulerConfig, type=float,
       help="deadline policy: estimated time of one LM decode step (calibrate per model and GPU)"),
    _f("--deadline-codec-ms", to=SchedulerConfig, type=float,
       help="deadline policy: estimated time of one codec launch"),
    _f("--deadline-prefill-ms", to=SchedulerConfig, type=float,
       help="deadline policy: estimated time of one prefill launch"),
)

_FLAG_BY_DEST = {f.dest: f for f in FLAGS}


def build_parser(runtime: str | None) -> argparse.ArgumentParser:
    """The parser of one runtime's flags (`None`: every flag, used before the runtime is known).

    Defaults are SUPPRESSed so that `given_flags` can tell which flags the user actually wrote.
    """
    prog = "vox-serve" if runtime is None else f"vox-serve --runtime {runtime}"
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Serve a speech language model (text-to-speech) over HTTP, or benchmark it. "
                    "`vox-serve say TEXT -o FILE` speaks through a running server (vox-serve say --help).",
        argument_default=argparse.SUPPRESS,
    )
    for flag in FLAGS:
        if runtime is not None and runtime not in flag.runtimes:
            continue
        kwargs = dict(flag.kwargs)
        default = kwargs.pop("default", False if kwargs.get("action") == "store_true" else None)
        help_text = kwargs.pop("help", "")
        if default not in (None, False):
            help_text = f"{help_text} (default: {default})".strip()
        if not flag.implemented or (runtime is not None and not flag.serves(runtime)):
            help_text = f"{help_text} [not implemented yet]".strip()
        elif runtime is None and flag.implemented_in is not None:
            help_text = f"{help_text} [{', '.join(sorted(flag.implemented_in))} runtime only]".strip()
        parser.add_argument(*flag.names, help=help_text or None, **kwargs)
    parser.add_argument("--version", action="version", version=f"vox-serve {__version__}")
    return parser


def _defaults() -> dict[str, Any]:
    out = {}
    for flag in FLAGS:
        is_bool = flag.kwargs.get("action") == "store_true"
        out[flag.dest] = flag.kwargs.get("default", False if is_bool else None)
    return out


def given_flags(argv: list[str]) -> dict[str, Any]:
    """Flags present on the command line, parsed with the union parser."""
    return vars(build_parser(None).parse_args(argv))


def python_only_flags(given: dict[str, Any]) -> list[str]:
    """The flags given (and set) that the Python runtime serves and the Rust runtime does not: with
    `--runtime auto` they make the Python runtime serve."""
    return [_FLAG_BY_DEST[d].names[0] for d, v in given.items()
            if v and _FLAG_BY_DEST[d].serves(PY) and not _FLAG_BY_DEST[d].serves(RS)]


def check_flags(given: dict[str, Any], runtime: str, rust_missing: bool) -> tuple[dict[str, Any], list[str]]:
    """Apply the runtime's rules to the flags given; returns (kept flags, warnings).

    Raises CliError for a flag that this runtime does not have (or that is not implemented yet).
    """
    kept, warnings = {}, []
    for dest, value in given.items():
        flag = _FLAG_BY_DEST[dest]
        name = flag.names[0]
        if dest == "runtime":
            continue
        if runtime not in flag.runtimes:
            if runtime == PY and rust_missing:
                warnings.append(f"{name} exists only in the Rust runtime; dropped (serving with the Python runtime)")
                continue
            raise CliError(f"{name} is not a flag of the {runtime} runtime")
        if not flag.implemented:
            raise CliError(f"{name} is not implemented yet in the {runtime} runtime")
        if value and not flag.serves(runtime):
            others = " or ".join(sorted(flag.implemented_in or ()))
            raise CliError(f"{name} is not implemented yet in the {runtime} runtime; the {others} runtime serves it "
                           f"(--runtime {others})")
        kept[dest] = value
    _check_values(kept, runtime)
    return kept, warnings


def _check_values(kept: dict[str, Any], runtime: str) -> None:
    _check_scheduler(kept)
    _check_server_values(kept, runtime)
    for dest in ("page_size", "max_batch_size", "max_prefill_tokens", "max_prefill_seqs", "max_codec_batch"):
        if dest in kept and kept[dest] < 1:
            raise CliError(f"--{dest.replace('_', '-')} must be >= 1")
    for dest in ("detokenize_interval", "first_chunk_frames", "max_num_pages", "max_model_len"):
        if kept.get(dest) is not None and kept[dest] < 1:
            raise CliError(f"--{dest.replace('_', '-')} must be >= 1")
    first, interval = kept.get("first_chunk_frames"), kept.get("detokenize_interval")
    if first is not None and interval is not None and first > interval:
        raise CliError(f"--first-chunk-frames {first} must be at most --detokenize-interval {interval}")
    if not 0.0 < kept.get("gpu_memory_utilization", 0.9) <= 1.0:
        raise CliError("--gpu-memory-utilization must be in (0, 1]")
    _check_model(kept)
    _check_bench(kept)


def _check_bench(kept: dict[str, Any]) -> None:
    if "bench_requests" in kept and kept["bench_requests"] < 1:
        raise CliError(f"--bench-requests {kept['bench_requests']}: must be >= 1 (leave the flag out to serve "
                       "HTTP)")
    _check_bench_kwargs(kept.get("bench_kwargs", "{}"))
    if "bench_rate" in kept:
        parse_bench_rates(kept["bench_rate"])
    if "bench_duration" in kept:
        if not 0.0 < kept["bench_duration"] < float("inf"):
            raise CliError(f"--bench-duration {kept['bench_duration']}: seconds > 0")
        if "bench_rate" not in kept:
            raise CliError("--bench-duration sets how long each --bench-rate phase sends requests: give --bench-rate")
    for dest in ("bench_rate", "bench_duration", "bench_json"):
        if dest in kept and "bench_requests" not in kept:
            raise CliError(f"--{dest.replace('_', '-')} needs --bench-requests N (the requests of each phase)")


def _check_scheduler(kept: dict[str, Any]) -> None:
    sched = kept.get("scheduler_type", "base")
    if sched not in SCHEDULER_TYPES_PY:
        raise CliError(f"--scheduler-type {sched!r}: expected one of {', '.join(SCHEDULER_TYPES_PY)}")
    if sched not in IMPLEMENTED_SCHEDULERS:
        raise CliError(f"--scheduler-type {sched} is not implemented yet")
    for dest in ("deadline_startup_ms", "deadline_max_prefill_deferral_ms", "deadline_lm_step_ms",
                 "deadline_codec_ms", "deadline_prefill_ms"):
        if dest in kept and not kept[dest] >= 0:
            raise CliError(f"--{dest.replace('_', '-')} must be >= 0")


DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:[0-9]+)?")


def _check_model(kept: dict[str, Any]) -> None:
    if "model" in kept and (problem := model_name_problem(kept["model"])) is not None:
        raise CliError(problem)
    device = kept.get("device", "auto")
    if not DEVICE_PATTERN.fullmatch(device):
        hint = " (a GPU is --device cuda or cuda:N)" if device.lower().startswith("gpu") else ""
        raise CliError(f"--device {device!r}: expected auto, cpu, cuda or cuda:N{hint}")


def _check_bench_kwargs(text: str) -> None:
    try:
        bench_kwargs = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"--bench-kwargs is not valid JSON: {exc}") from exc
    if not isinstance(bench_kwargs, dict):
        raise CliError("--bench-kwargs must be a JSON object")


def _check_server_values(kept: dict[str, Any], runtime: str) -> None:
    dp_size = kept.get("dp_size", 1)
    if dp_size < 1:
        raise CliError("--dp-size must be >= 1")
    if dp_size > 1 and kept.get("bench_requests", 0) > 0 and runtime == PY:
        raise CliError("--bench-requests runs one replica in the Python runtime (its --dp-size serves HTTP); the "
                       "Rust runtime runs a data-parallel bench (--runtime rust)")
    if dp_size > 1 and kept.get("device", "auto").startswith("cuda:"):
        raise CliError(f"--device {kept['device']} names one GPU; --dp-size {dp_size} uses GPUs 0..{dp_size - 1}")
    _check_codec_gpu(kept)
    for dest in ("request_timeout_s", "max_upload_mb", "header_timeout_s", "body_timeout_s",
                 "session_idle_timeout_s"):
        if dest in kept and not kept[dest] > 0:
            raise CliError(f"--{dest.replace('_', '-')} must be > 0")
    if kept.get("max_input_chars", 1) < 1:
        raise CliError("--max-input-chars must be >= 1")
    if kept.get("max_queued_requests", 0) < 0:
        raise CliError("--max-queued-requests must be >= 0")
    for dest in ("max_connections", "max_sessions"):
        if kept.get(dest) is not None and kept[dest] < 1:
            raise CliError(f"--{dest.replace('_', '-')} must be >= 1")
    if "port" in kept and not 1 <= kept["port"] <= 65535:
        raise CliError(f"--port {kept['port']}: must be 1 to 65535")
    if kept.get("api_key") is not None and not kept["api_key"].strip():
        raise CliError("--api-key must not be empty")


def _check_codec_gpu(kept: dict[str, Any]) -> None:
    gpu, sms = kept.get("codec_gpu"), kept.get("codec_sms")
    own_lane = kept.get("overlap_detok") or kept.get("async_engines")  # each replica's codec half on its own lane
    if sms is not None and gpu is None and not own_lane:
        raise CliError("--codec-sms partitions the codec GPU: give it with --codec-gpu G, or with --overlap-detok "
                       "(each replica's codec half on a partition of its own GPU)")
    if sms is not None and sms < 1:
        raise CliError(f"--codec-sms {sms}: a partition has at least one SM")
    if sms is not None and kept.get("device") == "cpu":
        raise CliError("--codec-sms partitions a GPU's SMs; --device cpu has none")
    if gpu is None:
        return
    for flag in ("overlap_detok", "async_engines"):
        if kept.get(flag):
            raise CliError(f"--codec-gpu runs the replicas' codec halves on its shared lane, collected with their "
                           f"steps; --{flag.replace('_', '-')} collects a replica's own codec batches asynchronously: "
                           "use one of them")
    if gpu < 0:
        raise CliError(f"--codec-gpu {gpu}: a GPU index is >= 0")
    if kept.get("enable_disaggregation"):
        raise CliError("--codec-gpu puts every replica's codec on one GPU and --enable-disaggregation gives each "
                       "replica a codec GPU of its own: use one of them")
    if kept.get("device", "auto").startswith("cuda:"):
        raise CliError(f"--device {kept['device']} names one GPU; with --codec-gpu replica i's LM runs on GPU i")


SECTIONS: tuple[tuple[str, type], ...] = (
    ("model", ModelConfig), ("cache", CacheConfig), ("scheduler", SchedulerConfig), ("engine", EngineConfig),
    ("bench", BenchConfig), ("server", ServerConfig))


def build_config(kept: dict[str, Any], runtime: str) -> VoxConfig:
    """The frozen config from validated flags (missing ones take their defaults): each flag sets the field
    it names (`Flag.target`)."""
    v = {**_defaults(), **kept}
    fields: dict[type, dict[str, Any]] = {section: {} for _, section in SECTIONS}
    for flag in FLAGS:
        if flag.target is not None:
            section, name = flag.target
            value = v[flag.dest]
            fields[section][name] = value if flag.convert is None else flag.convert(value)
    server = fields[ServerConfig]
    server["max_sessions"] = server["max_sessions"] or v["max_batch_size"]
    return VoxConfig(runtime=runtime, **{name: section(**fields[section]) for name, section in SECTIONS})


def warn(msg: str) -> None:
    print(f"vox-serve: {msg}", file=sys.stderr)
