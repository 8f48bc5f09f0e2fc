"""Qwen3-TTS Base (voice cloning): reference audio -> speaker embedding (+ reference codes) -> prompt.

Runs in `preprocess`, once per request, off the per-step path. The request uploads reference audio
(`audio`) and optionally its transcript (`ref_text`). Modes, as the reference's `create_voice_clone_prompt`:
  - in-context (ICL): the reference audio's codec frames and transcript are placed in the prompt, with
    the speaker embedding; the transcript is required;
  - x-vector only: just the speaker embedding; the transcript is ignored.
`x_vector_only_mode` picks the mode explicitly, as in the reference (which defaults to ICL); without it
the mode follows from whether `ref_text` is given. `non_streaming_mode` picks the prompt layout, as the
reference's `generate_voice_clone` (default false: the streaming layout, `stream.clone_streaming_layout`;
true: `prompt.build_clone_prompt`). Input streaming takes the streaming layout in both modes. Audio at
another rate is resampled to the codec's 24 kHz (the reference uses librosa's resampler; ours is a windowed
sinc, so only 24 kHz uploads give bit-identical prompts). The reference decodes an in-context clone's audio
after the reference frames and cuts their audio off: the prompt carries the reference codes as its codec
prefix (`CODEC_PREFIX`), which primes the request's codec slot once, at admission, so the streamed audio
is the reference's.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from vox_serve.audio_input import decode_audio, resample
from vox_serve.codecs.mimi.config import MimiConfig
from vox_serve.codecs.mimi.encoder import MimiEncoder
from vox_serve.core.meta import CODEC_PREFIX
from vox_serve.core.request import Prompt
from vox_serve.models.qwen3_tts.prompt import PromptIds, build_clone_prompt
from vox_serve.models.qwen3_tts.speaker_encoder import SAMPLE_RATE, SpeakerEncoder, SpeakerEncoderConfig
from vox_serve.models.qwen3_tts.stream import clone_prompt_text_ids, clone_streaming_layout, text_ids
from vox_serve.request_builder import FieldError
from vox_serve.rt.checkpoint import CheckpointError, init_random, read_json
from vox_serve.voice_prompt import SAVED_VOICE_FIELD, VoicePrompt

MIN_REFERENCE_SECONDS = 0.1
MAX_REFERENCE_SECONDS = 60.0  # the released models clone from a few seconds; longer only costs prompt length
CLONE_FIELDS = ("audio", "ref_text", "x_vector_only_mode")


class VoiceCloner:
    """The Base model's two encoders, on the program's device, in float32."""

    def __init__(self, speaker_encoder: SpeakerEncoder, codec_encoder: MimiEncoder) -> None:
        self.speaker_encoder, self.codec_encoder = speaker_encoder, codec_encoder

    def prompt(self, tokenizer: Any, ids: PromptIds, fields: dict[str, Any]) -> Prompt:
        """The request's prompt rows with its speaker embedding (and reference codes to prime the codec with,
        in-context), in the layout `non_streaming_mode` picks (default: the streaming one, as the reference's);
        FieldError for unusable inputs. A saved voice (fields[SAVED_VOICE_FIELD]) brings its embedding and
        reference codes: no encoder runs."""
        voice = self.voice(fields, clone_mode(fields))
        language = fields.get("language")
        if fields.get("non_streaming_mode", False):
            rows, speaker_row = build_clone_prompt(tokenizer, ids, fields["text"], language, voice.ref_text,
                                                   voice.ref_codes)
            return clone_prompt(rows, speaker_row, [], voice)
        texts = text_ids(tokenizer, ids, fields["text"])
        return clone_prompt(*clone_streaming_layout(tokenizer, ids, texts, language, voice.ref_text,
                                                    voice.ref_codes), voice)

    def streaming_prompt(self, tokenizer: Any, ids: PromptIds, fields: dict[str, Any],
                         prompt_text_ids: list[int]) -> Prompt:
        """An input-streaming request's prompt from its first text ids (`prompt_text_ids`, as many as
        `prompt_text_ids_needed` says, or all of a text that ended sooner, tts_eos included)."""
        check_streaming_fields(fields)
        voice = self.voice(fields, clone_mode(fields))
        return clone_prompt(*clone_streaming_layout(tokenizer, ids, prompt_text_ids, fields.get("language"),
                                                    voice.ref_text, voice.ref_codes), voice)

    def prompt_text_ids_needed(self, tokenizer: Any, fields: dict[str, Any]) -> int:
        """How many text ids an input-streaming clone's prompt pairs with its codec rows (FieldError for unusable
        audio): the reference frames' count comes from the saved voice or the upload's length."""
        if clone_mode(fields):
            return clone_prompt_text_ids(tokenizer, None, None)
        saved = fields.get(SAVED_VOICE_FIELD)
        if saved is not None:
            return clone_prompt_text_ids(tokenizer, saved.ref_text, len(saved.ref_codes))
        samples, rate = self._decoded(fields["audio"])  # not resampled: `resample`'s length, in integers
        frames = _ceil_div(_ceil_div(len(samples) * SAMPLE_RATE, rate), self.codec_encoder.config.samples_per_frame)
        return clone_prompt_text_ids(tokenizer, fields["ref_text"], frames)

    def voice(self, fields: dict[str, Any], x_vector_only: bool) -> VoicePrompt:
        """The request's cloning prompt: its saved voice's, or computed from its uploaded `audio`."""
        saved = fields.get(SAVED_VOICE_FIELD)
        if saved is None:
            return self.encode(fields["audio"], None if x_vector_only else fields["ref_text"])
        self.check_saved(saved)
        return VoicePrompt(saved.speaker) if x_vector_only else saved

    def encode(self, audio_file: bytes, ref_text: str | None) -> VoicePrompt:
        """Reference audio (and its transcript, for in-context cloning) -> the cloning prompt."""
        audio = self.reference_audio(audio_file)
        with torch.inference_mode():
            speaker = self.speaker_encoder(audio).tolist()
            ref_codes = None if ref_text is None else self.codec_encoder(audio).tolist()
        return VoicePrompt(speaker, ref_codes, ref_text)

    def check_saved(self, voice: VoicePrompt) -> None:
        """A saved voice must come from this model's encoders (same embedding width and code groups)."""
        width = self.speaker_encoder.fc.out_channels
        groups = self.codec_encoder.num_codebooks
        if len(voice.speaker) != width or any(len(frame) != groups for frame in voice.ref_codes or []):
            raise FieldError("voice", f"the saved voice was made by another model (speaker embedding of "
                                      f"{len(voice.speaker)}, not {width})")

    def reference_audio(self, data: bytes) -> torch.Tensor:
        """Uploaded bytes -> [samples] float32 at 24 kHz."""
        samples, rate = self._decoded(data)
        return resample(torch.from_numpy(samples), rate, SAMPLE_RATE)

    @staticmethod
    def _decoded(data: bytes) -> tuple[Any, int]:
        """Uploaded bytes -> (samples, rate), its length checked."""
        try:
            samples, rate = decode_audio(data, MAX_REFERENCE_SECONDS)
        except ValueError as exc:
            raise FieldError("audio", str(exc)) from exc
        seconds = len(samples) / rate
        if not MIN_REFERENCE_SECONDS <= seconds <= MAX_REFERENCE_SECONDS:
            raise FieldError("audio", f"the reference audio is {seconds:.2f} s long; it must be "
                                      f"{MIN_REFERENCE_SECONDS:g} to {MAX_REFERENCE_SECONDS:g} s")
        return samples, rate

    def weights_bytes(self) -> int:
        modules = (self.speaker_encoder, self.codec_encoder)
        return sum(p.numel() * p.element_size() for m in modules for p in m.parameters())


