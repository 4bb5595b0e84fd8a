"""Call the real function app the way the Functions host does, without the host: find
functions through ``app.get_functions()`` and invoke them with real binding objects."""

from __future__ import annotations

import functools
import importlib
import json
import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from importlib.util import find_spec
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, cast

import azure.functions as func
from azure.functions import meta
from azure.functions._abc import RetryContext, RpcException, TraceContext
from azure.functions.blob import BlobConverter
from azure.functions.eventhub import EventHubTriggerConverter
from azure.functions.queue import QueueMessageInConverter
from azure.functions.timer import TimerRequestConverter

import consumers
import function_app
from lab.runtime import triggers
from shared.idempotency.functions import housekeeping
from shared.idempotency.functions._housekeeping import NEEDS


def others() -> list[ModuleType]:
    """The modules whose functions tests call beside the app's: every recipe not switched on
    and the library tests' own consumers (tests/app.py), where they are (an app without the
    example has neither recipes/ nor, perhaps, tests)."""
    found = []
    if find_spec("recipes") is not None:
        found += importlib.import_module("recipes").every()
    if find_spec("tests") is not None and find_spec("tests.app") is not None:
        found.append(importlib.import_module("tests.app"))
    switched_on = set(consumers.modules())
    return [module for module in found if module not in switched_on]


_indexing = threading.Lock()


def indexed() -> tuple[Any, ...]:
    """The app's functions as the worker's indexing sees them, with those of ``others()`` and
    every housekeeping timer (an app with all of them, for their tests). get_functions()
    validates the app and may only be called once per app object: the first callers of
    several threads (the harness's competing workers) wait for one indexing."""
    with _indexing:
        return _indexed()


@functools.cache
def _indexed() -> tuple[Any, ...]:
    everything = func.FunctionApp()
    consumed = [*consumers.blueprints(), *(m.bp for m in others())]
    for blueprint in [*consumed, *housekeeping(NEEDS, watched=consumed)]:
        everything.register_functions(blueprint)
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # it warns that auth levels apply to HTTP functions only
    try:
        function_app.app.get_functions()  # the app itself must index
        try:
            return tuple(everything.get_functions())
        except ValueError as clash:  # "Function items does not have a unique function name"
            beside = ", ".join(m.__name__ for m in others())
            raise ValueError(f"{clash}: a function of consumers/ has the name of one in {beside}: rename it") from None
    finally:
        root.setLevel(level)


@functools.cache
def _functions() -> dict[str, Callable[..., Any]]:
    return {str(fn.get_function_name()): fn.get_user_function() for fn in indexed()}


def user_function(name: str) -> Callable[..., Any]:
    try:
        return _functions()[name]
    except KeyError:
        raise LookupError(f"function_app has no function named {name!r}") from None


# -- the binding objects, as the Python library decodes what the host sends each trigger ----------
# A body given as a dict is sent as its JSON. Each trigger but Service Bus and Event Grid is built
# as the host sends it to the worker (lab/runtime/triggers.py, the shapes the real-worker tests
# send the real worker), then decoded by azure.functions' own converter for that binding.


def _raw(body: bytes | dict[str, Any]) -> bytes:
    return json.dumps(body).encode() if isinstance(body, dict) else body


def _dotnet(value: Any) -> Any:
    if isinstance(value, triggers.DotNetDate):
        return value.json()
    raise TypeError(f"no .NET shape for {value!r}")


def _datum(value: Any) -> meta.Datum:
    """A value of the host's as the worker hands it to azure.functions: the host's ToRpc
    (triggers.typed), then the worker's Datum.from_typed_data (a collection keeps its protobuf
    message, whose field the converters read)."""
    if isinstance(value, bytes):
        return meta.Datum(value, "bytes")
    if isinstance(value, str):
        return meta.Datum(value, "string")
    if isinstance(value, triggers.ByteArrays):
        return meta.Datum(SimpleNamespace(bytes=list(value)), "collection_bytes")
    if isinstance(value, triggers.Strings):
        return meta.Datum(SimpleNamespace(string=[s for s in value if s]), "collection_string")
    if isinstance(value, triggers.Longs):
        return meta.Datum(SimpleNamespace(sint64=list(value)), "collection_sint64")
    return meta.Datum(json.dumps(value, separators=(",", ":"), default=_dotnet), "json")


def _decoded(decode: Callable[..., Any], invocation: triggers.Invocation) -> Any:
    """The trigger's argument: ``decode`` (its binding's converter's) of the host's value and metadata."""
    [value] = invocation.inputs.values()
    return decode(_datum(value), trigger_metadata={name: _datum(found) for name, found in invocation.metadata.items()})


def cloudevent(data: dict[str, Any], *, source: str, event_id: str, event_type: str,
               subject: str | None = None) -> func.CloudEvent:  # fmt: skip
    """An Event Grid CloudEvent as the trigger passes it. The consumer's payload (what its
    schema validates, its key source reads, its handler gets) is the envelope
    ``{"type", "subject", "data"}``; its key is (source, id)."""
    return func.CloudEvent(id=event_id, source=source, type=event_type, specversion="1.0", data=data,
                           subject=subject)  # fmt: skip


def storage_queue_message(body: bytes | dict[str, Any], *, message_id: str | None = None, dequeue_count: int = 1,
                          inserted: datetime | None = None) -> func.QueueMessage:  # fmt: skip
    """A Storage queue message as the host passes a queue-triggered function one: the body
    (the host sends it as text: UTF-8), the service's id (a new one unless given: a producer's
    retry enqueues a new message), the dequeue count (1 at the first delivery, one more at each
    dequeue), a pop receipt and the message's times (inserted now, unless ``inserted``)."""
    if dequeue_count < 1:
        raise ValueError(f"a dequeued message's dequeue count is at least 1, not {dequeue_count}")
    own = str(uuid.uuid4()) if message_id is None else message_id
    message = triggers.StorageQueueMessage(_raw(body), dequeue_count, own)
    invocation = triggers.storage_queue({"name": "msg"}, replace(message, inserted=inserted or message.inserted))
    return cast(func.QueueMessage, _decoded(QueueMessageInConverter.decode, invocation))


