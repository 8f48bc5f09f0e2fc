"""The scheduler process's message handling, driven in-process (no ZMQ, no HTTP): requests, errors,
aborts and input-streaming sessions, on the real orpheus-tiny program (and qwen3-tts-tiny, whose
sessions start before their text ends)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import pytest
from qwen3_tts_helpers import StreamingDriver

from tests.engine_helpers import build_program, engine_worker
from vox_serve import ipc
from vox_serve.config import CacheConfig, ModelConfig, SchedulerConfig, VoxConfig
from vox_serve.engine_loop import EngineLoop
from vox_serve.prompt_pool import PromptPool
from vox_serve.scheduler.base import Scheduler
from vox_serve.scheduler_entry import SchedulerService

CONFIG = VoxConfig(model=ModelConfig("orpheus-tiny", device="cpu"), cache=CacheConfig(max_num_pages=64),
                   scheduler=SchedulerConfig(max_batch_size=4, max_queued_requests=1))
FIELDS = {"text": "Hello, world. Again | and again.", "max_tokens": 35, "ignore_eos": True}


@pytest.fixture(scope="module")
def program() -> Any:
    return build_program(CONFIG)


class Harness:
    def __init__(self, program: Any, input_streaming: bool = False,
                 preprocess: Callable[[dict[str, Any]], list[list[int]]] | None = None, queue: int = 1) -> None:
        meta = dataclasses.replace(program.meta, supports_input_streaming=input_streaming)
        scheduler = dataclasses.replace(CONFIG.scheduler, max_queued_requests=queue)
        loop = EngineLoop(Scheduler(meta, program.limits, scheduler), engine_worker(program))
        self.sent: list[Any] = []
        self.wire: list[Any] = []
        self.service = SchedulerService(loop, preprocess or program.preprocess, CONFIG, self.receive)

    def receive(self, msg: Any) -> None:
        """As the API dispatches it: a step's AudioBatch as its chunks (`wire`: the messages as sent)."""
        self.wire.append(msg)
        self.sent.extend(ipc.request_events(msg))

    def run(self, max_steps: int = 500) -> None:
        for _ in range(max_steps):
            if not self.service.busy:
                return
            self.service.step()
        raise AssertionError("the loop did not go idle")

    def events(self, req_id: str) -> list[Any]:
        return [m for m in self.sent if getattr(m, "req_id", None) == req_id]

    def pcm(self, req_id: str) -> bytes:
        return b"".join(m.pcm for m in self.events(req_id) if isinstance(m, ipc.Audio))

    def pools_full(self) -> bool:
        pools = self.service.pools()
        return bool(pools) and all(free == total for free, total in pools.values())


