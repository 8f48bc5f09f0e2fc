"""Request bodies -> validated request fields: JSON, multipart or urlencoded forms, audio uploads.

Bodies are read through a byte counter, so an upload past --max-upload-mb is refused (413) while
it arrives, not after it has been buffered. Form values arrive as strings and are converted to
the field's documented type; then `request_builder` checks every field against the model's meta.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import json
from typing import Any

from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException
from starlette.requests import Request
from starlette.types import Message, Receive

from vox_serve.api.errors import ApiError
from vox_serve.api.schemas import AUDIO_FIELD, REQUEST_FIELDS
from vox_serve.core.meta import ProgramMeta
from vox_serve.request_builder import FieldError, normalise_fields, sampling_params

FORM_OVERHEAD_BYTES = 1 << 20  # room for the text fields and multipart framing beside an upload
DISCARD_LIMIT_BYTES = 64 << 20  # past this a refused body is cut off, not read
JSON_TYPES = ("application/json",)
FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


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


async def read_fields(request: Request, max_upload_bytes: int) -> tuple[dict[str, Any], bytes | None]:
    """The body's fields (form values converted to their types) and the uploaded audio, if any."""
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
        if media in JSON_TYPES:
            fields, audio = _json_fields(await limited.body())
        else:
            fields, audio = await _form_fields(limited)
    except BodyTooLarge:
        await _discard_body(request.receive)
        raise too_large from None
    if audio is not None and len(audio) > max_upload_bytes:
        raise _too_large(AUDIO_FIELD, max_upload_bytes)
    return fields, audio


def _json_fields(body: bytes) -> tuple[dict[str, Any], bytes | None]:
    try:
        fields = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"body: not valid JSON ({exc})", "body") from exc
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


async def _form_fields(request: Request) -> tuple[dict[str, Any], bytes | None]:
    try:
        form = await request.form(max_files=1, max_fields=64)
    except MultiPartException as exc:
        raise ApiError(400, f"body: malformed form data ({exc.message})", "body") from exc
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
    """A form string as the field's documented type; fields of other types stay strings."""
    doc = REQUEST_FIELDS.get(key)
    kind = doc.kind if doc is not None else "string"
    if kind == "boolean":
        if value.strip().lower() in _TRUE:
            return True
        if value.strip().lower() in _FALSE:
            return False
        raise FieldError(key, f"must be a boolean (true or false), got {value!r}")
    if kind in ("integer", "number"):
        try:
            return int(value)
        except ValueError:
            pass
        try:
            return float(value)
        except ValueError:
            raise FieldError(key, f"must be a number, got {value!r}") from None
    return value


def validate_fields(meta: ProgramMeta, fields: dict[str, Any], require_text: bool = True) -> dict[str, Any]:
    """The normalised fields (aliases applied); FieldError for anything the model cannot take."""
    clean = normalise_fields(meta, fields, require_text)
    for key, value in clean.items():
        if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
            raise FieldError(key, "must fit in a signed 64-bit integer")
    sampling_params(meta, clean, greedy=False, seed=0)  # the ranges of the values as sent (--greedy aside)
    return clean


def validate_session_fields(meta: ProgramMeta, fields: dict[str, Any]) -> dict[str, Any]:
    """Fields of an input-streaming session, whose text comes later."""
    if fields.get("streaming") is False:
        raise FieldError("streaming", "an input-streaming session always streams its audio")
    if "text" in fields:
        raise FieldError("text", "an input-streaming session sends its text with /generate/stream/{id}/text")
    return validate_fields(meta, fields, require_text=False)


async def check_audio(meta: ProgramMeta, audio: bytes | None) -> None:
    """An upload must be decodable audio that the model takes (FieldError naming `audio` if not)."""
    if audio is None:
        return
    if not audio:
        raise FieldError(AUDIO_FIELD, "is empty")
    await asyncio.to_thread(_decode_audio, audio)
    if AUDIO_FIELD not in meta.accepted_fields:
        raise FieldError(AUDIO_FIELD, f"not accepted by model {meta.name}: it takes no reference audio")


def _decode_audio(audio: bytes) -> None:
    import soundfile  # only uploads need libsndfile: a server without it still starts and serves text

    try:
        samples, _ = soundfile.read(io.BytesIO(audio), dtype="int16", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
        why = getattr(exc, "error_string", None) or str(exc)
        raise FieldError(AUDIO_FIELD, f"is not decodable audio ({why.strip().rstrip('.')})") from exc
    if len(samples) == 0:
        raise FieldError(AUDIO_FIELD, "holds no audio samples")
