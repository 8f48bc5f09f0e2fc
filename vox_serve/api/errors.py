"""Errors a client sees: one JSON shape, `{"error": {"type", "field", "message"}}`, for every 4xx/5xx."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from vox_serve.ipc import ErrorCode, Failed
from vox_serve.request_builder import FieldError

RETRY_AFTER_S = 1

# Scheduler error codes -> (HTTP status, retry later?)
_STATUS: dict[str, tuple[int, bool]] = {
    ErrorCode.INVALID_FIELD: (422, False),
    ErrorCode.UNSUPPORTED: (400, False),
    ErrorCode.QUEUE_FULL: (503, True),
    ErrorCode.STALLED: (503, True),
    ErrorCode.REPLICA_DIED: (503, True),
    ErrorCode.INTERNAL: (500, False),
    ErrorCode.TIMEOUT: (504, False),
}


class ApiError(Exception):
    """An error answered as JSON; `field` names the request field at fault, when there is one."""

    def __init__(self, status: int, message: str, field: str | None = None, type: str = "invalid_request",
                 retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.field, self.type = status, message, field, type
        self.retry_after = retry_after

    @classmethod
    def from_field_error(cls, exc: FieldError) -> ApiError:
        return cls(422, str(exc), exc.field, str(ErrorCode.INVALID_FIELD))

    @classmethod
    def from_failed(cls, event: Failed) -> ApiError:
        status, retry = _STATUS.get(event.code, (500, False))
        return cls(status, event.message, event.field, event.code, RETRY_AFTER_S if retry else None)

    @classmethod
    def unavailable(cls, message: str) -> ApiError:
        return cls(503, message, None, "unavailable", RETRY_AFTER_S)

    def response(self) -> JSONResponse:
        headers = {"Retry-After": str(self.retry_after)} if self.retry_after is not None else None
        return JSONResponse(error_body(self.type, self.message, self.field), self.status, headers=headers)


def error_body(type: str, message: str, field: str | None = None) -> dict[str, Any]:
    return {"error": {"type": type, "field": field, "message": message}}


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return exc.response()


async def _field_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, FieldError)
    return ApiError.from_field_error(exc).response()


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    return JSONResponse(error_body("http_error", str(exc.detail)), exc.status_code, headers=exc.headers)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "path", "query")]
    field = ".".join(loc) or None
    message = f"{field}: {first.get('msg', 'invalid')}" if field else str(first.get("msg", "invalid request"))
    return JSONResponse(error_body(str(ErrorCode.INVALID_FIELD), message, field), 422)


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(error_body(str(ErrorCode.INTERNAL), "internal server error (see the server log)"), 500)


EXCEPTION_HANDLERS = {
    Exception: _internal_error,
    ApiError: _api_error,
    FieldError: _field_error,
    HTTPException: _http_error,
    RequestValidationError: _validation_error,
}
