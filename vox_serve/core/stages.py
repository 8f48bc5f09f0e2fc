"""The stages of a step and their batch buckets (plain data shared by the engine, its spec and runtimes)."""

from __future__ import annotations

import enum


class Stage(enum.StrEnum):
    """A step launches, in this order: the prologue (admissions, page-table updates), the priming of admitted
    requests' codec slots with their codec prefixes (programs that declare `codec_prefix_frames`), the codec
    over first chunks and over other chunks, the prefill, the decode."""

    PROLOGUE = "prologue"
    CODEC_PRIME = "codec_prime"
    CODEC_FIRST = "codec_first"
    CODEC = "codec"
    PREFILL = "prefill"
    DECODE = "decode"


def bucket_sizes(maximum: int, smallest: int = 1) -> list[int]:
    """Powers of two from `smallest` up to `maximum`, plus `maximum` itself."""
    sizes, n = [], smallest
    while n < maximum:
        sizes.append(n)
        n *= 2
    return sizes + [maximum]


def pick_bucket(n: int, buckets: list[int]) -> int:
    """The smallest bucket holding n rows (buckets ascending)."""
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"{n} rows exceed the largest bucket {buckets[-1]}")
