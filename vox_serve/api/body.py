"""Request bodies -> validated request fields: JSON, multipart or urlencoded forms, audio uploads.

Bodies are read through a byte counter, so an upload past --max-upload-mb is refused (413) while
it arrives, not after it has been buffered. Form values arrive as strings and are converted to
the field's documented type; then `request_builder` checks every field against the model's meta.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import math
import re
from collections.abc import AsyncIterator
from typing import Any

import anyio
from starlette.datastructures import FormData, UploadFile
from starlette.formparsers import FormParser, MultiPartException, MultiPartParser, parse_options_header
from starlette.requests import Request
from starlette.types import Message, Receive

from vox_serve.api.errors import ApiError
from vox_serve.api.schemas import AUDIO_FIELD, REQUEST_FIELDS
from vox_serve.audio_upload import AudioError, audio_seconds
from vox_serve.core.meta import ProgramMeta
from vox_serve.request_builder import FieldError, normalise_fields, sampling_params

FORM_OVERHEAD_BYTES = 1 << 20  # room for the text fields and multipart framing beside an upload
DISCARD_LIMIT_BYTES = 64 << 20  # past this a refused body is cut off, not read
JSON_TYPES = ("application/json",)
FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")
_BOOLEANS = {"true": True, "false": False}  # as JSON writes them: "1", "on" or "yes" is not taken for true
MAX_FORM_FIELDS = 64
DEFAULT_MAX_AUDIO_SECONDS = 600.0  # for a model taking audio that states no limit of its own
MAX_NUMBER_CHARS = 40  # a form number longer than this is no sampling value (and int() of 5000 digits raises)
_FORM_INTEGER = re.compile(r"[+-]?[0-9]+")
_FORM_NUMBER = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")


class BodyTooLarge(Exception):
    pass


def _limited(receive: Receive, limit: int) -> Receive:
    seen = 0

    async def receive_limited() -> Message:
        nonlocal seen
        message = await receive()
        seen += len(message.get("body", b""))
        if seen > limit:
            raise BodyTooLarge
        return message

    return receive_limited


async def _discard_body(receive: Receive) -> None:
    """Read (and drop) the rest of a refused body, up to DISCARD_LIMIT_BYTES, so that a client which
    sends its whole body before reading the answer still reads the 413 instead of a reset."""
    seen = 0
    while seen < DISCARD_LIMIT_BYTES:
        message = await receive()
        seen += len(message.get("body", b""))
        if message["type"] != "http.request" or not message.get("more_body", False):
            return


def _too_large(field: str, max_upload_bytes: int) -> ApiError:
    what = "the upload is" if field == AUDIO_FIELD else "the request body is"
    return ApiError(413, f"{field}: {what} larger than --max-upload-mb ({max_upload_bytes / 2**20:g} MB) allows",
                    field, "too_large")


async def read_fields(request: Request, max_upload_bytes: int,
                      body_timeout_s: float) -> tuple[dict[str, Any], bytes | None]:
    """The body's fields (form values converted to their types) and the uploaded audio, if any. The
    whole body must arrive within body_timeout_s (408 after that)."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if not media and request.headers.get("content-length", "0") == "0" and "transfer-encoding" not in request.headers:
        return {}, None  # no body at all: no fields
    if media not in JSON_TYPES + FORM_TYPES:
        raise ApiError(415, f"body: content type {media or 'none'!r} is not supported; send application/json "
                            "or multipart/form-data", "body", "unsupported_media_type")
    too_large = _too_large(AUDIO_FIELD if media == "multipart/form-data" else "body", max_upload_bytes)
    limit = max_upload_bytes + FORM_OVERHEAD_BYTES
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        if request.headers.get("expect", "").lower() != "100-continue":  # else the body is never sent
            await _discard_body(request.receive)
        raise too_large
    limited = Request(request.scope, _limited(request.receive, limit))
    try:
        with anyio.fail_after(body_timeout_s):
            if media in JSON_TYPES:
                fields, audio = json_fields(await limited.body())
            else:
                fields, audio = await _form_fields(limited, media)
    except BodyTooLarge:
        await _discard_body(request.receive)
        raise too_large from None
    except TimeoutError:
        raise body_timeout(body_timeout_s) from None
    if audio is not None and len(audio) > max_upload_bytes:
        raise _too_large(AUDIO_FIELD, max_upload_bytes)
    return fields, audio


