"""Zonos v0.1 `config.json`: backbone sizes, the prefix conditioners and the token ids.

Only the pure-transformer backbone is served (an empty `ssm_cfg`); a hybrid (Mamba) config is refused
with the reason. Fields the published transformer config carries but the reference's torch backbone
ignores (`causal`, `rotary_emb_interleaved`, `attn_layer_idx`, ...) are checked where a different value
would change the model.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from vox_serve.rt.checkpoint import CheckpointError

NUM_CODEBOOKS = 9
CODEBOOK_SIZE = 1024
HEAD_ROWS = 1025  # rows of each stored head: the 1024 codes and EOS
EMBED_ROWS = 1026  # rows of each code embedding: codes, EOS and the mask token
EOS_ID = CODEBOOK_SIZE
MASK_ID = CODEBOOK_SIZE + 1


class ConditionerKind(enum.Enum):
    PHONEMES = "EspeakPhonemeConditioner"
    PASSTHROUGH = "PassthroughConditioner"
    FOURIER = "FourierConditioner"
    INTEGER = "IntegerConditioner"


@dataclass(frozen=True)
class ConditionerSpec:
    """One prefix conditioner: each contributes rows to the prefix, in config order."""

    kind: ConditionerKind
    name: str
    cond_dim: int | None = None  # input width (Passthrough), default the model width
    input_dim: int = 1  # Fourier input width
    min_val: float = 0.0
    max_val: float = 1.0
    projection: str = "none"  # "none" | "linear" | "mlp"
    learned_uncond: bool = False  # a learned vector stands in when the input is missing

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ConditionerSpec:
        try:
            kind = ConditionerKind(d["type"])
        except (KeyError, ValueError) as exc:
            raise CheckpointError(f"prefix conditioner {d.get('name')!r}: unknown type {d.get('type')!r}") from exc
        defaults = (0, 512) if kind is ConditionerKind.INTEGER else (0.0, 1.0)  # the reference's defaults
        projection = d.get("projection", "none")
        if projection not in ("none", "linear", "mlp"):
            raise CheckpointError(f"prefix conditioner {d['name']!r}: unknown projection {projection!r}")
        return cls(kind=kind, name=d["name"], cond_dim=d.get("cond_dim"), input_dim=int(d.get("input_dim", 1)),
                   min_val=d.get("min_val", defaults[0]), max_val=d.get("max_val", defaults[1]),
                   projection=projection, learned_uncond=d.get("uncond_type", "none") == "learned")


@dataclass(frozen=True)
class ZonosConfig:
    d_model: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    mlp_dim: int  # `attn_mlp_d_intermediate`
    norm_eps: float
    conditioners: tuple[ConditionerSpec, ...]
    prefix_projection: str
    eos_token_id: int = 1024
    masked_token_id: int = 1025
    pad_vocab_to_multiple_of: int = 8

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def logits_width(self) -> int:
        """Width of the logits: the reference pads each head at load by `1025 % multiple` zero rows
        (1 for the default 8: 1026 wide); padded entries are forced to -inf."""
        m = self.pad_vocab_to_multiple_of
        return HEAD_ROWS + (HEAD_ROWS % m if m else 0)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ZonosConfig:
        try:
            bb, pc = d["backbone"], d["prefix_conditioner"]
            attn = bb["attn_cfg"]
            cfg = cls(d_model=bb["d_model"], num_layers=bb["n_layer"], num_heads=attn["num_heads"],
                      num_kv_heads=attn.get("num_heads_kv", attn["num_heads"]),
                      mlp_dim=bb["attn_mlp_d_intermediate"], norm_eps=bb.get("norm_epsilon", 1e-5),
                      conditioners=tuple(ConditionerSpec.from_dict(c) for c in pc["conditioners"]),
                      prefix_projection=pc.get("projection", "none"),
                      eos_token_id=d.get("eos_token_id", 1024), masked_token_id=d.get("masked_token_id", 1025),
                      pad_vocab_to_multiple_of=d.get("pad_vocab_to_multiple_of", 8))
        except KeyError as exc:
            raise CheckpointError(f"Zonos config.json is missing {exc}") from exc
        cfg._check(bb, attn)
        return cfg

    def _check(self, bb: dict[str, Any], attn: dict[str, Any]) -> None:
        if bb.get("ssm_cfg"):
            raise CheckpointError("Zonos config has an ssm_cfg (the hybrid Mamba model); only the transformer "
                                  "model (Zyphra/Zonos-v0.1-transformer) is supported")
        if bb.get("rms_norm") or bb.get("residual_in_fp32"):
            raise CheckpointError("Zonos config: rms_norm / residual_in_fp32 are not used by the transformer model")
        rotary = attn.get("rotary_emb_dim", self.head_dim)
        if rotary != self.head_dim:  # the reference's torch backbone rotates the whole head
            raise CheckpointError(f"Zonos config: rotary_emb_dim {rotary} != head dim {self.head_dim}")
        if attn.get("qkv_proj_bias") or attn.get("out_proj_bias") or attn.get("causal") is False:
            raise CheckpointError("Zonos config: attention biases / non-causal attention are not supported")
        if (self.eos_token_id, self.masked_token_id) != (EOS_ID, MASK_ID):
            raise CheckpointError(f"Zonos config: token ids eos {self.eos_token_id}, mask "
                                  f"{self.masked_token_id} (expected 1024, 1025)")
        if self.d_model % self.num_heads or self.num_heads % self.num_kv_heads:
            raise CheckpointError(f"Zonos config: d_model {self.d_model}, {self.num_heads} heads, "
                                  f"{self.num_kv_heads} KV heads do not divide")
        if not self.conditioners or self.conditioners[0].kind is not ConditionerKind.PHONEMES:
            raise CheckpointError("Zonos config: the first prefix conditioner must be the phoneme conditioner")
        if self.prefix_projection not in ("none", "linear", "mlp"):
            raise CheckpointError(f"Zonos config: unknown prefix projection {self.prefix_projection!r}")

    def conditioner(self, name: str) -> ConditionerSpec | None:
        return next((c for c in self.conditioners if c.name == name), None)


# The published Zyphra/Zonos-v0.1-transformer config (sizes from third-party copies of it).
ZONOS_TRANSFORMER_CONFIG: dict[str, Any] = {
    "backbone": {
        "d_model": 2048, "d_intermediate": 0, "attn_mlp_d_intermediate": 8192, "n_layer": 26, "ssm_cfg": {},
        "attn_layer_idx": list(range(26)),
        "attn_cfg": {"causal": True, "num_heads": 16, "num_heads_kv": 4, "rotary_emb_dim": 128,
                     "rotary_emb_interleaved": True, "qkv_proj_bias": False, "out_proj_bias": False},
        "rms_norm": False, "residual_in_fp32": False, "norm_epsilon": 1e-5,
    },
    "prefix_conditioner": {
        "conditioners": [
            {"type": "EspeakPhonemeConditioner", "name": "espeak"},
            {"type": "PassthroughConditioner", "name": "speaker", "cond_dim": 128, "uncond_type": "learned",
             "projection": "linear"},
            {"type": "FourierConditioner", "name": "emotion", "input_dim": 8, "uncond_type": "learned"},
            {"type": "FourierConditioner", "name": "fmax", "min_val": 0, "max_val": 24000, "uncond_type": "learned"},
            {"type": "FourierConditioner", "name": "pitch_std", "min_val": 0, "max_val": 400,
             "uncond_type": "learned"},
            {"type": "FourierConditioner", "name": "speaking_rate", "min_val": 0, "max_val": 40,
             "uncond_type": "learned"},
            {"type": "IntegerConditioner", "name": "language_id", "min_val": -1, "max_val": 126,
             "uncond_type": "learned"},
        ],
        "projection": "linear",
    },
    "eos_token_id": 1024,
    "masked_token_id": 1025,
}
