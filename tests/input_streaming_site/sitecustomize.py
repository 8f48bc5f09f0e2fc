"""Test-only: every ProgramMeta built in this interpreter claims input streaming.

Orpheus has no input streaming; putting this folder on PYTHONPATH (for the API process and its
scheduler processes alike) lets test_http_sessions.py drive the input-streaming path of models that
take their whole text in the prompt (routes, messages, sessions collected until the text ends) on
orpheus-tiny. Qwen3-TTS streams its text incrementally: test_http_qwen3_input_streaming.py.
"""

from typing import Any

from vox_serve.core import meta

_init = meta.ProgramMeta.__init__


def _init_with_input_streaming(self: meta.ProgramMeta, *args: Any, **kwargs: Any) -> None:
    _init(self, *args, **kwargs)
    object.__setattr__(self, "supports_input_streaming", True)


meta.ProgramMeta.__init__ = _init_with_input_streaming
