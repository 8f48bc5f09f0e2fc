"""Qwen3-TTS input streaming, no reference needed: the tokenization rule for text that arrives in
pieces, and the streaming prompt layout."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from vox_serve.models.qwen3_tts.loader import QWEN3_TTS_TINY_CONFIG
from vox_serve.models.qwen3_tts.prompt import PromptIds, build_prompt
from vox_serve.models.qwen3_tts.stream import stable_text_ids, streaming_prompt
from vox_serve.models.tokenizers.qwen2 import tiny_qwen2_tokenizer

TOK = tiny_qwen2_tokenizer()
IDS = PromptIds.from_config(QWEN3_TTS_TINY_CONFIG)
EOS = IDS.tts_eos
# Characters of every class the Qwen2 split regex tells apart: letters (the tiny vocabulary merges
# "Hello", " the", ...), digits, punctuation, spaces, tabs, newlines, CJK, an apostrophe for
# contractions and a combining accent (NFC merges it into the letter before it).
FRAGMENTS = ["Hello", " the", "test", "is", "a", "x", "1", "2", ",", ".", "(", ")", "!", "'", "s", "t", " ", "  ",
             "\n", "\r\n", "\t", "你", "好", "e", "\u0301"]
pieces = st.lists(st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=6).map("".join), min_size=1,
                  max_size=8)


def whole(text: str) -> list[int]:
    return stable_text_ids(TOK, text, 0, True, EOS)[0]


def streamed(parts: list[str]) -> list[list[int]]:
    """The ids committed after each piece, as a session commits them (the last piece ends the text)."""
    out, text, start, ids = [], "", 0, []
    for i, part in enumerate(parts):
        text += part
        new, start = stable_text_ids(TOK, text, start, i == len(parts) - 1, EOS)
        ids = ids + new
        out.append(ids)
    return out


@settings(max_examples=200, deadline=None)
@given(parts=pieces)
def test_ids_committed_piece_by_piece_are_the_whole_texts(parts: list[str]) -> None:
    """Whatever follows, ids committed so far are never taken back: they start the whole text's ids."""
    want = whole("".join(parts))
    for ids in streamed(parts):
        assert want[: len(ids)] == ids, (parts, ids, want)
    assert streamed(parts)[-1] == want


def test_the_last_word_waits_for_more_text_or_the_end() -> None:
    hello = TOK.encode("Hello").ids
    assert stable_text_ids(TOK, "Hello", 0, False, EOS) == ([], 0)
    assert stable_text_ids(TOK, "Hello ", 0, False, EOS) == (hello, 5)  # the space may join the next word
    assert stable_text_ids(TOK, "Hello the", 0, False, EOS) == (hello, 5)
    assert stable_text_ids(TOK, "Hi \n ", 0, False, EOS) == (TOK.encode("Hi").ids, 2)  # " \n" and " " may merge
    assert stable_text_ids(TOK, "Hello the test", 5, False, EOS) == (TOK.encode(" the").ids, 9)
    assert whole("Hello the") == hello + TOK.encode(" the").ids + [EOS]


def test_streaming_prompt_is_the_prompt_up_to_its_text_then_the_first_token_with_codec_bos() -> None:
    plain = build_prompt(TOK, IDS, "Hello the test.", "ryan", "english", "Calm.")
    first = TOK.encode("Hello").ids[0]
    rows = streaming_prompt(TOK, IDS, first, "ryan", "english", "Calm.")
    num_text = len(TOK.encode("Hello the test.").ids)
    assert rows[:-1] == plain[: -(num_text + 2)]
    assert rows[-1] == [IDS.codec_bos, -1, -1, -1, first]
