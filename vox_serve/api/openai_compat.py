"""The OpenAI-compatible routes' error shape and request plumbing.

OpenAI answers `{"error": {"message", "type", "param", "code"}}`; its Python client turns that into
`openai.BadRequestError`, `NotFoundError`, ... by status. On these routes every error vox-serve raises
(ApiError, FieldError, request validation, HTTP errors) is answered in that shape: `param` is the
field at fault in OpenAI's naming (`input`, not `text`), `code` vox-serve's error type. A field a
model cannot take is a 400 here (OpenAI's status for invalid parameters), not /generate's 422.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from vox_serve.api.errors import RETRY_AFTER_S, ApiError
from vox_serve.formats import OptionError
from vox_serve.request_builder import FieldError

# vox-serve field -> the name an OpenAI request uses for it
OPENAI_NAMES = {"text": "input", "instruct": "instructions"}
UNKNOWN_FIELD = "unknown_field"  # an error about a name the client sent as is: never renamed


class OpenAIErrorBody(BaseModel):
    message: str
    type: str  # invalid_request_error, or server_error for 5xx
    param: str | None  # the request field at fault, in OpenAI's naming
    code: str  # vox-serve's error type


class OpenAIErrorResponse(BaseModel):
    error: OpenAIErrorBody


OPENAI_ERROR_TEXT = {
    400: "A field the model cannot take (`error.param` names it), a malformed body, or a feature this "
         "server or model does not have.",
    401: "Missing or wrong API key (`Authorization: Bearer KEY`, servers started with --api-key).",
    404: "No such model or voice.",
    408: "The body did not arrive within --body-timeout-s.",
    409: "A voice of that name exists, or the voice cannot be changed.",
    413: "Upload larger than --max-upload-mb.",
    415: "Unsupported content type.",
    500: "The request failed inside the server.",
    503: "Overloaded or no replica ready; see Retry-After.",
    504: "The request ran past --request-timeout-s.",
}


def openai_error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI responses of the error statuses a route answers, in OpenAI's error shape."""
    retry = {"Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "integer"}}}
    return {status: {"model": OpenAIErrorResponse, "description": OPENAI_ERROR_TEXT[status],
                     **({"headers": retry} if status == 503 else {})} for status in statuses}


def openai_error(exc: ApiError) -> JSONResponse:
    status = 400 if exc.status == 422 else exc.status
    kind = "server_error" if status >= 500 else "invalid_request_error"
    param = exc.field if exc.type == UNKNOWN_FIELD else OPENAI_NAMES.get(exc.field, exc.field) if exc.field else None
    message = exc.message
    if exc.field and param != exc.field and message.startswith(f"{exc.field}:"):
        message = f"{param}:{message[len(exc.field) + 1:]}"
    body = {"error": {"message": message, "type": kind, "param": param, "code": exc.type}}
    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after is not None else None
    return JSONResponse(body, status, headers=headers)


def as_api_error(exc: Exception) -> ApiError | None:
    """The ApiError of an exception a request can cause; None for a bug."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, FieldError | OptionError):
        return ApiError(422, str(exc), exc.field, "invalid_field")
    if isinstance(exc, RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        field = ".".join(str(p) for p in first.get("loc", ()) if p not in ("body", "path", "query")) or None
        return ApiError(422, f"{field}: {first.get('msg', 'invalid')}" if field else "invalid request", field,
                        "invalid_field")
    if isinstance(exc, HTTPException):
        return ApiError(exc.status_code, str(exc.detail), None, "http_error",
                        RETRY_AFTER_S if exc.status_code == 503 else None)
    return None


class OpenAIRoute(APIRoute):
    """A route whose errors are answered in OpenAI's shape."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def openai_handler(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:
                error = as_api_error(exc)
                if error is None:
                    raise
                return openai_error(error)

        return openai_handler
