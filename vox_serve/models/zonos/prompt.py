"""Zonos request fields -> the prompt: espeak-ng phonemes, the speaker embedding, the prefix pair as vectors.

Runs in `preprocess` (in the replica's prompt pool, off the engine loop): phonemisation, the speaker model
on an uploaded clip, and the prefix conditioner (a few dozen rows). The prompt is the L prefix positions
(ids all absent, vectors = conditional | unconditional row) and delayed column 0 (all mask); the slot
fields are `cfg_scale`, the unified sampler's (linear, conf, quad) and `num_frames` (max_tokens - 8).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from vox_serve.audio_input import decode_audio
from vox_serve.core.request import Prompt
from vox_serve.models.zonos import phonemes
from vox_serve.models.zonos.conditioning import condition_inputs
from vox_serve.models.zonos.config import MASK_ID, NUM_CODEBOOKS
from vox_serve.models.zonos.lm import ZonosLM
from vox_serve.models.zonos.speaker import ZonosSpeakerModel
from vox_serve.request_builder import FieldError

DELAY_STEPS = NUM_CODEBOOKS - 1  # rows between a frame's codebook 0 and its codebook 8
MAX_SPEAKER_SECONDS = 60.0
SCALARS = {"fmax": (0.0, 24000.0), "pitch_std": (0.0, 400.0), "speaking_rate": (0.0, 40.0)}
DEFAULTS = {"cfg_scale": 2.0, "linear": 0.0, "conf": 0.0, "quad": 0.0, "language": "en-us"}


def prefix_prompt(pair: torch.Tensor, *, cfg_scale: float, num_frames: int,
                  unified: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> Prompt:
    """pair [2, L, d] (conditional, unconditional prefix) -> the program's prompt of L + 1 positions."""
    length = pair.shape[1]
    ids = np.full((length + 1, NUM_CODEBOOKS), -1, dtype=np.int32)
    ids[length] = MASK_ID  # delayed column 0
    rows = torch.cat([pair[0], pair[1]], dim=-1).float().cpu().numpy()
    return Prompt.of(ids, {i: rows[i] for i in range(length)},
                     {"cfg_scale": [cfg_scale], "unified": list(unified), "num_frames": [num_frames]})


def _float(fields: dict[str, Any], name: str, lo: float, hi: float) -> float | None:
    value = fields.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise FieldError(name, f"must be a number in [{lo:g}, {hi:g}]")
    return float(value)


def emotion(value: Any) -> list[float]:
    """The 8 emotion weights (happiness, sadness, disgust, fear, surprise, anger, other, neutral)."""
    if (not isinstance(value, list | tuple) or len(value) != 8
            or not all(isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v <= 1 for v in value)
            or not sum(value) > 0):
        raise FieldError("emotion", "must be 8 numbers in [0, 1] with a positive sum (happiness, sadness, disgust, "
                                    "fear, surprise, anger, other, neutral)")
    return [float(v) for v in value]


class ZonosPrompter:
    def __init__(self, lm: ZonosLM, speaker: ZonosSpeakerModel | None) -> None:
        self.lm, self.speaker = lm, speaker

    def speaker_vector(self, fields: dict[str, Any]) -> list[float] | None:
        """The 128-d speaker input from an uploaded clip (`audio`), or None (the learned unconditional one)."""
        clip = fields.get("audio")
        if clip is None:
            return None
        if self.speaker is None:
            raise FieldError("audio", "this Zonos model has no speaker model loaded")
        try:
            samples, rate = decode_audio(clip, MAX_SPEAKER_SECONDS)
        except ValueError as exc:
            raise FieldError("audio", str(exc)) from exc
        return self.speaker.speaker_vector(torch.from_numpy(samples), rate).tolist()

    def prompt(self, fields: dict[str, Any], default_max_tokens: int) -> Prompt:
        language = fields.get("language") or DEFAULTS["language"]
        try:
            ids = phonemes.phoneme_ids(phonemes.phonemize(fields["text"], language))
            language_id = phonemes.language_id(language)
        except ValueError as exc:
            raise FieldError("language", str(exc)) from exc
        values: dict[str, Any] = {name: v for name, (lo, hi) in SCALARS.items()
                                  if (v := _float(fields, name, lo, hi)) is not None}
        if fields.get("emotion") is not None:
            values["emotion"] = emotion(fields["emotion"])
        values["speaker"] = self.speaker_vector(fields)
        cfg_scale = _float(fields, "cfg_scale", 0.0, 10.0)
        max_tokens = int(fields.get("max_tokens", default_max_tokens))
        if max_tokens <= DELAY_STEPS:
            raise FieldError("max_tokens", f"must be > {DELAY_STEPS}: Zonos counts LM steps, and its first frame "
                                           f"is complete after {DELAY_STEPS + 1}")
        inputs = condition_inputs(self.lm.cfg, ids, language_id, values=values)
        with torch.inference_mode():
            pair = self.lm.prefix_conditioner.guidance_pair(inputs)
        unified = tuple(_float(fields, k, 0.0, 10.0) or 0.0 for k in ("linear", "conf", "quad"))
        return prefix_prompt(pair, cfg_scale=DEFAULTS["cfg_scale"] if cfg_scale is None else cfg_scale,
                             num_frames=max_tokens - DELAY_STEPS, unified=unified)
