"""The plain data the scheduler and the worker exchange: a step plan in, a step result out.

Only built-in types live here (lists, ints, floats, bytes), so a plan can cross a process
boundary or be replayed against a simulated engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ABSENT_ID = -1  # an input column with no id: generated rows are padded to the input width with it
NO_SLOT = -1  # the codec slot of a padded codec row (a stateful codec must not touch any request's state)


@dataclass
class LmRow:
    """One sequence in a prefill or decode launch.

    `input_ids[i]` is the input row of position `start_pos + i` (`input_columns` ids each). A generated
    position's row is its sampled `tokens` row in the leading columns, then `ABSENT_ID`.
    `kv_len` counts the KV after this step; `pages` hold at least `kv_len` tokens.
    """

    req_id: str
    input_ids: list[list[int]]
    start_pos: int
    pages: list[int]
    sample: bool  # False for a non-final chunk of a chunked prefill
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repetition_penalty: float
    history: list[int]
    gen_index: int  # tokens generated so far (also the RNG offset)
    num_codes: int  # audio codes so far (position inside the frame)
    allow_stop: bool  # False while ignore_eos holds
    seed: int
    # Asynchronous scheduling: the row's last input is the token this request samples in the step
    # still in flight, unknown to the host when the row is planned. `input_ids` holds a placeholder
    # for it; `num_codes` and `history` leave it out, and the worker adds it on the device from
    # that step's outputs. `gen_index` and `start_pos` already count it.
    pending_input: bool = False
    # (index into input_ids, vector): added to those positions' input embeddings (prompt positions only)
    embeds: list[tuple[int, list[float]]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def kv_len(self) -> int:
        return self.start_pos + len(self.input_ids)


@dataclass
class CodecRow:
    """One audio chunk: a window of frames (lookback + chunk + lookahead) to turn into PCM.

    `frames[f]` holds `codes_per_frame` codes; `num_frames` of the chunk's frames are real (a final
    chunk may be shorter: the window is padded by repeating the last frame).
    """

    req_id: str
    chunk_index: int
    frames: list[list[int]]
    num_frames: int
    first_frame: int  # absolute index of the window's first frame (noise and state offsets)
    seed: int
    slot: int = 0
    is_last: bool = False


@dataclass
class StepPlan:
    step_id: int
    prefill: list[LmRow] = field(default_factory=list)
    decode: list[LmRow] = field(default_factory=list)
    codec: list[CodecRow] = field(default_factory=list)
    released_slots: list[int] = field(default_factory=list)  # codec slots to reset before this step

    @property
    def is_empty(self) -> bool:
        return not (self.prefill or self.decode or self.codec or self.released_slots)

    @property
    def num_lm_rows(self) -> int:
        return len(self.prefill) + len(self.decode)


@dataclass
class LmOut:
    req_id: str
    tokens: list[int]  # the sampled ids of this step (codes_per_step of them)
    codes: list[int]  # audio codes derived from them (valid when kind is AUDIO)
    kind: int  # OutKind


@dataclass
class CodecOut:
    req_id: str
    chunk_index: int
    pcm: bytes  # little-endian int16 mono


@dataclass
class StepResult:
    step_id: int
    prefill: list[LmOut] = field(default_factory=list)
    decode: list[LmOut] = field(default_factory=list)
    codec: list[CodecOut] = field(default_factory=list)
    stage_seconds: dict[str, float] = field(default_factory=dict)