ENQUEUED = datetime(2026, 1, 1, tzinfo=UTC)  # when eventhub_batch's event 0 was enqueued, unless told


def eventhub_batch(*bodies: bytes | dict[str, Any], hub: str = "events", partition_id: str = "0",
                   first_sequence_number: int = 1, message_ids: Sequence[str | None] | None = None,
                   enqueued_time: datetime | None = None) -> list[func.EventHubEvent]:  # fmt: skip
    """An Event Hubs batch (``cardinality="many"``, ``data_type=BODY_AS_BYTES``) as the host
    passes it: one metadata shared by the events — the partition's context, each event's
    properties (a ``message_id`` property: the producer's id, where ``message_ids`` gives one)
    and system properties — and consecutive sequence numbers from ``first_sequence_number``.
    Each event's enqueued time follows from its sequence number (a second apart from
    ``ENQUEUED``) unless ``enqueued_time`` gives the first's (a re-created hub: the same
    sequence numbers, later times): an event without a producer's id is keyed
    ``<hub>/<partition>/<sequence number>@<enqueued time>Z``, so the same call again, or a
    batch that overlaps it, is the events replayed from a checkpoint."""
    owns = [None] * len(bodies) if message_ids is None else list(message_ids)
    if len(owns) != len(bodies):
        raise ValueError(f"{len(bodies)} events but {len(owns)} message ids")
    first = ENQUEUED + timedelta(seconds=first_sequence_number) if enqueued_time is None else enqueued_time
    first = first if first.tzinfo else first.replace(tzinfo=UTC)
    events = [triggers.HubEvent(_raw(body), first_sequence_number + n, {"message_id": own} if own else {},
                                enqueued=first + timedelta(seconds=n))
              for n, (body, own) in enumerate(zip(bodies, owns, strict=True))]  # fmt: skip
    batch = triggers.eventhub_batch({"name": "events"}, events, hub=hub, partition=partition_id)
    return cast(list[func.EventHubEvent], _decoded(EventHubTriggerConverter.decode, batch))


class _NoException(RpcException):
    """A retry context's exception before any try failed: the worker's is empty too."""

    source = stack_trace = message = ""


class _RetryContext(RetryContext):
    def __init__(self, retry_count: int, max_retry_count: int) -> None:
        self._count, self._most = retry_count, max_retry_count

    @property
    def retry_count(self) -> int:
        return self._count

    @property
    def max_retry_count(self) -> int:
        return self._most

    @property
    def exception(self) -> RpcException:
        return _NoException()


class _TraceContext(TraceContext):
    def __init__(self) -> None:
        self._parent = f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"

    @property
    def trace_state(self) -> str:
        return ""

    @property
    def trace_parent(self) -> str:
        return self._parent

    @property
    def attributes(self) -> dict[str, str]:
        return {}


class _Context(func.Context):
    def __init__(self, retry: RetryContext) -> None:
        self._invocation, self._retry, self._trace = str(uuid.uuid4()), retry, _TraceContext()
        self._local = threading.local()

    @property
    def invocation_id(self) -> str:
        return self._invocation

    @property
    def thread_local_storage(self) -> type[threading.local]:
        return cast(type[threading.local], self._local)  # the worker's is an instance too

    @property
    def function_name(self) -> str:
        return ""

    @property
    def function_directory(self) -> str:
        return str(Path(function_app.__file__).parent)

    @property
    def trace_context(self) -> TraceContext:
        return self._trace

    @property
    def retry_context(self) -> RetryContext:
        return self._retry


def retry_context(retry_count: int = 0, max_retry_count: int = 5) -> func.Context:
    """The invocation context of a function with a retry policy (an Event Hubs batch, a timer),
    at its ``retry_count``-th retry of ``max_retry_count`` (-1: without end): while retries are
    left, what fails raises (the host runs the function again); on the last try it is parked."""
    return _Context(_RetryContext(retry_count, max_retry_count))


def blob_stream(name: str, content: bytes, *, last_modified: datetime | None = None) -> func.InputStream:
    """A blob as the host passes a blob-triggered function one: ``name`` is
    ``<container>/<blob>``, its properties those the host sends (``LastModified``, which
    orders the uploads an import follows: now unless given, a time without a zone being UTC;
    in whole seconds, as Storage keeps it — two uploads within a second share one)."""
    container, _, blob = name.partition("/")
    if not container or not blob:
        raise ValueError(f"a blob trigger's name is <container>/<blob>, not {name!r}")
    modified = last_modified or datetime.now(UTC)
    modified = (modified if modified.tzinfo else modified.replace(tzinfo=UTC)).replace(microsecond=0)
    found = triggers.Blob(container, blob, content, modified=modified)
    return cast(func.InputStream, _decoded(BlobConverter.decode, triggers.blob({"name": "blob"}, found)))


def timer_request(*, past_due: bool = False) -> func.TimerRequest:
    """A timer trigger's argument as the host passes it (with a schedule monitor's status:
    ``use_monitor=True``); ``past_due``: the occurrence was missed (the app was down) and runs late."""
    invocation = triggers.timer({"name": "timer", "useMonitor": True}, past_due=past_due)
    return cast(func.TimerRequest, _decoded(TimerRequestConverter.decode, invocation))
