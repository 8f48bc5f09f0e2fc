"""Request fields -> a validated Request: field names, types and ranges checked against the model meta."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from vox_serve.core.meta import ProgramMeta
from vox_serve.core.request import Prompt, Request, SamplingParams, TextFeed

# The common fields' types (their ranges are SamplingParams.validate's); a model's own fields are the ones it
# declares (`ProgramMeta.field_schemas`)
_NUMERIC = {
    "temperature": float, "top_p": float, "min_p": float, "repetition_penalty": float,
    "top_k": int, "max_tokens": int, "seed": int,
}
_BOOL = ("ignore_eos", "streaming", "x_vector_only_mode", "non_streaming_mode")
AUDIO = "audio"  # reference audio: the uploaded file's bytes
# alias -> field, for a model that takes the field and has no field of the alias's name (CSM's `speaker` is
# its own: an integer id)
_ALIASES = {"speaker": "voice"}
BASE64_PATTERN = r"^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
_BOUNDS = {"minimum": (lambda v, b: v >= b, ">="), "maximum": (lambda v, b: v <= b, "<="),
           "exclusiveMinimum": (lambda v, b: v > b, ">"), "exclusiveMaximum": (lambda v, b: v < b, "<")}


# Characters that show nothing when spoken or printed: ASCII and Latin-1 controls and spaces, the soft
# hyphen, Unicode spaces, zero-width and direction marks, word joiners, variation selectors and the BOM.
# Written with regex escapes (\x.., \u....) only, so that this one pattern means the same in Python and in the OpenAPI
# document (ECMA-262): a text must contain at least one character outside this class.
INVISIBLE_CHARS = ("\\x00-\\x20\\x7f-\\xa0\\xad\\u034f\\u061c\\u115f\\u1160\\u1680\\u17b4\\u17b5\\u180b-\\u180f"
                   "\\u2000-\\u200f\\u2028-\\u202f\\u205f-\\u206f\\u3000\\u3164\\ufe00-\\ufe0f\\ufeff\\uffa0\\ufff0-\\ufffb")
VISIBLE_PATTERN = f"[^{INVISIBLE_CHARS}]"
_VISIBLE = re.compile(VISIBLE_PATTERN)


class FieldError(ValueError):
    """A request field the model cannot take; `field` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def has_visible(text: str) -> bool:
    """Whether `text` has a character that is not whitespace, a control or an invisible format mark."""
    return _VISIBLE.search(text) is not None


