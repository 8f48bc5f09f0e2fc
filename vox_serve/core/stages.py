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


CODEC_WINDOW_STAGES = (Stage.CODEC_FIRST, Stage.CODEC)  # the stages that decode chunk windows


class EngineHalf(enum.StrEnum):
    """Which stages an engine runs. A whole engine runs every stage on one device; a disaggregated engine
    is two halves on two devices: the LM half runs the prologue, prefill and decode, and in place of the
    codec stages gathers each codec row's window (codes, latents) into its hand-over arena; the codec half
    runs the prologue (its own copy of the admissions, and the codec state's reset), the codec priming and
    the codec stages over the windows copied into its hand-over arena."""

    WHOLE = "whole"
    LM = "lm"
    CODEC = "codec"

    @property
    def has_lm(self) -> bool:
        return self is not EngineHalf.CODEC

    @property
    def has_codec(self) -> bool:
        return self is not EngineHalf.LM

    def runs(self, stage: Stage) -> bool:
        """Whether an engine of this half has `stage` (the LM half's codec stages are the hand-over gathers)."""
        if self is EngineHalf.LM:
            return stage is not Stage.CODEC_PRIME
        if self is EngineHalf.CODEC:
            return stage not in (Stage.PREFILL, Stage.DECODE)
        return True


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