def clone_mode(fields: dict[str, Any]) -> bool:
    """Whether the request clones from the speaker embedding only (else in context); FieldError for fields
    a clone cannot take or lacks. A saved voice clones in context when it was saved with a transcript."""
    if fields.get("voice") or fields.get("instruct"):
        name = "voice" if fields.get("voice") else "instruct"
        raise FieldError(name, "a Base (voice clone) model takes its voice from the reference `audio` or a saved "
                               "voice")
    saved = fields.get(SAVED_VOICE_FIELD)
    if saved is not None:
        if fields.get("audio") or fields.get("ref_text"):
            raise FieldError("audio" if fields.get("audio") else "ref_text",
                             "a saved voice brings its own reference audio and transcript")
        if saved.ref_codes is None and fields.get("x_vector_only_mode") is False:
            raise FieldError("x_vector_only_mode", "the saved voice has no transcript: it clones from the speaker "
                                                   "embedding only")
        return fields.get("x_vector_only_mode", saved.ref_codes is None)
    if not fields.get("audio"):
        raise FieldError("audio", "this Base (voice clone) model needs reference audio: upload it as `audio`, "
                                  "or name a saved voice")
    has_transcript = bool(fields.get("ref_text"))
    x_vector_only = fields.get("x_vector_only_mode", not has_transcript)
    if not x_vector_only and not has_transcript:
        raise FieldError("ref_text", "is required for in-context cloning (x_vector_only_mode false)")
    return x_vector_only


