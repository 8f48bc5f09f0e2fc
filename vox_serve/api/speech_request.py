"""What the speech routes (OpenAI-compatible and WebSocket) share before submitting: the voice, the
segments of a long text, and their validation (the same as POST /generate's, segment by segment)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vox_serve.api.body import check_audio, validate_fields
from vox_serve.api.replicas import ReplicaManager
from vox_serve.api.segments import plan_segments, segment_chars
from vox_serve.api.voices_store import VoiceStore
from vox_serve.config import VoxConfig
from vox_serve.core.meta import ProgramMeta
from vox_serve.request_builder import FieldError, field_aliases

NO_VOICE = "default"  # what a client names on a model without named voices (OpenAI's clients need a voice)


@dataclass(frozen=True)
class Voice:
    """A request's voice: a model's built-in name (a request field), or a saved voice's prompt."""

    name: str | None = None
    prompt: bytes = b""


def resolve_voice(meta: ProgramMeta, store: VoiceStore | None, voice: Any) -> Voice:
    """A `voice` value (a name, or OpenAI's `{"id": name}`) as a built-in or saved voice."""
    if isinstance(voice, dict) and set(voice) == {"id"}:
        voice = voice["id"]
    if voice is None or voice == "" or (voice == NO_VOICE and not meta.voices):
        return Voice()
    if not isinstance(voice, str):
        raise FieldError("voice", 'must be a voice name or {"id": name}')
    builtin = {v.lower(): v for v in meta.voices}
    if voice.lower() in builtin:
        return Voice(name=builtin[voice.lower()])
    saved = store.prompt(meta.name, voice) if store is not None else None
    if saved is not None:
        return Voice(prompt=saved)
    choices = [*meta.voices, *(store.names(meta.name) if store is not None else [])]
    known = f"choose one of {', '.join(choices)}" if choices else f"model {meta.name} has no named or saved voices"
    raise FieldError("voice", f"{voice!r} is not a voice of model {meta.name}; {known} (GET /v1/audio/voices)")


def take_saved_voice(meta: ProgramMeta, store: VoiceStore | None, fields: dict[str, Any]) -> bytes:
    """For the native routes: when `voice` (or its alias `speaker`, where the model has that alias) names a
    saved voice rather than a built-in one, remove it from the fields and return the voice's prompt; else b""
    (fields untouched)."""
    names = ("voice", *(alias for alias, target in field_aliases(meta).items() if target == "voice"))
    key = next((k for k in names if k in fields), None)
    name = fields.get(key) if key else None
    if not isinstance(name, str) or store is None or name.lower() in (v.lower() for v in meta.voices):
        return b""
    prompt = store.prompt(meta.name, name)
    if prompt is not None:
        del fields[key]
    return prompt or b""


def check_length(config: VoxConfig, text: Any) -> str:
    if not isinstance(text, str) or not text.strip():
        raise FieldError("text", "is required and must not be empty")
    limit = config.server.max_input_chars
    if len(text) > limit:
        raise FieldError("text", f"is {len(text)} characters; the limit is {limit} (--max-input-chars)")
    return text


def segment_fields(manager: ReplicaManager, config: VoxConfig, fields: dict[str, Any]) -> list[dict[str, Any]]:
    """`fields` once per segment of its text, each validated as POST /generate validates a request."""
    meta, limits = manager.require_meta(), manager.limits
    assert limits is not None
    text = check_length(config, fields.get("text"))
    parts = plan_segments(text, segment_chars(meta, limits.max_model_len))
    return [validate_fields(meta, {**fields, "text": part}) for part in parts]


async def check_upload(meta: ProgramMeta, audio: bytes | None, voice_prompt: bytes) -> None:
    """The upload is decodable audio the model takes, and not given beside a saved voice."""
    if audio is not None and voice_prompt:
        raise FieldError("voice", "a saved voice brings its own reference audio; send `voice` or `audio`, not both")
    await check_audio(meta, audio)
