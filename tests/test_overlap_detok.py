"""`--overlap-detok` (Rust runtime): each replica's engine is split into an LM half and a codec half on the
replica's own device (engine/placement.py `codec_device`; the next GPU with `--enable-disaggregation`), each
half driven on its own stream; a step waits for its LM half only and its codec batch lands when it has finished,
up to two batches in flight (rust/src/driver/disagg.rs; the contract on made-up workers is tested in the crate,
serve/bench_tests.rs and driver/disagg_tests.rs). The audio is byte-identical to the whole engine's, on a CPU
(where the halves are two CPU engines and every batch lands right after its step) and on a GPU; the flag's
rules. `--async-engines` adds the LM lane: each step launched before the one before it is collected (the
scheduler plans with the earlier step's tokens still on the device); its audio is the same too."""

from __future__ import annotations

import pytest
import torch
from rust_helpers import cuda_bench_wavs, require_rt
from test_rust_replicas import _bench, _gpus, _rust_flags

from vox_serve.cli import CliError, build_config, check_flags, given_flags
from vox_serve.config import EngineConfig, ModelConfig, ServerConfig, VoxConfig
from vox_serve.engine.placement import codec_device, replica_config


@pytest.mark.parametrize("model", ["orpheus-tiny", "qwen3-tts-tiny"])
def test_overlapped_codec_makes_the_whole_engines_audio(tmp_path, model: str) -> None:
    require_rt()
    whole, _, log = _bench(tmp_path / "whole", model)
    assert "(codec half)" not in log
    assert list(whole) == ["bench-000.wav", "bench-001.wav"] and all(len(w) > 44 for w in whole.values())
    for name, extra in (("overlap", ("--overlap-detok",)), ("disagg", ("--overlap-detok", "--enable-disaggregation")),
                        ("async", ("--async-engines",))):
        overlapped, report, log = _bench(tmp_path / name, model, *extra)
        assert overlapped == whole, name
        assert log.count("(codec half)") == 1 and "shared codec lane" not in log, log[-2000:]
        # one device: the codec half is built first, so the LM half's KV cache is sized after its memory
        assert log.index("(codec half)") < log.index("(lm half)")
        assert [r["finish"] for r in report["phases"][0]["requests"]] == ["length", "length"]


def _overlap_config(dp_size: int) -> VoxConfig:
    return VoxConfig(model=ModelConfig(device="auto"), server=ServerConfig(dp_size=dp_size),
                     engine=EngineConfig(overlap_detok=True))


def test_each_replicas_codec_half_stays_on_the_replicas_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    _gpus(monkeypatch, 2)
    config = _overlap_config(2)
    assert config.engine.splits
    lms = [replica_config(config, i).model.device for i in range(2)]
    assert lms == ["cuda:0", "cuda:1"]
    assert [codec_device(lm, config) for lm in lms] == lms
    assert codec_device("cpu", config) == "cpu"
    with pytest.raises(RuntimeError, match="--dp-size 3 needs 3 GPUs"):
        replica_config(_overlap_config(3), 0)


def test_with_disaggregation_the_overlapped_codec_keeps_the_next_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    _gpus(monkeypatch, 4)
    paired = VoxConfig(model=ModelConfig(device="auto"),
                       engine=EngineConfig(overlap_detok=True, enable_disaggregation=True))
    assert codec_device("cuda:2", paired) == "cuda:3"


def test_the_rust_runtime_takes_overlap_detok_and_the_python_runtime_does_not() -> None:
    kept = _rust_flags("--overlap-detok", "--bench-requests", "2")
    assert build_config(kept, "rust").engine.overlap_detok
    assert not build_config(_rust_flags("--bench-requests", "2"), "rust").engine.overlap_detok
    with pytest.raises(CliError, match="--overlap-detok is not a flag of the python runtime"):
        check_flags(given_flags(["--overlap-detok"]), "python", rust_missing=False)
    for flag in ("--overlap-detok", "--async-engines"):
        with pytest.raises(CliError, match=f"--codec-gpu runs the replicas' codec halves .* {flag} collects"):
            _rust_flags(flag, "--codec-gpu", "0")
    assert build_config(_rust_flags("--async-engines", "--bench-requests", "2"), "rust").engine.splits
    kept = _rust_flags("--overlap-detok", "--enable-disaggregation", "--bench-requests", "2")
    assert build_config(kept, "rust").engine.overlap_detok
    for flag in ("--overlap-detok", "--async-engines"):  # the codec half on an SM partition of the replica's GPU
        assert build_config(_rust_flags(flag, "--codec-sms", "24"), "rust").engine.codec_sms == 24
    with pytest.raises(CliError, match="--device cpu has none"):
        _rust_flags("--overlap-detok", "--codec-sms", "16", "--device", "cpu")
    kept, warnings = check_flags(given_flags(["--overlap-detok"]), "python", rust_missing=True)
    assert "overlap_detok" not in kept and any("--overlap-detok exists only in the Rust runtime" in w
                                               for w in warnings)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")
@pytest.mark.parametrize("model", ["orpheus-tiny", "qwen3-tts-tiny"])
@pytest.mark.parametrize("flag", ["--overlap-detok", "--async-engines"])
def test_overlapped_codec_on_a_gpu_makes_the_whole_engines_audio(tmp_path, model: str, flag: str) -> None:
    require_rt()
    whole, _ = cuda_bench_wavs("rust", tmp_path / "whole", model)
    overlapped, stderr = cuda_bench_wavs("rust", tmp_path / "overlap", model, flag)
    assert "(codec half)" in stderr, stderr[-2000:]
    assert list(whole) == ["bench-000.wav", "bench-001.wav", "bench-002.wav"] and overlapped == whole


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")
@pytest.mark.parametrize("model", ["orpheus-tiny", "qwen3-tts-tiny"])
def test_overlapped_codec_on_an_sm_partition_makes_the_whole_engines_audio(tmp_path, model: str) -> None:
    """`--overlap-detok --codec-sms 16`: the codec half's graphs on a 16-SM partition of the replica's own GPU."""
    require_rt()
    whole, _ = cuda_bench_wavs("rust", tmp_path / "whole", model)
    overlapped, stderr = cuda_bench_wavs("rust", tmp_path / "part", model, "--overlap-detok", "--codec-sms", "16")
    assert "SM partition of 16 of the" in stderr, stderr[-2000:]
    assert list(whole) == ["bench-000.wav", "bench-001.wav", "bench-002.wav"] and overlapped == whole
