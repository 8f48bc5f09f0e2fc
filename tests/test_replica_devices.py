"""Where each --dp-size replica builds its engine (the GPU count is simulated, so this runs on CPU): replica i
on cuda:i; with --enable-disaggregation replica i's LM on cuda:2i and its codec on cuda:2i+1; too few GPUs
is a clear error, and CPU replicas share the CPU."""

from __future__ import annotations

import pytest
import torch

from vox_serve.config import EngineConfig, ModelConfig, ServerConfig, VoxConfig
from vox_serve.engine.placement import codec_device, replica_config


def _gpus(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def _config(device: str, dp_size: int, disaggregated: bool = False) -> VoxConfig:
    return VoxConfig(model=ModelConfig(device=device), server=ServerConfig(dp_size=dp_size),
                     engine=EngineConfig(enable_disaggregation=disaggregated))


@pytest.mark.parametrize("device", ["auto", "cuda"])
def test_replica_i_runs_on_gpu_i(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    _gpus(monkeypatch, 4)
    assert [replica_config(_config(device, 4), i).model.device for i in range(4)] == [f"cuda:{i}" for i in range(4)]


def test_disaggregated_replicas_take_gpu_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    _gpus(monkeypatch, 4)
    config = _config("auto", 2, disaggregated=True)
    lm = [replica_config(config, i).model.device for i in (0, 1)]
    assert lm == ["cuda:0", "cuda:2"]
    assert [codec_device(d, config) for d in lm] == ["cuda:1", "cuda:3"]


@pytest.mark.parametrize("gpus,dp,disaggregated,match", [
    (1, 2, False, r"--dp-size 2 needs 2 GPUs; 1 visible"),
    (3, 2, True, r"--dp-size 2 needs 4 GPUs \(an LM GPU and a codec GPU each: --enable-disaggregation\); 3 visible"),
])
def test_too_few_gpus_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, gpus: int, dp: int, disaggregated: bool,
                                       match: str) -> None:
    _gpus(monkeypatch, gpus)
    with pytest.raises(RuntimeError, match=match):
        replica_config(_config("auto", dp, disaggregated), 0)


def test_a_codec_needs_the_gpu_after_the_lm(monkeypatch: pytest.MonkeyPatch) -> None:
    from vox_serve.config import ConfigError

    _gpus(monkeypatch, 1)
    with pytest.raises(ConfigError, match=r"the codec on the GPU after the LM's \(cuda:1\); 1 GPU\(s\) visible"):
        codec_device("cuda", _config("cuda", 1, disaggregated=True))


def test_cpu_replicas_share_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    _gpus(monkeypatch, 0)
    for device in ("auto", "cpu"):
        config = _config(device, 2, disaggregated=True)
        assert {replica_config(config, i).model.device for i in (0, 1)} == {"cpu"}
    assert codec_device("cpu", _config("cpu", 1, disaggregated=True)) == "cpu"
