"""Request fields -> a validated Request: field names, types and ranges checked against the model meta."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vox_serve.core.meta import ProgramMeta
from vox_serve.core.request import Prompt, Request, SamplingParams

_NUMERIC = {
    "temperature": float, "top_p": float, "min_p": float, "repetition_penalty": float,
    "top_k": int, "max_tokens": int, "seed": int,
}
_BOOL = ("ignore_eos", "streaming", "x_vector_only_mode")
AUDIO = "audio"  # reference audio: the uploaded file's bytes
_ALIASES = {"speaker": "voice"}


class FieldError(ValueError):
    """A request field the model cannot take; `field` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def normalise_fields(meta: ProgramMeta, fields: dict[str, Any], require_text: bool = True) -> dict[str, Any]:
    """Apply aliases, reject unknown fields and check types; returns a new dict.

    `require_text=False` checks everything but the text (an input-streaming session's text arrives later).
    """
    out: dict[str, Any] = {}
    for key, value in fields.items():
        key = _ALIASES.get(key, key)
        if key not in meta.accepted_fields:
            raise FieldError(key, f"not accepted by model {meta.name} (accepted: {', '.join(meta.accepted_fields)})")
        if value is None:
            continue
        if key in _NUMERIC:
            value = _number(key, value, _NUMERIC[key])
        elif key in _BOOL and not isinstance(value, bool):
            raise FieldError(key, "must be a boolean")
        elif key == AUDIO:
            if not isinstance(value, bytes | bytearray) or not value:
                raise FieldError(key, "must be a non-empty audio file upload")
        elif key not in _NUMERIC and key not in _BOOL and not isinstance(value, str):
            raise FieldError(key, "must be a string")
        out[key] = value
    text = out.get("text")
    if text is None and not require_text:
        return out
    if not isinstance(text, str) or not text.strip():
        raise FieldError("text", "is required and must not be empty")
    if len(text) > meta.max_text_chars:
        raise FieldError("text", f"is {len(text)} characters; the limit is {meta.max_text_chars}")
    return out


def _number(key: str, value: Any, kind: type) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FieldError(key, f"must be a number, got {type(value).__name__}")
    if kind is int:
        if isinstance(value, float) and not value.is_integer():
            raise FieldError(key, "must be an integer")
        return int(value)
    return float(value)


def sampling_params(meta: ProgramMeta, fields: dict[str, Any], greedy: bool, seed: int) -> SamplingParams:
    merged = {**meta.default_sampling, **{k: v for k, v in fields.items() if k in _NUMERIC or k == "ignore_eos"}}
    merged.setdefault("seed", seed)
    if greedy:
        merged["temperature"] = 0.0
    known = SamplingParams.__dataclass_fields__
    params = SamplingParams(**{k: v for k, v in merged.items() if k in known})
    try:
        params.validate()
    except ValueError as exc:
        name = str(exc).split(" ", 1)[0]
        raise FieldError(name, str(exc).split(" ", 1)[1]) from exc
    return params


Preprocess = Callable[[dict[str, Any]], Prompt]


def request_fields(meta: ProgramMeta, fields: dict[str, Any], greedy: bool, seed: int
                   ) -> tuple[dict[str, Any], SamplingParams]:
    """The normalised fields and the sampling parameters of a request (FieldError for a bad field)."""
    clean = normalise_fields(meta, fields)
    return clean, sampling_params(meta, clean, greedy, seed)


def make_prompt(preprocess: Preprocess, clean: dict[str, Any]) -> Prompt:
    """The program's prompt for validated fields; its ValueErrors become FieldErrors naming the field."""
    try:
        return preprocess(clean)
    except FieldError:
        raise
    except ValueError as exc:  # prompt builders name the field first: "voice 'x' is not one of ..."
        first = str(exc).split(" ", 1)[0].rstrip(":")
        raise FieldError(first if first in clean else "text", str(exc)) from exc


def new_request(req_id: str, prompt: Prompt, clean: dict[str, Any], sampling: SamplingParams) -> Request:
    return Request(req_id=req_id, prompt=prompt, sampling=sampling, streaming=clean.get("streaming", True),
                   extra={"fields": clean})


def build_request(meta: ProgramMeta, preprocess: Preprocess, fields: dict[str, Any], req_id: str,
                  greedy: bool = False, seed: int = 0) -> Request:
    """Validate fields and build the Request, its prompt built here (bench mode, tests)."""
    clean, sampling = request_fields(meta, fields, greedy, seed)
    return new_request(req_id, make_prompt(preprocess, clean), clean, sampling)
