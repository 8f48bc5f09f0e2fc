"""The Zonos prefix conditioner: per-request inputs -> the prefix rows the LM reads before any code.

Rows in config order: the phoneme ids (one row each), then one row per other conditioner (speaker,
emotion, fmax, pitch_std, speaking_rate, language_id in the published model). A given input goes through
its conditioner (and the conditioner's own projection); a missing one is replaced by the conditioner's
learned unconditional vector, unprojected. The concatenated rows then pass the prefix projection and a
LayerNorm. Classifier-free guidance pairs each request with an unconditional prefix that keeps only the
inputs whose conditioner has no learned vector (the phonemes).

Runs once per request at admission (a few dozen rows), not in the generation steps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from vox_serve.models.zonos.config import ConditionerKind, ConditionerSpec, ZonosConfig
from vox_serve.models.zonos.phonemes import NUM_PHONEME_IDS


@dataclass(frozen=True)
class ConditionInputs:
    """One request's conditioning: phoneme ids and the other conditioners' values by name.

    values[name] is a flat float sequence of the conditioner's input width (speaker: 128, emotion: 8,
    scalars: 1, language_id: the integer id); a name that is absent takes the unconditional vector.
    """

    phoneme_ids: tuple[int, ...]
    values: Mapping[str, tuple[float, ...]] = field(default_factory=dict)


def _projection(kind: str, cond_dim: int, dim: int) -> nn.Module:
    if kind == "linear":
        return nn.Linear(cond_dim, dim)
    if kind == "mlp":
        return nn.Sequential(nn.Linear(cond_dim, dim), nn.SiLU(), nn.Linear(dim, dim))
    return nn.Identity()


class Conditioner(nn.Module):
    """Base: `encode` maps an input to rows [n, cond_dim]; `project` maps them to the model width."""

    def __init__(self, spec: ConditionerSpec, dim: int) -> None:
        super().__init__()
        self.spec = spec
        self.cond_dim = spec.cond_dim or dim
        self.project = _projection(spec.projection, self.cond_dim, dim)
        if spec.learned_uncond:
            self.uncond_vector = nn.Parameter(torch.zeros(dim))

    def encode(self, value: Tensor) -> Tensor:
        """value: float32 (or int64 phoneme ids) on the module's device."""
        raise NotImplementedError

    def uncond_dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def rows(self, value: Tensor | None) -> Tensor:
        """value (the input, on the module's device) or None -> [n, dim]."""
        if value is None:
            if not self.spec.learned_uncond:
                raise ValueError(f"conditioning input {self.spec.name!r} is required")
            return self.uncond_vector[None]
        return self.project(self.encode(value))


class PhonemeConditioner(Conditioner):
    def __init__(self, spec: ConditionerSpec, dim: int) -> None:
        super().__init__(spec, dim)
        self.phoneme_embedder = nn.Embedding(NUM_PHONEME_IDS, dim)

    def encode(self, value: Tensor) -> Tensor:
        return self.phoneme_embedder(value.long())


class PassthroughConditioner(Conditioner):
    def encode(self, value: Tensor) -> Tensor:
        if value.numel() != self.cond_dim:
            raise ValueError(f"conditioning input {self.spec.name!r} needs {self.cond_dim} values, got {value.numel()}")
        return value.reshape(1, self.cond_dim).to(self.uncond_dtype())


