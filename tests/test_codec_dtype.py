"""--codec-dtype: Orpheus' SNAC in its own dtype; other models refuse one other than --dtype."""

from __future__ import annotations

import pytest
import torch

from vox_serve.cli import build_config, check_flags, given_flags
from vox_serve.codecs.snac import orpheus_frames_to_codes
from vox_serve.config import ConfigError
from vox_serve.engine.build import load_program


def _config(*argv: str):  # noqa: ANN202 - a VoxConfig
    return build_config(check_flags(given_flags(list(argv)), "python", True)[0], "python")


def test_orpheus_snac_takes_the_codec_dtype() -> None:
    base = ("--model", "orpheus-tiny", "--load-format", "dummy", "--device", "cpu", "--max-model-len", "256")
    default = load_program(_config(*base))
    assert next(default.snac.parameters()).dtype == torch.float32  # auto: the model's (float32 on a CPU)
    program = load_program(_config(*base, "--codec-dtype", "bfloat16"))
    assert next(program.snac.parameters()).dtype == torch.bfloat16
    assert next(program.lm.parameters()).dtype == torch.float32
    window = torch.randint(0, 4096, (1, 4, 7))
    with torch.no_grad():  # the same random weights, rounded: the same audio within bfloat16's error
        want = default.snac.decode(orpheus_frames_to_codes(window), keep=(2048, 4096))
        got = program.snac.decode(orpheus_frames_to_codes(window), keep=(2048, 4096)).float()
    assert ((got - want).norm() / want.norm()).item() < 0.05


@pytest.mark.parametrize("model", ["qwen3-tts-tiny", "csm-tiny"])
def test_other_models_refuse_a_codec_dtype_unlike_the_model(model: str) -> None:
    base = ("--model", model, "--load-format", "dummy", "--device", "cpu", "--max-model-len", "256")
    with pytest.raises(ConfigError, match="--codec-dtype"):
        load_program(_config(*base, "--codec-dtype", "bfloat16"))
    load_program(_config(*base, "--codec-dtype", "float32"))  # the model's own dtype is accepted
