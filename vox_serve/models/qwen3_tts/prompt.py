"""Qwen3-TTS prompts (CustomVoice, VoiceDesign, Base), built as the reference's non-streaming mode does.

Each prompt position is one input row: `[code_0, code_1, ..., code_{G-1}, text]`, -1 where absent.
Prompt positions use code column 0 only (the talker's codec vocabulary: control ids, languages,
speakers), except a voice clone's reference frames, which fill all G like generated frames; generated
frames leave the text absent (= tts_pad).

Order (reference `Qwen3TTSForConditionalGeneration.generate`, `non_streaming_mode=True`: the default of
`generate_custom_voice` and `generate_voice_design`; `generate_voice_clone` takes it as an argument):
  1. instruction turn `<|im_start|>user\\n{instruct}<|im_end|>\\n`: text only (when given);
  2. `<|im_start|>assistant\\n` (first 3 tokens of the assistant turn): text only;
  3. codec prefix `think, think_bos, language, think_eos` (or `nothink, think_bos, think_eos` for
     language "auto"), the speaker id (CustomVoice) or an empty position that gets the speaker
     embedding (Base), `codec_pad`; paired with tts_pad text, except that the last carries tts_bos;
  4. every text token (assistant turn without its 3 leading and 5 trailing tokens) with codec_pad,
     then tts_eos with codec_pad;
  5. tts_pad with codec_bos: the talker predicts the first frame from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vox_serve.models.tokenizers.qwen2 import chat_ids

ABSENT = -1
ASSISTANT_HEAD, ASSISTANT_TAIL = 3, 5  # tokens of "<|im_start|>assistant\n" and "<|im_end|>\n<|im_start|>assistant\n"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"  # put in by id (tokenizers/qwen2.chat_ids)
REF_TAIL = 2  # tokens of "<|im_end|>\n" closing a voice clone's reference transcript


@dataclass(frozen=True)
class PromptIds:
    """Token ids and vocabularies from a Qwen3-TTS config.json."""

    model_type: str  # custom_voice | voice_design | base
    model_size: str
    num_code_groups: int
    tts_pad: int
    tts_bos: int
    tts_eos: int
    codec_pad: int
    codec_bos: int
    codec_eos: int
    codec_think: int
    codec_nothink: int
    codec_think_bos: int
    codec_think_eos: int
    languages: dict[str, int]  # lower-case name -> codec id (dialects included)
    speakers: dict[str, int]
    speaker_dialects: dict[str, str | bool]

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> PromptIds:
        t = cfg["talker_config"]
        return cls(
            model_type=cfg.get("tts_model_type") or "custom_voice", model_size=str(cfg.get("tts_model_size") or ""),
            num_code_groups=t["num_code_groups"], tts_pad=cfg["tts_pad_token_id"], tts_bos=cfg["tts_bos_token_id"],
            tts_eos=cfg["tts_eos_token_id"], codec_pad=t["codec_pad_id"], codec_bos=t["codec_bos_id"],
            codec_eos=t["codec_eos_token_id"], codec_think=t["codec_think_id"], codec_nothink=t["codec_nothink_id"],
            codec_think_bos=t["codec_think_bos_id"], codec_think_eos=t["codec_think_eos_id"],
            languages={k.lower(): v for k, v in (t.get("codec_language_id") or {}).items()},
            speakers={k.lower(): v for k, v in (t.get("spk_id") or {}).items()},
            speaker_dialects={k.lower(): v for k, v in (t.get("spk_is_dialect") or {}).items()},
        )

    @property
    def supported_languages(self) -> tuple[str, ...]:
        return ("auto",) + tuple(k for k in self.languages if "dialect" not in k)

    @property
    def takes_speaker(self) -> bool:
        return self.model_type == "custom_voice"

    @property
    def takes_instruct(self) -> bool:
        # The 0.6B CustomVoice model was not trained with instructions (the reference drops them).
        return not (self.model_type == "custom_voice" and self.model_size == "0b6")


def _row(ids: PromptIds, text: int, code: int = ABSENT) -> list[int]:
    return [code] + [ABSENT] * (ids.num_code_groups - 1) + [text]


def language_id(ids: PromptIds, language: str | None, speaker: str | None) -> int | None:
    """The codec language id (None: "auto"), with a dialect speaker's dialect for Chinese / auto."""
    lang = (language or "auto").lower()
    if lang not in ids.supported_languages:
        raise ValueError(f"language {language!r} is not supported; choose one of {', '.join(ids.supported_languages)}")
    chosen = None if lang == "auto" else ids.languages[lang]
    dialect = ids.speaker_dialects.get(speaker) if speaker else False
    if lang in ("chinese", "auto") and dialect:
        chosen = ids.languages[dialect]
    return chosen


