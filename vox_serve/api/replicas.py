"""The scheduler processes seen from the API process: start, watch, restart, and route requests.

Each replica is a `vox_serve.scheduler_entry` process. The API binds one PULL socket that every
replica pushes to, and connects one PUSH socket to each replica (a fresh one per incarnation, so
nothing meant for a dead process reaches its successor). A monitor task notices a process that
exits (or stops reporting) within MONITOR_INTERVAL_S, fails the requests it held, and restarts
it; the same task ends requests that run past --request-timeout-s. New requests go to the live
replica with the fewest requests in flight; every later message of a request goes to the same one.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import zmq
import zmq.asyncio

from vox_serve import ipc
from vox_serve.api.errors import ApiError
from vox_serve.api.replica_state import (
    HEARTBEAT_TIMEOUT_S,
    MAX_RESTART_DELAY_S,
    MAX_UNREAD_AUDIO_BYTES,
    MONITOR_INTERVAL_S,
    STALE_GRACE_S,
    STALE_RECHECK_S,
    STOP_TIMEOUT_S,
    Replica,
    ReplicaState,
    RequestHandle,
    Session,
    replica_status,
)
from vox_serve.config import VoxConfig
from vox_serve.core.meta import EngineLimits, ProgramMeta

log = logging.getLogger("vox_serve.api")

class ReplicaManager:
    def __init__(self, config: VoxConfig) -> None:
        self.config = config
        self.replicas = [Replica(i) for i in range(config.server.dp_size)]
        self.handles: dict[str, RequestHandle] = {}
        self.sessions: dict[str, Session] = {}
        self.meta: ProgramMeta | None = None
        self.limits: EngineLimits | None = None
        self.fatal_error: str | None = None
        self.on_fatal: Callable[[str], None] = lambda reason: None  # a replica can never start
        self.is_stopping: Callable[[], bool] = lambda: False  # the server is shutting down: restart nothing
        # Sees every event of every request (and the Abort of one nobody waits for): the metrics.
        self.on_event: Callable[[RequestHandle, Any], None] = lambda handle, event: None
        self._seeds = itertools.count(config.model.seed)
        self._tasks: list[asyncio.Task] = []
        self._dir = ""

    # ---- life cycle ----------------------------------------------------------------------
    async def start(self) -> None:
        self._address_prefix = _socket_prefix()
        self._dir = "" if self._address_prefix.startswith("ipc://@") else self._address_prefix[len("ipc://"):]
        self._api_address = f"{self._address_prefix}/api"
        self._actx = zmq.asyncio.Context()
        self._ctx = zmq.Context()
        self._pull = self._actx.socket(zmq.PULL)
        self._pull.bind(self._api_address)
        for replica in self.replicas:
            self._spawn(replica)
        self._tasks = [asyncio.create_task(self._read_loop()), asyncio.create_task(self._monitor_loop())]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        live = [r for r in self.replicas if r.proc is not None and r.proc.poll() is None]
        for replica in live:
            self._send(replica, ipc.Shutdown())
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while any(r.proc.poll() is None for r in live) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for replica in self.replicas:
            if replica.proc is not None and replica.proc.poll() is None:
                replica.proc.kill()
                replica.proc.wait()
            self._close_socket(replica)
            replica.state, replica.reason, replica.proc = ReplicaState.STOPPED, "the server is stopping", None
        for handle in list(self.handles.values()):
            self._fail(handle, ipc.ErrorCode.REPLICA_DIED, "the server is stopping")
        self._pull.close(linger=0)
        self._actx.term()
        self._ctx.term()
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)

    def _spawn(self, replica: Replica) -> None:
        replica.incarnation += 1
        address = f"{self._address_prefix}/replica-{replica.index}-{replica.incarnation}"
        # The API key stays in this process: a command line is visible to every user of the machine.
        config = replace(self.config, server=replace(self.config.server, api_key=None))
        cmd = [sys.executable, "-m", "vox_serve.scheduler_entry", "--config", json.dumps(config.to_dict()),
               "--replica", str(replica.index), "--incarnation", str(replica.incarnation),
               "--bind", address, "--api", self._api_address]
        replica.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
        replica.socket = self._ctx.socket(zmq.PUSH)
        replica.socket.setsockopt(zmq.LINGER, 0)
        replica.socket.connect(address)
        replica.state, replica.reason, replica.stats, replica.fatal = ReplicaState.STARTING, "starting", None, None
        log.info("replica %d: started process %d (incarnation %d)", replica.index, replica.proc.pid,
                 replica.incarnation)

    def _close_socket(self, replica: Replica) -> None:
        if replica.socket is not None:
            replica.socket.close(linger=0)
            replica.socket = None

    # ---- watching the processes ----------------------------------------------------------
    async def _monitor_loop(self) -> None:
        while True:
            now = time.monotonic()
            try:
                for replica in self.replicas:
                    self._watch(replica, now)
                self._expire(now)
            except Exception:  # keep watching: a lost monitor would leave requests hanging
                log.exception("replica monitor")
            await asyncio.sleep(MONITOR_INTERVAL_S)

    def _watch(self, replica: Replica, now: float) -> None:
        if replica.is_stale(now) and replica.reason is None:
            replica.reason = replica.stale_reason(now)
            log.warning("replica %d: %s", replica.index, replica.reason)
        elif not replica.is_stale(now) and replica.state is ReplicaState.READY:
            replica.reason = None
        if replica.proc is not None and replica.proc.poll() is not None:
            self._on_exit(replica, replica.proc.returncode, now)
        elif replica.state is ReplicaState.READY and replica.unresponsive_for(now) > HEARTBEAT_TIMEOUT_S:
            replica.fatal = f"unresponsive ({replica.stale_reason(now)}); killed"
            log.error("replica %d: %s", replica.index, replica.fatal)
            replica.proc.kill()
        elif replica.state is ReplicaState.RESTARTING and now >= replica.restart_at:
            replica.num_restarts += 1
            self._spawn(replica)

    def _on_exit(self, replica: Replica, code: int, now: float) -> None:
        how = f"killed by {_signal_name(-code)}" if code < 0 else f"exited with code {code}"
        reason = f"process {replica.proc.pid} {how}" + (f" ({replica.fatal})" if replica.fatal else "")
        log.error("replica %d: %s", replica.index, reason)
        replica.proc, replica.stats = None, None
        self._close_socket(replica)
        for req_id in list(replica.in_flight):
            self._fail(self.handles[req_id], ipc.ErrorCode.REPLICA_DIED, f"replica {replica.index} died: {reason}")
        if self.is_stopping():
            replica.state, replica.reason = ReplicaState.STOPPED, "the server is stopping"
            return
        if not replica.ready_once:
            replica.state, replica.reason = ReplicaState.STOPPED, f"could not start: {reason}"
            self.fatal_error = f"replica {replica.index} {replica.reason}"
            self.on_fatal(self.fatal_error)
            return
        replica.num_crashes_in_a_row += 1
        delay = min(MAX_RESTART_DELAY_S, 0.5 * 2 ** (replica.num_crashes_in_a_row - 1))
        replica.state, replica.restart_at = ReplicaState.RESTARTING, now + delay
        replica.reason = f"{reason}; restarting"

    def _expire(self, now: float) -> None:
        timeout = self.config.server.request_timeout_s
        for handle in list(self.handles.values()):
            if now > handle.deadline:
                self._send_to(handle, ipc.Abort(handle.req_id, "timed out"))
                self._fail(handle, ipc.ErrorCode.TIMEOUT, f"the request ran past --request-timeout-s ({timeout:g}s)")
        idle_s = self.config.server.session_idle_timeout_s
        for session_id, session in list(self.sessions.items()):
            if not session.is_idle(now, idle_s):
                continue
            if session.handle.done and not session.claimed:
                del self.sessions[session_id]  # over, and unread for a whole idle period: drop its audio
            elif not session.handle.done:
                what = "its audio to be read" if session.ended else "more text"
                self._end_session(session, f"the session waited for {what} longer than "
                                           f"--session-idle-timeout-s ({idle_s:g}s)", now)

    def _end_session(self, session: Session, why: str, now: float) -> None:
        """Abort a session nobody drives any more. Its audio is dropped; a reader that comes within
        another idle period gets the reason (504), then the session is gone."""
        self._send_to(session.handle, ipc.Abort(session.handle.req_id, why))
        session.handle.drop_audio()
        self._fail(session.handle, ipc.ErrorCode.TIMEOUT, why)
        session.last_activity = now

    # ---- messages from the replicas ------------------------------------------------------
    async def _read_loop(self) -> None:
        while True:
            frames = await self._pull.recv_multipart()
            try:
                for msg in ipc.request_events(ipc.decode(frames)):
                    self._dispatch(msg)
            except ipc.ProtocolError as exc:
                log.error("dropping a malformed message from a replica: %s", exc)
            except Exception:  # keep reading: a lost reader would leave every request hanging
                log.exception("handling a message from a replica")

    def _dispatch(self, msg: Any) -> None:
        if isinstance(msg, ipc.REQUEST_EVENTS):
            handle = self.handles.get(msg.req_id)
            if handle is not None:
                self.on_event(handle, msg)
                handle.put(msg)
                if isinstance(msg, ipc.Finished | ipc.Failed):
                    self._close(handle)
                elif handle.num_buffered_bytes > MAX_UNREAD_AUDIO_BYTES:
                    self._on_unread(handle)
            return
        replica = self._sender(msg)
        if replica is None:
            return
        replica.last_seen = time.monotonic()
        if isinstance(msg, ipc.Heartbeat):
            replica.step_s = msg.step_s
        elif isinstance(msg, ipc.Stats):  # sent by the loop between steps: no step is running
            replica.stats, replica.step_s = msg, 0.0
        elif isinstance(msg, ipc.Ready):
            self._on_ready(replica, msg)
        elif isinstance(msg, ipc.Fatal):
            replica.fatal = msg.message

    def _on_unread(self, handle: RequestHandle) -> None:
        """A session's audio piles up with no reader: end it rather than buffer without bound."""
        session = self.sessions.get(handle.req_id)
        if session is not None and not session.claimed:
            self._end_session(session, f"the session's audio was not read ({MAX_UNREAD_AUDIO_BYTES >> 20} MB "
                                       "buffered); open GET /generate/stream/{id}/audio while it runs",
                              time.monotonic())

    def _sender(self, msg: Any) -> Replica | None:
        """The replica a status message is from, if it is from its current, still running process."""
        index = getattr(msg, "replica", -1)
        if not 0 <= index < len(self.replicas):
            return None
        replica = self.replicas[index]
        return replica if replica.incarnation == msg.incarnation and replica.proc is not None else None

    def _on_ready(self, replica: Replica, msg: ipc.Ready) -> None:
        meta = ipc.meta_from_dict(msg.meta)
        if self.meta is None:
            self.meta, self.limits = meta, ipc.limits_from_dict(msg.limits)
        elif meta != self.meta:
            log.error("replica %d serves model %s, unlike the others (%s)", replica.index, meta.name, self.meta.name)
        replica.state, replica.reason, replica.device = ReplicaState.READY, None, msg.device
        replica.step_s = 0.0
        replica.ready_once, replica.num_crashes_in_a_row = True, 0
        log.info("replica %d: ready (process %d on %s)", replica.index, msg.pid, msg.device)

    # ---- requests ------------------------------------------------------------------------
    async def submit(self, fields: dict[str, Any], audio: bytes = b"", input_streaming: bool = False,
                     voice_prompt: bytes = b"") -> RequestHandle:
        """Queue a request on the least-loaded live replica; returns once the replica accepted it.

        A replica that is full or dies first hands the request to the next one. Raises ApiError
        when no replica can take it, or the request itself is refused (a bad field).
        """
        seed = next(self._seeds)
        deadline = time.monotonic() + self.config.server.request_timeout_s
        tried: set[int] = set()
        while True:
            replica = await self._pick_live(tried)
            tried.add(replica.index)
            req_id = uuid.uuid4().hex
            submit = ipc.Submit(req_id, fields, seed, input_streaming, audio, voice_prompt)
            frames = ipc.encode(submit)  # may raise: nothing open
            handle = self._open_and_send(replica, req_id, frames, deadline)
            if handle is None:
                continue
            event = await handle.get()
            if isinstance(event, ipc.Started):
                handle.prompt_len = event.prompt_len
                return handle
            retry = event.code in (ipc.ErrorCode.QUEUE_FULL, ipc.ErrorCode.REPLICA_DIED)
            if not (retry and self._candidates(tried)):
                raise ApiError.from_failed(event)

    async def encode_voice(self, name: str, audio: bytes, ref_text: str | None) -> bytes:
        """A saved voice's file, computed by a replica's encoders; raises ApiError when refused."""
        replica, req_id = await self._pick_live(set()), uuid.uuid4().hex
        frames = ipc.encode(ipc.EncodeVoice(req_id, name, int(time.time()), ref_text, audio))
        deadline = time.monotonic() + self.config.server.request_timeout_s
        handle = self._open_and_send(replica, req_id, frames, deadline)
        if handle is None:
            raise ApiError.unavailable(f"replica {replica.index} cannot take the request")
        handle.counted = False
        try:
            event = await handle.get()
        finally:
            self._close(handle)
        if isinstance(event, ipc.Failed):
            raise ApiError.from_failed(event)
        return event.prompt

    def send_text(self, handle: RequestHandle, text: str) -> bool:
        return self._send_to(handle, ipc.AppendText(handle.req_id, text))

    def end_text(self, handle: RequestHandle) -> bool:
        return self._send_to(handle, ipc.EndText(handle.req_id))

    def abort(self, handle: RequestHandle, reason: str) -> None:
        """Stop a request nobody waits for any more; the replica frees its pages and slots."""
        if not handle.done:
            abort = ipc.Abort(handle.req_id, reason)
            self.on_event(handle, abort)
            self._send_to(handle, abort)
            self._close(handle)

    def _candidates(self, exclude: set[int]) -> list[Replica]:
        now = time.monotonic()
        return [r for r in self.replicas if r.state is ReplicaState.READY and not r.is_stale(now)
                and r.index not in exclude]

    async def _pick_live(self, exclude: set[int]) -> Replica:
        """`_pick`, after waiting up to STALE_GRACE_S for a ready replica that is only silent to speak."""
        give_up = time.monotonic() + STALE_GRACE_S
        while not self._candidates(exclude) and time.monotonic() < give_up and any(
                r.state is ReplicaState.READY and r.index not in exclude for r in self.replicas):
            await asyncio.sleep(STALE_RECHECK_S)  # the read loop runs: queued heartbeats are counted
        return self._pick(exclude)

    def _pick(self, exclude: set[int]) -> Replica:
        candidates = self._candidates(exclude)
        if not candidates:
            raise ApiError.unavailable(f"no replica can take the request: {self.unavailable_reason() or 'all busy'}")
        return min(candidates, key=Replica.load)

    def _open_and_send(self, replica: Replica, req_id: str, frames: list[bytes], deadline: float
                       ) -> RequestHandle | None:
        """The handle of a request whose encoded Submit the replica has taken; None (and nothing left
        open) when it cannot take it. Encoding comes first, so no error can leave a handle behind."""
        if not self._send_frames(replica, frames):
            return None
        handle = RequestHandle(req_id, replica.index, deadline)
        self.handles[req_id] = handle
        replica.in_flight.add(req_id)
        replica.num_dispatched += 1
        return handle

    def _close(self, handle: RequestHandle) -> None:
        handle.done = True
        self.handles.pop(handle.req_id, None)
        self.replicas[handle.replica].in_flight.discard(handle.req_id)

    def _fail(self, handle: RequestHandle, code: ipc.ErrorCode, message: str) -> None:
        failed = ipc.Failed(handle.req_id, str(code), message)
        self.on_event(handle, failed)
        handle.put(failed)
        self._close(handle)

    def _send_to(self, handle: RequestHandle, msg: Any) -> bool:
        return not handle.done and self._send(self.replicas[handle.replica], msg)

    def _send(self, replica: Replica, msg: Any) -> bool:
        """Queue a message for the replica without ever blocking; False if it cannot take it."""
        return self._send_frames(replica, ipc.encode(msg))

    def _send_frames(self, replica: Replica, frames: list[bytes]) -> bool:
        if replica.socket is None:
            return False
        with contextlib.suppress(zmq.Again):
            replica.socket.send_multipart(frames, flags=zmq.NOBLOCK)
            return True
        return False

    # ---- status --------------------------------------------------------------------------
    def require_meta(self) -> ProgramMeta:
        """The served program's meta; 503 while no replica has loaded it yet."""
        if self.meta is None:
            raise ApiError.unavailable(f"the model is still loading ({self.unavailable_reason()})")
        return self.meta

    def unavailable_reason(self) -> str | None:
        """None when every replica is ready (and heard from lately), else why not."""
        now = time.monotonic()
        problems = [f"replica {r.index}: {r.stale_reason(now) if r.is_stale(now) else r.reason}" for r in self.replicas
                    if r.state is not ReplicaState.READY or r.is_stale(now)]
        return "; ".join(problems) or None

    def session_room(self) -> bool:
        """Whether another session may open: at most --max-sessions per replica exist at once, from their
        start until their audio has been read (or they are dropped unread)."""
        return len(self.sessions) < self.config.server.max_sessions * len(self.replicas)

    def status(self) -> list[dict[str, Any]]:
        return [replica_status(r) for r in self.replicas]


def _socket_prefix() -> str:
    """Where the ZMQ sockets live. On Linux, in the abstract socket namespace: nothing on disk, so an API
    process that is killed (SIGKILL) leaves nothing behind. Elsewhere, in a fresh temporary directory."""
    if sys.platform.startswith("linux"):
        return f"ipc://@vox-serve-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    return f"ipc://{tempfile.mkdtemp(prefix='vox-serve-')}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
