"""The Qwen3-TTS program (CustomVoice, VoiceDesign, Base): talker + code predictor, and the 12 Hz codec.

Arena input layout (`input_ids [T, G + 1]`, G = code groups, 16 in the released models; -1 = absent):
  columns 0..G-1  code groups 0..G-1 of the position: a prompt position uses column 0 only (the
                  talker's codec vocabulary: control, language and speaker ids); a generated frame
                  fills all G (the worker writes a sampled `tokens` row into the leading columns).
  column G        the text id (Qwen2 vocabulary); absent on generated frames, which means tts_pad.
The input embedding of a position is text_projection(text_embedding(text)) + sum of the present
code embeddings, as the reference builds its prompt and decode inputs. Base (voice clone) prompts also
carry the speaker embedding of the reference audio, added at the speaker position through the prefill
arena's `embed_rows` / `embeds` fields (see `qwen3_tts_clone.py`: the encoders run in `preprocess`).

One LM step (prefill or decode) ends with whole frames: the talker samples group 0 over the codec
vocabulary with the control ids 2048..3071 suppressed except EOS (allowed once the row may stop and
at least two frames exist, the reference's `min_new_tokens=2`); then the code predictor samples
groups 1..G-1 in the same stage from the talker's hidden state and the group-0 code. Outputs:
`tokens` = `codes` = the frame [B, G]; `out_kind` STOP when group 0 is EOS, else AUDIO. Group g of
generated frame i draws its random numbers at offset `i * G + g` of the request's seed.

Codec stage: the 12 Hz decoder is causal, so chunks are consecutive frames (no lookback or
lookahead) decoded through each request's streaming state in `Qwen3CodecSlots`; padded codec rows
(slot -1) decode into a scratch slot past the scheduler's.

Where we differ from the reference: the repetition penalty covers the last `repetition_window` (256)
group-0 codes, the reference's all of them (the same for utterances up to 256 frames, 20 s); the code
predictor samples with the request's parameters (the reference has separate `subtalker_*` ones, by
default equal to the talker's).
"""

from __future__ import annotations

from typing import Any

import torch

from vox_serve.codecs.qwen3.decoder import Qwen3CodecDecoder, Qwen3CodecSlots
from vox_serve.core.meta import EngineLimits, ProgramMeta
from vox_serve.core.request import EmbeddedPrompt, OutKind
from vox_serve.models.qwen3_tts.clone import (
    CLONE_FIELDS,
    MAX_REFERENCE_SECONDS,
    MIN_REFERENCE_SECONDS,
    VoiceCloner,
    check_streaming_fields,
)
from vox_serve.models.qwen3_tts.layers import CodePredictor, Talker
from vox_serve.models.qwen3_tts.prompt import PromptIds, build_prompt
from vox_serve.models.qwen3_tts.stream import PROMPT_TEXT_IDS, stable_text_ids, streaming_prompt
from vox_serve.rt import kernels
from vox_serve.rt.arena import Arena
from vox_serve.rt.program import Program, attention_buffers

SAMPLES_PER_FRAME = 1920  # 24 kHz / 12.5 Hz
MIN_FRAMES_BEFORE_STOP = 2
NUM_CONTROL_IDS = 1024  # the top of the codec vocabulary: control, language and speaker ids
DEFAULT_SAMPLING = {"temperature": 0.9, "top_k": 50, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.05,
                    "repetition_window": 256, "max_tokens": 2048}
COMMON_FIELDS = ("text", "language", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens",
                 "seed", "ignore_eos", "streaming")


