"""Long text -> segments (api/segments.py): whole sentences where they fit, nothing lost or reordered."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from vox_serve.api.segments import plan_segments, segment_chars, split_sentences
from vox_serve.models.orpheus.program import orpheus_meta


def test_sentences_keep_their_punctuation_and_spaces() -> None:
    text = 'He said "stop." Then left! Why? Because.\nNext line'
    assert split_sentences(text) == ['He said "stop." ', "Then left! ", "Why? ", "Because.\n", "Next line"]


def test_segments_hold_whole_sentences_and_cut_long_ones_at_clauses() -> None:
    text = "Short one. Another short. " + "A long sentence, with clauses, that goes on and on, beyond the limit."
    segments = plan_segments(text, 30)
    assert segments[0] == "Short one. Another short. "
    assert all(len(s) <= 30 for s in segments) and "".join(segments) == text
    assert segments[1:3] == ["A long sentence, ", "with clauses, "]  # 31 characters together


def test_a_word_longer_than_a_segment_is_cut() -> None:
    assert plan_segments("x" * 25, 10) == ["x" * 10, "x" * 10, "x" * 5]


def test_punctuation_only_pieces_join_a_neighbour() -> None:
    assert plan_segments("Hi. ... ok", 4) == ["Hi. ... ", "ok"]


def test_segment_size_follows_the_context_and_the_token_rate() -> None:
    meta = orpheus_meta("orpheus", 4096, True)  # ~82 audio tokens per second
    assert 300 < segment_chars(meta, 4096) < 400
    assert segment_chars(meta, 1024) < segment_chars(meta, 4096) / 3
    assert segment_chars(meta, 10**9) == meta.max_text_chars


@given(st.text(alphabet=st.sampled_from("ab .,!?\n"), max_size=300), st.integers(1, 50))
def test_segments_join_to_the_text_and_stay_short(text: str, max_chars: int) -> None:
    segments = plan_segments(text, max_chars)
    assert "".join(segments) == text
    # only pieces with nothing to speak are merged past the limit, at a segment's start or end
    assert all(len(s.strip(" .,!?\n")) <= max_chars for s in segments)
