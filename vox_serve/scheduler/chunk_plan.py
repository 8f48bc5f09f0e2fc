"""Which audio chunks are ready, and the codec rows of the ones a step takes (torch-free).

The scheduler's codec half, over the slot table's columns: `ready_chunks` counts each slot's decodable
chunks from its frames and next chunk (`core/chunks.py` gives the frames a chunk needs); `take` plans the
first ones that fit into the step's codec rows, advancing the slots' next chunk. Policies choose whose
chunks and in which order (scheduler/base.py and its subclasses); this only does the arithmetic.
"""

from __future__ import annotations

import numpy as np

from vox_serve.core.chunks import ChunkGeometry
from vox_serve.core.slot_table import SlotState, SlotTable
from vox_serve.scheduler.rows import CodecRows


def _one_each(take: np.ndarray) -> bool:
    """Every slot takes exactly one chunk (then a slot's rows need no np.repeat)."""
    return bool((take == 1).all())


class ChunkPlanner:
    def __init__(self, table: SlotTable, geometry: ChunkGeometry, stateful_codec: bool, max_codec_batch: int) -> None:
        self.table, self.geometry = table, geometry
        self.stateful_codec, self.max_codec_batch = stateful_codec, max_codec_batch
        self.rows = CodecRows()  # the codec rows of the plan being made

    def start(self) -> None:
        """A new plan: no codec rows yet."""
        self.rows = CodecRows()

    def ready_chunks(self, slots: np.ndarray, any_draining: bool) -> tuple[np.ndarray, np.ndarray]:
        """(chunks ready now, whether the last of them is a draining request's final one) per slot
        (`any_draining`: some request is draining, else none of these slots is).

        Chunk i needs `skip + first + lookahead + i * frames_per_chunk` frames (core/chunks.py); after the
        full ones, a draining request has a shorter final chunk while frames remain that have lookahead.
        A stateful codec decodes at most one chunk of a request per step.
        """
        t, g = self.table, self.geometry
        frames, nxt = t.num_frames(slots), t.next_chunk[slots]
        if any_draining:
            draining = t.state[slots] == SlotState.DRAINING
            some_draining = bool(draining.any())
        else:
            draining, some_draining = np.zeros(len(slots), dtype=np.bool_), False
        # a codec that pads the end needs no lookahead at it
        ahead = np.where(draining, g.final_lookahead, g.lookahead) if some_draining else g.lookahead
        base = g.skip + (g.first_frames or g.frames_per_chunk) + ahead
        count = np.maximum((frames - base) // g.frames_per_chunk + 1 - nxt, 0)  # full chunks
        if some_draining:  # then a shorter final chunk after the full ones
            start, _ = g.emitted(nxt + count)
            count = count + (draining & (frames - g.final_lookahead > start))
        limited = np.minimum(count, 1) if self.stateful_codec else count
        return limited, (draining & (limited == count)) if some_draining else draining

    def take(self, slots: np.ndarray, count: np.ndarray, no_more: np.ndarray, room: int | None,
             any_draining: bool) -> tuple[np.ndarray, list[str]]:
        """Plan the ready chunks (`ready_chunks`' count and no_more) of `slots` in that order, at most `room`
        more rows (None: up to the codec batch); returns (the slots that got rows, the rows' request ids)."""
        rows = self.rows
        limit = self.max_codec_batch if room is None else min(len(rows) + room, self.max_codec_batch)
        room_left = limit - len(rows)
        take = count if int(count.sum()) <= room_left else np.minimum(
            count, np.maximum(room_left - (np.cumsum(count) - count), 0))  # the first ones that fit
        taken = slots[take > 0]
        if not len(taken):
            return taken, []
        one_each = _one_each(take)
        row_slots = slots if one_each else np.repeat(slots, take)
        last = ((take == count) & no_more) if any_draining else None  # a slot's last chunk is among them
        return taken, rows.add(self.table, row_slots, self._columns(slots, take, last, one_each))

    def _columns(self, slots: np.ndarray, take: np.ndarray, last: np.ndarray | None,
                 one_each: bool) -> dict[str, np.ndarray]:
        """Codec row columns of the next `take[i]` chunks of each slot (`one_each`: every take is 1; `last[i]`: the
        slot's final chunk is the last one taken, None when no request is draining); advances their next chunk."""
        t, g = self.table, self.geometry
        nxt = t.next_chunk[slots]
        per_row = (lambda column: column) if one_each else (lambda column: np.repeat(column, take))  # noqa: E731
        offsets = None if one_each else np.arange(int(take.sum())) - np.repeat(np.cumsum(take) - take, take)
        index = nxt if offsets is None else per_row(nxt) + offsets
        start, full_end = g.emitted(index)
        t.next_chunk[slots] = nxt + take
        if last is None:  # nothing is draining: every chunk is a full one with its lookahead
            end, is_last, window_end = full_end, np.zeros(len(index), dtype=np.bool_), full_end + g.lookahead
        else:  # a full chunk with its lookahead, else a final one: short, or full without lookahead (codec_pads_end)
            frames = per_row(t.num_frames(slots))
            end = np.where(frames >= full_end + g.lookahead, full_end, np.minimum(full_end, frames - g.final_lookahead))
            last_row = True if offsets is None else offsets == per_row(take) - 1
            is_last, window_end = last_row & per_row(last), np.minimum(end + g.lookahead, frames)
        return {"chunk_index": index, "first_frame": start - g.lookback, "window_end": window_end,
                "num_frames": end - start, "is_last": is_last}
