"""The Rust runtime end to end on CPU: `vox-serve --runtime rust --bench-requests N` serves each
model through `_rt.serve` (the Rust scheduler thread and engine driver, the engine built in the same
interpreter) and writes WAV files byte-identical to the Python runtime's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from qwen3_tts_helpers import reference_wavs
from rust_helpers import require_rt


def _bench(runtime: str, model: str, out: Path, *extra: str, requests: int = 4, greedy: bool = True,
           trace_dir: Path | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "vox_serve.launch", "--runtime", runtime, "--model", model, "--device", "cpu",
           "--bench-requests", str(requests), "--bench-out", str(out), *(["--greedy"] if greedy else []), *extra]
    if trace_dir is not None:
        cmd += ["--trace-dir", str(trace_dir)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})


def _rows(stdout: str) -> list[tuple[str, str, str, str]]:
    """(request, audio_s, tokens, finish) of each per-request line: what must match across runtimes."""
    rows = []
    for line in stdout.splitlines():
        if line.startswith("bench-"):
            parts = line.split()
            rows.append((parts[0], parts[3], parts[4], " ".join(parts[5:])))
    return rows


@pytest.fixture(scope="module")
def rt():
    module = require_rt()
    if not callable(getattr(module, "serve", None)):
        pytest.fail("vox_serve._rt has no serve(): the extension is older than its Python package")
    return module


CASES = {
    "orpheus-tiny": ["--bench-kwargs", '{"max_tokens": 70, "ignore_eos": true}'],
    "qwen3-tts-tiny": ["--bench-kwargs", '{"max_tokens": 48}'],
    "qwen3-tts-tiny-stop": [],  # random weights that stop on their own (433 tokens): the STOP path
    # first chunks of 2 frames (the codec_first stage) and prompts prefilled in chunks of 32 tokens
    "qwen3-tts-tiny-chunks": ["--first-chunk-frames", "2", "--max-prefill-tokens", "32",
                              "--bench-kwargs", '{"max_tokens": 40}'],
    "orpheus-tiny-voice": ["--bench-kwargs", '{"max_tokens": 42, "ignore_eos": true, "voice": "zoe"}',
                           "--bench-text", "Ünïcode, <|im_end|> and   spaces!"],
    "orpheus-tiny-fp8": ["--kv-cache-dtype", "fp8", "--bench-kwargs", '{"max_tokens": 42, "ignore_eos": true}'],
    # float8 decoder weights (the talker's and the code predictor's for Qwen3-TTS)
    "orpheus-tiny-w8": ["--quantization", "fp8", "--bench-kwargs", '{"max_tokens": 42, "ignore_eos": true}'],
    "qwen3-tts-tiny-w8": ["--quantization", "fp8", "--bench-kwargs", '{"max_tokens": 24}'],
}


@pytest.mark.parametrize("case", list(CASES))
def test_rust_bench_wavs_match_python(rt, case: str, tmp_path: Path) -> None:
    model = case.removesuffix("-stop").removesuffix("-voice").removesuffix("-chunks").removesuffix("-fp8")
    model = model.removesuffix("-w8")
    py = _bench("python", model, tmp_path / "py", *CASES[case])
    assert py.returncode == 0, py.stderr
    rs = _bench("rust", model, tmp_path / "rs", *CASES[case])
    assert rs.returncode == 0, rs.stderr
    names = sorted(p.name for p in (tmp_path / "py").glob("*.wav"))
    assert names == [f"bench-{i:03d}.wav" for i in range(4)]
    assert sorted(p.name for p in (tmp_path / "rs").glob("*.wav")) == names
    for name in names:
        ours, theirs = (tmp_path / "rs" / name).read_bytes(), (tmp_path / "py" / name).read_bytes()
        assert len(ours) > 44 + 2000, f"{name}: {len(ours)} bytes"
        assert ours == theirs, name
    assert _rows(rs.stdout) == _rows(py.stdout)
    assert "prompts built in Rust" in rs.stderr  # from the spec's meta.prompt_builder, not the program
    assert rs.stdout.splitlines()[0].split()[:4] == ["request", "ttfa_ms", "latency_s", "audio_s"]
    assert "RTF" in rs.stdout.splitlines()[-1]
    if case.endswith("-stop"):
        assert all(row[3] == "stop" for row in _rows(rs.stdout))


def test_rust_bench_serves_csm_like_python(rt, tmp_path: Path) -> None:
    """CSM: 33 input columns, the depth decoder inside the LM stage, a stateful Mimi codec; its prompts
    come from the program's preprocess (it publishes no prompt builder for Rust)."""
    extra = ["--bench-kwargs", '{"max_tokens": 20}']
    py = _bench("python", "csm-tiny", tmp_path / "py", *extra, requests=2)
    assert py.returncode == 0, py.stderr
    rs = _bench("rust", "csm-tiny", tmp_path / "rs", *extra, requests=2)
    assert rs.returncode == 0, rs.stderr
    assert "prompts built by the program's preprocess" in rs.stderr
    for name in ("bench-000.wav", "bench-001.wav"):
        ours, theirs = (tmp_path / "rs" / name).read_bytes(), (tmp_path / "py" / name).read_bytes()
        assert len(ours) > 44 + 2000 and ours == theirs, name
    assert _rows(rs.stdout) == _rows(py.stdout)