def resolve_speaker(ids: PromptIds, voice: str | None) -> str | None:
    if not ids.takes_speaker:
        if voice:
            raise ValueError(f"voice: this {ids.model_type} model has no named voices (describe the voice in "
                             "`instruct`)")
        return None
    if not voice:
        return None
    speaker = voice.lower()
    if speaker not in ids.speakers:
        raise ValueError(f"voice {voice!r} is not one of {', '.join(ids.speakers)}")
    return speaker


def build_prompt(tokenizer: Any, ids: PromptIds, text: str, voice: str | None = None, language: str | None = None,
                 instruct: str | None = None) -> list[list[int]]:
    """The prompt rows [positions][G + 1] of one request; raises ValueError for unsupported inputs."""
    speaker = resolve_speaker(ids, voice)
    lang_id = language_id(ids, language, speaker)
    if instruct and not ids.takes_instruct:
        raise ValueError("instruct: the 0.6B CustomVoice model does not take instructions")
    turn = assistant_turn(tokenizer, text)
    speaker_codes = [ids.speakers[speaker]] if speaker is not None else []
    return _head(tokenizer, ids, turn, lang_id, speaker_codes, instruct) + _text_rows(ids, turn)


def build_clone_prompt(tokenizer: Any, ids: PromptIds, text: str, language: str | None = None,
                       ref_text: str | None = None, ref_codes: list[list[int]] | None = None
                       ) -> tuple[list[list[int]], int]:
    """A Base (voice clone) prompt: (rows, index of the speaker row, whose input gets the speaker embedding).

    x-vector-only cloning (no `ref_codes`) is the plain layout with the speaker embedding in the speaker
    position. In-context cloning (reference `generate_icl_prompt`, non-streaming) replaces the text rows:
    the reference transcript's tokens then the text's, each with codec_pad, then tts_eos with codec_pad,
    then codec_bos and every reference frame (all G code groups), each with tts_pad; the model continues
    the reference audio from its last frame.
    """
    turn = assistant_turn(tokenizer, text)
    rows = _head(tokenizer, ids, turn, language_id(ids, language, None), [ABSENT], None)
    speaker_row = len(rows) - 2  # the row before the codec_pad / tts_bos row
    if ref_codes is None:
        return rows + _text_rows(ids, turn), speaker_row
    if ref_text is None:
        raise ValueError("ref_text: in-context cloning needs the reference audio's transcript")
    texts = reference_text_ids(tokenizer, ref_text) + turn[ASSISTANT_HEAD:-ASSISTANT_TAIL]
    rows += [_row(ids, t, ids.codec_pad) for t in texts] + [_row(ids, ids.tts_eos, ids.codec_pad),
                                                            _row(ids, ids.tts_pad, ids.codec_bos)]
    rows += [list(frame) + [ids.tts_pad] for frame in ref_codes]
    return rows, speaker_row


def reference_text_ids(tokenizer: Any, ref_text: str) -> list[int]:
    """The reference transcript's ids, as the reference cuts them from
    `<|im_start|>assistant\n{ref_text}<|im_end|>\n`."""
    return chat_ids(tokenizer, IM_START, f"assistant\n{ref_text}", IM_END, "\n")[ASSISTANT_HEAD:-REF_TAIL]


def assistant_turn(tokenizer: Any, text: str) -> list[int]:
    """Ids of `<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n`, the user's text
    tokenized as plain text (special-token strings in it stay text)."""
    return chat_ids(tokenizer, IM_START, f"assistant\n{text}", IM_END, "\n", IM_START, "assistant\n")


def _head(tokenizer: Any, ids: PromptIds, turn: list[int], lang_id: int | None, speaker_codes: list[int],
          instruct: str | None) -> list[list[int]]:
    """Instruction turn, assistant role, codec prefix and speaker position, up to the tts_bos row."""
    rows: list[list[int]] = []
    if instruct:
        rows += [_row(ids, t) for t in chat_ids(tokenizer, IM_START, f"user\n{instruct}", IM_END, "\n")]
    rows += [_row(ids, t) for t in turn[:ASSISTANT_HEAD]]
    if lang_id is None:
        prefix = [ids.codec_nothink, ids.codec_think_bos, ids.codec_think_eos]
    else:
        prefix = [ids.codec_think, ids.codec_think_bos, lang_id, ids.codec_think_eos]
    prefix += speaker_codes + [ids.codec_pad]
    return rows + [_row(ids, ids.tts_pad, code) for code in prefix[:-1]] + [_row(ids, ids.tts_bos, prefix[-1])]


def _text_rows(ids: PromptIds, turn: list[int]) -> list[list[int]]:
    """Every text token with codec_pad, tts_eos with codec_pad, then tts_pad with codec_bos."""
    rows = [_row(ids, t, ids.codec_pad) for t in turn[ASSISTANT_HEAD:-ASSISTANT_TAIL]]
    return rows + [_row(ids, ids.tts_eos, ids.codec_pad), _row(ids, ids.tts_pad, ids.codec_bos)]
