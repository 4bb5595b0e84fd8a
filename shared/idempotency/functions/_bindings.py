"""What a test hands the app's functions, as the host does: ``servicebus_message``, ``cloudevent``,
``queue_message`` and ``http_request`` (the binding objects a Service Bus, an Event Grid, a Storage
queue and an HTTP trigger pass); and
``app_function``, a function of the app found by its object or its name, with its trigger's type
(the proof kit, testing/proof.py)."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, cast
from urllib.parse import parse_qsl, urlsplit

from azure.functions import CloudEvent, HttpRequest, meta
from azure.functions.decorators.function_app import FunctionBuilder
from azure.functions.http import HttpRequestConverter
from azure.functions.queue import QueueMessage
from azure.functions.servicebus import ServiceBusMessage

from ._app import declaring


def app_function(function: Any) -> tuple[Callable[[Any], Any], str]:
    """The function to call and its trigger's type (with `` (batch)`` or `` (sessions)``): a
    function object as its module declares it
    (``@bp.function_name(...)``), or its name, found in the modules of ``consumers`` (the app's)
    and every module already imported."""
    if isinstance(function, str):
        with contextlib.suppress(ImportError):  # an app without a consumers package: what is imported
            declaring("consumers")
        found = [value for module in list(sys.modules.values()) for value in vars(module).values()
                 if _is_function(value) and value._function.get_function_name() == function]  # fmt: skip
        if not found:
            raise LookupError(f"no function of the app is named {function!r}")
        function = found[0]
    if not _is_function(function):
        raise TypeError(f"{function!r} is not a function of the app (a @bp.function_name(...) decorated function)")
    trigger = function._function.get_trigger()
    if getattr(trigger, "is_sessions_enabled", False):
        return function, f"{trigger.get_binding_name()} (sessions)"
    if str(getattr(trigger, "cardinality", None) or "one").lower() == "many":
        return function, f"{trigger.get_binding_name()} (batch)"
    return function, str(trigger.get_binding_name())


def _is_function(value: Any) -> bool:
    return isinstance(value, FunctionBuilder)


def servicebus_message(body: bytes | dict[str, Any], message_id: str | None, *, delivery_count: int = 1,
                       correlation_id: str | None = None, sequence_number: int | None = None,
                       enqueued_time: datetime | None = None,
                       properties: Mapping[str, Any] | None = None) -> Any:  # fmt: skip
    """A Service Bus message as the trigger passes it (``data_type=BODY_AS_BYTES``): a body given as
    a dict is sent as its JSON."""
    return ServiceBusMessage(
        body=body if isinstance(body, bytes) else json.dumps(body).encode(),
        message_id=message_id,  # type: ignore[arg-type]  # the host passes None when the producer set none
        correlation_id=correlation_id,
        delivery_count=delivery_count,
        content_type="application/json",
        application_properties=dict(properties or {}),
        user_properties=dict(properties or {}),
        sequence_number=sequence_number,
        enqueued_time_utc=enqueued_time,
    )


def cloudevent(data: Any, event_id: str, attributes: Mapping[str, str] | None = None) -> Any:
    """An Event Grid CloudEvent as the trigger passes it: ``attributes`` its ``source`` (default
    ``/proof``), ``type`` (``proof.event``) and ``subject``. Its consumer's key is (source, id), its
    payload the envelope ``{"type", "subject", "data"}``."""
    given = dict(attributes or {})
    return CloudEvent(id=event_id, source=given.get("source", "/proof"), type=given.get("type", "proof.event"),
                      specversion="1.0", data=data, subject=given.get("subject"))  # fmt: skip


def queue_message(body: bytes | dict[str, Any], message_id: str, *, dequeue_count: int = 1,
                  insertion_time: datetime | None = None) -> Any:  # fmt: skip
    """A Storage queue message as the trigger passes it: ``message_id`` is the service's own (a
    producer's retry is another message, with another id); a body given as a dict is sent as its JSON."""
    return QueueMessage(id=message_id, body=body if isinstance(body, bytes) else json.dumps(body).encode(),  # type: ignore[no-untyped-call]
                        dequeue_count=dequeue_count, insertion_time=insertion_time)  # fmt: skip


def http_request(body: bytes | dict[str, Any], *, idempotency_key: str | None = None, method: str = "POST",
                 url: str = "/api/requests", headers: dict[str, str] | None = None,
                 route_params: dict[str, str] | None = None) -> HttpRequest:  # fmt: skip
    """An HTTP request as the host passes an HTTP-triggered function one: a JSON body
    (``Content-Type: application/json``, its ``Content-Length``) with ``Idempotency-Key`` when
    given; ``headers`` over those (whatever their case: another Content-Type, ``x-functions-key``
    for the caller's function key); the query string of ``url`` as its params (``?code=`` is a
    function key too; empty values dropped, as the host does). The host sends header names in
    lower case and the URL absolute (a path is on ``https://localhost``)."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    sent = {"Content-Type": "application/json", **({"Content-Length": str(len(raw))} if raw else {})}
    if idempotency_key is not None:
        sent["Idempotency-Key"] = idempotency_key
    given = {name.lower() for name in headers or {}}
    sent = {**{name: value for name, value in sent.items() if name.lower() not in given}, **(headers or {})}
    parts = urlsplit(url)
    absolute = url if parts.scheme else "https://localhost" + (url if url.startswith("/") else "/" + url)
    value = {
        "method": meta.Datum(method, "string"),
        "url": meta.Datum(absolute, "string"),
        "headers": {name.lower(): meta.Datum(text, "string") for name, text in sent.items()},
        "query": {name: meta.Datum(text, "string") for name, text in parse_qsl(parts.query)},
        "params": {name: meta.Datum(text, "string") for name, text in (route_params or {}).items()},
        "body": meta.Datum(raw, "bytes"),  # the worker's for no body, too
    }
    return cast(HttpRequest, HttpRequestConverter.decode(meta.Datum(value, "http"), trigger_metadata={}))
