"""The Orpheus program: a Llama-3.2 LM emitting SNAC codes, 7 tokens a frame, and the SNAC 24 kHz decoder.

Facts (see shared/models.md): audio ids start at 128266, 7 slots of 4096 codes; slot s of a frame
holds code `(id - 128266) - 4096 * s`; stop id 128258. With `constrain_audio` (the default) the LM
head is evaluated only over the current slot's 4096 ids plus the stop id, which both guards real
models against invalid codes and lets random weights produce audio of any requested length.
"""

from __future__ import annotations

from typing import Any

import torch

from vox_serve.codecs.snac import SnacDecoder, orpheus_frames_to_codes
from vox_serve.core.meta import ProgramMeta, StopRule
from vox_serve.core.request import Prompt
from vox_serve.layers.llama import LlamaConfig, LlamaForCausalLM
from vox_serve.models.orpheus import step_kernels
from vox_serve.models.orpheus.step_kernels import AUDIO_START, CODES_PER_SLOT, STOP_ID
from vox_serve.rt import kernels, slot_head
from vox_serve.rt.codec_window import CodecWindow
from vox_serve.rt.lm_batch import LmBatch, LmSample
from vox_serve.rt.program import Program

SLOTS_PER_FRAME = 7
PROMPT_START = [128259]
PROMPT_END = [128009, 128260, 128261, 128257]
VOICES = ("tara", "leah", "jess", "leo", "dan", "mia", "zac", "zoe")

DEFAULT_SAMPLING = {"temperature": 0.6, "top_p": 0.8, "top_k": 0, "min_p": 0.0,
                    "repetition_penalty": 1.3, "repetition_window": 64, "max_tokens": 2048}
ACCEPTED_FIELDS = ("text", "voice", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                   "max_tokens", "seed", "ignore_eos", "streaming")


def orpheus_meta(name: str, max_model_len: int, constrain_audio: bool) -> ProgramMeta:
    return ProgramMeta(
        name=name, sample_rate=24000, input_columns=1, codes_per_step=1,
        codes_per_frame=SLOTS_PER_FRAME, samples_per_frame=2048, frames_per_chunk=1,
        codec_lookback_frames=1, codec_lookahead_frames=2, skip_leading_frames=1,
        max_model_len=max_model_len, max_text_chars=2000,
        stop_rule=StopRule(token=STOP_ID, at_frame_boundary=True),
        default_sampling=dict(DEFAULT_SAMPLING), accepted_fields=ACCEPTED_FIELDS,
        voices=VOICES, default_voice="tara", extra={"constrain_audio": constrain_audio},
    )


class OrpheusProgram(Program):
    def __init__(self, lm_cfg: LlamaConfig, lm: LlamaForCausalLM, snac: SnacDecoder, tokenizer: Any,
                 meta: ProgramMeta, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(device, dtype)
        self.meta, self.lm_cfg, self.lm, self.snac, self.tokenizer = meta, lm_cfg, lm, snac, tokenizer
        self.constrain_audio = bool(meta.extra["constrain_audio"])
        self.codec_noise = True  # SNAC's noise blocks, drawn per request seed (tests compare without)
        end = AUDIO_START + SLOTS_PER_FRAME * CODES_PER_SLOT
        if self.constrain_audio and lm_cfg.vocab_size < end:
            raise ValueError(f"vocab_size {lm_cfg.vocab_size} has no room for the audio ids (< {end})")

    def kv_geometry(self) -> tuple[int, int, int, int]:
        c = self.lm_cfg
        return c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim

    # ---- prompts -------------------------------------------------------------------------
    def preprocess(self, fields: dict[str, Any]) -> Prompt:
        text = fields["text"]
        voice = fields.get("voice") or self.meta.default_voice
        if voice not in self.meta.voices:
            raise ValueError(f"voice {voice!r} is not one of {', '.join(self.meta.voices)}")
        ids = self.tokenizer.encode(f"{voice}: {text}").ids
        return Prompt.of([[t] for t in PROMPT_START + list(ids) + PROMPT_END])

    def prompt_builder_spec(self) -> dict[str, Any]:
        """The Rust prompt builder's inputs: the tokenizer (its JSON, as loaded) and the voices."""
        return {"kind": "orpheus", "tokenizer_json": self.tokenizer.to_str(), "voices": list(self.meta.voices),
                "default_voice": self.meta.default_voice}

    # ---- LM stage ------------------------------------------------------------------------
    def lm_step(self, b: LmBatch) -> LmSample:
        """One launch: the LM over its tokens, then for each row the next token, its code and kind."""
        hidden = self.lm(b.ids[:, 0], b.positions, self.attention, b.attention)
        last = hidden[b.logits_index]
        slot = b.num_codes % SLOTS_PER_FRAME  # the token's place in its frame
        if self.constrain_audio:
            token, code, kind = step_kernels.emit(self._draw_constrained(last, b, slot), slot)
        else:
            token = self._sample_full(last, b)
            code, kind = step_kernels.code_and_kind(token, slot)
        return LmSample(tokens=token[:, None], codes=code[:, None], kind=kind)

    def _sample_full(self, hidden: torch.Tensor, b: LmBatch) -> torch.Tensor:
        logits = self.lm.logits(hidden)
        allowed = torch.ones_like(logits, dtype=torch.bool)
        allowed[:, STOP_ID] = b.allow_stop
        return kernels.sample(logits, b.sampling, b.history, allowed)

    def _draw_constrained(self, hidden: torch.Tensor, b: LmBatch, slot: torch.Tensor) -> torch.Tensor:
        """A candidate per row over [the row's slot's 4096 ids, stop]: candidate c < 4096 is id base + c."""
        n = hidden.shape[0]
        w = self.lm.lm_head.weight
        # Few rows: one kernel reading only the slots present (rt.slot_head); else all 7 slots' product.
        logits = slot_head.slot_logits(hidden, w, AUDIO_START, slot, CODES_PER_SLOT, SLOTS_PER_FRAME, STOP_ID)
        if logits is None:
            audio_w = w[AUDIO_START : AUDIO_START + SLOTS_PER_FRAME * CODES_PER_SLOT]
            audio = (hidden @ audio_w.t()).float().view(n, SLOTS_PER_FRAME, CODES_PER_SLOT)
            audio = audio.gather(1, slot.view(n, 1, 1).expand(n, 1, CODES_PER_SLOT)).squeeze(1)
            stop = (hidden @ w[STOP_ID]).float().unsqueeze(1)
            logits = torch.cat([audio, stop], dim=1)
        local, allowed = step_kernels.constrain(logits, b.history, slot, b.allow_stop)  # (a kernel: no mask)
        return kernels.sample(logits, b.sampling, local, allowed)

    # ---- codec ---------------------------------------------------------------------------
    def decode_audio(self, window: CodecWindow, frames: int) -> torch.Tensor:
        seed = window.seed if self.codec_noise else None
        spf = self.meta.samples_per_frame
        start = self.meta.codec_lookback_frames * spf
        # only the kept samples, from the columns they depend on (SnacDecoder.crop_plan)
        audio = self.snac.decode(orpheus_frames_to_codes(window.codes.clamp(0, CODES_PER_SLOT - 1)), noise_seed=seed,
                                 frame_offset=window.first_frame, keep=(start, start + frames * spf))
        return audio[:, 0]

    def codec_modules(self) -> list[torch.nn.Module]:
        return [self.snac]

    def quantizable_modules(self) -> list[torch.nn.Module]:
        return [self.lm]

    def weights_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for m in (self.lm, self.snac) for p in m.parameters())
