"""The CSM-1B program: the backbone over 33 input columns, the depth decoder inside the LM stages, Mimi per slot.

Arena input layout (`input_ids [T, K + 1]`, K = 32 codebooks; -1 = absent): columns 0..K-1 the codebooks of
an audio position (a context frame, or a generated frame, which the stage reads from the slot's history),
column K the text id of a text position. The input embedding is the masked sum over the present columns
(`layers.CsmBackbone.embed`), as transformers' `CsmForConditionalGeneration` embeds its inputs.

One LM step ends with whole frames: the backbone's `lm_head` samples codebook 0 from the last hidden state
(with the request's sampling parameters and repetition window), then the depth decoder samples codebooks
1..31 in the same stage, 31 sub-steps over its static KV cache (allocated in `allocate` at the larger of the
decode batch and the prefill sequence count), with the request's `depth_decoder_*` parameters (a declared
slot field, set at admission). Codebook k of generated frame g draws its random numbers at offset
`g * 32 + k` of the request's seed. A request whose `temperature` is 0 is greedy in every codebook (so
`--greedy` is too); `depth_decoder_temperature` 0 makes only codebooks 1..31 greedy.

Stop (the reference's rule): a frame whose codebooks 0..30 are all `codebook_eos` (0) ends the request and is
kept; the reference cuts the audio at the first all-zero frame, so the stop frame is AUDIO_STOP (decoded)
when its codebook 31 is non-zero and STOP (no audio) when it is all zero. Codes are sampled over the whole
2051-id vocabulary as the reference does; ids past Mimi's 2048 codes (never produced by trained weights) are
clamped in the codec stage, where the reference's Mimi would fail on them.

Codec stage: Mimi is causal, so chunks are consecutive frames (no lookback or lookahead) decoded through
each request's streaming state in a `CodecSlots` pool (one row per request slot, and the scratch slot's for
padded rows), reset when a request is admitted.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from vox_serve.codecs.slots import CodecSlots
from vox_serve.core.meta import EngineLimits, ProgramLayout, ProgramMeta, SlotField, StopRule
from vox_serve.core.request import OutKind, Prompt
from vox_serve.layers.decoder import paged_attend
from vox_serve.models.csm.context import encode_context
from vox_serve.models.csm.layers import sample_frame, stop_rows
from vox_serve.models.csm.prompt import (
    MAX_CONTEXT_SECONDS,
    PromptIds,
    build_prompt,
    field_schemas,
    parse_fields,
)
from vox_serve.request_builder import FieldError
from vox_serve.rt import kernels
from vox_serve.rt.codec_window import CodecWindow
from vox_serve.rt.lm_batch import LmBatch, LmSample
from vox_serve.rt.program import Program

if TYPE_CHECKING:  # the loader builds this program
    from vox_serve.models.csm.loader import CsmModules

DEPTH_FIELDS = ("depth_decoder_temperature", "depth_decoder_top_k", "depth_decoder_top_p")
DEPTH_SAMPLING = SlotField("depth_sampling", (len(DEPTH_FIELDS),))  # per slot: temperature, top_k, top_p
# The reference's defaults: transformers' CSM conversion writes these into generation_config.json (its
# `max_new_tokens` 125: 10 s of audio); a checkpoint's own generation_config.json overrides them.
DEFAULT_SAMPLING: dict[str, Any] = {
    "temperature": 0.9, "top_k": 50, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0,
    "repetition_window": 64, "max_tokens": 125,
    "depth_decoder_temperature": 0.9, "depth_decoder_top_k": 50, "depth_decoder_top_p": 1.0,
}
COMMON_FIELDS = ("text", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens", "seed",
                 "ignore_eos", "streaming")
MAX_TEXT_CHARS = 2000
FRAMES_PER_CHUNK = 10  # 0.8 s of 12.5 Hz frames


def csm_meta(name: str, ids: PromptIds, max_model_len: int, sample_rate: int, samples_per_frame: int,
             sampling: dict[str, Any]) -> ProgramMeta:
    k = ids.num_codebooks
    schemas = field_schemas(ids, MAX_TEXT_CHARS)
    stop = StopRule(token=ids.codebook_eos, keeps_frame=True,
                    description=f"a frame whose codebooks 0..{k - 2} are all {ids.codebook_eos} ends the request; "
                                f"it is audio unless codebook {k - 1} is {ids.codebook_eos} too")
    return ProgramMeta(
        name=name, sample_rate=sample_rate, input_columns=k + 1, codes_per_step=k, codes_per_frame=k,
        samples_per_frame=samples_per_frame, frames_per_chunk=FRAMES_PER_CHUNK, codec_lookback_frames=0,
        codec_lookahead_frames=0, skip_leading_frames=0, max_model_len=max_model_len, max_text_chars=MAX_TEXT_CHARS,
        stop_rule=stop, default_sampling=dict(sampling), accepted_fields=COMMON_FIELDS + tuple(schemas),
        field_schemas=schemas, stateful_codec=True, layout=ProgramLayout(slot_fields=(DEPTH_SAMPLING,)),
        extra={"input_layout": f"columns 0..{k - 1}: codebooks (-1 absent); column {k}: text id (-1 absent)",
               "context_audio_seconds": MAX_CONTEXT_SECONDS},
    )


def sampling_defaults(generation_config: dict[str, Any]) -> dict[str, Any]:
    """DEFAULT_SAMPLING with a checkpoint's generation_config.json values where present (`do_sample` false
    makes that part greedy)."""
    given = {key: value for key, value in generation_config.items() if value is not None}
    out = dict(DEFAULT_SAMPLING)
    for prefix in ("", "depth_decoder_"):
        out.update({prefix + key: given[prefix + key] for key in ("temperature", "top_k", "top_p")
                    if prefix + key in given})
        if given.get(prefix + "do_sample") is False:
            out[prefix + "temperature"] = 0.0
    if "repetition_penalty" in given:
        out["repetition_penalty"] = given["repetition_penalty"]
    if "max_new_tokens" in given:
        out["max_tokens"] = given["max_new_tokens"]
    return out


class CsmProgram(Program):
    def __init__(self, modules: CsmModules, tokenizer: Any, ids: PromptIds, meta: ProgramMeta,
                 device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(device, dtype)
        self.m, self.tokenizer, self.ids, self.meta = modules, tokenizer, ids, meta
        self.codec_slots: CodecSlots | None = None  # Mimi's streaming state per slot, sized in allocate
        self.codebook_eos = modules.config.ids.codebook_eos

    def kv_geometry(self) -> tuple[int, int, int, int]:
        b = self.m.config.backbone
        return b.num_layers, b.num_heads, b.num_kv_heads, b.head_dim

    def allocate(self, limits: EngineLimits) -> None:
        self.m.depth.allocate(max(limits.max_batch, limits.max_prefill_seqs))

    def allocate_codec(self, limits: EngineLimits) -> None:
        self.codec_slots = CodecSlots(self.m.codec, limits.slots + 1)

    def state_bytes(self) -> int:
        lm = self.m.depth.memory_bytes() if self.half.has_lm else 0
        return super().state_bytes() + lm + (self.codec_slots.memory_bytes() if self.half.has_codec else 0)

    def codec_modules(self) -> list[torch.nn.Module]:
        return [self.m.codec]

    def quantizable_modules(self) -> list[torch.nn.Module]:
        return [self.m.backbone, self.m.depth]

    def weights_bytes(self) -> int:
        modules = (self.m.backbone, self.m.depth, self.m.codec, self.m.codec_encoder)
        return sum(p.numel() * p.element_size() for m in modules for p in m.parameters())

    # ---- prompts (off the step path: the replica's prompt pool) ------------------------------------
    def preprocess(self, fields: dict[str, Any]) -> Prompt:
        """Parse the fields, encode context clips with Mimi's encoder, build the rows; FieldError naming the
        field (`context[1].codes[0]`, `context[0].audio`, ...)."""
        parsed = encode_context(self.m.codec_encoder, parse_fields(fields, self.ids))
        rows = build_prompt(self.tokenizer, self.ids, parsed)
        if len(rows) >= self.meta.max_model_len:
            where = "context" if parsed.context else "text"
            raise FieldError(where, f"the prompt is {len(rows)} positions (context audio frames included); the model "
                                    f"takes fewer than {self.meta.max_model_len} (--max-model-len)")
        temperature, top_k, top_p = (fields.get(name, self.meta.default_sampling[name]) for name in DEPTH_FIELDS)
        # a top-k past the vocabulary keeps every id, as 0 does; bounded, it stays exact in the float32 slot field
        depth = [temperature, min(top_k, self.m.config.codebook_vocab), top_p]
        return Prompt.of(rows, conditioning={DEPTH_SAMPLING.name: np.asarray(depth, dtype=np.float32)})

    def warm_up_eager(self) -> None:
        """The context encoder at its longest clip, so the KV cache is sized after its activations."""
        enc = self.m.codec_encoder
        samples = min(int(MAX_CONTEXT_SECONDS * enc.config.sampling_rate), enc.max_samples)
        with torch.inference_mode():
            enc(torch.zeros(samples, device=self.device))

    # ---- LM stage ------------------------------------------------------------------------------------
    def lm_step(self, b: LmBatch) -> LmSample:
        """The backbone over the launch's tokens, then a whole frame per row (codebook 0, then the depth
        decoder's 31), and its kind."""
        hidden = self.m.backbone(b.ids, b.positions, paged_attend(self.attention, b.attention))
        hidden = hidden[b.logits_index]  # [n, hidden]
        depth = self._depth_sampling(b)

        def sample(logits: Tensor, codebook: int) -> Tensor:
            if codebook == 0:
                return kernels.sample(logits, self._offset(b.sampling, b, 0), b.history)
            return kernels.sample(logits, self._offset(depth, b, codebook))

        frame = sample_frame(self.m.backbone, self.m.depth, hidden, sample)  # [n, K]
        stops = b.allow_stop & stop_rows(frame, self.codebook_eos)
        silent = frame[:, -1] == self.codebook_eos
        kind = torch.where(stops, torch.where(silent, int(OutKind.STOP), int(OutKind.AUDIO_STOP)), int(OutKind.AUDIO))
        return LmSample(tokens=frame, codes=frame, kind=kind)

    def _depth_sampling(self, b: LmBatch) -> kernels.SamplingTensors:
        """The rows' depth-decoder parameters (slot field), greedy where the request's temperature is 0."""
        s, params = b.sampling, b.state[DEPTH_SAMPLING.name][b.slot]  # [n, 3]
        temperature = torch.where(s.temperature == 0, 0.0, params[:, 0])
        return kernels.SamplingTensors(temperature=temperature, top_k=params[:, 1].long(), top_p=params[:, 2],
                                       min_p=torch.zeros_like(temperature),
                                       repetition_penalty=torch.ones_like(temperature), seed=s.seed, offset=s.offset)

    def _offset(self, params: kernels.SamplingTensors, b: LmBatch, codebook: int) -> kernels.SamplingTensors:
        """`params` drawing at offset gen_index * K + codebook (each codebook its own random numbers)."""
        return dataclasses.replace(params, offset=b.gen_index * self.ids.num_codebooks + codebook)

    # ---- codec ---------------------------------------------------------------------------------------
    def decode_audio(self, window: CodecWindow, frames: int) -> Tensor:
        codes = window.codes.clamp(0, self.ids.codebook_size - 1)
        return self.codec_slots.decode_chunk(codes, window.slot)[:, : frames * self.meta.samples_per_frame]

    def reset_codec_slots(self, slots: Tensor) -> None:
        self.codec_slots.reset_slots(slots)