def test_rust_runtime_refuses_paired_rows_with_a_clear_error(rt, tmp_path: Path) -> None:
    proc = _bench("rust", "zonos-tiny", tmp_path / "rs", requests=1)
    assert proc.returncode != 0 and "kv_streams" in proc.stderr and "--runtime python" in proc.stderr


# Qwen3-TTS's prompt layouts, sampled (seeded per request), not greedy: the tiny models' greedy codes do not
# depend on the text ids of generated frames. model, bench kwargs, and whether the codec slots are primed.
LAYOUT_CASES = {
    # Base, x-vector only, the streaming-text layout (its default): the prompt's trailing text ids go one
    # per frame through the text column
    "base-x-vector": ("qwen3-tts-base-tiny", {"max_tokens": 24}, False),
    # Base in context: the reference frames prime the codec slot (codec_prime) in the step that admits it
    "base-in-context": ("qwen3-tts-base-tiny", {"max_tokens": 24, "ref_text": "A reference sentence."}, True),
    "base-in-context-non-streaming": ("qwen3-tts-base-tiny", {"max_tokens": 24, "ref_text": "A reference sentence.",
                                                              "non_streaming_mode": True}, True),
    # CustomVoice's streaming-text layout, its prompt (and trailing text ids) built in Rust
    "custom-streaming-text": ("qwen3-tts-tiny", {"max_tokens": 24, "non_streaming_mode": False}, False),
}


def _stage_launches(trace_dir: Path) -> list[tuple[int, str]]:
    (path,) = trace_dir.glob("*.jsonl")
    records = (json.loads(line) for line in path.read_text().splitlines())
    return [(r["step"], r["stage"]) for r in records if r["type"] == "stage"]


@pytest.mark.parametrize("case", list(LAYOUT_CASES))
def test_rust_bench_qwen3_layouts_match_python(rt, tmp_path: Path, case: str) -> None:
    """Qwen3-TTS Base clones and the streaming-text layout: a Base clip is encoded by the program's Python
    prompt builder (off the step path); speaker vectors, prompt vectors, trailing text ids and codec prefixes
    go through the Rust scheduler and writer, which launch the same stages in the same steps as Python."""
    model, kwargs, primes = LAYOUT_CASES[case]
    extra = ["--bench-kwargs", json.dumps(kwargs)]
    clones = model == "qwen3-tts-base-tiny"
    if clones:
        ref = tmp_path / "ref.wav"
        ref.write_bytes(reference_wavs()["sine"])
        extra += ["--bench-audio", str(ref)]
    runs = {}
    for runtime in ("python", "rust"):
        runs[runtime] = _bench(runtime, model, tmp_path / runtime, *extra, requests=2, greedy=False,
                               trace_dir=tmp_path / f"{runtime}-trace")
        assert runs[runtime].returncode == 0, runs[runtime].stderr
    py, rs = runs["python"], runs["rust"]
    # the reference-audio encoder is Python
    assert ("prompts built by the program's preprocess" if clones else "prompts built in Rust") in rs.stderr
    for i in range(2):
        name = f"bench-{i:03d}.wav"
        ours, theirs = (tmp_path / "rust" / name).read_bytes(), (tmp_path / "python" / name).read_bytes()
        assert len(ours) > 44 + 2000 and ours == theirs, name
    assert _rows(rs.stdout) == _rows(py.stdout)
    launches = _stage_launches(tmp_path / "rust-trace")
    assert launches == _stage_launches(tmp_path / "python-trace")
    assert any(stage == "codec_prime" for _, stage in launches) == primes


