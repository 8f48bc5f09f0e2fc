"""Finding and reading checkpoints on local disk (no downloads, ever), and random init for dummy weights."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import torch
from torch import nn


class CheckpointError(ValueError):
    """A checkpoint that is missing or malformed; the message says what to do."""


def resolve_local(name_or_path: str) -> Path | None:
    """A local directory for a path or a Hugging Face id already in the local cache, else None."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    if "/" not in name_or_path or name_or_path.startswith(("/", ".")):
        return None
    cache = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", "~/.cache/huggingface"))
                 .expanduser() / "hub")
    snapshots = cache / f"models--{name_or_path.replace('/', '--')}" / "snapshots"
    if snapshots.is_dir():
        found = sorted(p for p in snapshots.iterdir() if (p / "config.json").exists())
        if found:
            return found[-1]
    return None


def checkpoint_dir(repo: str, load_format: str) -> Path | None:
    """The local directory of `repo`, or None for `--load-format dummy` (random weights).

    Raises CheckpointError when real weights are asked for and the checkpoint is not on local disk.
    """
    if load_format == "dummy":
        return None
    model_dir = resolve_local(repo)
    if model_dir is None:
        raise CheckpointError(
            f"checkpoint {repo!r} is not on local disk (vox-serve never downloads); pass a local "
            "directory as --model, or --load-format dummy for random weights of the real shapes"
        )
    return model_dir


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise CheckpointError(f"{path} is missing") from exc
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from exc


def iter_safetensors(directory: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of every `*.safetensors` file in the directory (sharded checkpoints included)."""
    from safetensors import safe_open

    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors files in {directory} (or use --load-format dummy)")
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                yield key, f.get_tensor(key)


def load_strict(model: torch.nn.Module, tensors: dict[str, torch.Tensor], what: str) -> None:
    """Copy `tensors` into `model`, failing on missing, unexpected or mis-shaped keys (names in the message)."""
    own = model.state_dict()
    missing = sorted(set(own) - set(tensors))
    unexpected = sorted(set(tensors) - set(own))
    wrong = sorted(k for k in set(own) & set(tensors) if own[k].shape != tensors[k].shape)
    if missing or unexpected or wrong:
        shapes = [f"{k} {tuple(tensors[k].shape)} != {tuple(own[k].shape)}" for k in wrong[:4]]
        raise CheckpointError(f"{what} does not match the model: missing {missing[:6]}, unexpected "
                              f"{unexpected[:6]}, wrong shapes {shapes}")
    model.load_state_dict(tensors, strict=True)


def init_random(module: nn.Module, seed: int, std: float = 0.02) -> None:
    """Deterministic random weights of the module's shapes: N(0, std) matrices, unit norms."""
    gens: dict[torch.device, torch.Generator] = {}
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0 if name.endswith("weight") else 0.0)
                continue
            if p.device not in gens:  # draw on the parameter's device: 3B weights in seconds on a GPU
                gens[p.device] = torch.Generator(device=p.device).manual_seed(seed)
            p.normal_(0.0, std, generator=gens[p.device])


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[dtype]


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise CheckpointError(f"--device {device}: CUDA is not available on this machine")
    return dev


class TensorPool:
    """A checkpoint's tensors by name, taken one by one, so a loader can say what was missing or left over."""

    def __init__(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.pending = dict(tensors)

    def take(self, name: str) -> torch.Tensor:
        if name not in self.pending:
            raise CheckpointError(f"checkpoint is missing {name}")
        return self.pending.pop(name)

    def take_prefix(self, prefix: str) -> dict[str, torch.Tensor]:
        """Every tensor under `prefix`, the prefix removed."""
        return {k[len(prefix):]: self.pending.pop(k) for k in [k for k in self.pending if k.startswith(prefix)]}

    def check_consumed(self) -> None:
        if self.pending:
            raise CheckpointError(f"checkpoint has unexpected weights {sorted(self.pending)[:8]}")


_LAYER_RENAMES = (("self_attn.o_proj", "o_proj"), ("mlp.down_proj", "down_proj"),
                  ("input_layernorm", "input_layernorm"), ("post_attention_layernorm", "post_attention_layernorm"))
_QK_NORMS = (("self_attn.q_norm", "q_norm"), ("self_attn.k_norm", "k_norm"))


def fused_decoder_weights(take: Callable[[str], torch.Tensor], src: str, dst: str, num_layers: int,
                          qk_norm: bool = False) -> dict[str, torch.Tensor]:
    """A transformers Llama/Qwen3 decoder stack (`{src}layers.N.self_attn.q_proj.weight`, ..., `{src}norm`) as
    `vox_serve.layers.decoder.DecoderLayer` weights under `dst`, q/k/v and gate/up fused."""
    values = {f"{dst}norm.weight": take(f"{src}norm.weight")}
    renames = _LAYER_RENAMES + (_QK_NORMS if qk_norm else ())
    for i in range(num_layers):
        s, d = f"{src}layers.{i}.", f"{dst}layers.{i}."
        values[d + "qkv_proj.weight"] = torch.cat([take(f"{s}self_attn.{p}_proj.weight") for p in "qkv"])
        values[d + "gate_up_proj.weight"] = torch.cat([take(f"{s}mlp.{p}_proj.weight") for p in ("gate", "up")])
        for theirs, ours in renames:
            values[f"{d}{ours}.weight"] = take(f"{s}{theirs}.weight")
    return values


def copy_weights(params: dict[str, nn.Parameter], values: dict[str, torch.Tensor]) -> None:
    """Copy `values` into the parameters of the same names; every parameter must get one, of its shape."""
    missing = sorted(set(params) - set(values))
    unknown = sorted(set(values) - set(params))
    if missing or unknown:
        raise CheckpointError(f"checkpoint is missing weights for {missing[:8]}; no parameter for {unknown[:8]}")
    with torch.no_grad():
        for name, value in values.items():
            if params[name].shape != value.shape:
                raise CheckpointError(f"{name}: checkpoint shape {tuple(value.shape)} != {tuple(params[name].shape)}")
            params[name].copy_(value)
