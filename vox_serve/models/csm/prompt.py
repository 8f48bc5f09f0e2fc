"""CSM prompts and request fields (torch-free): a conversation of earlier turns, then the turn to speak.

Each input row is `[code_0, ..., code_{K-1}, text]` (K = 32 codebooks), -1 where absent. As transformers'
`CsmProcessor` builds it (`add_special_tokens=False`) and `CsmForConditionalGeneration` embeds it:
  - every turn is `<|begin_of_text|>[speaker]text<|end_of_text|>`: text rows (the text tokenized on its own,
    without special tokens; `[speaker]` is the speaker id in brackets);
  - a context turn with audio continues with one row per audio frame (all K codes, no text: the processor's
    `<|AUDIO|>` x n, n = ceil(samples / 1920)) and one all-eos frame (`<|audio_eos|>`: every code 0);
  - the turn to speak has no audio: the model continues with its first frame.

Request fields: `text`, `speaker` (an integer, default 0), `context` (a list of earlier turns, oldest first:
`{"text": str, "speaker": int, "audio": clip}` or `{..., "codes": [[32 codes] per frame]}`; a turn may
also have neither, text only). A clip is the audio file's bytes (base64 in JSON); it is encoded with
Mimi's encoder before the prompt is built (`vox_serve.models.csm.context`). Errors name the field,
e.g. `context[1].codes`.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

from vox_serve.request_builder import BASE64_PATTERN, VISIBLE_PATTERN, FieldError, check_encodable, has_visible

ABSENT = -1
DEFAULT_SPEAKER = 0
MAX_SPEAKER_ID = 2**31 - 1  # any non-negative int is a valid "[n]"; this only bounds the prompt text
MAX_CONTEXT_TURNS = 64
MAX_CONTEXT_SECONDS = 60.0  # per clip; the conversation as a whole is bounded by the model length
END_OF_TEXT = "<|end_of_text|>"
TURN_FIELDS = ("text", "speaker", "audio", "codes")


@dataclass(frozen=True)
class PromptIds:
    """The ids a CSM prompt is made of."""

    bos: int
    eos: int
    num_codebooks: int
    codebook_size: int  # codes a client may send: 0 .. codebook_size - 1 (Mimi's codebooks)
    codebook_eos: int

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, *, bos: int, num_codebooks: int, codebook_size: int,
                       codebook_eos: int) -> PromptIds:
        eos = tokenizer.token_to_id(END_OF_TEXT)
        if eos is None:
            raise ValueError(f"the tokenizer has no {END_OF_TEXT} token")
        return cls(bos=bos, eos=eos, num_codebooks=num_codebooks, codebook_size=codebook_size,
                   codebook_eos=codebook_eos)


@dataclass(frozen=True)
class ContextTurn:
    """An earlier turn of the conversation; `audio` (a clip's file bytes) is replaced by `codes` before the
    prompt is built."""

    text: str
    speaker: int
    codes: tuple[tuple[int, ...], ...] | None = None  # [frames][num_codebooks]
    audio: bytes | None = None

    @property
    def needs_encoding(self) -> bool:
        return self.audio is not None


@dataclass(frozen=True)
class CsmFields:
    text: str
    speaker: int
    context: tuple[ContextTurn, ...]


def parse_fields(fields: dict[str, Any], ids: PromptIds) -> CsmFields:
    """The CSM-specific request fields, checked; FieldError naming the field (`speaker`, `context[i].codes`)."""
    context = fields.get("context") or []
    if not isinstance(context, list | tuple):
        raise FieldError("context", "must be a list of earlier turns (objects with text, speaker, audio or codes)")
    if len(context) > MAX_CONTEXT_TURNS:
        raise FieldError("context", f"has {len(context)} turns; at most {MAX_CONTEXT_TURNS} are taken")
    return CsmFields(text=fields["text"], speaker=parse_speaker("speaker", fields.get("speaker", DEFAULT_SPEAKER)),
                     context=tuple(_turn(f"context[{i}]", turn, ids) for i, turn in enumerate(context)))


def _integer(value: Any) -> int | None:
    """`value` as an int when JSON would call it an integer (`3` or `3.0`, as the common fields take them)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    return int(value) if isinstance(value, float) and value.is_integer() else None


def parse_speaker(name: str, value: Any) -> int:
    speaker = _integer(value)
    if speaker is None:
        raise FieldError(name, f"must be an integer speaker id, got {type(value).__name__}")
    if not 0 <= speaker <= MAX_SPEAKER_ID:
        raise FieldError(name, f"must be in [0, {MAX_SPEAKER_ID}]")
    return speaker


def _turn(name: str, turn: Any, ids: PromptIds) -> ContextTurn:
    if not isinstance(turn, dict):
        raise FieldError(name, "must be an object with text, speaker and optionally audio or codes")
    unknown = sorted(set(turn) - set(TURN_FIELDS))
    if unknown:
        raise FieldError(f"{name}.{unknown[0]}", f"is not a field of a context turn ({', '.join(TURN_FIELDS)})")
    text = turn.get("text")
    if not isinstance(text, str) or not has_visible(text):
        raise FieldError(f"{name}.text", "is required and must have a visible character")
    check_encodable(f"{name}.text", text)
    speaker = parse_speaker(f"{name}.speaker", turn.get("speaker", DEFAULT_SPEAKER))
    audio, codes = turn.get("audio"), turn.get("codes")
    if audio is not None and codes is not None:
        raise FieldError(f"{name}.codes", "a turn takes its audio as a clip (`audio`) or as codes, not both")
    if codes is not None:
        return ContextTurn(text, speaker, codes=_codes(f"{name}.codes", codes, ids))
    if audio is not None:
        return ContextTurn(text, speaker, audio=_clip(f"{name}.audio", audio))
    return ContextTurn(text, speaker)


def _codes(name: str, codes: Any, ids: PromptIds) -> tuple[tuple[int, ...], ...]:
    if not isinstance(codes, list | tuple) or not codes:
        raise FieldError(name, f"must be a non-empty list of frames, each {ids.num_codebooks} codes")
    frames = []
    for i, frame in enumerate(codes):
        if not isinstance(frame, list | tuple) or len(frame) != ids.num_codebooks:
            raise FieldError(f"{name}[{i}]", f"must be a list of {ids.num_codebooks} codes")
        ints = tuple(_integer(c) for c in frame)
        if not all(c is not None and 0 <= c < ids.codebook_size for c in ints):
            raise FieldError(f"{name}[{i}]", f"codes must be integers in [0, {ids.codebook_size})")
        frames.append(ints)
    return tuple(frames)


def _clip(name: str, audio: Any) -> bytes:
    if isinstance(audio, str):  # JSON bodies carry the file base64-encoded
        try:
            audio = base64.b64decode(audio, validate=True)
        except binascii.Error as exc:
            raise FieldError(name, f"is not valid base64 ({exc})") from exc
    if not isinstance(audio, bytes | bytearray) or not audio:
        raise FieldError(name, "must be a non-empty audio file (base64-encoded in JSON)")
    return bytes(audio)


def field_schemas(ids: PromptIds, max_text_chars: int) -> dict[str, dict[str, Any]]:
    """The JSON schemas of CSM's own request fields (`ProgramMeta.field_schemas`: request_builder checks the
    type and range, `parse_fields` the rest; the OpenAPI document and GET /info publish them)."""
    speaker = {"type": "integer", "minimum": 0, "maximum": MAX_SPEAKER_ID}
    frame = {"type": "array", "minItems": ids.num_codebooks, "maxItems": ids.num_codebooks,
             "items": {"type": "integer", "minimum": 0, "maximum": ids.codebook_size - 1}}
    turn = {
        "type": "object", "required": ["text"], "additionalProperties": False,
        "properties": {
            "text": {"type": "string", "minLength": 1, "maxLength": max_text_chars, "pattern": VISIBLE_PATTERN,
                     "description": "What was said in this turn."},
            "speaker": {**speaker, "default": DEFAULT_SPEAKER, "description": "Who said it."},
            "audio": {"type": "string", "contentEncoding": "base64", "pattern": BASE64_PATTERN, "minLength": 1,
                      "description": "The turn's audio: a WAV, FLAC, OGG or MP3 file, base64-encoded (encoded to "
                                     f"codes with Mimi's encoder; at most {MAX_CONTEXT_SECONDS:g} s)."},
            "codes": {"type": "array", "minItems": 1, "items": frame,
                      "description": f"The turn's audio as Mimi codes: frames of {ids.num_codebooks} codes."},
        },
        "not": {"required": ["audio", "codes"]},
    }
    return {
        "speaker": {**speaker, "default": DEFAULT_SPEAKER,
                    "description": "Speaker id of the text (`[n]` before it in the prompt; 0 by default)."},
        "context": {"type": "array", "maxItems": MAX_CONTEXT_TURNS, "items": turn,
                    "description": "Earlier turns of the conversation, oldest first: each with its text, speaker "
                                   "and optionally its audio (a clip or codes), which the model continues from."},
        "depth_decoder_temperature": {"type": "number", "minimum": 0, "maximum": 10,
                                      "description": "Temperature of codebooks 1..31 (the depth decoder); 0 is "
                                                     "greedy, as is everything when `temperature` is 0."},
        "depth_decoder_top_k": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1,
                                "description": "Top-k of codebooks 1..31; 0 disables."},
        "depth_decoder_top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1,
                                "description": "Nucleus mass of codebooks 1..31."},
    }