def body_timeout(body_timeout_s: float) -> ApiError:
    return ApiError(408, f"body: not received within --body-timeout-s ({body_timeout_s:g} s)", "body", "timeout")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise FieldError(key, "is given more than once")
        out[key] = value
    return out


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def json_fields(body: bytes) -> tuple[dict[str, Any], bytes | None]:
    """A JSON body's object and its base64 `audio`, if any; 400 naming `body` for what is not a JSON
    object (bad syntax or UTF-8, NaN, nesting too deep, an integer of thousands of digits)."""
    try:
        fields = json.loads(body, object_pairs_hook=_unique_keys, parse_float=_finite, parse_constant=_no_constant)
    except FieldError:
        raise
    except RecursionError:
        raise ApiError(400, "body: not valid JSON (nested too deeply)", "body") from None
    except ValueError as exc:  # bad syntax or UTF-8, NaN, an integer of more than 4300 digits
        raise ApiError(400, f"body: not valid JSON ({str(exc)[:200]})", "body") from None
    if not isinstance(fields, dict):
        raise ApiError(400, "body: must be a JSON object of request fields", "body")
    audio = fields.pop(AUDIO_FIELD, None)
    if audio is None:
        return fields, None
    if not isinstance(audio, str):
        raise FieldError(AUDIO_FIELD, "must be base64-encoded audio in a JSON body")
    try:
        return fields, base64.b64decode(audio, validate=True)
    except binascii.Error as exc:
        raise FieldError(AUDIO_FIELD, f"is not valid base64 ({exc})") from exc


def _malformed(why: str) -> ApiError:
    return ApiError(400, f"body: malformed form data ({why})", "body")


async def _watch_closing(stream: AsyncIterator[bytes], delimiter: bytes, seen: list[bool]) -> AsyncIterator[bytes]:
    """The chunks of `stream`; sets seen[0] once the multipart closing delimiter has passed. The form
    parser reads a body cut off before it as if it were complete, losing the part it was in."""
    tail = b""
    async for chunk in stream:
        window = tail + chunk
        if delimiter in window:
            seen[0] = True
        tail = window[-len(delimiter):]
        yield chunk


async def _parse_form(request: Request, media: str) -> FormData:
    if media == "application/x-www-form-urlencoded":
        return await FormParser(request.headers, request.stream(), max_fields=MAX_FORM_FIELDS).parse()
    _, params = parse_options_header(request.headers["content-type"])
    boundary = params.get(b"boundary")
    if not boundary:
        raise _malformed("the content-type header has no boundary")
    seen = [False]
    stream = _watch_closing(request.stream(), b"--" + boundary + b"--", seen)
    form = await MultiPartParser(request.headers, stream, max_files=1, max_fields=MAX_FORM_FIELDS).parse()
    if not seen[0]:
        await form.close()
        raise _malformed("the body ends before its closing boundary; it was cut off")
    return form


async def _form_fields(request: Request, media: str) -> tuple[dict[str, Any], bytes | None]:
    try:
        form = await _parse_form(request, media)
    except MultiPartException as exc:
        raise _malformed(exc.message.rstrip(".")) from exc
    try:
        fields: dict[str, Any] = {}
        audio = None
        for key, value in form.multi_items():
            if key in fields or (key == AUDIO_FIELD and audio is not None):
                raise FieldError(key, "is given more than once")
            if isinstance(value, UploadFile):
                if key != AUDIO_FIELD:
                    raise FieldError(key, "must be a form field, not a file")
                audio = await value.read()
            elif key == AUDIO_FIELD:
                raise FieldError(AUDIO_FIELD, "must be a file upload")
            else:
                fields[key] = _form_value(key, value)
        return fields, audio
    finally:
        await form.close()


