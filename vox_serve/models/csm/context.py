"""The per-request hook that turns context turns' clips into codes with Mimi's encoder (once per request,
off the per-step path; the program runs it before `prompt.build_prompt`)."""

from __future__ import annotations

import dataclasses

import torch

from vox_serve.audio_input import decode_audio, resample
from vox_serve.codecs.mimi.encoder import MimiEncoder
from vox_serve.models.csm.prompt import MAX_CONTEXT_SECONDS, ContextTurn, CsmFields
from vox_serve.request_builder import FieldError


def encode_context(encoder: MimiEncoder, fields: CsmFields) -> CsmFields:
    """`fields` with every context clip replaced by its codes [frames][codebooks]; FieldError naming the clip."""
    turns = tuple(_encoded(encoder, f"context[{i}].audio", t) if t.needs_encoding else t
                  for i, t in enumerate(fields.context))
    return dataclasses.replace(fields, context=turns)


def _encoded(encoder: MimiEncoder, name: str, turn: ContextTurn) -> ContextTurn:
    rate = encoder.config.sampling_rate
    longest = min(MAX_CONTEXT_SECONDS, encoder.max_samples / rate)
    try:
        samples, clip_rate = decode_audio(turn.audio, longest)  # decodes no more than a clip may hold
    except ValueError as exc:
        raise FieldError(name, str(exc)) from exc
    seconds = len(samples) / clip_rate
    if not 0 < seconds <= longest:
        raise FieldError(name, f"the clip is {seconds:.2f} s long; it must be longer than 0 and at most {longest:g} s")
    audio = resample(torch.from_numpy(samples), clip_rate, rate)
    with torch.inference_mode():
        codes = encoder(audio)
    return dataclasses.replace(turn, audio=None, codes=tuple(tuple(frame) for frame in codes.tolist()))
