"""Zonos request fields -> the prompt: espeak-ng phonemes, the speaker embedding, the prefix pair as vectors.

Runs in `preprocess` (in the replica's prompt pool, off the engine loop): phonemisation, the speaker model
on an uploaded clip, and the prefix conditioner (a few dozen rows). The prompt is the L prefix positions
(ids all absent, vectors = conditional | unconditional row) and delayed column 0 (all mask); the slot
fields are `cfg_scale`, the unified sampler's (linear, conf, quad) and `num_frames` (max_tokens - 8).
Field types and ranges are checked before, at the edge (`request_builder.normalise_fields`).
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
from vox_serve.voice_prompt import SAVED_VOICE_FIELD, VoicePrompt

DELAY_STEPS = NUM_CODEBOOKS - 1  # rows between a frame's codebook 0 and its codebook 8
MAX_SPEAKER_SECONDS = 60.0
SCALARS = ("fmax", "pitch_std", "speaking_rate")  # conditioning numbers (ranges: FIELD_SCHEMAS)
DEFAULTS = {"cfg_scale": 2.0, "linear": 0.0, "conf": 0.0, "quad": 0.0, "language": "en-us"}
NUM_EMOTIONS = 8


def _number(description: str, **bounds: float) -> dict[str, Any]:
    return {"type": "number", **bounds, "description": description}


# Zonos' own request fields (`ProgramMeta.field_schemas`): request_builder checks each value's type and range
# (and an array's length and items), the prompt builder the rest; the OpenAPI document and GET /info publish them.
FIELD_SCHEMAS: dict[str, dict[str, Any]] = {
    "cfg_scale": _number("Classifier-free guidance scale (1: the conditional logits alone).",
                         exclusiveMinimum=0, maximum=10),
    "fmax": _number("Highest frequency of the voice, Hz (conditioning).", minimum=0, maximum=24000),
    "pitch_std": _number("Pitch variation (standard deviation, Hz) to condition on.", minimum=0, maximum=400),
    "speaking_rate": _number("Speaking rate, phonemes per second, to condition on.", minimum=0, maximum=40),
    "linear": _number("Unified sampler: linear term (> 0 turns it on).", minimum=-2, maximum=2),
    "conf": _number("Unified sampler: entropy-scaled term.", minimum=-2, maximum=2),
    "quad": _number("Unified sampler: quadratic term.", minimum=-2, maximum=2),
    "emotion": {"type": "array", "minItems": NUM_EMOTIONS, "maxItems": NUM_EMOTIONS,
                "items": {"type": "number", "minimum": 0, "maximum": 1},
                "description": "8 emotion weights (happiness, sadness, disgust, fear, surprise, anger, other, "
                               "neutral), normalised to sum 1; in a form, comma-separated or JSON."},
}


def prefix_prompt(pair: torch.Tensor, *, cfg_scale: float, num_frames: int,
                  unified: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> Prompt:
    """pair [2, L, d] (conditional, unconditional prefix) -> the program's prompt of L + 1 positions."""
    length = pair.shape[1]
    ids = np.full((length + 1, NUM_CODEBOOKS), -1, dtype=np.int32)
    ids[length] = MASK_ID  # delayed column 0
    rows = torch.cat([pair[0], pair[1]], dim=-1).float().cpu().numpy()
    return Prompt.of(ids, {i: rows[i] for i in range(length)},
                     {"cfg_scale": [cfg_scale], "unified": list(unified), "num_frames": [num_frames]})


def _emotion(value: list[float]) -> list[float]:
    if not sum(value) > 0:
        raise FieldError("emotion", "needs a positive sum (the weights are normalised to sum 1)")
    return value


class ZonosPrompter:
    def __init__(self, lm: ZonosLM, speaker: ZonosSpeakerModel | None) -> None:
        self.lm, self.speaker = lm, speaker
        spec = lm.cfg.conditioner("speaker")
        self.speaker_dim = (spec.cond_dim or lm.cfg.d_model) if spec is not None else 0

    def speaker_vector(self, fields: dict[str, Any]) -> list[float] | None:
        """The 128-d speaker input: a saved voice's, or the speaker model's on an uploaded clip (`audio`);
        None without either (the learned unconditional speaker)."""
        saved, clip = fields.get(SAVED_VOICE_FIELD), fields.get("audio")
        if saved is not None:
            if clip is not None:
                raise FieldError("audio", "a saved voice brings its own speaker embedding; send one of them")
            if len(saved.speaker) != self.speaker_dim:
                raise FieldError("voice", f"the saved voice was made by another model (speaker embedding of "
                                          f"{len(saved.speaker)} values, this model takes {self.speaker_dim})")
            return list(saved.speaker)
        if clip is None:
            return None
        if self.speaker is None:
            raise FieldError("audio", "this Zonos model has no speaker model loaded")
        try:
            samples, rate = decode_audio(clip, MAX_SPEAKER_SECONDS)
        except ValueError as exc:
            raise FieldError("audio", str(exc)) from exc
        return self.speaker.speaker_vector(torch.from_numpy(samples), rate).tolist()

    def encode_voice(self, clip: bytes, ref_text: str | None) -> VoicePrompt:
        """A saved voice: the clip's speaker embedding (Zonos conditions on the embedding only)."""
        if ref_text:
            raise FieldError("ref_text", "Zonos takes a voice from the clip's speaker embedding only, without "
                                         "a transcript")
        return VoicePrompt(self.speaker_vector({"audio": clip}))

    def prompt(self, fields: dict[str, Any], default_max_tokens: int) -> Prompt:
        language = fields.get("language") or DEFAULTS["language"]
        try:
            ids = phonemes.phoneme_ids(phonemes.phonemize(fields["text"], language))
            language_id = phonemes.language_id(language)
        except ValueError as exc:
            raise FieldError("language", str(exc)) from exc
        values: dict[str, Any] = {name: fields[name] for name in SCALARS if name in fields}
        if "emotion" in fields:
            values["emotion"] = _emotion(fields["emotion"])
        values["speaker"] = self.speaker_vector(fields)
        max_tokens = int(fields.get("max_tokens", default_max_tokens))
        if max_tokens <= DELAY_STEPS:
            raise FieldError("max_tokens", f"must be > {DELAY_STEPS}: Zonos counts LM steps, and its first frame "
                                           f"is complete after {DELAY_STEPS + 1}")
        inputs = condition_inputs(self.lm.cfg, ids, language_id, values=values)
        with torch.inference_mode():
            pair = self.lm.prefix_conditioner.guidance_pair(inputs)
        unified = tuple(float(fields.get(k, DEFAULTS[k])) for k in ("linear", "conf", "quad"))
        return prefix_prompt(pair, cfg_scale=float(fields.get("cfg_scale", DEFAULTS["cfg_scale"])),
                             num_frames=max_tokens - DELAY_STEPS, unified=unified)
