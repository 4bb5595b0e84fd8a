"""Where the demo and the chaos harness run the app's functions: in this process (calling the
user functions with real binding objects, lab/host.py), or in the real Azure Functions
Python worker over gRPC (lab/runtime), as Azure runs them. Both raise ``InvocationFailed``
when the runtime would report a failed invocation, which makes the host abandon the message."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from importlib.util import find_spec
from typing import Any, Protocol

import azure.functions as func

from lab.host import user_function
from shared.idempotency.telemetry import extra
from shared.idempotency.testing import servicebus_message

KINDS = ("process", "worker")


class InvocationFailed(Exception):
    """The function raised: the host abandons the message or retries the event."""


class Runtime(Protocol):
    def servicebus(self, function: str, body: bytes, message_id: str | None, delivery_count: int,
                   placed: Placed | None = None) -> None: ...  # fmt: skip

    def cloudevent(self, function: str, event: Mapping[str, Any]) -> None: ...

    def http(self, function: str, path: str, headers: Mapping[str, str], body: bytes) -> tuple[int, dict[str, str]]: ...


@dataclass(frozen=True)
class Placed:
    """Where the broker placed a Service Bus message: its sequence number, enqueued time and
    application properties."""

    sequence: int | None
    enqueued: datetime | None
    properties: Mapping[str, Any] = field(default_factory=dict)


class InProcess:
    def servicebus(self, function: str, body: bytes, message_id: str | None, delivery_count: int,
                   placed: Placed | None = None) -> None:  # fmt: skip
        at = placed or Placed(None, None)
        message = servicebus_message(body, message_id, delivery_count=delivery_count, sequence_number=at.sequence,
                                     enqueued_time=at.enqueued, properties=at.properties)  # fmt: skip
        _call(function, message)

    def cloudevent(self, function: str, event: Mapping[str, Any]) -> None:
        attributes = {k: v for k, v in event.items() if k != "data"}
        _call(function, func.CloudEvent(data=event.get("data"), **attributes))

    def http(self, function: str, path: str, headers: Mapping[str, str], body: bytes) -> tuple[int, dict[str, str]]:
        response = user_function(function)(func.HttpRequest("POST", path, headers=dict(headers), body=body))
        return response.status_code, dict(response.headers)


def _call(function: str, binding: Any) -> None:
    try:
        user_function(function)(binding)
    except Exception as error:
        raise InvocationFailed(str(error)) from error


class InWorker:
    def __init__(self, host: Any) -> None:
        from lab.runtime import triggers

        self.host, self.triggers = host, triggers

    def _invoke(self, function: str, invocation: Any) -> Any:
        response = self.host.invoke(function, invocation)
        failure = self.host.failed(response)
        if failure is not None:
            raise InvocationFailed(failure)
        return response

    def servicebus(self, function: str, body: bytes, message_id: str | None, delivery_count: int,
                   placed: Placed | None = None) -> None:  # fmt: skip
        message = self.triggers.ServiceBusMessage(body, message_id, delivery_count=delivery_count)
        if placed is not None and placed.sequence is not None and placed.enqueued is not None:
            message = replace(message, sequence_number=placed.sequence, enqueued=placed.enqueued,
                              application_properties=dict(placed.properties))  # fmt: skip
        self._invoke(function, self.triggers.servicebus(self.host.trigger(function), message))

    def cloudevent(self, function: str, event: Mapping[str, Any]) -> None:
        self._invoke(function, self.triggers.cloudevent(self.host.trigger(function), event))

    def http(self, function: str, path: str, headers: Mapping[str, str], body: bytes) -> tuple[int, dict[str, str]]:
        request = self.triggers.Http("POST", path, headers, body)
        response = self._invoke(function, self.triggers.http(self.host.trigger(function), request))
        status, response_headers, _ = self.triggers.http_result(self.host.pb, response)
        return status, response_headers


def app_settings() -> dict[str, str]:
    """The documented local settings, overlaid with this process's values for the app's
    settings (the harness points them at its Azurite and tables)."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "local.settings.json.example")
    with open(path) as file:
        documented: dict[str, str] = json.load(file)["Values"]
    prefixes = ("DEDUP_", "COSMOS_", "PAYMENT_", "ORDERS_", "ORDER_", "LEDGER_", "BALANCES_", "BILLING_", "SHIPPING_",
                "ITEMS_")  # fmt: skip
    ours = {k: v for k, v in os.environ.items() if k in documented or k.startswith(prefixes)}
    return {**documented, **ours}


_OUTCOME = re.compile(r"outcome='(\w+)'")


def _relay(entry: Any) -> None:
    """The worker's dedup log lines, back into this process's ``idempotency`` logger, with
    the outcome as structured data (what the harness counts)."""
    if entry.category != "idempotency":
        return
    found = _OUTCOME.search(entry.message)
    from lab.runtime.host import log_level

    logging.getLogger("idempotency").log(
        log_level(entry.level), "%s", entry.message, extra=extra({"outcome": found.group(1) if found else "?"})
    )


@contextmanager
def started(kind: str) -> Iterator[Runtime]:
    """``process`` or ``worker`` (DEMO_RUNTIME / CHAOS_RUNTIME). The worker is started now,
    with the app settings as they are in this process, on the app with the library tests'
    consumers beside it (tests/app.py, where it is), as the in-process host sees them."""
    if kind == "process":
        yield InProcess()
        return
    if kind != "worker":
        raise ValueError(f"runtime must be one of {KINDS}, not {kind!r}")
    from lab.runtime.build import prepare
    from lab.runtime.host import WorkerHost

    with_tests = find_spec("tests") is not None and find_spec("tests.app") is not None

    # the worker's own switch for DEBUG records: everyday outcomes log at DEBUG (telemetry.py); the harness counts them
    settings = {**app_settings(), "PYTHON_ENABLE_DEBUG_LOGGING": "1"}
    with WorkerHost(prepare(with_tests=with_tests), settings, on_log=_relay) as host:
        yield InWorker(host.start_app())
