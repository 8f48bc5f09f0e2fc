"""One scheduler process per replica: the engine loop behind a ZMQ connection to the API process.

The process builds the engine, the scheduling policy, the worker and the engine loop, then
repeats: take every message the API sent (blocking only while there is nothing to run), run one
step, and send the audio the step produced as it is decoded. Prompts are built off the loop's
thread (`prompt_pool.py`): a request joins the scheduler once its prompt is ready. Every
STATS_INTERVAL_S it reports load and pool occupancy; a thread of its own sends a heartbeat as often,
during steps too, saying how long the current step has run. No request can
end the process: whatever a request causes becomes a Failed message for that request.

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
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from typing import Any

from vox_serve import ipc
from vox_serve.config import VoxConfig
from vox_serve.core.request import Request, RequestStatus, SamplingParams, TextFeed
from vox_serve.engine.placement import replica_config
from vox_serve.engine_loop import EngineLoop
from vox_serve.prompt_pool import PromptPool
from vox_serve.replica_transport import STATS_INTERVAL_S, Connection, Heartbeat
from vox_serve.request_builder import FieldError, Preprocess, make_prompt, new_request, request_fields
from vox_serve.scheduler.base import QueueFull
from vox_serve.stage_stats import StageStats, TimedWorker
from vox_serve.text_sessions import InputSession, TextStreaming
from vox_serve.voice_prompt import SAVED_VOICE_FIELD, VoiceFileError, VoicePrompt

log = logging.getLogger("vox_serve.scheduler_entry")

IDLE_POLL_S = 0.05  # longest wait for a message while nothing runs
WARM_UP_TEXT = "Hello, this is a warm-up."  # one prompt built before the replica is ready
VoiceEncoder = Callable[[bytes, str | None], VoicePrompt]  # (reference audio, its transcript) -> prompt


@dataclass
class Preparing:
    """A request whose prompt is being built."""

    fields: dict[str, Any]
    sampling: SamplingParams
    text_feed: TextFeed | None
    reply_started: bool  # answer Started once it is queued (a session already got its Started)


class SchedulerService:
    """The message handling of one replica, independent of the transport (tests drive it directly).

    `send` carries messages to the API. A step's audio chunks go as one AudioBatch after the step (or before
    any other message, so a request's messages keep their order). Requests the API aborted end silently;
    every other request ends with exactly one Finished or Failed message. `streamer` (the program, for a model
    whose meta has a `streamed_text_column`) starts input-streaming requests before their text ends
    (text_sessions.py); without it, a session's text is collected and the request starts at its end.
    `voice_encoder` (models that clone voices) computes saved voices' prompts (EncodeVoice); a request
    naming a saved voice brings that prompt, which its preprocess finds in SAVED_VOICE_FIELD.
    """

    def __init__(self, loop: EngineLoop, preprocess: Preprocess, config: VoxConfig,
                 send: Callable[[Any], None], replica: int = 0, incarnation: int = 0,
                 streamer: TextStreaming | None = None, prompts: PromptPool | None = None,
                 voice_encoder: VoiceEncoder | None = None) -> None:
        self.loop, self.scheduler = loop, loop.scheduler
        self.meta, self.preprocess, self._transport = loop.scheduler.meta, preprocess, send
        self.audio = ipc.AudioOutbox()
        self.streamer, self.voice_encoder = streamer, voice_encoder
        self.prompts = prompts or PromptPool(threads=0)
        self.preparing: dict[str, Preparing] = {}
        self.encoding: dict[str, ipc.EncodeVoice] = {}  # saved voices being encoded, by request id
        self.stage_stats = StageStats()  # step time by stage, for /metrics: the loop's worker reports it
        loop.worker = TimedWorker(loop.worker, self.stage_stats)
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
            ipc.Abort: self._on_abort, ipc.Shutdown: self._on_shutdown, ipc.EncodeVoice: self._on_encode_voice,
        }

    # ---- messages out --------------------------------------------------------------------
    def send(self, msg: Any) -> None:
        """Send `msg` after the audio chunks collected so far."""
        self.flush_audio()
        self._transport(msg)

    def flush_audio(self) -> None:
        if len(self.audio):
            self._transport(self.audio.take())

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
        self._queue_prepared()  # prompts built inline (or already done) are queued at once

    @property
    def busy(self) -> bool:
        """Requests to step, or prompts being built."""
        return self.loop.busy or bool(self.preparing) or bool(self.encoding)

    def _in_use(self, req_id: str) -> bool:
        return (req_id in self.scheduler.requests or req_id in self.sessions or req_id in self.preparing
                or req_id in self.encoding)

    def _on_submit(self, msg: ipc.Submit) -> None:
        if self._in_use(msg.req_id):
            self._reply_failed(msg.req_id, ipc.ErrorCode.INTERNAL, f"request id {msg.req_id!r} is already in use")
            return
        try:
            voice = VoicePrompt.from_bytes(msg.voice_prompt) if msg.voice_prompt else None
        except VoiceFileError as exc:
            self._reply_failed(msg.req_id, ipc.ErrorCode.INVALID_FIELD, f"voice: the saved voice is unusable: {exc}",
                               "voice")
            return
        if not msg.input_streaming:
            self._admit(msg.req_id, msg.fields, msg.default_seed, msg.audio, reply_started=True, voice=voice)
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
        needed = 1
        if self.streamer is not None:
            fields = {**msg.fields, "audio": msg.audio, SAVED_VOICE_FIELD: voice}
            try:
                self.streamer.check_streaming_fields(fields)
                needed = self.streamer.num_prompt_text_ids_for(fields)
            except FieldError as exc:
                self._reply_failed(msg.req_id, ipc.ErrorCode.INVALID_FIELD, str(exc), exc.field)
                return
        self.sessions[msg.req_id] = InputSession(dict(msg.fields), msg.default_seed, msg.audio, voice=voice,
                                                 prompt_text_ids=needed)
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
        self._admit(msg.req_id, fields, session.default_seed, session.audio, voice=session.voice)

    def _stream_text(self, req_id: str, session: InputSession, ended: bool) -> None:
        """Hand on the session's newly stable text ids: the first ones start the request, the
        others extend its text feed."""
        new, session.stable_chars = self.streamer.stable_text_ids(session.text, session.stable_chars, ended)
        if session.started:
            preparing = self.preparing.get(req_id)
            if preparing is not None:  # its prompt is being built: the text waits in its feed
                preparing.text_feed.ids.extend(new)
                preparing.text_feed.ended |= ended
            else:
                self.scheduler.append_text(req_id, new, ended)
            return
        ids = session.text_ids = session.text_ids + new
        n = session.prompt_text_ids
        if len(ids) < n and not ended:
            return
        fields = {**session.fields, "text": session.text}
        if not self._admit(req_id, fields, session.default_seed, session.audio,
                           lambda clean: self.streamer.preprocess_streaming(clean, ids[:n]), TextFeed(ids[n:], ended),
                           voice=session.voice):
            self.sessions.pop(req_id, None)
            return
        session.started = True

    def _on_encode_voice(self, msg: ipc.EncodeVoice) -> None:
        """Compute a saved voice's prompt with the model's encoders, off the loop (the prompt pool)."""
        if self.voice_encoder is None:
            self._reply_failed(msg.req_id, ipc.ErrorCode.UNSUPPORTED, f"model {self.meta.name} does not clone voices")
            return
        self.encoding[msg.req_id] = msg
        encode = self.voice_encoder
        self.prompts.submit(msg.req_id, lambda: encode(msg.audio, msg.ref_text))

    def _voice_encoded(self, msg: ipc.EncodeVoice, future: Future) -> None:
        exc = future.exception()
        if isinstance(exc, FieldError):
            self._reply_failed(msg.req_id, ipc.ErrorCode.INVALID_FIELD, str(exc), exc.field)
        elif exc is not None:
            log.error("encoding voice %r failed: %r", msg.name, exc)
            self._reply_failed(msg.req_id, ipc.ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}")
        else:
            self.send(ipc.VoiceEncoded(msg.req_id, future.result().to_bytes(msg.name, self.meta.name, msg.created_at)))

    def _on_abort(self, msg: ipc.Abort) -> None:
        session = self.sessions.pop(msg.req_id, None)
        preparing = self.preparing.pop(msg.req_id, None)  # its prompt is dropped when it is ready
        if msg.req_id in self.scheduler.requests:
            self._abort_codes[msg.req_id] = None
            self.scheduler.abort(msg.req_id, msg.reason)
        elif session is not None or preparing is not None:
            self.num_aborted += 1

    def _on_shutdown(self, msg: ipc.Shutdown) -> None:
        self.stopping = True
        for req_id in list(self.scheduler.requests):
            self._abort_codes[req_id] = ipc.ErrorCode.REPLICA_DIED
            self.scheduler.abort(req_id, "the server is shutting down")
        self.sessions.clear()
        self.preparing.clear()
        self.prompts.close()

    # ---- requests ------------------------------------------------------------------------
    def _admit(self, req_id: str, fields: dict[str, Any], seed: int, audio: bytes,
               preprocess: Preprocess | None = None, text_feed: TextFeed | None = None,
               reply_started: bool = False, voice: VoicePrompt | None = None) -> bool:
        """Validate the fields and have the request's prompt built (with `preprocess`, default the
        program's, given the saved `voice` if any) off the loop; it is queued once the prompt is ready.
        On a bad field, answer Failed and return False."""
        fields = {**fields, "audio": audio} if audio else fields
        run = preprocess or self.preprocess
        if voice is not None:
            run = _with_voice(run, voice)
        try:
            clean, sampling = request_fields(self.meta, fields, self.greedy, seed)
        except FieldError as exc:
            self._reply_failed(req_id, ipc.ErrorCode.INVALID_FIELD, str(exc), exc.field)
            return False
        self.preparing[req_id] = Preparing(clean, sampling, text_feed, reply_started)
        self.prompts.submit(req_id, lambda: make_prompt(run, clean))
        return True

    def warm_prompts(self) -> None:
        """Build a plain text request's prompt once before the replica reports ready (see PromptPool.warm).
        A model whose requests need more than text (a reference clip) has nothing to warm this way."""
        try:
            clean, _ = request_fields(self.meta, {"text": WARM_UP_TEXT}, True, 0)
        except FieldError:
            return
        try:
            self.prompts.warm(lambda: make_prompt(self.preprocess, clean))
        except FieldError:
            return
        except Exception as exc:  # the replica still serves; its first request pays the lazy start-up
            log.warning("building a warm-up prompt failed: %r", exc)

    def _queue_prepared(self) -> None:
        """Queue the requests whose prompts are ready (or fail those whose prompt could not be built)."""
        for req_id, future in self.prompts.completed():
            if req_id in self.encoding:
                self._voice_encoded(self.encoding.pop(req_id), future)
                continue
            entry = self.preparing.pop(req_id, None)
            if entry is not None:  # else aborted while its prompt was built
                self._queue(req_id, entry, future)

    def _queue(self, req_id: str, entry: Preparing, future: Future) -> None:
        exc = future.exception()
        if exc is not None:
            self.sessions.pop(req_id, None)
            if isinstance(exc, FieldError):
                self._reply_failed(req_id, ipc.ErrorCode.INVALID_FIELD, str(exc), exc.field)
            else:
                log.error("building the prompt of %s failed: %r", req_id, exc)
                self._reply_failed(req_id, ipc.ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}")
            return
        req = new_request(req_id, future.result(), entry.fields, entry.sampling)
        req.sink = self._on_audio
        if entry.text_feed is not None:  # the prompt's trailing text ids come before the streamed ones
            entry.text_feed.ids[:0] = req.prompt.trailing_text
            req.text_feed = entry.text_feed
        req.extra["num_chunks_sent"] = req.extra["num_samples_sent"] = 0
        try:
            self.scheduler.add_request(req)
        except (QueueFull, ValueError) as exc:
            self.sessions.pop(req_id, None)
            if isinstance(exc, QueueFull):
                self._reply_failed(req_id, ipc.ErrorCode.QUEUE_FULL, f"the replica is at capacity: {exc}")
            else:  # the prompt is longer than the model or the KV cache can hold
                self._reply_failed(req_id, ipc.ErrorCode.INVALID_FIELD, f"text: {exc}", "text")
            return
        if entry.reply_started:
            self.send(ipc.Started(req_id, req.prompt_len))

    def _on_audio(self, req: Request, pcm: bytes | None, final: bool) -> None:
        """The request sink: audio chunks as binary frames, then one final message."""
        if pcm:
            self.audio.add(req.req_id, req.extra["num_chunks_sent"], pcm)
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
        self._queue_prepared()
        if not self.loop.busy:
            return IDLE_POLL_S
        try:
            wait = self.loop.poll()
        except Exception as exc:  # a scheduling bug: the state of every request is suspect
            log.exception("scheduling failed; failing every request on this replica")
            for req_id in list(self.scheduler.requests):
                self._fail_request(req_id, f"{type(exc).__name__}: {exc}")
            return 0.0
        finally:
            self.flush_audio()
        return IDLE_POLL_S if wait is None else min(wait, IDLE_POLL_S)

    def stats(self) -> ipc.Stats:
        return ipc.Stats(
            self.replica, self.incarnation, num_active=self.scheduler.num_active + len(self.preparing),
            num_waiting=len(self.scheduler.waiting), num_sessions=len(self.sessions), pools=self.pools(),
            num_finished=self.num_finished, num_aborted=self.num_aborted, num_failed=self.num_failed,
            num_steps=self.loop.num_steps, num_running=len(self.scheduler.running),
            stage_times=self.stage_stats.to_wire(),
        )

    def pools(self) -> dict[str, list[int]]:
        """[free, total] of every pool the scheduler holds: KV pages and, for stateful codecs, slots."""
        return {name: list(counts) for name, counts in self.scheduler.pool_usage().items()}


def serve(service: SchedulerService, conn: Connection, parent_pid: int, heartbeat: Heartbeat | None = None) -> None:
    """Drain messages, step, report; until Shutdown or the API process is gone."""
    next_stats, wait = 0.0, 0.0
    while not service.stopping:
        for msg in conn.receive(wait):
            service.handle(msg)
        if heartbeat is not None:
            heartbeat.step_started = time.monotonic()
        wait = service.step()
        if heartbeat is not None:
            heartbeat.step_started = None
        now = time.monotonic()
        if now >= next_stats:
            conn.send(service.stats())
            next_stats = now + STATS_INTERVAL_S
            if os.getppid() != parent_pid:
                log.warning("the API process is gone; exiting")
                return
    service.loop.drain()
    service.flush_audio()  # the drained steps' chunks


def _with_voice(preprocess: Preprocess, voice: VoicePrompt) -> Preprocess:
    return lambda clean: preprocess({**clean, SAVED_VOICE_FIELD: voice})


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

        loop, program = build_loop(config, time_stages=True)
    except Exception as exc:
        log.exception("the replica cannot start")
        conn.send(ipc.Fatal(args.replica, args.incarnation, f"{type(exc).__name__}: {exc}"))
        conn.close(linger_s=2.0)
        return 1
    prompts = PromptPool(threads=1, device=str(program.device), wake=conn.wake)
    service = SchedulerService(loop, program.preprocess, config, conn.send, args.replica, args.incarnation,
                               streamer=program if program.meta.streamed_text_column is not None else None,
                               prompts=prompts, voice_encoder=getattr(program, "encode_voice", None))
    service.warm_prompts()
    conn.send(ipc.Ready(args.replica, args.incarnation, os.getpid(), str(program.device),
                        program.meta.to_dict(), asdict(program.limits)))
    log.info("ready on %s: model %s, %d KV pages", program.device, program.meta.name, program.limits.num_pages - 1)
    heartbeat = Heartbeat(conn, args.replica, args.incarnation)
    serve(service, conn, parent_pid, heartbeat)
    heartbeat.close()
    conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
