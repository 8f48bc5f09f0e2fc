"""Schemathesis hooks for vox-serve (loaded with SCHEMATHESIS_HOOKS=hooks): the positive-data check,
with the two refusals that depend on a value's content rather than its form.

schemathesis' own `positive_data_acceptance` fails any 4xx to data the schema allows. Two 422s are
right for such data, and no JSON schema can state what they depend on: reference `audio` that is
not decodable audio (random bytes are valid base64 and valid binary; CSM's context clips
`context[i].audio` alike), and a `text` that is within `maxLength` characters but more tokens than the
model's `max_model_len` (for CSM also its `context`: turns and their audio frames are prompt positions).
In a form, CSM's `context` is JSON text (`contentSchema`, which schemathesis does not apply): a form's
refusal of any part of it is a refusal of content too. This check accepts exactly those (naming their
field, with their message) and fails every other 4xx, as the built-in does.
"""

from __future__ import annotations

import re

import schemathesis

CONTENT_REFUSALS = {
    "audio": ("is not decodable audio", "holds no audio", "s long", "longer than", "channels at"),
    "text": ("exceeds max_model_len", "does not fit in the KV cache", "too short for this model",
             "the model takes fewer than"),
    "context": ("the model takes fewer than", "does not fit in the KV cache"),
}
CONTEXT_CLIP = re.compile(r"context\[\d+\]\.audio")
FORM_JSON_FIELD = re.compile(r"context([\[.].*)?")
CREDENTIAL_OR_STATE = {401, 403, 404, 409, 429}


@schemathesis.check
def positive_data_accepted(ctx, response, case):  # noqa: ANN001, ANN201 - schemathesis' check signature
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or not 400 <= response.status_code < 500:
        return None
    if response.status_code in CREDENTIAL_OR_STATE:
        return None
    error = response.json().get("error", {}) if "json" in response.headers.get("content-type", [""])[0] else {}
    field = error.get("field") or ""
    form = "form" in (case.media_type or "")
    if response.status_code == 422 and form and FORM_JSON_FIELD.fullmatch(field):
        return None
    reasons = CONTENT_REFUSALS.get("audio" if CONTEXT_CLIP.fullmatch(field) else field, ())
    if response.status_code == 422 and any(r in error.get("message", "") for r in reasons):
        return None
    raise AssertionError(f"valid data was refused with {response.status_code}: {response.text[:300]}")
