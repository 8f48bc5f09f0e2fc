"""Weight norm folded into plain weights at load time, for every layout checkpoints use."""

from __future__ import annotations

import torch
from torch import Tensor

WEIGHT_NORM_PAIRS = ((".weight_g", ".weight_v"),
                     (".parametrizations.weight.original0", ".parametrizations.weight.original1"))


def fuse_weight_norm(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """Replace each (g, v) pair by ``<base>.weight = g * v / ||v||``; other keys pass through.

    The norm runs over the dims where g has size 1, so weight norm over dim 0 (torch's default), another
    dim or the whole tensor all fold correctly; a g stored flat ([C]) is taken as dim 0. An unpaired g or v
    is left as it is (the loader then reports it).
    """
    out = dict(sd)
    for key in sd:
        for g_sfx, v_sfx in WEIGHT_NORM_PAIRS:
            base = key[: -len(g_sfx)]
            if not (key.endswith(g_sfx) and base + v_sfx in sd):
                continue
            g, v = out.pop(key).double(), out.pop(base + v_sfx)
            if g.dim() != v.dim():
                g = g.reshape(-1, *[1] * (v.dim() - 1))
            dims = [i for i in range(v.dim()) if g.shape[i] == 1]
            norm = torch.linalg.vector_norm(v.double(), dim=dims, keepdim=True)
            out[base + ".weight"] = (v.double() * (g / norm)).to(v.dtype)
    return out