def qwen3_tts_meta(name: str, ids: PromptIds, max_model_len: int, hidden_size: int, sample_rate: int = 24000,
                   samples_per_frame: int = SAMPLES_PER_FRAME) -> ProgramMeta:
    g = ids.num_code_groups
    voices = tuple(ids.speakers) if ids.takes_speaker else ()
    clones = ids.model_type == "base"
    accepted = COMMON_FIELDS + (CLONE_FIELDS if clones else ("voice", "instruct"))
    return ProgramMeta(
        name=name, sample_rate=sample_rate, input_columns=g + 1, codes_per_step=g, codes_per_frame=g,
        samples_per_frame=samples_per_frame, frames_per_chunk=10, codec_lookback_frames=0,
        codec_lookahead_frames=0, skip_leading_frames=0, max_model_len=max_model_len, max_text_chars=4000,
        stop_rule=f"group-0 code {ids.codec_eos} (from the third frame on)",
        default_sampling=dict(DEFAULT_SAMPLING), accepted_fields=accepted, voices=voices,
        default_voice=voices[0] if voices else None, languages=ids.supported_languages, stateful_codec=True,
        prompt_embed_dim=hidden_size if clones else 0,
        # A cloned voice streams its text in x-vector-only mode only (qwen3_tts_clone.check_streaming_fields).
        supports_input_streaming=True, streamed_text_column=g,
        extra={"model_type": ids.model_type, "takes_instruct": ids.takes_instruct,
               "input_layout": f"columns 0..{g - 1}: code groups (-1 absent); column {g}: text id (-1: tts_pad)",
               # the API checks an upload's length against this before the replica decodes it
               **({"reference_audio_seconds": [MIN_REFERENCE_SECONDS, MAX_REFERENCE_SECONDS]} if clones else {})},
    )


