"""Incremental input streaming in the scheduler: requests whose text arrives while they generate.

A model with `ProgramMeta.streamed_text_column` feeds one text id per generated token row (a frame,
for Qwen3-TTS): the input row of generated row k carries `req.text_feed.ids[k]` in that column
(absent once the ids, which end with the model's end-of-text id, are used up). Before the input row
of a generated row can be computed, its text id must have arrived, or the text must have ended.
A request whose next row lacks its text waits for it: it is neither decoded nor (after a
preemption) re-prefilled, keeps its KV pages and slot, and its ready audio chunks are decoded as
usual. Other requests are not held up. The slot table's `text_limit` mirrors how many generated rows
can be fed, so the decode batch is chosen without looking at each request.
"""

from __future__ import annotations

import numpy as np

from vox_serve.core.plan import ABSENT_ID
from vox_serve.core.request import Request, RequestStatus


def has_input(req: Request, pos: int) -> bool:
    """Whether the input row at absolute position `pos` is known (prompt positions always are)."""
    feed = req.text_feed
    return feed is None or pos < req.prompt_len or feed.has(pos - req.prompt_len)


def waits_for_text(req: Request) -> bool:
    """True while the request (waiting or running) has tokens left to generate and its next LM row (up
    to its last sampled token, pending ones included) needs a text id that has not arrived."""
    generating = req.status in (RequestStatus.WAITING, RequestStatus.RUNNING)
    return generating and not has_input(req, req.total_len + req.num_pending - 1)


def text_ids(req: Request, first_row: int, num_rows: int) -> np.ndarray:
    """[num_rows] the streamed text ids of generated rows first_row.. (ABSENT_ID where none: before
    generation, past the end of the text)."""
    out = np.full(num_rows, ABSENT_ID, dtype=np.int32)
    ids = req.text_feed.ids if req.text_feed is not None else ()
    for i in range(num_rows):
        k = first_row + i
        if 0 <= k < len(ids):
            out[i] = ids[k]
    return out


def extend(req: Request, ids: list[int], ended: bool) -> None:
    """More text ids for an input-streaming request; `ended` once its text is complete."""
    if req.text_feed is None:
        raise ValueError(f"request {req.req_id} does not stream its text")
    if req.text_feed.ended and ids:
        raise ValueError(f"request {req.req_id}: text after its end")
    req.text_feed.ids.extend(ids)
    req.text_feed.ended = req.text_feed.ended or ended
    if req.table is not None and req.slot is not None:
        req.table.text_limit[req.slot] = req.text_feed.limit