def check_streaming_fields(fields: dict[str, Any]) -> None:
    """What input streaming refuses of a clone (besides `clone_mode`'s): the non-streaming layout, which
    needs the whole text before the first frame."""
    clone_mode(fields)
    check_streaming_layout(fields)


def check_streaming_layout(fields: dict[str, Any]) -> None:
    if fields.get("non_streaming_mode"):
        raise FieldError("non_streaming_mode", "input streaming feeds the text as it arrives (the streaming "
                                               "layout); send the whole text to POST /generate for the other")


def clone_prompt(rows: list[list[int]], speaker_row: int, trailing: list[int], voice: VoicePrompt) -> Prompt:
    """A clone's prompt: the speaker embedding at its row; in context, the reference codes that prime the codec
    (the reference decodes the clip's codes before the generated ones and cuts their audio off)."""
    conditioning = {CODEC_PREFIX: voice.ref_codes} if voice.ref_codes else {}
    return Prompt.of(rows, {speaker_row: voice.speaker}, conditioning, trailing)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def max_reference_frames(samples_per_frame: int) -> int:
    """Codec frames of the longest reference clip (the codec prefix a slot holds)."""
    return math.ceil(MAX_REFERENCE_SECONDS * SAMPLE_RATE / samples_per_frame)


def load_cloner(cfg: dict[str, Any], model_dir: Path | None, codec_dir: Path | None,
                codec_config: dict[str, Any] | None, num_code_groups: int, device: torch.device,
                seed: int) -> VoiceCloner:
    """The encoders from the checkpoint (`speaker_encoder.*` weights, `speech_tokenizer/`'s encoder), or
    random weights of `cfg`'s shapes without one (the codec encoder's from `codec_config` or Mimi's)."""
    speaker_encoder = SpeakerEncoder(SpeakerEncoderConfig.from_dict(cfg.get("speaker_encoder_config") or {}))
    if model_dir is None:
        init_random(speaker_encoder, seed)
    else:
        _load_speaker_encoder(speaker_encoder, model_dir)
    if codec_dir is None:
        config, valid = codec_encoder_config(codec_config or {})
        codec_encoder = MimiEncoder.random(config, seed + 1, num_codebooks=valid or num_code_groups)
    else:
        codec_encoder = load_codec_encoder(codec_dir)
    if codec_encoder.num_codebooks != num_code_groups:
        raise CheckpointError(f"the codec encoder keeps {codec_encoder.num_codebooks} quantizers, "
                              f"the talker has {num_code_groups} code groups")
    if speaker_encoder.fc.out_channels != cfg["talker_config"]["hidden_size"]:
        raise CheckpointError("speaker_encoder_config.enc_dim differs from the talker's hidden_size")
    return VoiceCloner(speaker_encoder.to(device).eval(), codec_encoder.to(device).eval())


def _load_speaker_encoder(encoder: SpeakerEncoder, model_dir: Path) -> None:
    from safetensors import safe_open

    prefix, sd = "speaker_encoder.", {}
    for file in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            sd.update({k[len(prefix):]: f.get_tensor(k) for k in f.keys() if k.startswith(prefix)})
    own = encoder.state_dict()
    missing, unexpected = sorted(set(own) - set(sd)), sorted(set(sd) - set(own))
    bad = [k for k in own if k in sd and sd[k].shape != own[k].shape]
    if missing or unexpected or bad:
        raise CheckpointError(f"{model_dir}: speaker encoder weights missing {missing[:4]}, unexpected "
                              f"{unexpected[:4]}, of other shapes {bad[:4]}")
    encoder.load_state_dict(sd)


def codec_encoder_config(tokenizer_config: dict[str, Any]) -> tuple[MimiConfig, int | None]:
    """The 12 Hz tokenizer's Mimi encoder (`encoder_config`) and the codebooks it keeps
    (`encoder_valid_num_quantizers`; None when not given)."""
    return (MimiConfig.from_dict(tokenizer_config.get("encoder_config", {})),
            tokenizer_config.get("encoder_valid_num_quantizers"))


def load_codec_encoder(path: Path) -> MimiEncoder:
    """The encoder half of a `speech_tokenizer/` folder (config.json + model.safetensors). As qwen-tts runs it
    (transformers 4.57), its transformer attends over the whole clip (no sliding window)."""
    from safetensors import safe_open

    config, valid = codec_encoder_config(read_json(path / "config.json"))
    encoder = MimiEncoder(config, num_codebooks=valid)
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:  # the decoder half stays unread
        sd = {k[len("encoder."):]: f.get_tensor(k) for k in f.keys() if k.startswith("encoder.")}
    try:
        encoder.load_checkpoint(sd, source=str(path))
    except ValueError as exc:
        raise CheckpointError(str(exc)) from exc
    return encoder.eval()
