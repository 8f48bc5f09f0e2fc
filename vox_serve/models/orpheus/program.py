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
from vox_serve.core.meta import ProgramMeta
from vox_serve.core.request import OutKind
from vox_serve.layers.llama import LlamaConfig, LlamaForCausalLM
from vox_serve.rt import kernels
from vox_serve.rt.arena import Arena
from vox_serve.rt.program import Program, attention_buffers

AUDIO_START = 128266
CODES_PER_SLOT = 4096
SLOTS_PER_FRAME = 7
STOP_ID = 128258
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
        stop_rule=f"token {STOP_ID} at a frame boundary",
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
    def preprocess(self, fields: dict[str, Any]) -> list[list[int]]:
        text = fields["text"]
        voice = fields.get("voice") or self.meta.default_voice
        if voice not in self.meta.voices:
            raise ValueError(f"voice {voice!r} is not one of {', '.join(self.meta.voices)}")
        ids = self.tokenizer.encode(f"{voice}: {text}").ids
        return [[t] for t in PROMPT_START + list(ids) + PROMPT_END]

    # ---- LM stages -----------------------------------------------------------------------
    def _run_lm(self, arena_in: Arena, arena_out: Arena, num_tokens: int, num_seqs: int) -> None:
        bufs = attention_buffers(arena_in)
        hidden = self.lm(arena_in["input_ids"][:num_tokens, 0], arena_in["positions"][:num_tokens],
                         self.attention, bufs)
        last = hidden[arena_in["logits_index"][:num_seqs]]
        self._sample_and_classify(last, arena_in, arena_out, num_seqs)

    def prefill(self, num_tokens: int, num_seqs: int) -> None:
        self._run_lm(self.arenas["prefill_in"], self.arenas["prefill_out"], num_tokens, num_seqs)

    def decode(self, batch: int) -> None:
        self._run_lm(self.arenas["decode_in"], self.arenas["decode_out"], batch, batch)

    def _sampling(self, a: Arena, n: int) -> kernels.SamplingTensors:
        return kernels.SamplingTensors(
            temperature=a["temperature"][:n], top_k=a["top_k"][:n], top_p=a["top_p"][:n],
            min_p=a["min_p"][:n], repetition_penalty=a["repetition_penalty"][:n],
            seed=a["seed"][:n], offset=a["gen_index"][:n],
        )

    def _sample_and_classify(self, hidden: torch.Tensor, a: Arena, out: Arena, n: int) -> None:
        """hidden [n, H] -> out.tokens/codes [n, 1], out.out_kind [n]."""
        slot = a["num_codes"][:n] % SLOTS_PER_FRAME
        if self.constrain_audio:
            token = self._sample_constrained(hidden, a, n, slot)
        else:
            token = self._sample_full(hidden, a, n)
        base = AUDIO_START + CODES_PER_SLOT * slot
        code = token - base
        is_audio = (code >= 0) & (code < CODES_PER_SLOT)
        kind = torch.where(token == STOP_ID, int(OutKind.STOP),
                           torch.where(is_audio, int(OutKind.AUDIO), int(OutKind.OTHER)))
        out["tokens"][:n, 0] = token
        out["codes"][:n, 0] = torch.where(is_audio, code, 0)
        out["out_kind"][:n] = kind.to(torch.int32)

    def _sample_full(self, hidden: torch.Tensor, a: Arena, n: int) -> torch.Tensor:
        logits = self.lm.logits(hidden)
        allowed = torch.ones_like(logits, dtype=torch.bool)
        allowed[:, STOP_ID] = a["allow_stop"][:n]
        return kernels.sample(logits, self._sampling(a, n), a["history"][:n], allowed)

    def _sample_constrained(self, hidden: torch.Tensor, a: Arena, n: int, slot: torch.Tensor) -> torch.Tensor:
        """Logits over [the row's slot's 4096 ids, stop]: candidate c < 4096 is id base + c."""
        w = self.lm.lm_head.weight
        audio_w = w[AUDIO_START : AUDIO_START + SLOTS_PER_FRAME * CODES_PER_SLOT]
        audio = (hidden @ audio_w.t()).float().view(n, SLOTS_PER_FRAME, CODES_PER_SLOT)
        audio = audio.gather(1, slot.view(n, 1, 1).expand(n, 1, CODES_PER_SLOT)).squeeze(1)
        stop = (hidden @ w[STOP_ID]).float().unsqueeze(1)
        logits = torch.cat([audio, stop], dim=1)
        base = (AUDIO_START + CODES_PER_SLOT * slot).unsqueeze(1)
        hist = a["history"][:n]
        local = hist - base
        in_slot = (hist >= 0) & (local >= 0) & (local < CODES_PER_SLOT)
        local = torch.where(hist == STOP_ID, CODES_PER_SLOT, torch.where(in_slot, local, -1))
        allowed = torch.ones_like(logits, dtype=torch.bool)
        allowed[:, CODES_PER_SLOT] = a["allow_stop"][:n] & (slot == 0)
        cand = kernels.sample(logits, self._sampling(a, n), local, allowed)
        return torch.where(cand == CODES_PER_SLOT, STOP_ID, base.squeeze(1) + cand)

    # ---- codec ---------------------------------------------------------------------------
    def codec(self, batch: int, first: bool = False) -> None:
        a, out = self.codec_arenas(first)
        frames = a["codes"][:batch].clamp(0, CODES_PER_SLOT - 1)
        seed = a["seed"][:batch] if self.codec_noise else None
        audio = self.snac.decode(orpheus_frames_to_codes(frames), noise_seed=seed,
                                 frame_offset=a["first_frame"][:batch])
        spf = self.meta.samples_per_frame
        start = self.meta.codec_lookback_frames * spf
        keep = out["pcm"].shape[1]
        pcm = audio[:, 0, start : start + keep].float().clamp(-1.0, 1.0) * 32767.0
        out["pcm"][:batch] = pcm.round().to(torch.int16)

    def weights_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for m in (self.lm, self.snac) for p in m.parameters())