@pytest.mark.parametrize("builder", ["rust", "python"])
def test_rust_bench_names_a_bad_field(rt, tmp_path: Path, builder: str) -> None:
    proc = _bench("rust", "orpheus-tiny", tmp_path, "--prompt-builder", builder, "--bench-kwargs",
                  '{"language": "english"}', requests=1)
    assert proc.returncode == 2
    assert "language" in proc.stderr and "not accepted" in proc.stderr
    proc = _bench("rust", "orpheus-tiny", tmp_path, "--prompt-builder", builder, "--bench-kwargs",
                  '{"voice": "nobody"}', requests=1)
    assert proc.returncode == 2
    assert "--bench-kwargs/--bench-text: voice: voice 'nobody' is not one of tara" in proc.stderr


def test_prompt_builder_python_gives_the_same_wavs(rt, tmp_path: Path) -> None:
    extra = ["--bench-kwargs", '{"max_tokens": 30}']
    ours = _bench("rust", "qwen3-tts-tiny", tmp_path / "rs", *extra, requests=2)
    theirs = _bench("rust", "qwen3-tts-tiny", tmp_path / "py", "--prompt-builder", "python", *extra, requests=2)
    assert ours.returncode == 0 and theirs.returncode == 0, ours.stderr + theirs.stderr
    assert "prompts built in Rust" in ours.stderr and "preprocess (Python)" in theirs.stderr
    for i in range(2):
        name = f"bench-{i:03d}.wav"
        assert (tmp_path / "rs" / name).read_bytes() == (tmp_path / "py" / name).read_bytes()


