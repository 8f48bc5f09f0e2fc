"""Input-streaming sessions in the scheduler process: text that arrives in pieces (pure Python).

A model without incremental input streaming collects a session's pieces and starts the request at
the end of the text. A model with it (`ProgramMeta.streamed_text_column`, e.g. Qwen3-TTS) is a
`TextStreaming` program: after every piece, the ids of the text received so far that more text can no
longer change (`stable_text_ids`) are handed on: the first `num_prompt_text_ids_for` the request of them to build
the prompt, which starts the request (or all of them once the text ends); the prompt's own trailing text
ids (`Prompt.trailing_text`) lead its text feed; the rest, as they become stable, to the request's text feed. Only
the text not yet stable is tokenized again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from vox_serve.core.request import Prompt


class TextStreaming(Protocol):
    """What a program with incremental input streaming provides (the Qwen3-TTS program, for one)."""

    num_prompt_text_ids: int  # text ids the prompt needs before the request can start

    def num_prompt_text_ids_for(self, fields: dict[str, Any]) -> int:
        """The text ids this request's prompt needs (`num_prompt_text_ids` but for prompts that pair more
        with other rows, e.g. a voice clone's reference frames); fields as `check_streaming_fields` gets them,
        FieldError for unusable ones. A text that ends sooner starts the request with all of its ids."""

    def stable_text_ids(self, text: str, start: int, ended: bool) -> tuple[list[int], int]:
        """(ids, end): the ids of `text[start:]` (`text` is all received so far; `start` is 0 or the
        previous call's `end`) that more text cannot change, and where in `text` they end; once
        `ended`, all of them and the model's end-of-text id."""

    def check_streaming_fields(self, fields: dict[str, Any]) -> None:
        """Raises FieldError for fields the model takes, but not with input streaming (checked when the
        session opens, so that its start is refused rather than its audio)."""

    def preprocess_streaming(self, fields: dict[str, Any], prompt_text_ids: list[int]
                             ) -> Prompt:
        """The prompt of an input-streaming request; raises ValueError like `preprocess`."""


@dataclass
class InputSession:
    """An input-streaming request whose text is still arriving."""

    fields: dict[str, Any]
    default_seed: int
    audio: bytes
    parts: list[str] = field(default_factory=list)
    num_chars: int = 0
    started: bool = False  # incremental streaming: the request runs
    stable_chars: int = 0  # incremental streaming: text before this offset is tokenized for good
    text_ids: list[int] = field(default_factory=list)  # stable ids kept until the request starts
    voice: Any = None  # a saved voice's VoicePrompt, when the session names one
    prompt_text_ids: int = 1  # incremental streaming: text ids the prompt needs (num_prompt_text_ids_for)

    @property
    def text(self) -> str:
        return "".join(self.parts)