def _form_value(key: str, value: str) -> Any:
    """A form string as the field's documented type, written as JSON would write it (no spaces, no
    digit separators); fields of other types stay strings."""
    doc = REQUEST_FIELDS.get(key)
    kind = doc.kind if doc is not None else "string"
    if kind == "boolean":
        if value not in _BOOLEANS:
            raise FieldError(key, f"must be a boolean (true or false), got {value[:40]!r}")
        return _BOOLEANS[value]
    if kind in ("integer", "number"):
        if len(value) > MAX_NUMBER_CHARS or not _FORM_NUMBER.fullmatch(value):
            raise FieldError(key, f"must be a number such as 7, -2 or 0.5e-3, got {value[:40]!r}")
        return int(value) if _FORM_INTEGER.fullmatch(value) else _finite_field(key, value)
    if kind == "array":  # numbers, comma-separated
        items = value.split(",")
        if len(value) > MAX_NUMBER_CHARS * 16 or not all(_FORM_NUMBER.fullmatch(v.strip()) for v in items):
            raise FieldError(key, f"must be comma-separated numbers such as 0.5,0.25, got {value[:40]!r}")
        return [_finite_field(key, v.strip()) for v in items]
    return value


def _finite_field(key: str, value: str) -> float:
    number = float(value)
    if not math.isfinite(number):
        raise FieldError(key, f"is out of range: {value[:40]}")
    return number


def validate_fields(meta: ProgramMeta, fields: dict[str, Any], require_text: bool = True) -> dict[str, Any]:
    """The normalised fields (aliases applied); FieldError for anything the model cannot take: names,
    types, ranges, and the voice, language and instruction against what the model has."""
    clean = normalise_fields(meta, fields, require_text)
    for key, value in clean.items():
        if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
            raise FieldError(key, "must fit in a signed 64-bit integer")
    sampling_params(meta, clean, greedy=False, seed=0)  # the ranges of the values as sent (--greedy aside)
    _check_choice("voice", clean.get("voice"), meta.voices, f"model {meta.name} has no named voices")
    unsupported = meta.extra.get("unsupported_languages", {}).get(str(clean.get("language")).lower())
    if unsupported:  # listed by the reference but not served here: say why
        raise FieldError("language", f"{clean['language']!r} is not supported: {unsupported}")
    _check_choice("language", clean.get("language"), meta.languages, f"model {meta.name} takes no language")
    if clean.get("instruct") and not meta.extra.get("takes_instruct", True):
        raise FieldError("instruct", f"model {meta.name} does not take instructions")
    return clean


def _check_choice(key: str, value: str | None, choices: tuple[str, ...], none_message: str) -> None:
    """A voice or language must be one the model lists (GET /info), written as listed."""
    if value is None:
        return
    if not choices:
        raise FieldError(key, none_message)
    if value not in choices:
        raise FieldError(key, f"{value[:60]!r} is not one of {', '.join(choices)}")


def validate_session_fields(meta: ProgramMeta, fields: dict[str, Any]) -> dict[str, Any]:
    """Fields of an input-streaming session, whose text comes later: checked as POST /generate checks them."""
    if fields.get("streaming") is False:
        raise FieldError("streaming", "an input-streaming session always streams its audio")
    if "text" in fields:
        raise FieldError("text", "an input-streaming session sends its text with /generate/stream/{id}/text")
    return validate_fields(meta, fields, require_text=False)


async def check_audio(meta: ProgramMeta, audio: bytes | None) -> None:
    """An upload must be audio that the model takes, of a length it takes (FieldError naming `audio` if
    not). The model is asked first; the file is then decoded block by block, at most to the model's limit,
    and nothing decoded is kept."""
    if audio is None:
        return
    if AUDIO_FIELD not in meta.accepted_fields:
        raise FieldError(AUDIO_FIELD, f"not accepted by model {meta.name}: it takes no reference audio")
    if not audio:
        raise FieldError(AUDIO_FIELD, "is empty")
    min_s, max_s = meta.extra.get("reference_audio_seconds", (0.0, DEFAULT_MAX_AUDIO_SECONDS))
    try:
        seconds = await asyncio.to_thread(audio_seconds, audio, max_s)
    except AudioError as exc:
        raise FieldError(AUDIO_FIELD, str(exc)) from None
    if seconds == 0 or seconds < min_s:
        raise FieldError(AUDIO_FIELD, f"is {seconds:.3f} s long; the model takes {min_s:g} to {max_s:g} s")