def test_request_streams_audio_then_one_finished_and_frees_its_pages(program: Any) -> None:
    h = Harness(program)
    h.service.handle(ipc.Submit("r", FIELDS, default_seed=3))
    h.run()
    events = h.events("r")
    assert isinstance(events[0], ipc.Started) and events[0].prompt_len > 0
    audio = [e for e in events if isinstance(e, ipc.Audio)]
    assert [a.chunk_index for a in audio] == list(range(len(audio))) and len(audio) == 2
    assert events[-1] == ipc.Finished("r", "length", 35, len(h.pcm("r")) // 2)
    assert sum(isinstance(e, ipc.Finished | ipc.Failed) for e in events) == 1
    assert h.pools_full() and h.service.stats().num_finished == 1


def test_a_steps_chunks_travel_as_one_batch_before_the_finished_message(program: Any) -> None:
    """Two requests in step: every step's chunks of both go as one AudioBatch, never as single Audio messages,
    and each request's Finished comes after the batch holding its last chunk."""
    h = Harness(program, queue=2)
    for req_id in ("a", "b"):
        h.service.handle(ipc.Submit(req_id, FIELDS, default_seed=3))
    h.run()
    batches = [m for m in h.wire if isinstance(m, ipc.AudioBatch)]
    assert not any(isinstance(m, ipc.Audio) for m in h.wire)
    assert any(sorted(b.req_ids) == ["a", "b"] for b in batches), "both requests' chunks share a step's message"
    for req_id in ("a", "b"):
        finished = next(i for i, m in enumerate(h.wire) if isinstance(m, ipc.Finished) and m.req_id == req_id)
        assert max(i for i, m in enumerate(h.wire) if isinstance(m, ipc.AudioBatch) and req_id in m.req_ids) < finished
        assert len(h.pcm(req_id)) == 2 * h.events(req_id)[-1].num_samples > 0


def test_a_field_the_model_cannot_take_fails_naming_it(program: Any) -> None:
    h = Harness(program)
    h.service.handle(ipc.Submit("r", {**FIELDS, "voice": "nobody"}, 0))
    assert h.events("r") == [ipc.Failed("r", "invalid_field", h.sent[0].message, "voice")]
    assert "nobody" in h.sent[0].message and not h.service.busy


def test_abort_ends_the_request_silently_and_frees_its_pages(program: Any) -> None:
    h = Harness(program)
    h.service.handle(ipc.Submit("r", {**FIELDS, "max_tokens": 2000}, 0))
    for _ in range(5):
        h.service.step()
    assert not h.pools_full()
    h.service.handle(ipc.Abort("r", "the client disconnected"))
    h.run()
    assert not any(isinstance(e, ipc.Finished | ipc.Failed) for e in h.events("r"))
    assert h.pools_full() and h.service.stats().num_aborted == 1


def test_a_full_queue_refuses_with_queue_full(program: Any) -> None:
    h = Harness(program)
    h.service.handle(ipc.Submit("a", FIELDS, 0))
    h.service.handle(ipc.Submit("b", FIELDS, 0))
    assert h.events("b")[0].code == "queue_full"
    h.run()
    assert isinstance(h.events("a")[-1], ipc.Finished)


def test_input_streaming_session_carries_its_text_pieces_exactly(program: Any) -> None:
    pieces = ["Hello, ", "world. Ag", "ain | and", " again."]
    assert "".join(pieces) == FIELDS["text"]
    session = Harness(program, input_streaming=True)
    fields = {k: v for k, v in FIELDS.items() if k != "text"}
    session.service.handle(ipc.Submit("s", fields, 9, input_streaming=True))
    for piece in pieces:
        session.service.handle(ipc.AppendText("s", piece))
    session.run()
    assert session.events("s") == [ipc.Started("s", 0)]  # nothing runs before the text ends
    session.service.handle(ipc.EndText("s"))
    session.run()
    assert isinstance(session.events("s")[-1], ipc.Finished)
    whole = Harness(program)
    whole.service.handle(ipc.Submit("w", FIELDS, 9))
    whole.run()
    assert session.pcm("s") == whole.pcm("w") and len(session.pcm("s")) > 0


def test_input_streaming_on_a_model_without_it_is_unsupported(program: Any) -> None:
    h = Harness(program)
    h.service.handle(ipc.Submit("s", {}, 0, input_streaming=True))
    assert h.events("s")[0].code == "unsupported"


def test_session_text_past_the_limit_fails_naming_text(program: Any) -> None:
    h = Harness(program, input_streaming=True)
    h.service.handle(ipc.Submit("s", {}, 0, input_streaming=True))
    h.service.handle(ipc.AppendText("s", "a" * (program.meta.max_text_chars + 1)))
    failed = h.events("s")[-1]
    assert failed.code == "invalid_field" and failed.field == "text" and not h.service.sessions


def test_a_request_that_breaks_prompt_building_fails_alone(program: Any) -> None:
    def preprocess(fields: dict[str, Any]) -> list[list[int]]:
        if fields["text"] == "boom":
            raise RuntimeError("tokenizer exploded")
        return program.preprocess(fields)

    h = Harness(program, preprocess=preprocess)
    h.service.handle(ipc.Submit("bad", {**FIELDS, "text": "boom"}, 0))
    h.service.handle(ipc.Submit("bad", FIELDS, 0))  # ids stay usable after a failure
    h.run()
    assert h.events("bad")[0].code == "internal" and "tokenizer exploded" in h.events("bad")[0].message
    assert isinstance(h.events("bad")[-1], ipc.Finished)


def test_a_duplicate_request_id_is_refused(program: Any) -> None:
    h = Harness(program)
    h.service.handle(ipc.Submit("r", FIELDS, 0))
    h.service.handle(ipc.Submit("r", FIELDS, 0))
    assert [type(e).__name__ for e in h.events("r")] == ["Started", "Failed"]
    h.run()
    assert isinstance(h.events("r")[-1], ipc.Finished)


def test_shutdown_fails_what_is_running_and_stops(program: Any) -> None:
    h = Harness(program)
    h.service.handle(ipc.Submit("r", {**FIELDS, "max_tokens": 2000}, 0))
    h.service.step()
    h.service.handle(ipc.Shutdown())
    assert h.service.stopping and h.events("r")[-1].code == "replica_died" and h.pools_full()


@pytest.fixture(scope="module")
def qwen() -> tuple[Any, VoxConfig]:
    config = dataclasses.replace(CONFIG, model=ModelConfig("qwen3-tts-tiny", device="cpu"))
    return build_program(config), config


def test_qwen_session_starts_before_its_text_ends_and_abort_while_waiting_frees_it(qwen) -> None:
    program, config = qwen
    driver = StreamingDriver(program, config)
    driver.start("s", {"max_tokens": 40, "ignore_eos": True})
    driver.text("s", "Hello there, this is a longer piece and")  # about 35 text ids: 3 chunks of 10 frames
    driver.steps(60)
    req = driver.reqs["s"]
    assert req.num_generated == len(req.text_feed.ids) + 1 > 1  # started, ran, now waits for text
    assert driver.events("s", ipc.Audio), "complete chunks stream while the request waits"
    driver.service.handle(ipc.Abort("s", "the client disconnected"))
    driver.finish()
    assert not driver.events("s", ipc.Finished) and not driver.events("s", ipc.Failed)
    assert not driver.service.sessions and driver.service.stats().num_aborted == 1
    assert all(free == total for free, total in driver.service.pools().values())


def test_qwen_session_text_past_the_limit_fails_the_running_request(qwen) -> None:
    program, config = qwen
    driver = StreamingDriver(program, config)
    driver.start("s", {"max_tokens": 40, "ignore_eos": True})
    driver.text("s", "Hello there, and")
    driver.steps(3)
    driver.text("s", "a" * program.meta.max_text_chars)
    driver.finish()
    (failed,) = driver.events("s", ipc.Failed)
    assert failed.code == "invalid_field" and "limit" in failed.message and not driver.service.sessions
    assert all(free == total for free, total in driver.service.pools().values())


def test_warm_up_builds_one_prompt_in_the_pool_thread_before_any_request(program: Any) -> None:
    built: list[str] = []

    def preprocess(fields: dict[str, Any]) -> Any:
        built.append(threading.current_thread().name)
        return program.preprocess(fields)

    meta = program.meta
    loop = EngineLoop(Scheduler(meta, program.limits, CONFIG.scheduler), engine_worker(program))
    pool = PromptPool(threads=1)
    service = SchedulerService(loop, preprocess, CONFIG, [].append, prompts=pool)
    service.warm_prompts()
    assert len(built) == 1 and built[0].startswith("prompts")
    assert not service.busy and pool.num_pending == 0 and pool.completed() == []
    pool.close()


def test_a_failing_warm_up_is_logged_and_the_replica_still_serves(program: Any,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    def broken(fields: dict[str, Any]) -> Any:
        raise RuntimeError("no tokenizer")

    h = Harness(program, preprocess=broken)
    h.service.warm_prompts()
    assert "warm-up prompt failed" in caplog.text and "no tokenizer" in caplog.text
