"""Test-only: every ProgramMeta built in this interpreter claims input streaming.

No served model has input streaming yet; putting this folder on PYTHONPATH (for the API process
and its scheduler processes alike) lets test_http_sessions.py drive the whole input-streaming
path (routes, messages, scheduler sessions) on orpheus-tiny.
"""

from typing import Any

from vox_serve.rt import meta

_init = meta.ProgramMeta.__init__


def _init_with_input_streaming(self: meta.ProgramMeta, *args: Any, **kwargs: Any) -> None:
    _init(self, *args, **kwargs)
    object.__setattr__(self, "supports_input_streaming", True)


meta.ProgramMeta.__init__ = _init_with_input_streaming
