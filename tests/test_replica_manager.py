"""The API's view of its replicas, without processes (issue 10, defects 2 and 3): a request handle is
opened only once its Submit is encoded and sent, and a session's unread audio is bounded."""

from __future__ import annotations

import asyncio
import time

import pytest

from vox_serve import ipc
from vox_serve.api.errors import ApiError
from vox_serve.api.replica_state import (
    HEARTBEAT_TIMEOUT_S,
    MAX_UNREAD_AUDIO_BYTES,
    STALE_GRACE_S,
    STUCK_STEP_S,
    ReplicaState,
    Session,
)
from vox_serve.api.replicas import ReplicaManager
from vox_serve.config import VoxConfig


class FakeSocket:
    def __init__(self) -> None:
        self.sent: list[list[bytes]] = []

    def send_multipart(self, frames: list[bytes], flags: int = 0) -> None:
        self.sent.append(frames)

    def close(self, linger: int = 0) -> None:
        pass


def ready_manager() -> ReplicaManager:
    manager = ReplicaManager(VoxConfig())
    replica = manager.replicas[0]
    replica.state, replica.reason, replica.socket, replica.last_seen = ReplicaState.READY, None, FakeSocket(), \
        time.monotonic()
    return manager


def test_a_submit_that_cannot_be_encoded_leaves_no_handle_open() -> None:
    """A lone surrogate reaching ipc.encode after the handle was opened left a phantom request in flight."""
    manager = ready_manager()
    with pytest.raises(UnicodeEncodeError):
        asyncio.run(manager.submit({"text": "a\ud800b"}))
    assert not manager.handles and not manager.replicas[0].in_flight and not manager.replicas[0].socket.sent


def test_a_session_whose_audio_nobody_reads_is_ended_past_the_bound() -> None:
    manager = ready_manager()

    async def run() -> None:
        task = asyncio.create_task(manager.submit({}, input_streaming=True))
        await asyncio.sleep(0)
        [req_id] = manager.handles
        manager._dispatch(ipc.Started(req_id, 0))
        handle = await task
        manager.sessions[req_id] = Session(handle, last_activity=time.monotonic(), ended=True)
        chunk = b"\0" * (1 << 16)
        for i in range(MAX_UNREAD_AUDIO_BYTES // len(chunk) + 1):
            manager._dispatch(ipc.Audio(req_id, i, chunk))
        assert handle.done and handle.num_buffered_bytes == 0  # ended, its audio dropped
        event = await handle.get()
        assert isinstance(event, ipc.Failed) and event.code == ipc.ErrorCode.TIMEOUT and "not read" in event.message
        abort = ipc.decode(manager.replicas[0].socket.sent[-1])
        assert isinstance(abort, ipc.Abort) and abort.req_id == req_id

    asyncio.run(run())


def test_a_replica_silent_past_a_few_heartbeats_is_not_ready() -> None:
    manager = ready_manager()
    assert manager.unavailable_reason() is None
    manager.replicas[0].last_seen -= 5.0
    assert "heartbeat" in manager.unavailable_reason()
    assert not manager._candidates(set())


class FakeProcess:
    killed = False

    def poll(self) -> None:
        return None

    def kill(self) -> None:
        self.killed = True


def test_a_replica_busy_in_a_long_step_stays_ready_until_the_step_is_stuck() -> None:
    """Its heartbeat thread keeps reporting during a step: a step of a few seconds (a loaded CPU) does
    not make it unavailable; a step past STUCK_STEP_S does, and one past HEARTBEAT_TIMEOUT_S is killed."""
    manager = ready_manager()
    replica = manager.replicas[0]
    replica.proc = FakeProcess()
    replica.last_seen -= 0.5
    manager._dispatch(ipc.Heartbeat(0, 0, step_s=3.0))
    assert time.monotonic() - replica.last_seen < 0.1  # the heartbeat was taken as the replica's
    assert manager.unavailable_reason() is None and manager._candidates(set())
    manager._dispatch(ipc.Heartbeat(0, 0, step_s=STUCK_STEP_S + 1))
    assert "in one step for" in manager.unavailable_reason() and not manager._candidates(set())
    manager._dispatch(ipc.Stats(0, 0, 0, 0, 0, {}, 0, 0, 0, 1))  # the loop reports: the step ended
    assert manager.unavailable_reason() is None
    manager._dispatch(ipc.Heartbeat(0, 0, step_s=HEARTBEAT_TIMEOUT_S + 1))
    manager._watch(replica, time.monotonic())
    assert replica.proc.killed and "stuck" in replica.fatal


def test_a_request_waits_briefly_for_a_silent_replica_whose_heartbeat_is_only_unread() -> None:
    """The API's own stall (its loop or CPU starved) looks like the replica's silence: a request that
    finds the only replica stale waits for the queued heartbeat instead of a 503."""
    manager = ready_manager()
    replica = manager.replicas[0]
    replica.proc, replica.last_seen = FakeProcess(), replica.last_seen - 5.0

    async def run() -> None:
        async def heartbeat_arrives() -> None:
            await asyncio.sleep(0.1)
            manager._dispatch(ipc.Heartbeat(0, 0, step_s=0.0))

        beat = asyncio.create_task(heartbeat_arrives())
        task = asyncio.create_task(manager.submit({"text": "hi"}))
        for _ in range(200):
            if manager.handles or task.done():
                break
            await asyncio.sleep(0.01)
        [req_id] = manager.handles  # the request went to the replica (a 503 leaves no handle)
        manager._dispatch(ipc.Started(req_id, 3))
        assert (await task).prompt_len == 3
        await beat

    asyncio.run(run())


def test_a_request_to_a_replica_that_stays_silent_is_refused_after_the_grace() -> None:
    manager = ready_manager()
    manager.replicas[0].last_seen -= 5.0
    start = time.monotonic()
    with pytest.raises(ApiError) as err:
        asyncio.run(manager.submit({"text": "hi"}))
    assert err.value.status == 503 and "heartbeat" in str(err.value)
    assert STALE_GRACE_S <= time.monotonic() - start and not manager.handles
