"""Qwen3-TTS input streaming: the reference's `non_streaming_mode=False` text layout, fed incrementally.

The prompt is the non-streaming one up to the codec prefix, then one last position that pairs the
first text token with codec_bos. Every other text token, then tts_eos, is "trailing text": generated
frame k's input carries trailing token k in the text column (then tts_pad, the absent id), one text
token per frame, as the reference adds `trailing_text_hidden[:, k]` at generation step k.

Text arrives in pieces, and BPE must give the ids the whole text would get. The Qwen2 tokenizer first
splits text into pre-token words with a regex, then merges bytes within each word, so a token can
only change while its word can: `stable_text_ids` tokenizes the text not yet committed and keeps the
tokens of every word but the last (which more letters, digits or punctuation could extend), and but
the last two when both are whitespace (a newline after them merges a whitespace run into one word).
Words before those never change: the regex's alternatives that read past a word's end stop at the
first character of another class. The held-back tokens follow with more text, or with the end. The
regex has no look-behind, so tokenizing from a word boundary on gives the whole text's tokens; the
next call starts at the first held-back word, and a session's text is tokenized about once.
"""

from __future__ import annotations

from typing import Any

from vox_serve.models.qwen3_tts.prompt import (
    ASSISTANT_HEAD,
    PromptIds,
    _row,
    build_clone_prompt,
    build_prompt,
)
from vox_serve.models.tokenizers.user_text import for_user_text

PROMPT_TEXT_IDS = 1  # text ids in the prompt: the first token (the rest trail, one per frame)


def stable_text_ids(tokenizer: Any, text: str, start: int, ended: bool, tts_eos: int) -> tuple[list[int], int]:
    """(ids, end): the ids of `text[start:]` (`text` is all received so far; `start`, 0 or the `end` of
    the previous call, a word boundary) that more text cannot change, and where in `text` they end.
    Once `ended`, all of them and tts_eos. All ids of one text, concatenated, are the reference's
    (`input_id[:, 3:-5]`, from the assistant turn, whose head is only tokenized when `start` is 0)."""
    # The turn's special tokens split the tokenizer's input, so the text's ids are those of the plain
    # text between <|im_start|> and <|im_end|>: "assistant\n" (on the first call) and the text.
    head = "assistant\n" if start == 0 else ""
    turn = f"{head}{text[start:]}"
    enc = for_user_text(tokenizer).encode(turn)
    first_id = ASSISTANT_HEAD - 1 if head else 0  # <|im_start|> is not in `enc`
    ids = enc.ids[first_id:]
    if ended:
        return ids + [tts_eos], len(text)
    words = enc.word_ids[first_id:]
    offsets = enc.offsets[first_id:]
    keep = len(ids)
    for held in range(2):  # the last word; the one before it too when both are whitespace
        if keep == 0:
            break
        first = words.index(words[keep - 1])
        is_space = turn[offsets[first][0]:offsets[keep - 1][1]].isspace()
        if held == 1 and not is_space:
            break
        keep = first
        if not is_space:
            break
    end = start + offsets[keep][0] - len(head) if keep < len(ids) else start
    return ids[:keep], end


def streaming_prompt(tokenizer: Any, ids: PromptIds, first_text_id: int, voice: str | None = None,
                     language: str | None = None, instruct: str | None = None) -> list[list[int]]:
    """The prompt rows of an input-streaming request: the non-streaming prompt of an empty text ends
    with the rows (tts_eos, codec_pad) and (tts_pad, codec_bos); here one row (first text id, codec_bos)
    replaces them. Raises ValueError for unsupported inputs, as build_prompt does."""
    rows = build_prompt(tokenizer, ids, "", voice, language, instruct)
    return _first_text_row(ids, rows, first_text_id)


def clone_streaming_prompt(tokenizer: Any, ids: PromptIds, first_text_id: int, language: str | None = None
                           ) -> tuple[list[list[int]], int]:
    """An x-vector-only voice clone's input-streaming prompt: (rows, index of the speaker row). The
    reference builds it as `streaming_prompt`'s, with the speaker embedding in the speaker position."""
    rows, speaker_row = build_clone_prompt(tokenizer, ids, "", language)
    return _first_text_row(ids, rows, first_text_id), speaker_row


def _first_text_row(ids: PromptIds, rows: list[list[int]], first_text_id: int) -> list[list[int]]:
    """An empty text's prompt with its closing rows (tts_eos, codec_pad), (tts_pad, codec_bos) replaced by
    (first text id, codec_bos)."""
    return rows[:-2] + [_row(ids, first_text_id, ids.codec_bos)]
