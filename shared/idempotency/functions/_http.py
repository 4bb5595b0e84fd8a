"""HTTP with ``Idempotency-Key``: ``on_http``, the stored response replayed (``stored_response``),
and the answers every HTTP face shares (RFC 9457 problems, 503 with Retry-After)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any
from urllib.parse import quote

import azure.functions as func

from ..consumer import Handler, IdempotentConsumer
from ..errors import StoreUnavailable
from ..keys import joined_identity
from ..messages import Declined, Delivery, Effects, Outcome, Result
from ..reasons import PUBLIC, Reason
from ..steps import Context
from ._settle import Consumer

REPLAYED = "Idempotent-Replayed"


RETRY_AFTER_SECONDS = "5"


MAX_REQUEST_BYTES = 256 * 1024  # as a Service Bus Standard message: larger bodies get 413 before parsing


MAX_IDEMPOTENCY_KEY = 255  # characters
# How long a request waits inside the call for a transient failure to clear: its caller is
# told Retry-After and retries by itself.
HTTP_WAIT = timedelta(seconds=2)


def on_http(consumer: Consumer, req: func.HttpRequest) -> func.HttpResponse:
    """A JSON POST with ``Idempotency-Key``: refused (413, 400, 415) before parsing when it
    must be, 503 when a cold instance cannot reach its store, else the stored response."""
    delivery = too_large(req) or http_delivery(req)
    if isinstance(delivery, func.HttpResponse):
        return delivery
    found = ready(consumer)
    return found if isinstance(found, func.HttpResponse) else http_response(found.process(delivery))


def http_delivery(req: func.HttpRequest) -> Delivery | func.HttpResponse:
    """A JSON request with its Idempotency-Key, or the problem response that refuses it.
    The consumer keys it by the business key in the body (one order per orderId, whatever
    the Idempotency-Key); the caller is its origin, so a caller's retry under a new key
    replays its own response, and nobody else's request matches it."""
    key = req.headers.get("Idempotency-Key")
    if not key:
        return problem(400, "Idempotency-Key header required", "send a unique key per logical request")
    if len(key) > MAX_IDEMPOTENCY_KEY:
        return problem(400, "Idempotency-Key too long", f"at most {MAX_IDEMPOTENCY_KEY} characters")
    if not req.headers.get("Content-Type", "").startswith("application/json"):
        return problem(415, "Unsupported media type", "send Content-Type: application/json")
    caller, traceparent = caller_identity(req), req.headers.get("traceparent")
    return Delivery(body=req.get_body(), message_id=joined_identity(caller, key), correlation_id=traceparent,
                    traceparent=traceparent, origin=caller, wait=HTTP_WAIT)  # fmt: skip


def caller_identity(req: func.HttpRequest) -> str:
    """Who is calling, so that one client never sees another's stored responses.
    The Easy Auth principal (trusted only when Easy Auth is on: the platform then strips
    any such header sent by a client), else the function key used (hashed, never
    stored), else ``anonymous`` — only possible with auth level ANONYMOUS or locally."""
    principal: str | None = req.headers.get("x-ms-client-principal-id")
    if principal and os.environ.get("WEBSITE_AUTH_ENABLED", "").lower() == "true":
        return "principal:" + principal
    key = req.headers.get("x-functions-key") or req.params.get("code")
    if key:
        return "key:" + hashlib.sha256(key.encode()).hexdigest()[:32]
    return "anonymous"


def too_large(req: func.HttpRequest) -> func.HttpResponse | None:
    """413 before anything parses the body."""
    declared = req.headers.get("Content-Length", "")
    size = int(declared) if declared.isdigit() else len(req.get_body())
    if size > MAX_REQUEST_BYTES:
        return problem(413, "Request too large", f"bodies are limited to {MAX_REQUEST_BYTES} bytes")
    return None


