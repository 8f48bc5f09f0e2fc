"""The Qwen3-TTS program (CustomVoice, VoiceDesign, Base): talker + code predictor, and the 12 Hz codec.

Arena input layout (`input_ids [T, G + 1]`, G = code groups, 16 in the released models; -1 = absent):
  columns 0..G-1  code groups 0..G-1 of the position: a prompt position uses column 0 only (the
                  talker's codec vocabulary: control, language and speaker ids); a generated frame
                  fills all G (the worker writes a sampled `tokens` row into the leading columns).
  column G        the text id (Qwen2 vocabulary); absent on generated frames, which means tts_pad.
The input embedding of a position is text_projection(text_embedding(text)) + sum of the present
code embeddings, as the reference builds its prompt and decode inputs. Base (voice clone) prompts also
carry the speaker embedding of the reference audio, added at the speaker position through the prefill
arena's `embed_rows` / `embeds` fields (see `clone.py`: the encoders run in `preprocess`).

Prompt layouts, as the reference's `non_streaming_mode` (a request field; the reference's defaults: false
for Base's `generate_voice_clone`, true for the others): true puts the whole text in the prompt (prompt.py);
false ends the prompt with the first text id (in-context clones: the reference frames paired with the
transcript's and the text's ids) and feeds the others one per generated frame through the streamed text
column (`Prompt.trailing_text`, the same path input streaming takes: stream.py). An in-context clone's
codec slot is primed with its reference frames at admission (`codec_prime`), as the reference decodes
them before the generated frames and cuts their audio off.

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
from vox_serve.core.meta import EngineLimits, ProgramLayout, ProgramMeta, StopRule
from vox_serve.core.request import OutKind, Prompt
from vox_serve.layers.decoder import paged_attend
from vox_serve.models.qwen3_tts.clone import (
    CLONE_FIELDS,
    MAX_REFERENCE_SECONDS,
    MIN_REFERENCE_SECONDS,
    VoiceCloner,
    check_streaming_fields,
    check_streaming_layout,
    max_reference_frames,
)
from vox_serve.models.qwen3_tts.layers import CodePredictor, Talker
from vox_serve.models.qwen3_tts.prompt import PromptIds, build_prompt
from vox_serve.models.qwen3_tts.stream import PROMPT_TEXT_IDS, stable_text_ids, streaming_prompt, text_ids
from vox_serve.request_builder import FieldError
from vox_serve.rt import kernels
from vox_serve.rt.codec_window import CodecWindow
from vox_serve.rt.lm_batch import LmBatch, LmSample
from vox_serve.rt.program import Program
from vox_serve.voice_prompt import VoicePrompt

SAMPLES_PER_FRAME = 1920  # 24 kHz / 12.5 Hz
MIN_FRAMES_BEFORE_STOP = 2
NUM_CONTROL_IDS = 1024  # the top of the codec vocabulary: control, language and speaker ids
DEFAULT_SAMPLING = {"temperature": 0.9, "top_k": 50, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.05,
                    "repetition_window": 256, "max_tokens": 2048}
COMMON_FIELDS = ("text", "language", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens",
                 "seed", "ignore_eos", "streaming", "non_streaming_mode")


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
        stop_rule=StopRule(token=ids.codec_eos, min_generated=MIN_FRAMES_BEFORE_STOP),
        default_sampling=dict(DEFAULT_SAMPLING), accepted_fields=accepted, voices=voices,
        default_voice=voices[0] if voices else None, languages=ids.supported_languages, stateful_codec=True,
        # An in-context clone primes its codec slot with the reference frames (clone.clone_prompt).
        layout=ProgramLayout(prompt_vector_dim=hidden_size if clones else 0,
                             codec_prefix_frames=max_reference_frames(samples_per_frame) if clones else 0),
        supports_input_streaming=True, streamed_text_column=g,
        extra={"model_type": ids.model_type, "takes_instruct": ids.takes_instruct,
               "input_layout": f"columns 0..{g - 1}: code groups (-1 absent); column {g}: text id (-1: tts_pad)",
               # the API checks an upload's length against this before the replica decodes it
               **({"reference_audio_seconds": [MIN_REFERENCE_SECONDS, MAX_REFERENCE_SECONDS]} if clones else {})},
    )


class Qwen3TTSProgram(Program):
    def __init__(self, talker: Talker, predictor: CodePredictor, codec: Qwen3CodecDecoder, tokenizer: Any,
                 ids: PromptIds, meta: ProgramMeta, device: torch.device, dtype: torch.dtype,
                 cloner: VoiceCloner | None = None, prompt_config: dict[str, Any] | None = None) -> None:
        super().__init__(device, dtype)
        if (cloner is None) != (ids.model_type != "base"):
            raise ValueError("a Qwen3-TTS Base program needs the voice-clone encoders, other variants none")
        self.talker, self.predictor, self.codec_decoder, self.tokenizer = talker, predictor, codec, tokenizer
        self.cloner = cloner
        self.codec_slots: Qwen3CodecSlots | None = None  # streaming state pools, sized in allocate
        self.ids, self.meta = ids, meta
        self.prompt_config = prompt_config  # the checkpoint's config.json: the Rust prompt builder reads its ids
        self.num_groups = ids.num_code_groups
        vocab = talker.cfg.vocab_size
        # [vocab] bool: the audio codes, the group-0 candidates of every row (EOS is allowed per row)
        self.audio_ids = torch.arange(vocab, device=device) < vocab - NUM_CONTROL_IDS
        self.group_index = torch.arange(self.num_groups, device=device)[:, None]  # [G, 1]

    def kv_geometry(self) -> tuple[int, int, int, int]:
        c = self.talker.cfg
        return c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim

    def allocate(self, limits: EngineLimits) -> None:
        self.predictor.allocate(max(limits.max_batch, limits.max_prefill_seqs))

    def allocate_codec(self, limits: EngineLimits) -> None:
        # One pool row per request slot, and the scratch slot's (padded codec rows decode into it).
        self.codec_slots = Qwen3CodecSlots(self.codec_decoder, limits.slots + 1)

    def state_bytes(self) -> int:
        pools = [self.predictor.k_cache, self.predictor.v_cache] if self.half.has_lm else []
        pools += [self.codec_slots.state, self.codec_slots.pos] if self.half.has_codec else []
        return super().state_bytes() + sum(t.numel() * t.element_size() for t in pools)

    # ---- prompts -------------------------------------------------------------------------
    def preprocess(self, fields: dict[str, Any]) -> Prompt:
        if self.cloner is not None:
            return self.cloner.prompt(self.tokenizer, self.ids, fields)
        voice, language, instruct = fields.get("voice") or self.meta.default_voice, fields.get("language"), \
            fields.get("instruct")
        if fields.get("non_streaming_mode", True):  # the default of generate_custom_voice / _voice_design
            return Prompt.of(build_prompt(self.tokenizer, self.ids, fields["text"], voice, language, instruct))
        first, *trailing = text_ids(self.tokenizer, self.ids, fields["text"])
        return Prompt.of(streaming_prompt(self.tokenizer, self.ids, first, voice, language, instruct),
                         trailing_text=trailing)

    def prompt_builder_spec(self) -> dict[str, Any]:
        """The Rust prompt builder's inputs: the tokenizer (its JSON) and the checkpoint's config; `clone`
        says reference audio is encoded in Python (Base)."""
        if self.prompt_config is None:
            return {}
        return {"kind": "qwen3_tts", "tokenizer_json": self.tokenizer.to_str(), "config": self.prompt_config,
                "clone": self.cloner is not None}

    def encode_voice(self, audio: bytes, ref_text: str | None) -> VoicePrompt:
        """A saved voice's prompt from reference audio (Base only): FieldError for unusable audio."""
        if self.cloner is None:
            raise FieldError("audio", f"model {self.meta.name} does not clone voices")
        return self.cloner.encode(audio, ref_text)

    # ---- input streaming (qwen3_tts_stream.py) ---------------------------------------------
    num_prompt_text_ids = PROMPT_TEXT_IDS

    def stable_text_ids(self, text: str, start: int, ended: bool) -> tuple[list[int], int]:
        return stable_text_ids(self.tokenizer, text, start, ended, self.ids.tts_eos)

    def check_streaming_fields(self, fields: dict[str, Any]) -> None:
        if self.cloner is not None:
            check_streaming_fields(fields)
        check_streaming_layout(fields)

    def num_prompt_text_ids_for(self, fields: dict[str, Any]) -> int:
        """An in-context clone's prompt pairs its reference frames with text ids (`clone_prompt_text_ids`)."""
        if self.cloner is None:
            return self.num_prompt_text_ids
        return self.cloner.prompt_text_ids_needed(self.tokenizer, fields)

    def preprocess_streaming(self, fields: dict[str, Any], prompt_text_ids: list[int]) -> Prompt:
        if self.cloner is not None:
            return self.cloner.streaming_prompt(self.tokenizer, self.ids, fields, prompt_text_ids)
        voice = fields.get("voice") or self.meta.default_voice
        return Prompt.of(streaming_prompt(self.tokenizer, self.ids, prompt_text_ids[0], voice, fields.get("language"),
                                          fields.get("instruct")))

    # ---- LM stage ------------------------------------------------------------------------
    def lm_step(self, b: LmBatch) -> LmSample:
        """The talker over the launch's tokens, then for each row a whole frame: group 0 from the talker,
        groups 1..G-1 from the code predictor."""
        attend = paged_attend(self.attention, b.attention)
        hidden = self.talker(b.ids, b.positions, attend, self.ids.tts_pad, b.prompt_vectors)
        last = hidden[b.logits_index]  # [n, hidden]
        # [G, n]: each group's RNG offsets, computed once for the frame (not two kernels per group)
        offsets = b.gen_index * self.num_groups + self.group_index
        first = self._sample_group0(last, b, offsets[0])
        frame = self._sample_rest(last, first, b, offsets)
        kind = torch.where(first == self.ids.codec_eos, int(OutKind.STOP), int(OutKind.AUDIO))
        return LmSample(tokens=frame, codes=frame, kind=kind)

    def _sampling(self, b: LmBatch, offset: torch.Tensor) -> kernels.SamplingTensors:
        s = b.sampling
        return kernels.SamplingTensors(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, min_p=s.min_p,
                                       repetition_penalty=s.repetition_penalty, seed=s.seed, offset=offset)

    def _sample_group0(self, hidden: torch.Tensor, b: LmBatch, offset: torch.Tensor) -> torch.Tensor:
        """hidden [n, H] -> group-0 codes [n] (or EOS)."""
        n = hidden.shape[0]
        logits = self.talker.codec_head(hidden).float()
        may_stop = b.allow_stop & (b.gen_index >= MIN_FRAMES_BEFORE_STOP)
        allowed = self.audio_ids.expand(n, -1).clone()
        allowed[:, self.ids.codec_eos] = may_stop
        return kernels.sample(logits, self._sampling(b, offset), b.history, allowed)

    def _sample_rest(self, hidden: torch.Tensor, first: torch.Tensor, b: LmBatch,
                     offsets: torch.Tensor) -> torch.Tensor:
        """The code predictor: groups 1..G-1 after group 0; returns the frame [n, G]."""
        # No history: the reference's sub-talker samples without repetition penalty.
        def sample(logits: torch.Tensor, group: int) -> torch.Tensor:
            return kernels.sample(logits, self._sampling(b, offsets[group]))

        return self.predictor.sample_frame(hidden, first, self.talker.codec_embedding, sample)

    # ---- codec ---------------------------------------------------------------------------
    def decode_audio(self, window: CodecWindow, frames: int) -> torch.Tensor:
        pcm = self.codec_slots.decode_chunk(window.codes, window.slot)  # [batch, frames * samples_per_frame]
        return pcm[:, : frames * self.meta.samples_per_frame]

    def reset_codec_slots(self, slots: torch.Tensor) -> None:
        self.codec_slots.reset_slots(slots)

    def prime_codec(self, slots: torch.Tensor, codes: torch.Tensor, lengths: torch.Tensor) -> None:
        self.codec_slots.prime_slots(slots, codes.long(), lengths)

    def codec_modules(self) -> list[torch.nn.Module]:
        return [self.codec_decoder]

    def quantizable_modules(self) -> list[torch.nn.Module]:
        return [self.talker, self.predictor]

    def weights_bytes(self) -> int:
        modules = (self.talker, self.predictor, self.codec_decoder)
        encoders = self.cloner.weights_bytes() if self.cloner is not None else 0
        return encoders + sum(p.numel() * p.element_size() for m in modules for p in m.parameters())