def audio_frames(num_samples: int, samples_per_frame: int) -> int:
    """Frames (prompt positions) of a clip of `num_samples`: ceil(samples / samples_per_frame)."""
    return -(-num_samples // samples_per_frame)


def build_prompt(tokenizer: Any, ids: PromptIds, fields: CsmFields) -> list[list[int]]:
    """The prompt rows [positions][num_codebooks + 1]; every context clip must have been encoded."""
    rows: list[list[int]] = []
    for i, turn in enumerate(fields.context):
        if turn.needs_encoding:
            raise ValueError(f"context[{i}].audio has not been encoded")
        rows += _text_rows(tokenizer, ids, turn.text, turn.speaker)
        if turn.codes is not None:
            rows += [list(frame) + [ABSENT] for frame in turn.codes]
            rows.append([ids.codebook_eos] * ids.num_codebooks + [ABSENT])
    return rows + _text_rows(tokenizer, ids, fields.text, fields.speaker)


def _text_rows(tokenizer: Any, ids: PromptIds, text: str, speaker: int) -> list[list[int]]:
    tokens = [ids.bos] + tokenizer.encode(f"[{speaker}]{text}", add_special_tokens=False).ids + [ids.eos]
    return [[ABSENT] * ids.num_codebooks + [t] for t in tokens]


def audio_frame_count(frames: list[list[int]], codebook_eos: int) -> int:
    """How many generated frames have audio: all up to the first frame whose every code is eos (the stop frame
    when its last codebook is eos too; transformers cuts the audio there)."""
    for i, frame in enumerate(frames):
        if all(c == codebook_eos for c in frame):
            return i
    return len(frames)
