"""User text is text: a tokenizer that prompts use never turns what a request says into control tokens.

A tokenizer with added special tokens (`<|im_end|>`, `<|eot_id|>`, ...) normally matches their strings
anywhere in its input, so a request's text could close a chat turn or open one. Prompt builders put
their special tokens in by id instead, and tokenize everything else with `for_user_text`'s setting.
"""

from __future__ import annotations

from typing import Any


def for_user_text(tok: Any) -> Any:
    """`tok` (a `tokenizers.Tokenizer`), set to read special-token strings in its input as plain text:
    `<|im_end|>` in a request's text becomes the tokens of those characters, never its special id."""
    tok.encode_special_tokens = True
    return tok
