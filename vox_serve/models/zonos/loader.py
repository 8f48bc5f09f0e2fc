"""Loading the Zonos LM from the published layout (`config.json` + `model.safetensors`), or dummy weights.

Strict in both directions: a key the model does not have, a missing key or a wrong shape fails with the
names (upstream's `from_local` fails on extra keys and keeps its random init for missing ones; a missing
weight here is always an error). The heads are stored with 1025 rows; the logits get their padding
column(s) at -inf when guided (`sampling.guided_logits`), as the reference's load-time padding does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from vox_serve.models.zonos.config import ZonosConfig
from vox_serve.models.zonos.lm import ZonosLM
from vox_serve.rt.checkpoint import init_random, iter_safetensors, load_strict, read_json


def load_zonos_lm(model_dir: Path | None, device: torch.device, dtype: torch.dtype, *, seed: int = 0,
                  config: dict[str, Any] | None = None) -> ZonosLM:
    """The LM of a checkpoint directory, or random weights of `config`'s shapes when model_dir is None."""
    if model_dir is None:
        if config is None:
            raise ValueError("dummy Zonos weights need a config")
        lm = ZonosLM(ZonosConfig.from_dict(config))
        init_random(lm, seed)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():  # the Fourier matrices are buffers, outside init_random's reach
            for name, buf in lm.named_buffers():
                if name.endswith(".weight"):
                    buf.copy_(torch.randn(buf.shape, generator=gen))
        return lm.to(device=device, dtype=dtype).eval()
    cfg = ZonosConfig.from_dict(config if config is not None else read_json(model_dir / "config.json"))
    lm = ZonosLM(cfg)
    load_strict(lm, dict(iter_safetensors(model_dir)), f"Zonos checkpoint {model_dir}")
    return lm.to(device=device, dtype=dtype).eval()
