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
    ABSENT,
    ASSISTANT_HEAD,
    ASSISTANT_TAIL,
    PromptIds,
    _row,
    assistant_turn,
    build_clone_prompt,
    build_prompt,
    reference_text_ids,
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


def _first_text_row(ids: PromptIds, rows: list[list[int]], first_text_id: int) -> list[list[int]]:
    """An empty text's prompt with its closing rows (tts_eos, codec_pad), (tts_pad, codec_bos) replaced by
    (first text id, codec_bos)."""
    return rows[:-2] + [_row(ids, first_text_id, ids.codec_bos)]


def text_ids(tokenizer: Any, ids: PromptIds, text: str) -> list[int]:
    """A whole text's ids and tts_eos: what the streaming layout pairs with codec rows or trails."""
    return assistant_turn(tokenizer, text)[ASSISTANT_HEAD:-ASSISTANT_TAIL] + [ids.tts_eos]


def paired_rows(ids: PromptIds, codec_rows: list[list[int]], texts: list[int]) -> tuple[list[list[int]], list[int]]:
    """The streaming layout's ending: codec row k (G code columns) with text id `texts[k]`, tts_pad once the
    texts run out; returns those rows and the texts left over (they trail, one per generated frame)."""
    rows = [codes + [texts[k] if k < len(texts) else ids.tts_pad] for k, codes in enumerate(codec_rows)]
    return rows, texts[len(codec_rows):]


def clone_streaming_layout(tokenizer: Any, ids: PromptIds, texts: list[int], language: str | None = None,
                           ref_text: str | None = None, ref_codes: list[list[int]] | None = None
                           ) -> tuple[list[list[int]], int, list[int]]:
    """A voice clone's prompt in the reference's streaming layout (`non_streaming_mode=False`): (rows, index of
    the speaker row, trailing text ids). `texts` are the text's ids, with tts_eos once the text is complete
    (`text_ids`), or the first of them that have arrived (input streaming; enough for the rows they pair with).

    The head is the non-streaming layout's, up to the tts_bos row; then codec_bos and (in-context cloning:
    `ref_codes` and `ref_text`) every reference frame, each paired with the next id of the reference
    transcript then the text (reference `generate_icl_prompt`); x-vector only: codec_bos with the first text
    id. The ids past the codec rows trail."""
    head, speaker_row = build_clone_prompt(tokenizer, ids, "", language)
    codec_rows = [_row(ids, ABSENT, ids.codec_bos)[:-1]]
    if ref_codes is not None:
        if ref_text is None:
            raise ValueError("ref_text: in-context cloning needs the reference audio's transcript")
        texts = reference_text_ids(tokenizer, ref_text) + texts
        codec_rows += [list(frame) for frame in ref_codes]
    rows, trailing = paired_rows(ids, codec_rows, texts)
    return head[:-2] + rows, speaker_row, trailing


def clone_prompt_text_ids(tokenizer: Any, ref_text: str | None, num_ref_frames: int | None) -> int:
    """Text ids an input-streaming clone needs before its prompt can be built (fewer once its text ends):
    one (x-vector only), or as many as the reference frames and codec_bos outnumber the transcript's."""
    if num_ref_frames is None:
        return PROMPT_TEXT_IDS
    return max(0, num_ref_frames + 1 - len(reference_text_ids(tokenizer, ref_text or "")))
