"""What the HTTP API documents: request fields (per model), response bodies and error bodies.

Request fields are checked by `request_builder` against the model's meta; the table here gives
their JSON types and ranges for form-data parsing and for the OpenAPI document (a test keeps the
ranges equal to what `SamplingParams.validate` accepts).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field

from vox_serve.core.meta import ProgramMeta
from vox_serve.request_builder import BASE64_PATTERN, VISIBLE_PATTERN, field_aliases


@dataclass(frozen=True)
class FieldDoc:
    kind: str  # JSON type: string | number | integer | boolean
    description: str
    bounds: dict[str, float] = field(default_factory=dict)  # JSON-schema range keywords
    schema: dict[str, Any] = field(default_factory=dict)  # other JSON-schema keywords (arrays)


INT64_MAX = 2**63 - 1  # integers travel to the replicas as signed 64-bit (msgpack)
REQUEST_FIELDS: dict[str, FieldDoc] = {
    "text": FieldDoc("string", "Text to speak: required, with a visible character (not only whitespace, "
                     "controls or invisible marks), at most `max_text_chars` characters (GET /info), and short "
                     "enough in tokens for the model's `max_model_len`."),
    "streaming": FieldDoc("boolean", "true (default): a WAV stream whose PCM chunks arrive as they are "
                          "decoded; false: one complete WAV when generation ends."),
    "voice": FieldDoc("string", "Voice name, as GET /info lists the model's voices. Alias: `speaker` (not "
                      "both)."),
    "language": FieldDoc("string", "Language of the text, as GET /info lists the model's languages."),
    "instruct": FieldDoc("string", "A style instruction, for models that take one."),
    "ref_text": FieldDoc("string", "Transcript of the reference audio: with it a voice clone continues the "
                         "reference (in-context cloning); without it only the speaker embedding is used."),
    "x_vector_only_mode": FieldDoc("boolean", "Voice cloning from the reference audio's speaker embedding only, "
                                   "ignoring `ref_text` (default: true when `ref_text` is absent)."),
    "non_streaming_mode": FieldDoc("boolean", "Qwen3-TTS prompt layout, as the reference's: true puts the "
                                   "whole text before the first frame, false feeds it one token per frame "
                                   "(default: false for Base voice cloning, true otherwise; input streaming "
                                   "is always false)."),
    "temperature": FieldDoc("number", "Sampling temperature; 0 is greedy.", {"minimum": 0, "maximum": 10}),
    "top_p": FieldDoc("number", "Nucleus sampling mass.", {"exclusiveMinimum": 0, "maximum": 1}),
    "top_k": FieldDoc("integer", "Sample among the k most likely tokens; 0 disables.",
                      {"minimum": 0, "maximum": INT64_MAX}),
    "min_p": FieldDoc("number", "Drop tokens below min_p times the top probability.",
                      {"minimum": 0, "exclusiveMaximum": 1}),
    "repetition_penalty": FieldDoc("number", "Penalty on recently generated tokens; 1 disables.",
                                   {"exclusiveMinimum": 0, "maximum": 10}),
    "max_tokens": FieldDoc("integer", "Most tokens to generate.", {"minimum": 1, "maximum": INT64_MAX}),
    "seed": FieldDoc("integer", "Seed of this request's sampling; the same seed repeats the same audio.",
                     {"minimum": 0, "maximum": INT64_MAX}),
    "ignore_eos": FieldDoc("boolean", "Keep generating until max_tokens even after a stop token."),
}
AUDIO_FIELD = "audio"
AUDIO_DOC = "Reference audio (WAV, FLAC, OGG or MP3), at most --max-upload-mb MB."


def accepted_fields(meta: ProgramMeta | None) -> list[str]:
    """The request fields a model takes (every documented one while no model is loaded yet)."""
    if meta is None:
        return [*REQUEST_FIELDS, AUDIO_FIELD]
    return list(meta.accepted_fields)


def _property(name: str, meta: ProgramMeta | None, media: str, whole_text: bool) -> dict[str, Any]:
    if name == AUDIO_FIELD:
        if media == "json":
            return {"type": "string", "contentEncoding": "base64", "pattern": BASE64_PATTERN, "minLength": 1,
                    "description": f"{AUDIO_DOC} Base64-encoded."}
        return {"type": "string", "format": "binary", "contentMediaType": "audio/*", "minLength": 1,
                "description": AUDIO_DOC}
    declared = meta.field_schemas.get(name) if meta is not None else None
    if declared is not None:
        return _declared_property(name, declared, meta, media)
    doc = REQUEST_FIELDS.get(name, FieldDoc("string", "A field of this model."))
    prop: dict[str, Any] = {"type": doc.kind, "description": doc.description, **doc.bounds, **doc.schema}
    if name == "text":
        prop["minLength"] = 1
        if whole_text:  # a session's first piece may be only spaces: its whole text is checked at its end
            prop["pattern"] = VISIBLE_PATTERN
        if meta is not None:
            prop["maxLength"] = meta.max_text_chars
    choices = {"voice": meta.voices, "language": meta.languages} if meta is not None else {}
    if choices.get(name):
        prop["enum"] = list(choices[name])
    if name == "streaming":
        prop["default"] = True
        if not whole_text:  # an input-streaming session always streams
            prop["enum"] = [True]
    elif name == "non_streaming_mode" and not whole_text:  # ... and feeds its text as it arrives
        prop["enum"] = [False]
    elif meta is not None and name in meta.default_sampling:
        prop["default"] = meta.default_sampling[name]
    return prop


def _declared_property(name: str, schema: dict[str, Any], meta: ProgramMeta, media: str) -> dict[str, Any]:
    """A field the model declares: its own schema; in a form an array or object is a JSON text."""
    prop = dict(schema)
    if name in meta.default_sampling:
        prop["default"] = meta.default_sampling[name]
    if media != "json" and prop["type"] in ("array", "object"):
        return {"type": "string", "contentMediaType": "application/json", "contentSchema": prop,
                "description": f"{prop.get('description', '')} In a form: the value as JSON text.".strip()}
    return prop


def request_schema(meta: ProgramMeta | None, media: str, text_required: bool = True) -> dict[str, Any]:
    """JSON schema of a generate request body sent as `media`: json, multipart or urlencoded
    (which cannot carry a file)."""
    names = [n for n in accepted_fields(meta) if n != AUDIO_FIELD or media != "urlencoded"]
    props = {name: _property(name, meta, media, whole_text=text_required) for name in names}
    aliases = field_aliases(meta)
    for alias, target in aliases.items():
        if target in props:
            props[alias] = {**props[target], "description": f"Alias of `{target}`."}
    schema: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    clones = meta is not None and "reference_audio_seconds" in meta.extra
    required = (["text"] if text_required else []) + ([AUDIO_FIELD] if clones and media != "urlencoded" else [])
    if required:
        schema["required"] = required
    rules = [{"not": {"required": [alias, target]}} for alias, target in aliases.items() if target in props]
    if clones:
        rules.append(IN_CONTEXT_NEEDS_TRANSCRIPT)
    if rules:
        schema["allOf"] = rules
    return schema


# What the server refuses across fields, as JSON schema: an alias beside its field (`field_aliases`), and
# in-context cloning (x_vector_only_mode false) without a transcript.
IN_CONTEXT_NEEDS_TRANSCRIPT: dict[str, Any] = {"anyOf": [  # the second holds when the mode is absent or true
    {"required": ["ref_text"], "properties": {"ref_text": {"minLength": 1}}},
    {"properties": {"x_vector_only_mode": {"const": True}}},
]}


# ---- response bodies ------------------------------------------------------------------------
class ErrorDetail(BaseModel):
    type: str = Field(description="invalid_field, invalid_request, unsupported, queue_full, unavailable, "
                                  "replica_died, timeout, internal, ...")
    field: str | None = Field(description="The request field at fault, when there is one.")
    message: str = Field(description="What is wrong, naming the field.")


class ErrorResponse(BaseModel):
    error: ErrorDetail


class PoolUsage(BaseModel):
    free: int
    total: int


class ReplicaStatus(BaseModel):
    replica: int
    state: Literal["starting", "ready", "restarting", "stopped"]
    reason: str | None = Field(description="Why the replica is not ready (also while a ready one has not "
                                           "reported for a second: frozen, or stuck in a long step).")
    seconds_since_heartbeat: float | None = Field(description="Since the replica last reported (every 0.2 s).")
    pid: int | None
    device: str | None
    restarts: int = Field(description="Times the replica's process was restarted after it died.")
    in_flight: int = Field(description="Requests of this server on the replica.")
    active_requests: int | None = Field(description="Requests the scheduler holds (last report).")
    waiting_requests: int | None
    pools: dict[str, PoolUsage] = Field(description="KV pages and request slots: free and total.")
    finished: int | None
    aborted: int | None
    failed: int | None


class SessionStatus(BaseModel):
    open: int = Field(description="Input-streaming sessions the server holds (started, audio not yet read).")
    max_per_replica: int = Field(description="--max-sessions: sessions per replica before /start answers 503.")
    idle_timeout_s: float = Field(description="--session-idle-timeout-s: a session without new text (or, "
                                              "ended, without its reader) this long ends.")


class HealthResponse(BaseModel):
    status: Literal["ok", "unavailable"]
    reason: str | None = Field(description="Why the server is unavailable.")
    server_pid: int = Field(description="The API server's process id: a start-up script can tell that the "
                                        "server answering is the one it started.")
    replicas: list[ReplicaStatus]
    sessions: SessionStatus


class Limits(BaseModel):
    max_text_chars: int
    max_model_len: int = Field(description="Longest prompt + generation, in tokens.")
    max_upload_mb: float
    request_timeout_s: float
    max_queued_requests: int = Field(description="Waiting requests per replica before 503.")
    max_batch_size: int
    dp_size: int
    max_sessions: int = Field(description="Input-streaming sessions per replica.")
    session_idle_timeout_s: float


class InfoResponse(BaseModel):
    model: str
    sample_rate: int
    channels: int = 1
    sample_format: str = Field("pcm_s16le", description="PCM format inside the WAV.")
    samples_per_chunk: int = Field(description="Samples of a full streamed audio chunk.")
    voices: list[str]
    default_voice: str | None
    languages: list[str]
    accepted_fields: list[str]
    aliases: dict[str, str]
    field_schemas: dict[str, Any] = Field(description="JSON schemas of the fields this model defines itself "
                                                     "(CSM: `speaker`, `context`, depth-decoder sampling).")
    default_sampling: dict[str, Any]
    supports_input_streaming: bool
    supports_reference_audio: bool
    limits: Limits


class StreamStartResponse(BaseModel):
    id: str = Field(description="The session id for the /generate/stream/{id}/... routes.")
    sample_rate: int


class StreamTextResponse(BaseModel):
    id: str
    num_chars: int = Field(description="Characters of text received so far.")


RETRY_AFTER_HEADER = {"Retry-After": {"description": "Seconds to wait before retrying.",
                                      "schema": {"type": "integer"}}}
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": text, **({"headers": RETRY_AFTER_HEADER} if status == 503 else {})}
    for status, text in {
        400: "Malformed body, or a feature the model does not have.",
        401: "Missing or wrong API key (`Authorization: Bearer KEY`, servers started with --api-key).",
        408: "The body did not arrive within --body-timeout-s.",
        404: "No such input-streaming session.",
        409: "The session is not in a state for this call.",
        413: "Upload larger than --max-upload-mb.",
        415: "Unsupported content type.",
        422: "A field the model cannot take, named in `error.field`.",
        500: "The request failed inside the server.",
        503: "Overloaded (past --max-queued-requests or --max-sessions) or no replica ready; see Retry-After.",
        504: "The request ran past --request-timeout-s.",
    }.items()
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: ERROR_RESPONSES[status] for status in statuses}


def error_responses_doc(status: int) -> dict[str, Any]:
    """The OpenAPI response object of an error status (for responses added after FastAPI built the document)."""
    return {"description": ERROR_RESPONSES[status]["description"], "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}}