def check_encodable(key: str, value: str) -> None:
    """A string must be valid Unicode: a lone surrogate (JSON `"\\ud800"`) cannot be encoded or spoken."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise FieldError(key, f"contains a lone surrogate ({value[exc.start]!r} at character {exc.start}); "
                              "send valid Unicode text") from None


def field_aliases(meta: ProgramMeta | None) -> dict[str, str]:
    """The aliases a model takes (alias -> field); all of them while no model is known."""
    if meta is None:
        return dict(_ALIASES)
    return {alias: target for alias, target in _ALIASES.items()
            if target in meta.accepted_fields and alias not in meta.accepted_fields}


def normalise_fields(meta: ProgramMeta, fields: dict[str, Any], require_text: bool = True) -> dict[str, Any]:
    """Apply aliases, reject unknown fields and check types; returns a new dict.

    `require_text=False` checks everything but the text (an input-streaming session's text arrives later).
    """
    out: dict[str, Any] = {}
    aliases = field_aliases(meta)
    for alias, target in aliases.items():
        if alias in fields and target in fields:
            raise FieldError(alias, f"`{alias}` is an alias of `{target}`; send one of them, not both")
    for key, value in fields.items():
        key = aliases.get(key, key)
        if key not in meta.accepted_fields:
            raise FieldError(key, f"not accepted by model {meta.name} (accepted: {', '.join(meta.accepted_fields)})")
        schema = meta.field_schemas.get(key)
        out[key] = _field_value(key, value) if schema is None else declared_value(key, value, schema)
    text = out.get("text")
    if text is None and not require_text:
        return out
    check_text(meta, text)
    return out


def _field_value(key: str, value: Any) -> Any:
    if value is None:  # refused rather than read as "absent": the schema gives every field one type
        raise FieldError(key, "must not be null; leave the field out to get its default")
    if key in _NUMERIC:
        return _number(key, value, _NUMERIC[key])
    if key in _BOOL:
        if not isinstance(value, bool):
            raise FieldError(key, "must be a boolean")
    elif key == AUDIO:
        if not isinstance(value, bytes | bytearray) or not value:
            raise FieldError(key, "must be a non-empty audio file upload")
    elif not isinstance(value, str):
        raise FieldError(key, "must be a string")
    else:
        check_encodable(key, value)
    return value


def declared_value(key: str, value: Any, schema: dict[str, Any]) -> Any:
    """A value of a field the model declares (`ProgramMeta.field_schemas`), checked against its schema's type
    and range; what an array or object holds is the model's prompt builder's to check."""
    if value is None:
        raise FieldError(key, "must not be null; leave the field out to get its default")
    kind = schema["type"]
    if kind in ("integer", "number"):
        return _bounded(key, value, schema)
    if kind == "boolean" and not isinstance(value, bool):
        raise FieldError(key, "must be a boolean")
    if kind == "string":
        if not isinstance(value, str):
            raise FieldError(key, "must be a string")
        check_encodable(key, value)
    if kind == "array":
        return _array(key, value, schema)
    if kind == "object" and not isinstance(value, dict):
        raise FieldError(key, f"must be an object, got {type(value).__name__}")
    return value


def check_text(meta: ProgramMeta, text: Any) -> None:
    """The whole text of a request: a string with something visible in it, at most max_text_chars."""
    if not isinstance(text, str) or not text:
        raise FieldError("text", "is required and must not be empty")
    check_encodable("text", text)
    if not has_visible(text):
        raise FieldError("text", "has no visible character (only whitespace, control or invisible format "
                                 "characters)")
    if len(text) > meta.max_text_chars:
        raise FieldError("text", f"is {len(text)} characters; the limit is {meta.max_text_chars}")


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


def as_field_error(exc: ValueError, fields: dict[str, Any]) -> FieldError:
    """A prompt builder's ValueError as a FieldError: builders name the field first ("voice 'x' is not
    one of ..."); a message naming no field of the request is about its text."""
    if isinstance(exc, FieldError):
        return exc
    first = str(exc).split(" ", 1)[0].rstrip(":")
    return FieldError(first if first in fields else "text", str(exc))


def request_fields(meta: ProgramMeta, fields: dict[str, Any], greedy: bool, seed: int
                   ) -> tuple[dict[str, Any], SamplingParams]:
    """The normalised fields and the sampling parameters of a request (FieldError for a bad field)."""
    clean = normalise_fields(meta, fields)
    return clean, sampling_params(meta, clean, greedy, seed)


def make_prompt(preprocess: Preprocess, clean: dict[str, Any]) -> Prompt:
    """The program's prompt for validated fields; its ValueErrors become FieldErrors naming the field."""
    try:
        return preprocess(clean)
    except ValueError as exc:
        raise as_field_error(exc, clean) from exc


def new_request(req_id: str, prompt: Prompt, clean: dict[str, Any], sampling: SamplingParams) -> Request:
    """A request for its prompt; one with trailing text ids is fed them, one per generated row, as an input-
    streaming request whose text has ended."""
    feed = TextFeed(list(prompt.trailing_text), ended=True) if prompt.trailing_text else None
    return Request(req_id=req_id, prompt=prompt, sampling=sampling, streaming=clean.get("streaming", True),
                   extra={"fields": clean}, text_feed=feed)


def build_request(meta: ProgramMeta, preprocess: Preprocess, fields: dict[str, Any], req_id: str,
                  greedy: bool = False, seed: int = 0) -> Request:
    """Validate fields and build the Request, its prompt built here (bench mode, tests)."""
    clean, sampling = request_fields(meta, fields, greedy, seed)
    return new_request(req_id, make_prompt(preprocess, clean), clean, sampling)


def _bounded(key: str, value: Any, schema: dict[str, Any]) -> int | float:
    """A number of an `integer` / `number` schema within its bounds."""
    number = _number(key, value, int if schema["type"] == "integer" else float)
    for bound, (holds, sign) in _BOUNDS.items():
        if bound in schema and not holds(number, schema[bound]):
            raise FieldError(key, f"must be {sign} {schema[bound]}, got {number}")
    return number


def _array(key: str, value: Any, schema: dict[str, Any]) -> list[Any]:
    """A list within its schema's item counts; items of a numeric item schema checked (and converted) here,
    others left to the model's prompt builder."""
    if not isinstance(value, list | tuple):
        raise FieldError(key, f"must be a list, got {type(value).__name__}")
    least, most = schema.get("minItems", 0), schema.get("maxItems", len(value))
    if not least <= len(value) <= most:
        count = f"{least}" if least == most else f"{least} to {most}" if least else f"at most {most}"
        raise FieldError(key, f"has {len(value)} items; {count} are taken")
    items = schema.get("items", {})
    if items.get("type") not in ("integer", "number"):
        return list(value)
    out = []
    for i, item in enumerate(value):
        try:
            out.append(_bounded(key, item, items))
        except FieldError as exc:
            raise FieldError(key, f"item {i} {str(exc).removeprefix(f'{key}: ')}") from None
    return out