def test_rust_without_bench_says_http_is_next(rt) -> None:
    proc = subprocess.run([sys.executable, "-m", "vox_serve.launch", "--runtime", "rust", "--model", "orpheus-tiny",
                           "--device", "cpu"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "bench mode" in proc.stderr and "--runtime python" in proc.stderr


def test_serve_refuses_a_config_without_bench_requests(rt) -> None:
    from vox_serve.config import VoxConfig

    with pytest.raises(RuntimeError, match="HTTP"):
        rt.serve(json.dumps(VoxConfig().to_dict()))


def _decisions(trace_dir: Path) -> list[dict]:
    """Every record but the header, without its times (what both runtimes must agree on)."""
    (path,) = trace_dir.glob("*.jsonl")
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert records[0]["type"] == "header"
    timeless = ("t", "plan_ms", "device_ms")
    return [{k: v for k, v in r.items() if k not in timeless} for r in records[1:]]


def test_rust_trace_matches_python_and_reads_in_trace_summary(rt, tmp_path: Path) -> None:
    """--trace-dir: the Rust scheduler's decisions and launches are the Python scheduler's, record for
    record, in the same shapes, and benchmark/trace_summary.py reads them."""
    extra = ["--bench-kwargs", '{"max_tokens": 40, "ignore_eos": true}']
    for runtime in ("python", "rust"):
        proc = _bench(runtime, "orpheus-tiny", tmp_path / f"{runtime}-wav", *extra, "--trace-dir",
                      str(tmp_path / runtime), requests=3)
        assert proc.returncode == 0, proc.stderr
    ours, theirs = _decisions(tmp_path / "rust"), _decisions(tmp_path / "python")
    assert [r["type"] for r in ours].count("schedule") > 10
    assert ours == theirs
    summary = subprocess.run([sys.executable, "benchmark/trace_summary.py", str(tmp_path / "rust")],
                             capture_output=True, text=True, timeout=60)
    assert summary.returncode == 0, summary.stderr
    assert "decode" in summary.stdout and "steps" in summary.stdout


def _bench_cuda(runtime: str, model: str, out: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "vox_serve.launch", "--runtime", runtime, "--model", model, "--device", "cuda",
           "--bench-requests", "4", "--bench-out", str(out), "--greedy", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


@pytest.mark.gpu
@pytest.mark.parametrize("model,extra", [
    ("orpheus-tiny", ["--bench-kwargs", '{"max_tokens": 70, "ignore_eos": true}']),
    ("qwen3-tts-tiny", ["--bench-kwargs", '{"max_tokens": 48}']),
    # FlashInfer needs head_dim 64/128/256: the full-size model with dummy weights
    ("orpheus", ["--attention-backend", "flashinfer", "--load-format", "dummy", "--max-model-len", "512",
                 "--max-batch-size", "8", "--bench-kwargs", '{"max_tokens": 70, "ignore_eos": true}']),
    ("orpheus-tiny", ["--disable-cuda-graph", "--bench-kwargs", '{"max_tokens": 70, "ignore_eos": true}']),
    # a float8 KV cache: the planless Triton backend, its captured prefill and decode launched without a plan
    ("orpheus", ["--kv-cache-dtype", "fp8", "--load-format", "dummy", "--max-model-len", "512",
                 "--max-batch-size", "8", "--bench-kwargs", '{"max_tokens": 70, "ignore_eos": true}']),
    # and through FlashInfer's e4m3 modules, planned in Rust
    ("orpheus", ["--kv-cache-dtype", "fp8", "--attention-backend", "flashinfer", "--load-format", "dummy",
                 "--max-model-len", "512", "--max-batch-size", "8", "--bench-kwargs",
                 '{"max_tokens": 70, "ignore_eos": true}']),
    # float8 decoder weights: the small-rows kernels with scales, the float8 GEMMs above their rows
    ("orpheus", ["--quantization", "fp8", "--load-format", "dummy", "--max-model-len", "512",
                 "--max-batch-size", "32", "--bench-kwargs", '{"max_tokens": 70, "ignore_eos": true}']),
    ("qwen3-tts", ["--quantization", "fp8", "--load-format", "dummy", "--max-model-len", "512",
                   "--max-batch-size", "8", "--bench-kwargs", '{"max_tokens": 24}']),
    # an in-context clone: the captured codec_prime graph launched by the Rust driver ("REF": the clip)
    ("qwen3-tts-base-tiny", ["--bench-audio", "REF", "--bench-kwargs",
                             '{"max_tokens": 24, "ref_text": "A reference sentence."}']),
], ids=["orpheus", "qwen3", "orpheus-flashinfer", "orpheus-eager", "orpheus-fp8", "orpheus-fp8-flashinfer",
        "orpheus-w8", "qwen3-w8", "qwen3-base-in-context"])
def test_rust_bench_on_cuda_matches_python(rt, model: str, extra: list[str], tmp_path: Path) -> None:
    """On a GPU the Rust driver copies step_in up and step_out down in one transfer each and launches the
    captured graphs by their exec handles; eager stages and attention planning go through Python on its
    stream. The WAVs equal the Python runtime's, and --trace-dir's stage times are CUDA events."""
    ref = tmp_path / "ref.wav"
    ref.write_bytes(reference_wavs()["sine"])
    extra = [str(ref) if arg == "REF" else arg for arg in extra]
    py = _bench_cuda("python", model, tmp_path / "py", *extra)
    assert py.returncode == 0, py.stderr
    rs = _bench_cuda("rust", model, tmp_path / "rs", *extra, "--trace-dir", str(tmp_path / "trace"))
    assert rs.returncode == 0, rs.stderr
    if "flashinfer" in extra and "--disable-cuda-graph" not in extra:  # captured launches planned by the shim
        assert "flashinfer launches are planned in Rust" in rs.stderr, rs.stderr[-2000:]
    for i in range(4):
        name = f"bench-{i:03d}.wav"
        assert (tmp_path / "rs" / name).read_bytes() == (tmp_path / "py" / name).read_bytes(), name
    (path,) = (tmp_path / "trace").glob("*.jsonl")
    stages = [r for r in map(json.loads, path.read_text().splitlines()) if r["type"] == "stage"]
    assert stages and all(s["timer"] == "cuda" and s["device_ms"] > 0 for s in stages)


def test_declared_fields_through_the_rust_driver(rt) -> None:
    """The test-only program that declares every optional field (several input columns, prompt vectors,
    a per-slot conditioning field, frame latents) gives the same PCM through the Rust scheduler and
    driver as through the Python runtime."""
    from dataclasses import asdict

    from tests.declared_program import DeclaredProgram
    from tests.engine_helpers import make_loop, prepare, spec_of
    from tests.test_declared_fields import CONFIG, STEPS, _prompts
    from vox_serve.core.request import Request, SamplingParams
    from vox_serve.rust_host import _request_data

    def requests() -> list[Request]:
        return [Request(f"r{i}", p, SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True))
                for i, p in enumerate(_prompts())]

    program = prepare(DeclaredProgram(), CONFIG)
    loop = make_loop(program, CONFIG, record=False)
    theirs = requests()
    pcm: dict[str, list[bytes]] = {r.req_id: [] for r in theirs}
    for req in theirs:
        req.sink = lambda r, chunk, final: chunk and pcm[r.req_id].append(chunk)
        loop.scheduler.add_request(req)
    loop.run_until_idle()
    program = prepare(DeclaredProgram(), CONFIG)
    ours = rt.run_requests(json.dumps(spec_of(program)), json.dumps(asdict(CONFIG.scheduler)),
                           json.dumps([_request_data(r) for r in requests()]))
    assert [o[0] for o in ours] == [r.req_id for r in theirs]
    for req_id, reason, error, generated, audio in ours:
        assert (reason, error, generated) == ("length", None, STEPS), req_id
        assert len(audio) > 0 and audio == b"".join(pcm[req_id]), req_id
