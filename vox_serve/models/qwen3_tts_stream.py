"""Qwen3-TTS input streaming: the reference's `non_streaming_mode=False` text layout, fed incrementally.

The prompt is the non-streaming one up to the codec prefix, then one last position that pairs the
first text token with codec_bos. Every other text token, then tts_eos, is "trailing text": generated
frame k's input carries trailing token k in the text column (then tts_pad, the absent id), one text
token per frame, as the reference adds `trailing_text_hidden[:, k]` at generation step k.

Text arrives in pieces, and BPE must give the ids the whole text would get. The Qwen2 tokenizer first
splits text into pre-token words with a regex, then merges bytes within each word, so a token can
only change while its word can: `stable_text_ids` re-tokenizes all the text received so far and
keeps the tokens of every word but the last (which more letters, digits or punctuation could extend),
and but the last two when both are whitespace (a newline after them merges a whitespace run into one
word). Words before those never change: the regex's alternatives that read past a word's end stop at
the first character of another class. The held-back tokens follow with more text, or with the end.
"""

from __future__ import annotations

from typing import Any

from vox_serve.models.qwen3_tts_prompt import ASSISTANT_HEAD, ASSISTANT_TAIL, PromptIds, _row, build_prompt

PROMPT_TEXT_IDS = 1  # text ids in the prompt: the first token (the rest trail, one per frame)


def _turn(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"


def stable_text_ids(tokenizer: Any, text: str, ended: bool, tts_eos: int) -> list[int]:
    """The text ids of `text` (all received so far) that more text cannot change; once `ended`, all of
    them and tts_eos. They are the ids the reference gets for the same text (`input_id[:, 3:-5]`)."""
    turn = _turn(text)
    enc = tokenizer.encode(turn)
    end = len(enc.ids) - ASSISTANT_TAIL
    ids = enc.ids[ASSISTANT_HEAD:end]
    if ended:
        return ids + [tts_eos]
    words = enc.word_ids[ASSISTANT_HEAD:end]
    offsets = enc.offsets[ASSISTANT_HEAD:end]
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
    return ids[:keep]


def streaming_prompt(tokenizer: Any, ids: PromptIds, first_text_id: int, voice: str | None = None,
                     language: str | None = None, instruct: str | None = None) -> list[list[int]]:
    """The prompt rows of an input-streaming request: the non-streaming prompt of an empty text ends
    with the rows (tts_eos, codec_pad) and (tts_pad, codec_bos); here one row (first text id, codec_bos)
    replaces them. Raises ValueError for unsupported inputs, as build_prompt does."""
    rows = build_prompt(tokenizer, ids, "", voice, language, instruct)
    return rows[:-2] + [_row(ids, first_text_id, ids.codec_bos)]
