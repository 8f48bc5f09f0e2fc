"""The Zonos v0.1 transformer program: paired rows (classifier-free guidance) over 9 delayed DAC codebooks.

Rows and streams. A request owns two KV sequences (`ProgramLayout.kv_streams = 2`): stream 0 reads the
conditional prefix, stream 1 the unconditional one (same length: the phonemes, then one row per other
conditioner); both read the same code columns. Every row's two logit sets are mixed with the request's
`cfg_scale` (a slot field) before one sample per codebook is drawn.

Prompt and input columns (9, one per codebook; -1 = absent). A prompt is L prefix positions, whose ids are
all absent and whose input is the prompt vector (conditional | unconditional prefix row, 2 * d_model
floats), then delayed column 0 (all mask). Generated token row g is delayed column g + 1 as the reference
writes it (`delay.write_column`: codebook k holds frame g - k's code, mask where that frame does not
exist); the next position's input is its 9 embeddings summed, read from the slot's history.

Steps, as the reference counts them. Row g = 0 is the prefill step: no EOS ban, no repetition penalty, no
stop rule. Rows g >= 1 ban EOS on codebooks 1-8, penalise the last `repetition_window` input columns
(`penalty ** count`), and run the stop rule (`delay.stop_rule`, per-slot `remaining` / `stopping`). Frame f
is complete once column f + 9 is written, i.e. at row g = f + 8: rows 0-7 are OTHER (no audio), row
g >= 8 is AUDIO and appends frame g - 8 undelayed (codebook k from row g - 8 + k; EOS / mask as 0, as the
reference's output). EOS in codebook 0 at row e starts the stop diagonal; row e + 8 (whose frame is the
EOS frame, which the reference drops) is STOP. `max_tokens` counts LM steps: a request makes at most
`max_tokens - 8` frames (the reference's `max_new_tokens`), and the host ends it after its last frame.
With `ignore_eos` codebook 0 may not sample EOS at decode steps.

Codec: DAC 44.1 kHz (hop 512, not causal) on windows of lookback + chunk + lookahead frames; frames outside
[0, window_end) are masked as a one-shot decode's zero padding, so with 10 frames each side the joined
chunks equal the one-shot decode to float rounding (`codecs/dac/stream.py`).

Sampling draws use the request's seed at offset g (codebook k: stream g * 9 + k), as `sampling.py` states;
the engine's `top_p` 1 (off) is the reference's 0 (off). Where we differ from the reference: no audio-prefix
continuation (the reference's `audio_prefix_codes`), and a `cfg_scale` of 1 (which upstream refuses)
samples the conditional logits alone.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from vox_serve.codecs.dac.decoder import DacDecoder
from vox_serve.core.meta import EngineLimits, ProgramLayout, ProgramMeta, SlotField, StopRule
from vox_serve.core.request import OutKind, Prompt
from vox_serve.models.zonos import delay, phonemes, sampling
from vox_serve.models.zonos.config import CODEBOOK_SIZE, EOS_ID, MASK_ID, NUM_CODEBOOKS
from vox_serve.models.zonos.lm import ZonosLM
from vox_serve.models.zonos.prompt import DELAY_STEPS, FIELD_SCHEMAS, ZonosPrompter
from vox_serve.rt.codec_window import CodecWindow
from vox_serve.rt.lm_batch import LmBatch, LmSample
from vox_serve.rt.program import Program
from vox_serve.voice_prompt import VoicePrompt

SAMPLE_RATE = 44100
HOP = 512
CODEC_CONTEXT_FRAMES = 10  # DAC 44.1 kHz's receptive field each side (codecs/dac/decoder.receptive_field)
MAX_PENALTY_WINDOW = 16  # input columns the repetition penalty may cover (the reference default: 2)
ZONOS_FIELDS = ("text", "language", "audio", "voice", "emotion", "fmax", "pitch_std", "speaking_rate", "cfg_scale",
                "temperature", "top_p", "top_k", "min_p", "linear", "conf", "quad", "repetition_penalty",
                "max_tokens", "seed", "ignore_eos", "streaming")
STOP_DESCRIPTION = ("EOS sampled in codebook 0 starts the stop diagonal; the row 8 steps later is STOP (its frame, "
                    "the EOS frame, is dropped); rows 0-7 are OTHER (no frame is complete yet)")


def zonos_meta(name: str, max_model_len: int, d_model: int) -> ProgramMeta:
    defaults = {k: v for k, v in sampling.DEFAULT_SAMPLING.items() if k not in ("max_tokens", "top_p")}
    # max_tokens counts LM steps: the reference's 2580 new frames plus the 8 steps of delay
    defaults.update(top_p=1.0, max_tokens=sampling.DEFAULT_SAMPLING["max_tokens"] + DELAY_STEPS)
    return ProgramMeta(
        name=name, sample_rate=SAMPLE_RATE, input_columns=NUM_CODEBOOKS, codes_per_step=NUM_CODEBOOKS,
        codes_per_frame=NUM_CODEBOOKS, samples_per_frame=HOP, frames_per_chunk=32,
        codec_lookback_frames=CODEC_CONTEXT_FRAMES, codec_lookahead_frames=CODEC_CONTEXT_FRAMES, skip_leading_frames=0,
        max_model_len=max_model_len, max_text_chars=1000,
        stop_rule=StopRule(token=EOS_ID, column=0, description=STOP_DESCRIPTION), default_sampling=defaults,
        accepted_fields=ZONOS_FIELDS, field_schemas=FIELD_SCHEMAS, codec_pads_end=True,
        languages=tuple(code for code in phonemes.LANGUAGES if code not in phonemes.UNSUPPORTED_LANGUAGES),
        layout=ProgramLayout(prompt_vector_dim=d_model, kv_streams=2, slot_fields=(
            SlotField("cfg_scale", (1,)), SlotField("unified", (3,)), SlotField("num_frames", (1,)))),
        extra={"unsupported_languages": dict(phonemes.UNSUPPORTED_LANGUAGES),
               "input_layout": "columns 0..8: delayed codebooks 0..8 (-1 absent: prefix rows)",
               "streams": ["conditional prefix", "unconditional prefix (phonemes only)"],
               "max_tokens": "LM steps: at most max_tokens - 8 frames (86.13 frames per second)"},
    )


class ZonosProgram(Program):
    def __init__(self, lm: ZonosLM, dac: DacDecoder, prompter: ZonosPrompter, meta: ProgramMeta,
                 device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(device, dtype)
        if dac.cfg.n_codebooks != NUM_CODEBOOKS or dac.cfg.hop_length != HOP:
            raise ValueError(f"the DAC codec has {dac.cfg.n_codebooks} codebooks and hop {dac.cfg.hop_length}; "
                             f"Zonos needs {NUM_CODEBOOKS} and {HOP}")
        self.lm, self.dac, self.prompter, self.meta = lm, dac, prompter, meta
        self.remaining: Tensor | None = None  # [slots + 1] int64: the stop rule's steps left
        self.stopping: Tensor | None = None  # [slots + 1] bool: inside the stop diagonal

    def kv_geometry(self) -> tuple[int, int, int, int]:
        c = self.lm.cfg
        return c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim

    def allocate(self, limits: EngineLimits) -> None:
        rows = limits.slots + 1
        self.remaining = torch.zeros(rows, dtype=torch.int64, device=self.device)
        self.stopping = torch.zeros(rows, dtype=torch.bool, device=self.device)

    def reset_slots(self, slots: Tensor) -> None:
        frames = self.state["num_frames"][slots, 0].long()
        # graph-safe: index_copy_ / index_fill_ take no host tensor (a `[slots] = False` would copy one)
        self.remaining.index_copy_(0, slots, frames + DELAY_STEPS)  # delay.decode_steps, per row
        self.stopping.index_fill_(0, slots, False)

    def state_bytes(self) -> int:
        pools = (self.remaining, self.stopping) if self.half.has_lm else ()
        return super().state_bytes() + sum(t.numel() * t.element_size() for t in pools)

    def codec_modules(self) -> list[torch.nn.Module]:
        return [self.dac]

    def weights_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for m in (self.lm, self.dac) for p in m.parameters())

    # ---- prompts -------------------------------------------------------------------------
    def preprocess(self, fields: dict[str, Any]) -> Prompt:
        return self.prompter.prompt(fields, self.meta.default_sampling["max_tokens"])

    def encode_voice(self, audio: bytes, ref_text: str | None) -> VoicePrompt:
        return self.prompter.encode_voice(audio, ref_text)

    # ---- LM stage ------------------------------------------------------------------------
    def embed(self, ids: Tensor) -> Tensor:
        """ids [T, 9] (-1 absent) -> [T, d]: the present codebooks' embeddings summed in codebook order (the
        reference's order, so float32 sums agree bit for bit); prefix rows are zero."""
        x = None
        for k, table in enumerate(self.lm.embeddings):
            col = ids[:, k]
            e = torch.where((col >= 0)[:, None], table(col.clamp(min=0)), 0.0)
            x = e if x is None else x + e
        return x

    def lm_step(self, b: LmBatch) -> LmSample:
        x = self.embed(b.ids)
        if b.prompt_vectors is not None:
            x = x.index_add(0, b.prompt_vectors[0], b.prompt_vectors[1].to(x.dtype))
        hidden = self.lm(x, b.positions, self.attention, b.attention)
        n = b.num_seqs
        logits = self.lm.logits(hidden[b.logits_index]).view(b.kv_streams, n, NUM_CODEBOOKS, -1)
        st, slot, g = b.state, b.slot, b.gen_index
        guided = sampling.guided_logits(logits[0], logits[1], st["cfg_scale"][slot, 0], self.lm.cfg.logits_width)
        first = g == 0  # the reference's prefill step
        tokens = sampling.sample_codes(torch.where(first[:, None, None], guided, self._decode_logits(guided, b)),
                                       self._sampling(b))
        remaining, stopping = self.remaining[slot], self.stopping[slot]
        forced, left, stops = delay.stop_rule(tokens, remaining, stopping)
        tokens = torch.where(first[:, None], tokens, forced)
        left, stops = torch.where(first, remaining, left), torch.where(first, stopping, stops)
        self.remaining[b.write_slot], self.stopping[b.write_slot] = left, stops
        column = delay.write_column(tokens, torch.full_like(tokens, MASK_ID),
                                    delay.unknown_entries(g + 1, torch.zeros_like(g), st["num_frames"][slot, 0].long()))
        done = ~first & (left <= 0)
        audio = torch.where(g >= DELAY_STEPS, int(OutKind.AUDIO), int(OutKind.OTHER))  # a frame is complete
        kind = torch.where(done, int(OutKind.STOP), audio)
        return LmSample(tokens=column, codes=self._frame(b, column), kind=kind)

    def _decode_logits(self, guided: Tensor, b: LmBatch) -> Tensor:
        """Decode steps: EOS only in codebook 0 (and not there while the row may not stop), then the penalty."""
        logits = sampling.ban_eos_after_head0(guided)
        no_stop = sampling.entry_mask(logits.shape[1:], codebooks=slice(0, 1), device=logits.device)
        logits = logits.masked_fill(no_stop[None] & ~b.allow_stop[:, None, None], float("-inf"))
        return sampling.repetition_penalty(logits, self._history(b), b.sampling.repetition_penalty)

    def _history(self, b: LmBatch) -> Tensor:
        """[n, 9, MAX_PENALTY_WINDOW] the input columns the penalty covers at row g: columns g + 1 - w .. g
        (w the request's window); column c >= 1 is token row c - 1, column 0 all mask, c < 0 empty (-1)."""
        st, w = b.state, MAX_PENALTY_WINDOW
        j = torch.arange(w, device=b.slot.device)
        col = b.gen_index[:, None] + 1 - w + j  # [n, w]
        window = st["repetition_window"][b.slot].clamp(max=w)
        rows = st.tokens[b.slot[:, None], (col - 1).clamp(0, st.max_generated - 1)].long()  # [n, w, 9]
        rows = torch.where((col == 0)[:, :, None], MASK_ID, rows)
        valid = (col >= 0) & (j[None] >= w - window[:, None])
        return torch.where(valid[:, :, None], rows, -1).transpose(1, 2)

    def _sampling(self, b: LmBatch) -> sampling.ZonosSampling:
        s, unified = b.sampling, b.state["unified"][b.slot]
        return sampling.ZonosSampling(
            temperature=s.temperature, top_p=torch.where(s.top_p >= 1.0, 0.0, s.top_p), top_k=s.top_k.long(),
            min_p=s.min_p, linear=unified[:, 0], conf=unified[:, 1], quad=unified[:, 2],
            repetition_penalty=s.repetition_penalty, seed=s.seed, offset=b.gen_index)

    def _frame(self, b: LmBatch, column: Tensor) -> Tensor:
        """[n, 9] frame g - 8 undelayed: codebook k from row g - 8 + k (k = 8: this row's column); EOS and
        mask codes as 0, as the reference's output."""
        st, k = b.state, torch.arange(DELAY_STEPS, device=column.device)
        rows = (b.gen_index[:, None] - DELAY_STEPS + k).clamp(0, st.max_generated - 1)
        codes = torch.cat([st.tokens[b.slot[:, None], rows, k].long(), column[:, DELAY_STEPS:].long()], dim=1)
        return torch.where(codes >= CODEBOOK_SIZE, 0, codes)

    # ---- codec ---------------------------------------------------------------------------
    def decode_audio(self, window: CodecWindow, frames: int) -> Tensor:
        codes = window.codes.transpose(1, 2)  # [K, 9, size]
        size = codes.shape[-1]
        valid = torch.stack([(-window.first_frame).clamp(0, size), (window.window_end - window.first_frame)
                             .clamp(0, size)], dim=1)
        audio = self.dac.decode(codes, valid)
        start = self.meta.codec_lookback_frames * HOP
        return audio[:, start : start + frames * HOP]
