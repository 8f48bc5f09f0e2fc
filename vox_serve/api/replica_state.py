"""What the API process knows of each replica and each request (the state `ReplicaManager` in replicas.py
keeps): a replica's process, heartbeat and load; a request's events; an input-streaming session; and the
limits that decide when a replica is stale, stuck or dead."""

from __future__ import annotations

import asyncio
import enum
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

import zmq

from vox_serve import ipc

MONITOR_INTERVAL_S = 0.1
# A replica's heartbeat thread reports every STATS_INTERVAL_S (0.2 s; replica_transport.py), steps or
# not. One silent for STALE_AFTER_S (five heartbeats: frozen), or in one step for STUCK_STEP_S (no
# step of a served model takes that long), is not ready: /health says so and new requests go
# elsewhere. One silent or in one step for HEARTBEAT_TIMEOUT_S is killed, which fails its requests
# (503 replica_died) and restarts it.
STALE_AFTER_S = 1.0
STUCK_STEP_S = 10.0
HEARTBEAT_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 5.0
# A request that finds every ready replica silent waits this long for one to speak before the 503:
# the silence may be this process's own (its event loop or CPU starved, heartbeats unread), not theirs.
STALE_GRACE_S = 1.0
STALE_RECHECK_S = 0.02
MAX_UNREAD_AUDIO_BYTES = 4 << 20  # audio a session may hold for a reader that has not come yet
MAX_RESTART_DELAY_S = 30.0


class ReplicaState(enum.StrEnum):
    STARTING = "starting"
    READY = "ready"
    RESTARTING = "restarting"
    STOPPED = "stopped"


@dataclass
class Replica:
    index: int
    incarnation: int = 0
    state: ReplicaState = ReplicaState.STARTING
    reason: str | None = "starting"
    proc: subprocess.Popen | None = None
    socket: zmq.Socket | None = None
    device: str | None = None
    stats: ipc.Stats | None = None
    last_seen: float = 0.0
    step_s: float = 0.0  # how long its current step had run at the last heartbeat
    in_flight: set[str] = field(default_factory=set)
    num_dispatched: int = 0
    num_restarts: int = 0
    num_crashes_in_a_row: int = 0
    ready_once: bool = False
    restart_at: float = 0.0
    fatal: str | None = None  # what the process said before it exited

    def is_stale(self, now: float) -> bool:
        """Ready, but silent for longer than a few heartbeats (frozen), or stuck in one long step."""
        return self.state is ReplicaState.READY and self.unresponsive_s(now) > 0

    def unresponsive_s(self, now: float) -> float:
        """How far past its limit it is: silence beyond STALE_AFTER_S, or a step beyond STUCK_STEP_S
        (0 when neither); what `stale_reason` names."""
        silent = now - self.last_seen
        return max(silent - STALE_AFTER_S, self.step_s + silent - STUCK_STEP_S, 0.0)

    def unresponsive_for(self, now: float) -> float:
        """Seconds since it last proved it makes progress: its silence, plus the step it was in then."""
        return now - self.last_seen + self.step_s

    def stale_reason(self, now: float) -> str:
        silent = now - self.last_seen
        if silent > STALE_AFTER_S:
            return f"no heartbeat for {silent:.1f}s (frozen)"
        return f"in one step for {self.step_s + silent:.1f}s (stuck)"

    def load(self) -> tuple[int, float, int]:
        """Sort key, least loaded first: requests in flight, then KV pages in use, then traffic so far."""
        pages = self.stats.pools.get("kv_pages") if self.stats is not None else None
        used = 1.0 - pages[0] / pages[1] if pages and pages[1] else 0.0
        return len(self.in_flight), used, self.num_dispatched


class RequestHandle:
    """One request (or input-streaming session) on one replica: the events the replica sends for it.

    Events are ipc.Started / Audio / Finished / Failed; the manager closes the handle on the last
    one, and also injects Failed when the replica dies or the request times out.
    """

    def __init__(self, req_id: str, replica: int, deadline: float) -> None:
        self.req_id, self.replica, self.deadline = req_id, replica, deadline
        self.events: asyncio.Queue[Any] = asyncio.Queue()
        self.done = False
        self.opened = time.monotonic()
        self.prompt_len = 0  # from the replica's Started
        self.counted = True  # a speech request (metrics count it); False for a voice encoding
        self.num_buffered_bytes = 0  # PCM received and not yet taken by a reader

    def put(self, event: Any) -> None:
        if isinstance(event, ipc.Audio):
            self.num_buffered_bytes += len(event.pcm)
        self.events.put_nowait(event)

    def drop_audio(self) -> None:
        """Forget the audio nobody read (a session that is being ended)."""
        kept = [e for e in _drain(self.events) if not isinstance(e, ipc.Audio)]
        self.num_buffered_bytes = 0
        for event in kept:
            self.events.put_nowait(event)

    async def get(self) -> Any:
        event = await self.events.get()
        if isinstance(event, ipc.Audio):
            self.num_buffered_bytes -= len(event.pcm)
        return event


@dataclass
class Session:
    """An input-streaming session: text arrives in pieces, audio is read from one stream."""

    handle: RequestHandle
    last_activity: float  # monotonic time of its start, last text, end or reader
    num_chars: int = 0
    visible: bool = False  # some text so far has a visible character
    ended: bool = False
    claimed: bool = False  # its audio stream has been requested

    def is_idle(self, now: float, idle_timeout_s: float) -> bool:
        """Waiting for text, or (ended) for its reader, for longer than idle_timeout_s."""
        return not (self.ended and self.claimed) and now - self.last_activity > idle_timeout_s


def _drain(queue: asyncio.Queue[Any]) -> list[Any]:
    items = []
    while not queue.empty():
        items.append(queue.get_nowait())
    return items


def replica_status(r: Replica) -> dict[str, Any]:
    s = r.stats
    since = round(time.monotonic() - r.last_seen, 3) if r.state is ReplicaState.READY else None
    return {
        "replica": r.index, "state": str(r.state), "reason": r.reason, "seconds_since_heartbeat": since,
        "pid": r.proc.pid if r.proc is not None else None, "device": r.device, "restarts": r.num_restarts,
        "in_flight": len(r.in_flight),
        "active_requests": s.num_active if s else None, "waiting_requests": s.num_waiting if s else None,
        "pools": {name: {"free": free, "total": total} for name, (free, total) in (s.pools.items() if s else ())},
        "finished": s.num_finished if s else None, "aborted": s.num_aborted if s else None,
        "failed": s.num_failed if s else None,
    }