class FourierConditioner(Conditioner):
    """[cos, sin] of 2 pi * normalised x @ W^T, W a fixed random matrix stored in the checkpoint."""

    def __init__(self, spec: ConditionerSpec, dim: int) -> None:
        super().__init__(spec, dim)
        if dim % 2:
            raise ValueError(f"Fourier conditioner {spec.name!r} needs an even width, got {dim}")
        self.register_buffer("weight", torch.zeros(dim // 2, spec.input_dim))

    def encode(self, value: Tensor) -> Tensor:
        spec = self.spec
        if value.numel() != spec.input_dim:
            raise ValueError(f"conditioning input {spec.name!r} needs {spec.input_dim} values, got {value.numel()}")
        x = (value.reshape(1, spec.input_dim) - spec.min_val) / (spec.max_val - spec.min_val)
        f = (2 * math.pi * x.to(self.weight.dtype)) @ self.weight.T
        return torch.cat([f.cos(), f.sin()], dim=-1)


class IntegerConditioner(Conditioner):
    def __init__(self, spec: ConditionerSpec, dim: int) -> None:
        super().__init__(spec, dim)
        self.int_embedder = nn.Embedding(int(spec.max_val - spec.min_val + 1), dim)

    def encode(self, value: Tensor) -> Tensor:
        index = value.reshape(1).long() - int(self.spec.min_val)
        if not 0 <= int(index) < self.int_embedder.num_embeddings:
            raise ValueError(f"conditioning input {self.spec.name!r}: {int(value.reshape(()))} is outside "
                             f"[{int(self.spec.min_val)}, {int(self.spec.max_val)}]")
        return self.int_embedder(index)


_CONDITIONERS: dict[ConditionerKind, type[Conditioner]] = {
    ConditionerKind.PHONEMES: PhonemeConditioner, ConditionerKind.PASSTHROUGH: PassthroughConditioner,
    ConditionerKind.FOURIER: FourierConditioner, ConditionerKind.INTEGER: IntegerConditioner,
}


class PrefixConditioner(nn.Module):
    def __init__(self, cfg: ZonosConfig) -> None:
        super().__init__()
        dim = cfg.d_model
        self.conditioners = nn.ModuleList(_CONDITIONERS[spec.kind](spec, dim) for spec in cfg.conditioners)
        self.project = _projection(cfg.prefix_projection, dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, inputs: ConditionInputs) -> Tensor:
        """One request's prefix [num_prefix_rows(inputs), d] in the module's dtype."""
        device = self.norm.weight.device
        rows = []
        for cond in self.conditioners:
            if cond.spec.kind is ConditionerKind.PHONEMES:
                value = torch.tensor(inputs.phoneme_ids, dtype=torch.long, device=device)
            elif cond.spec.name in inputs.values:
                value = torch.tensor(inputs.values[cond.spec.name], dtype=torch.float32, device=device)
            else:
                value = None
            rows.append(cond.rows(value))
        return self.norm(self.project(torch.cat(rows, dim=0)))

    def unconditional(self, inputs: ConditionInputs) -> ConditionInputs:
        """The guidance partner: only the inputs that have no learned unconditional vector (the phonemes)."""
        keep = {c.spec.name for c in self.conditioners if not c.spec.learned_uncond}
        return ConditionInputs(inputs.phoneme_ids, {k: v for k, v in inputs.values.items() if k in keep})

    def guidance_pair(self, inputs: ConditionInputs) -> Tensor:
        """[2, rows, d]: the conditional prefix and the unconditional one (same length)."""
        return torch.stack([self(inputs), self(self.unconditional(inputs))])


def num_prefix_rows(cfg: ZonosConfig, inputs: ConditionInputs) -> int:
    """Prefix length of a request: its phonemes plus one row per other conditioner."""
    return len(inputs.phoneme_ids) + len(cfg.conditioners) - 1


# The reference's `make_cond_dict` defaults (emotion: happiness, sadness, disgust, fear, surprise, anger,
# other, neutral; normalised to sum 1).
DEFAULT_CONDITIONS: dict[str, tuple[float, ...]] = {
    "emotion": (0.3077, 0.0256, 0.0256, 0.0256, 0.0256, 0.0256, 0.2564, 0.3077),
    "fmax": (22050.0,), "pitch_std": (20.0,), "speaking_rate": (15.0,),
}


def condition_inputs(cfg: ZonosConfig, phoneme_ids: list[int], language_id: int, *,
                     values: Mapping[str, float | list[float] | None] | None = None,
                     unconditional: frozenset[str] = frozenset()) -> ConditionInputs:
    """A request's conditioning as the reference's `make_cond_dict` builds it.

    values: conditioner name -> value (a float, or a list for speaker / emotion); a name left out takes
    the reference's default, None or a name in `unconditional` the learned unconditional vector (the
    speaker is unconditional unless given). Emotion is normalised to sum 1 in float32, as upstream.
    """
    given = {**DEFAULT_CONDITIONS, "language_id": (float(language_id),), **(values or {})}
    out: dict[str, tuple[float, ...]] = {}
    for spec in cfg.conditioners[1:]:
        value = given.get(spec.name)
        if value is None or spec.name in unconditional:
            if not spec.learned_uncond:
                raise ValueError(f"conditioning input {spec.name!r} is required by this model")
            continue
        t = torch.tensor(value, dtype=torch.float32).reshape(-1)
        if spec.name == "emotion":
            if not t.sum() > 0:
                raise ValueError(f"emotion {list(value)} needs a positive sum (it is normalised to 1)")
            t = t / t.sum()
        out[spec.name] = tuple(t.tolist())
    return ConditionInputs(tuple(phoneme_ids), out)
