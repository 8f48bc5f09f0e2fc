"""The error a client raises for an error the server answered."""

from __future__ import annotations

import json
from typing import Any


class VoxError(Exception):
    """The server refused or failed a request; `param` names the field at fault, when there is one."""

    def __init__(self, status: int | None, message: str, type: str | None = None, param: str | None = None) -> None:
        super().__init__(f"{status or 'error'}: {message}")
        self.status, self.message, self.type, self.param = status, message, type, param

    @classmethod
    def from_body(cls, status: int | None, body: bytes | str | dict[str, Any]) -> VoxError:
        """From an OpenAI-shaped error body (`param`, `code`) or vox-serve's native one (`field`, `type`)."""
        try:
            data = body if isinstance(body, dict) else json.loads(body)
            error = data["error"]
            return cls(status, error["message"], error.get("code") or error.get("type"),
                       error.get("param", error.get("field")))
        except (ValueError, KeyError, TypeError):
            text = body.decode(errors="replace") if isinstance(body, bytes) else str(body)
            return cls(status, text[:500] or "no error body")
