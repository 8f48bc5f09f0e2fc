"""Where each replica's engine runs (`--dp-size N`, `--enable-disaggregation`, `--codec-gpu G`,
`--overlap-detok`).

Replica i runs on GPU i. With `--enable-disaggregation` it is split over the pair of GPUs 2i (its LM) and
2i + 1 (its codec; engine/disagg.py). With `--codec-gpu G` (Rust runtime) its LM runs on GPU i and its
codec half on GPU G, the codec halves of every replica on the same GPU, where they take turns on a codec
lane (rust/src/driver/codec_lane.rs). With `--overlap-detok` alone (Rust runtime) both halves stay on GPU i,
each driven on its own stream, so that a step's codec batch runs while its prefill and decode do. CPU
replicas share the CPU, and there a codec half is a second CPU engine (so CI checks the split and the lane
without GPUs).
"""

from __future__ import annotations

from dataclasses import replace

from vox_serve.config import ConfigError, VoxConfig


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def replica_config(config: VoxConfig, replica: int) -> VoxConfig:
    """The config of replica `replica` of `--dp-size`: its LM device (the codec half's follows from it,
    `codec_device`)."""
    device, dp_size, codec_gpu = config.model.device, config.server.dp_size, config.engine.codec_gpu
    if device == "cpu" or device.startswith("cuda:"):
        return config
    per_replica = 2 if config.engine.enable_disaggregation else 1
    visible = _visible_gpus()
    needed = max(dp_size * per_replica, 0 if codec_gpu is None else codec_gpu + 1)
    if device == "auto" and not visible:
        device = "cpu"
    elif visible < needed:
        what = " (an LM GPU and a codec GPU each: --enable-disaggregation)" if per_replica == 2 else ""
        if codec_gpu is not None:
            what = f" (LM GPUs 0..{dp_size - 1} and codec GPU {codec_gpu}: --codec-gpu)"
        raise RuntimeError(f"--dp-size {dp_size} needs {needed} GPUs{what}; {visible} visible")
    else:
        device = f"cuda:{replica * per_replica}"
    return replace(config, model=replace(config.model, device=device))


def codec_device(lm_device: str, config: VoxConfig) -> str:
    """The device of a split engine's codec half: GPU G with `--codec-gpu G`, the GPU after the LM's with
    `--enable-disaggregation`, else (`--overlap-detok`, `--async-engines`) the LM's own; the CPU for a CPU LM."""
    if not lm_device.startswith("cuda"):
        return lm_device
    if config.engine.codec_gpu is None and not config.engine.enable_disaggregation:
        return lm_device
    visible = _visible_gpus()
    if config.engine.codec_gpu is not None:
        if config.engine.codec_gpu >= visible:
            raise ConfigError(f"--codec-gpu {config.engine.codec_gpu}: {visible} GPU(s) visible")
        return f"cuda:{config.engine.codec_gpu}"
    import torch

    index = torch.cuda.current_device() if lm_device == "cuda" else int(lm_device.split(":")[1])
    if index + 1 >= visible:
        raise ConfigError(f"--enable-disaggregation runs the codec on the GPU after the LM's (cuda:{index + 1}); "
                          f"{visible} GPU(s) visible")
    return f"cuda:{index + 1}"