class Qwen3TTSProgram(Program):
    def __init__(self, talker: Talker, predictor: CodePredictor, codec: Qwen3CodecDecoder, tokenizer: Any,
                 ids: PromptIds, meta: ProgramMeta, device: torch.device, dtype: torch.dtype,
                 cloner: VoiceCloner | None = None) -> None:
        super().__init__(device, dtype)
        if (cloner is None) != (ids.model_type != "base"):
            raise ValueError("a Qwen3-TTS Base program needs the voice-clone encoders, other variants none")
        self.talker, self.predictor, self.codec_decoder, self.tokenizer = talker, predictor, codec, tokenizer
        self.cloner = cloner
        self.codec_slots: Qwen3CodecSlots | None = None  # streaming state pools, sized in setup_arenas
        self.scratch_slot = 0
        self.ids, self.meta = ids, meta
        self.num_groups = ids.num_code_groups
        vocab = talker.cfg.vocab_size
        # [vocab] bool: the audio codes, the group-0 candidates of every row (EOS is allowed per row)
        self.audio_ids = torch.arange(vocab, device=device) < vocab - NUM_CONTROL_IDS

    def kv_geometry(self) -> tuple[int, int, int, int]:
        c = self.talker.cfg
        return c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim

    def setup_arenas(self, limits: EngineLimits) -> None:
        super().setup_arenas(limits)
        self.predictor.allocate(max(limits.max_batch, limits.max_prefill_seqs))
        # One slot past the scheduler's: padded codec rows (slot -1) decode into it, never into a request's.
        self.scratch_slot = limits.codec_slots
        self.codec_slots = Qwen3CodecSlots(self.codec_decoder, limits.codec_slots + 1)

    # ---- prompts -------------------------------------------------------------------------
    def preprocess(self, fields: dict[str, Any]) -> list[list[int]] | EmbeddedPrompt:
        if self.cloner is not None:
            return self.cloner.prompt(self.tokenizer, self.ids, fields)
        voice = fields.get("voice") or self.meta.default_voice
        return build_prompt(self.tokenizer, self.ids, fields["text"], voice, fields.get("language"),
                            fields.get("instruct"))

    # ---- input streaming (qwen3_tts_stream.py) ---------------------------------------------
    num_prompt_text_ids = PROMPT_TEXT_IDS

    def stable_text_ids(self, text: str, start: int, ended: bool) -> tuple[list[int], int]:
        return stable_text_ids(self.tokenizer, text, start, ended, self.ids.tts_eos)

    def check_streaming_fields(self, fields: dict[str, Any]) -> None:
        if self.cloner is not None:
            check_streaming_fields(fields)

    def preprocess_streaming(self, fields: dict[str, Any], prompt_text_ids: list[int]
                             ) -> list[list[int]] | EmbeddedPrompt:
        if self.cloner is not None:
            return self.cloner.streaming_prompt(self.tokenizer, self.ids, fields, prompt_text_ids[0])
        voice = fields.get("voice") or self.meta.default_voice
        return streaming_prompt(self.tokenizer, self.ids, prompt_text_ids[0], voice, fields.get("language"),
                                fields.get("instruct"))

    # ---- LM stages -----------------------------------------------------------------------
    def prefill(self, num_tokens: int, num_seqs: int) -> None:
        self._step(self.arenas["prefill_in"], self.arenas["prefill_out"], num_tokens, num_seqs)

    def decode(self, batch: int) -> None:
        self._step(self.arenas["decode_in"], self.arenas["decode_out"], batch, batch)

    def _step(self, a: Arena, out: Arena, num_tokens: int, n: int) -> None:
        bufs = attention_buffers(a)

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return self.attention.forward(layer, q, k, v, bufs)

        # Prompt vectors (Base prefill only): unused entries add zeros to token 0.
        added = (a["embed_rows"], a["embeds"]) if "embeds" in a.specs else None
        hidden = self.talker(a["input_ids"][:num_tokens], a["positions"][:num_tokens], attend, self.ids.tts_pad,
                             added)
        last = hidden[a["logits_index"][:n]]  # [n, hidden]
        first = self._sample_group0(last, a, n)
        frame = self._sample_rest(last, first, a, n)
        out["tokens"][:n] = frame
        out["codes"][:n] = frame
        out["out_kind"][:n] = torch.where(first == self.ids.codec_eos, int(OutKind.STOP),
                                          int(OutKind.AUDIO)).to(torch.int32)

    def _sampling(self, a: Arena, n: int, group: int) -> kernels.SamplingTensors:
        return kernels.SamplingTensors(
            temperature=a["temperature"][:n], top_k=a["top_k"][:n], top_p=a["top_p"][:n], min_p=a["min_p"][:n],
            repetition_penalty=a["repetition_penalty"][:n], seed=a["seed"][:n],
            offset=a["gen_index"][:n] * self.num_groups + group,
        )

    def _sample_group0(self, hidden: torch.Tensor, a: Arena, n: int) -> torch.Tensor:
        """hidden [n, H] -> group-0 codes [n] (or EOS)."""
        logits = self.talker.codec_head(hidden).float()
        may_stop = a["allow_stop"][:n] & (a["gen_index"][:n] >= MIN_FRAMES_BEFORE_STOP)
        allowed = self.audio_ids.expand(n, -1).clone()
        allowed[:, self.ids.codec_eos] = may_stop
        return kernels.sample(logits, self._sampling(a, n, 0), a["history"][:n], allowed)

    def _sample_rest(self, hidden: torch.Tensor, first: torch.Tensor, a: Arena, n: int) -> torch.Tensor:
        """The code predictor: groups 1..G-1 after group 0; returns the frame [n, G]."""
        codes = [first]
        x = torch.stack([hidden, self.talker.codec_embedding(0, first)], dim=1)  # [n, 2, H]
        for group in range(1, self.num_groups):
            # Predictor positions: 0 the talker's hidden state, g the code of group g (0 .. G-2); the
            # first step feeds positions 0 and 1, each later one the code just sampled.
            logits = self.predictor.step(x, start=0 if group == 1 else group, head=group - 1)
            # No history: the reference's sub-talker samples without repetition penalty.
            code = kernels.sample(logits, self._sampling(a, n, group))
            codes.append(code)
            x = self.talker.codec_embedding(group, code).unsqueeze(1)
        return torch.stack(codes, dim=1)

    # ---- codec ---------------------------------------------------------------------------
    def codec(self, batch: int, first: bool = False) -> None:
        a, out = self.codec_arenas(first)
        slots = a["slot"][:batch]
        slots = torch.where(slots >= 0, slots, self.scratch_slot)
        pcm = self.codec_slots.decode_chunk(a["codes"][:batch], slots)  # [batch, window * samples_per_frame]
        keep = out["pcm"].shape[1]
        out["pcm"][:batch] = (pcm[:, :keep].float().clamp(-1.0, 1.0) * 32767.0).round().to(torch.int16)

    def release_codec_slot(self, slot: int) -> None:
        if self.codec_slots is not None:
            self.codec_slots.reset_slot(slot)

    def weights_bytes(self) -> int:
        modules = (self.talker, self.predictor, self.codec_decoder)
        encoders = self.cloner.weights_bytes() if self.cloner is not None else 0
        return encoders + sum(p.numel() * p.element_size() for m in modules for p in m.parameters())
