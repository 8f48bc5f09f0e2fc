"""Long text: split at sentence boundaries into segments that each fit the model's context.

A segment is generated as its own request, and the segments of one input play as one stream
(`speech_stream.SpeechSource`). How much text a segment may hold follows from the model's context
(`max_model_len`) and its token rate: a segment's prompt plus its audio tokens, at a slow speaking
rate, must fit, with room to spare. Sentences are kept whole where they fit; a longer sentence is
cut at clause punctuation, then between words, and only a single overlong word mid-word.
"""

from __future__ import annotations

import re

from vox_serve.core.meta import ProgramMeta

SLOW_CHARS_PER_S = 10.0  # a slow speaker: fewer characters per second means more audio tokens per character
PROMPT_TOKENS_PER_CHAR = 1.0  # at most one prompt token per character (byte-level and BPE tokenizers)
CONTEXT_SHARE = 0.8  # of max_model_len a segment may plan to use (the estimate is rough)
_SENTENCE_END = re.compile(r"(?<=[.!?;\u3002\uff01\uff1f\u2026])[\"'\u201d\u2019)\]]*\s+|\n\s*")
_CLAUSE_END = re.compile(r"(?<=[,:\u2014\u3001\uff0c])\s+")


def audio_tokens_per_second(meta: ProgramMeta) -> float:
    """Generated token rows per second of audio (Orpheus: 7 per 2048-sample frame; Qwen3-TTS: 1 per frame)."""
    rows_per_frame = meta.codes_per_frame / meta.codes_per_step
    return meta.sample_rate / meta.samples_per_frame * rows_per_frame


def segment_chars(meta: ProgramMeta, max_model_len: int) -> int:
    """The most characters of text one segment may hold, for a context of max_model_len tokens."""
    tokens_per_char = audio_tokens_per_second(meta) / SLOW_CHARS_PER_S + PROMPT_TOKENS_PER_CHAR
    return max(1, min(meta.max_text_chars, int(CONTEXT_SHARE * max_model_len / tokens_per_char)))


def split_sentences(text: str) -> list[str]:
    """Sentences (and lines) of `text`, each with its trailing space, in order: "".join() gives `text`."""
    pieces, start = [], 0
    for match in _SENTENCE_END.finditer(text):
        pieces.append(text[start:match.end()])
        start = match.end()
    if start < len(text):
        pieces.append(text[start:])
    return [p for p in pieces if p]


def plan_segments(text: str, max_chars: int) -> list[str]:
    """`text` as consecutive segments of at most `max_chars` characters, cut at the best boundary
    available; segments with no speakable character are merged into their neighbour."""
    segments: list[str] = []
    for sentence in split_sentences(text):
        pieces = _fit(sentence, max_chars)
        if segments and len(pieces) == 1 and len(segments[-1]) + len(sentence) <= max_chars:
            segments[-1] += sentence  # whole sentences share a segment; a cut one starts its own
        else:
            segments.extend(pieces)
    return _merge_blank(segments)


def _fit(sentence: str, max_chars: int) -> list[str]:
    """A sentence as pieces of at most max_chars: clauses, then words, then characters."""
    if len(sentence) <= max_chars:
        return [sentence]
    out: list[str] = []
    for pattern in (_CLAUSE_END, re.compile(r"(?<=\s)")):
        parts = _split_keep(sentence, pattern)
        if len(parts) > 1:
            for part in parts:
                out.extend(_fit(part, max_chars))
            return _pack(out, max_chars)
    return [sentence[i:i + max_chars] for i in range(0, len(sentence), max_chars)]


def _split_keep(text: str, pattern: re.Pattern[str]) -> list[str]:
    pieces, start = [], 0
    for match in pattern.finditer(text):
        if match.end() > start:
            pieces.append(text[start:match.end()])
            start = match.end()
    pieces.append(text[start:])
    return [p for p in pieces if p]


def _pack(pieces: list[str], max_chars: int) -> list[str]:
    out: list[str] = []
    for piece in pieces:
        if out and len(out[-1]) + len(piece) <= max_chars:
            out[-1] += piece
        else:
            out.append(piece)
    return out


def _merge_blank(segments: list[str]) -> list[str]:
    """A segment of only spaces and punctuation would be refused (or speak nothing): join it to its
    neighbour even past the segment size; it adds no audio."""
    out: list[str] = []
    for segment in segments:
        if out and not any(c.isalnum() for c in segment):
            out[-1] += segment
        elif out and not any(c.isalnum() for c in out[-1]):
            out[-1] += segment
        else:
            out.append(segment)
    return out


class SentenceBuffer:
    """Text that arrives in pieces -> segments as soon as they are complete sentences (for models
    without input streaming: each segment starts once its sentences are known)."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self.text = ""

    def push(self, piece: str) -> list[str]:
        """The segments that `piece` completes: every whole sentence so far, packed up to max_chars;
        text past max_chars without a sentence end is cut at the best boundary too."""
        self.text += piece
        sentences = split_sentences(self.text)
        done, rest = sentences[:-1], sentences[-1] if sentences else ""
        segments = plan_segments("".join(done), self.max_chars) if done else []
        if len(rest) > self.max_chars:
            cut = plan_segments(rest, self.max_chars)
            segments, rest = segments + cut[:-1], cut[-1]
        self.text = rest
        return segments

    def flush(self) -> list[str]:
        """What is left once the text has ended."""
        rest, self.text = self.text, ""
        return plan_segments(rest, self.max_chars) if rest.strip() else []
