"""One scheduler process per replica: the engine loop behind a ZMQ connection to the API process.

The process builds the program, the scheduling policy, the worker and the engine loop, then
repeats: take every message the API sent (blocking only while there is nothing to run), run one
step, and send the audio the step produced as it is decoded. Every STATS_INTERVAL_S it reports
load and pool occupancy, which is also its heartbeat. No request can end the process: whatever a
request causes becomes a Failed message for that request.

    python -m vox_serve.scheduler_entry --config JSON --replica I --incarnation K \\
        --bind ipc:///tmp/.../replica-I-K --api ipc:///tmp/.../api
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

import zmq

from vox_serve import ipc
from vox_serve.config import VoxConfig
from vox_serve.core.request import EmbeddedPrompt, Request, RequestStatus, TextFeed
from vox_serve.engine_loop import EngineLoop
from vox_serve.request_builder import FieldError, build_request
from vox_serve.scheduler.base import QueueFull
from vox_serve.text_sessions import InputSession, TextStreaming

log = logging.getLogger("vox_serve.scheduler_entry")

IDLE_POLL_S = 0.05  # longest wait for a message while nothing runs
STATS_INTERVAL_S = 0.2
Preprocess = Callable[[dict[str, Any]], list[list[int]] | EmbeddedPrompt]


class SchedulerService:
    """The message handling of one replica, independent of the transport (tests drive it directly).

    `send` carries messages to the API. Requests the API aborted end silently; every other request
    ends with exactly one Finished or Failed message. `streamer` (the program, for a model whose meta
    has a `streamed_text_column`) starts input-streaming requests before their text ends
    (text_sessions.py); without it, a session's text is collected and the request starts at its end.
    """

    def __init__(self, loop: EngineLoop, preprocess: Preprocess, config: VoxConfig,
                 send: Callable[[Any], None], replica: int = 0, incarnation: int = 0,
                 streamer: TextStreaming | None = None) -> None:
        self.loop, self.scheduler = loop, loop.scheduler
        self.meta, self.preprocess, self.send = loop.scheduler.meta, preprocess, send
        self.streamer = streamer
        self.greedy = config.bench.greedy
        self.max_sessions = config.server.max_sessions
        self.replica, self.incarnation = replica, incarnation
        self.sessions: dict[str, InputSession] = {}
        self.num_finished = self.num_aborted = self.num_failed = 0
        self.stopping = False
        # How a request that ends ABORTED is reported: None (the API asked; silent) or a code.
        self._abort_codes: dict[str, ipc.ErrorCode | None] = {}
        self._handlers: dict[type, Callable[[Any], None]] = {
            ipc.Submit: self._on_submit, ipc.AppendText: self._on_append, ipc.EndText: self._on_end,
            ipc.Abort: self._on_abort, ipc.Shutdown: self._on_shutdown,
        }

    # ---- messages in ---------------------------------------------------------------------
    def handle(self, msg: Any) -> None:
        handler = self._handlers.get(type(msg))
        if handler is None:
            log.warning("ignoring a %s message", type(msg).__name__)
            return
        try:
            handler(msg)
        except Exception as exc:  # a bug triggered by one request fails that request only
            log.exception("handling %s failed", type(msg).__name__)
            req_id = getattr(msg, "req_id", None)
            if req_id is not None:
                self._fail_request(req_id, f"{type(exc).__name__}: {exc}")

    def _on_submit(self, msg: ipc.Submit) -> None:
        if msg.req_id in self.scheduler.requests or msg.req_id in self.sessions:
            self._reply_failed(msg.req_id, ipc.ErrorCode.INTERNAL, f"request id {msg.req_id!r} is already in use")
            return
        if not msg.input_streaming:
            req = self._admit(msg.req_id, msg.fields, msg.default_seed, msg.audio)
            if req is not None:
                self.send(ipc.Started(msg.req_id, req.prompt_len))
            return
        if not self.meta.supports_input_streaming:
            self._reply_failed(msg.req_id, ipc.ErrorCode.UNSUPPORTED,
                               f"model {self.meta.name} does not support input streaming")
            return
        if len(self.sessions) >= self.max_sessions:  # sessions wait for their text
            self._reply_failed(msg.req_id, ipc.ErrorCode.QUEUE_FULL,
                               f"the replica is at capacity: {len(self.sessions)} sessions are open "
                               f"(--max-sessions {self.max_sessions})")
            return
        if self.streamer is not None:
            try:
                self.streamer.check_streaming_fields({**msg.fields, "audio": msg.audio})
            except FieldError as exc:
                self._reply_failed(msg.req_id, ipc.ErrorCode.INVALID_FIELD, str(exc), exc.field)
                return
        self.sessions[msg.req_id] = InputSession(dict(msg.fields), msg.default_seed, msg.audio)
        self.send(ipc.Started(msg.req_id, 0))

    def _on_append(self, msg: ipc.AppendText) -> None:
        session = self.sessions.get(msg.req_id)
        if session is None:
            log.warning("text for %s, which is not an open session", msg.req_id)
            return
        session.parts.append(msg.text)
        session.num_chars += len(msg.text)
        if session.num_chars > self.meta.max_text_chars:
            message = f"text: is {session.num_chars} characters; the limit is {self.meta.max_text_chars}"
            del self.sessions[msg.req_id]
            if msg.req_id in self.scheduler.requests:  # started: the request ends with this error
                self._abort_codes[msg.req_id] = ipc.ErrorCode.INVALID_FIELD
                self.scheduler.abort(msg.req_id, message)
            else:
                self._reply_failed(msg.req_id, ipc.ErrorCode.INVALID_FIELD, message, "text")
        elif self.streamer is not None:
            self._stream_text(msg.req_id, session, ended=False)

    def _on_end(self, msg: ipc.EndText) -> None:
        session = self.sessions.pop(msg.req_id, None)
        if session is None:
            log.warning("end of %s, which is not an open session", msg.req_id)
            return
        if self.streamer is not None:
            self._stream_text(msg.req_id, session, ended=True)
            return
        fields = {**session.fields, "text": session.text}
        self._admit(msg.req_id, fields, session.default_seed, session.audio)

    def _stream_text(self, req_id: str, session: InputSession, ended: bool) -> None:
        """Hand on the session's newly stable text ids: the first ones start the request, the
        others extend its text feed."""
        new, session.stable_chars = self.streamer.stable_text_ids(session.text, session.stable_chars, ended)
        if session.started:
            self.scheduler.append_text(req_id, new, ended)
            return
        ids = session.text_ids = session.text_ids + new
        n = self.streamer.num_prompt_text_ids
        if len(ids) < n:
            if ended:
                self._reply_failed(req_id, ipc.ErrorCode.INVALID_FIELD, "text: too short for this model", "text")
            return
        fields = {**session.fields, "text": session.text}
        req = self._admit(req_id, fields, session.default_seed, session.audio,
                          lambda clean: self.streamer.preprocess_streaming(clean, ids[:n]), TextFeed(ids[n:], ended))
        if req is None:
            self.sessions.pop(req_id, None)
            return
        session.started = True

    def _on_abort(self, msg: ipc.Abort) -> None:
        session = self.sessions.pop(msg.req_id, None)
        if msg.req_id in self.scheduler.requests:
            self._abort_codes[msg.req_id] = None
            self.scheduler.abort(msg.req_id, msg.reason)
        elif session is not None:
            self.num_aborted += 1

    def _on_shutdown(self, msg: ipc.Shutdown) -> None:
        self.stopping = True
        for req_id in list(self.scheduler.requests):
            self._abort_codes[req_id] = ipc.ErrorCode.REPLICA_DIED
            self.scheduler.abort(req_id, "the server is shutting down")
        self.sessions.clear()

    # ---- requests ------------------------------------------------------------------------
    def _admit(self, req_id: str, fields: dict[str, Any], seed: int, audio: bytes,
               preprocess: Preprocess | None = None, text_feed: TextFeed | None = None) -> Request | None:
        """Build the request (with `preprocess`, default the program's) and queue it; on a problem,
        answer Failed and return None."""
        fields = {**fields, "audio": audio} if audio else fields
        try:
            req = build_request(self.meta, preprocess or self.preprocess, fields, req_id, self.greedy, seed)
        except FieldError as exc:
            self._reply_failed(req_id, ipc.ErrorCode.INVALID_FIELD, str(exc), exc.field)
            return None
        req.sink, req.text_feed = self._on_audio, text_feed
        req.extra["num_chunks_sent"] = req.extra["num_samples_sent"] = 0
        try:
            self.scheduler.add_request(req)
        except QueueFull as exc:
            self._reply_failed(req_id, ipc.ErrorCode.QUEUE_FULL, f"the replica is at capacity: {exc}")
            return None
        except ValueError as exc:  # the prompt is longer than the model or the KV cache can hold
            self._reply_failed(req_id, ipc.ErrorCode.INVALID_FIELD, f"text: {exc}", "text")
            return None
        return req

    def _on_audio(self, req: Request, pcm: bytes | None, final: bool) -> None:
        """The request sink: audio chunks as binary frames, then one final message."""
        if pcm:
            self.send(ipc.Audio(req.req_id, req.extra["num_chunks_sent"], pcm))
            req.extra["num_chunks_sent"] += 1
            req.extra["num_samples_sent"] += len(pcm) // 2
        if not final:
            return
        self.sessions.pop(req.req_id, None)  # a request may finish before its text ends
        if req.status is RequestStatus.FINISHED:
            self.num_finished += 1
            self.send(ipc.Finished(req.req_id, req.finish_reason or "stop", req.num_generated,
                                   req.extra["num_samples_sent"]))
            return
        if req.status is RequestStatus.FAILED:
            self._reply_failed(req.req_id, ipc.ErrorCode.INTERNAL, req.error or "the step failed")
            return
        code = self._abort_codes.pop(req.req_id, ipc.ErrorCode.STALLED)
        if code is None:
            self.num_aborted += 1
        else:
            self._reply_failed(req.req_id, code, req.finish_reason or "aborted")

    def _reply_failed(self, req_id: str, code: ipc.ErrorCode, message: str, field: str | None = None) -> None:
        self.num_failed += 1
        self.send(ipc.Failed(req_id, str(code), message, field))

    def _fail_request(self, req_id: str, message: str) -> None:
        self.sessions.pop(req_id, None)
        if req_id in self.scheduler.requests:
            self._abort_codes[req_id] = ipc.ErrorCode.INTERNAL
            self.scheduler.abort(req_id, message)
        else:
            self._reply_failed(req_id, ipc.ErrorCode.INTERNAL, message)

    # ---- stepping ------------------------------------------------------------------------
    def step(self) -> float:
        """Run one step if there is work; returns how long the caller may wait for messages."""
        if not self.loop.busy:
            return IDLE_POLL_S
        try:
            wait = self.loop.poll()
        except Exception as exc:  # a scheduling bug: the state of every request is suspect
            log.exception("scheduling failed; failing every request on this replica")
            for req_id in list(self.scheduler.requests):
                self._fail_request(req_id, f"{type(exc).__name__}: {exc}")
            return 0.0
        return IDLE_POLL_S if wait is None else min(wait, IDLE_POLL_S)

    def stats(self) -> ipc.Stats:
        return ipc.Stats(
            self.replica, self.incarnation, num_active=self.scheduler.num_active,
            num_waiting=len(self.scheduler.waiting), num_sessions=len(self.sessions), pools=self.pools(),
            num_finished=self.num_finished, num_aborted=self.num_aborted, num_failed=self.num_failed,
            num_steps=self.loop.num_steps,
        )

    def pools(self) -> dict[str, list[int]]:
        """[free, total] of every pool the scheduler holds: KV pages and, for stateful codecs, slots."""
        return {name: list(counts) for name, counts in self.scheduler.pool_usage().items()}


class Connection:
    """The replica's two sockets: PULL (bound) for the API's messages, PUSH to the API's PULL."""

    def __init__(self, bind: str, api: str) -> None:
        self.ctx = zmq.Context()
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.bind(bind)
        self.push = self.ctx.socket(zmq.PUSH)
        self.push.setsockopt(zmq.SNDHWM, 0)  # never block a step on a slow reader
        self.push.connect(api)

    def send(self, msg: Any) -> None:
        self.push.send_multipart(ipc.encode(msg), copy=False)

    def receive(self, timeout_s: float) -> list[Any]:
        """Every message waiting, after waiting up to timeout_s for the first one."""
        out: list[Any] = []
        if not self.pull.poll(int(timeout_s * 1000)):
            return out
        while True:
            try:
                frames = self.pull.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return out
            try:
                out.append(ipc.decode(frames))
            except ipc.ProtocolError as exc:
                log.error("dropping a malformed message: %s", exc)

    def close(self, linger_s: float = 1.0) -> None:
        self.pull.close(linger=0)
        self.push.close(linger=int(linger_s * 1000))
        self.ctx.term()


def serve(service: SchedulerService, conn: Connection, parent_pid: int) -> None:
    """Drain messages, step, report; until Shutdown or the API process is gone."""
    next_stats, wait = 0.0, 0.0
    while not service.stopping:
        for msg in conn.receive(wait):
            service.handle(msg)
        wait = service.step()
        now = time.monotonic()
        if now >= next_stats:
            conn.send(service.stats())
            next_stats = now + STATS_INTERVAL_S
            if os.getppid() != parent_pid:
                log.warning("the API process is gone; exiting")
                return
    service.loop.drain()


def replica_config(config: VoxConfig, replica: int) -> VoxConfig:
    """The config of one replica: replica i runs on GPU i (CPU replicas share the CPU)."""
    device, dp_size = config.model.device, config.server.dp_size
    if device == "cpu" or device.startswith("cuda:"):
        return config
    import torch

    if device == "auto" and not torch.cuda.is_available():
        device = "cpu"
    elif torch.cuda.device_count() < dp_size:
        raise RuntimeError(f"--dp-size {dp_size} needs {dp_size} GPUs; {torch.cuda.device_count()} visible")
    else:
        device = f"cuda:{replica}"
    return replace(config, model=replace(config.model, device=device))


def _parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="one vox-serve scheduler process (started by the API)")
    parser.add_argument("--config", required=True, help="VoxConfig as JSON")
    parser.add_argument("--replica", type=int, required=True)
    parser.add_argument("--incarnation", type=int, required=True)
    parser.add_argument("--bind", required=True, help="ZMQ address to receive the API's messages on")
    parser.add_argument("--api", required=True, help="ZMQ address of the API's receiving socket")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s [replica {args.replica}] %(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the API, which stops the replicas
    parent_pid = os.getppid()
    conn = Connection(args.bind, args.api)
    try:
        config = replica_config(VoxConfig.from_dict(json.loads(args.config)), args.replica)
        from vox_serve.bench import build_loop, set_cpu_threads

        set_cpu_threads(config)

        loop, program = build_loop(config)
    except Exception as exc:
        log.exception("the replica cannot start")
        conn.send(ipc.Fatal(args.replica, args.incarnation, f"{type(exc).__name__}: {exc}"))
        conn.close(linger_s=2.0)
        return 1
    service = SchedulerService(loop, program.preprocess, config, conn.send, args.replica, args.incarnation,
                               streamer=program if program.meta.streamed_text_column is not None else None)
    conn.send(ipc.Ready(args.replica, args.incarnation, os.getpid(), str(program.device),
                        program.meta.to_dict(), asdict(program.limits)))
    log.info("ready on %s: model %s, %d KV pages", program.device, program.meta.name, program.limits.num_pages - 1)
    serve(service, conn, parent_pid)
    conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