def stored_response(handler: Handler, status: int, location: str) -> Handler:
    """Store the HTTP response (status, body, headers) as the result, so a repeat
    replays exactly what the first request answered. ``location``: a format string
    applied to the handler's result, each value percent-encoded (a header holds ASCII
    without line breaks, whatever the ids hold)."""

    def handle(payload: Any, context: Context) -> Effects:
        effects = handler(payload, context)
        assert isinstance(effects, Effects), "an HTTP response is stored with a marker"
        if effects.declined is not None:  # the decline is stored, and answered as a problem (``declined``)
            return effects
        safe = {name: quote(str(value), safe="") for name, value in effects.result.items()}
        headers = {"Location": location.format(**safe)}
        return replace(effects, result={"status": status, "body": effects.result, "headers": headers})

    return handle


def http_response(result: Result) -> func.HttpResponse:
    if result.declined:
        return declined(result)
    if result.outcome in (Outcome.PROCESSED, Outcome.DUPLICATE) and isinstance(result.response, dict):
        headers = dict(result.response.get("headers") or {})
        if result.outcome is Outcome.DUPLICATE:
            headers[REPLAYED] = "true"
        return func.HttpResponse(json.dumps(result.response["body"]), status_code=int(result.response["status"]),
                                 headers=headers, mimetype="application/json")  # fmt: skip
    if result.outcome is Outcome.DUPLICATE:  # processed long ago: its stored response has expired
        return problem(409, "Already processed", "this request was processed; its stored response has expired")
    return refusal(result)


def declined(result: Result) -> func.HttpResponse:
    """409 with the handler's reason and detail (``Effects.declined``): the request conflicts with
    what is stored; its copies get the same answer, replayed."""
    decline = Declined.of(result.response)
    return problem(409, f"Declined: {decline.reason}", decline.detail, replayed=result.outcome is Outcome.DUPLICATE,
                   reason=decline.reason)  # fmt: skip


# A key the caller reused with another body (the consumer's ``_reused``): an earlier request's.
CALLER_CONFLICTS = frozenset({Reason.FINGERPRINT_MISMATCH, Reason.KEY_PARTITION_MISMATCH, Reason.VERSION_CONFLICT})


def refusal(result: Result) -> func.HttpResponse:
    caller = result.outcome is Outcome.INVALID and result.reason in CALLER_CONFLICTS
    if result.outcome is Outcome.CONFLICT or caller:
        return problem(409, "Conflict with an earlier request",
                       "this business key was already used by another request or another caller")  # fmt: skip
    if result.outcome is Outcome.IN_FLIGHT:
        return problem(409, "A request with this key is in progress", "retry later", retry_after=True)
    if (
        result.outcome is Outcome.INVALID and result.reason == Reason.IDEMPOTENCY_KEY_REUSED
    ):  # IETF Idempotency-Key draft
        return problem(422, "Idempotency-Key reused", "this Idempotency-Key was already sent with another payload")
    if result.outcome is Outcome.INVALID:
        detail = (result.detail or "")[:500] if result.reason in PUBLIC else "the request was refused"
        return problem(400, f"Invalid request: {result.reason}", detail)
    return unavailable()


def ready(consumer: Callable[[], IdempotentConsumer]) -> IdempotentConsumer | func.HttpResponse:
    """A cold instance whose store is unreachable answers as a warm one does: 503 + Retry-After."""
    try:
        return consumer()
    except StoreUnavailable:
        return unavailable()


def unavailable() -> func.HttpResponse:
    return problem(503, "Temporarily unavailable", "retry later", retry_after=True)


def problem(status: int, title: str, detail: str, *, retry_after: bool = False, replayed: bool = False,
            reason: str | None = None) -> func.HttpResponse:  # fmt: skip
    """RFC 9457 problem details (``reason``: an extension member, a declined request's code)."""
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail}
    if reason is not None:
        body["reason"] = reason
    headers = {"Retry-After": RETRY_AFTER_SECONDS} if retry_after else {}
    if replayed:
        headers[REPLAYED] = "true"
    return func.HttpResponse(json.dumps(body), status_code=status, headers=headers,
                             mimetype="application/problem+json")  # fmt: skip
