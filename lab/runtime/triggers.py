"""InvocationRequest inputs and trigger metadata shaped as the Functions host v4 and its
extensions send them to an out-of-process worker. Each shape names the source it follows
(repository and path); "host" is Azure/azure-functions-host, "sb" is azure-sdk-for-net
sdk/servicebus/Microsoft.Azure.WebJobs.Extensions.ServiceBus (extension v5), "eg" is
azure-sdk-for-net sdk/eventgrid/Microsoft.Azure.WebJobs.Extensions.EventGrid (v3), "sdk" is
Azure/azure-webjobs-sdk and "ext" is Azure/azure-webjobs-sdk-extensions.

Values are built as the .NET values the host holds, then converted by ``typed()``, which
follows the host's ``ToRpc`` (host src/WebJobs.Script.Grpc/MessageExtensions/
GrpcMessageConversionExtensions.cs): byte[] → bytes, string → string, string[] →
collection_string (empty entries dropped), byte[][] → collection_bytes, long[] →
collection_sint64, anything else (int, DateTime, dictionaries, int[]) → compact JSON.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode


class Strings(list[str]):
    """A .NET string[]."""


class ByteArrays(list[bytes]):
    """A .NET byte[][]."""


class Longs(list[int]):
    """A .NET long[]."""


@dataclass(frozen=True)
class DotNetDate:
    """A DateTime (``offset=False``, Kind Unspecified) or DateTimeOffset, as Newtonsoft writes it."""

    value: datetime
    offset: bool = False

    def json(self) -> str:
        text = self.value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f").rstrip("0").rstrip(".")
        return text + ("+00:00" if self.offset else "")


@dataclass(frozen=True)
class Http:
    """What the host's ToRpcHttp reads from the ASP.NET request."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes = b""
    query: Mapping[str, str] = field(default_factory=dict)
    params: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Invocation:
    inputs: dict[str, Any]
    metadata: dict[str, Any]


class HostBindingError(Exception):
    """The host fails to bind the trigger: the function is never invoked."""


def typed(pb: Any, value: Any) -> Any:
    """host GrpcMessageConversionExtensions.ToRpc (and ToRpcDefault for everything else)."""
    if isinstance(value, Http):
        return pb.TypedData(http=_rpc_http(pb, value))
    if isinstance(value, bytes):
        return pb.TypedData(bytes=value)
    if isinstance(value, str):
        return pb.TypedData(string=value)
    if isinstance(value, ByteArrays):  # ToRpcByteArray
        return pb.TypedData(collection_bytes=pb.CollectionBytes(bytes=list(value)))
    if isinstance(value, Strings):  # ToRpcStringArray: without IncludeEmptyEntriesInMessagePayload, drops ""
        return pb.TypedData(collection_string=pb.CollectionString(string=[s for s in value if s]))
    if isinstance(value, Longs):  # ToRpcLongArray
        return pb.TypedData(collection_sint64=pb.CollectionSInt64(sint64=list(value)))
    return pb.TypedData(json=json.dumps(value, separators=(",", ":"), default=_dotnet_json))


def _dotnet_json(value: Any) -> Any:
    if isinstance(value, DotNetDate):
        return value.json()
    raise TypeError(f"no .NET shape for {value!r}")


def _rpc_http(pb: Any, request: Http) -> Any:
    """host GrpcMessageConversionExtensions.ToRpcHttp: header names lower-cased, empty query
    values skipped, route values in ``params``; with RawHttpBodyBytes and RpcHttpBodyOnly the
    body is bytes for every content type and rawBody is unset; no body when Content-Length is 0."""
    query = {k: v for k, v in request.query.items() if v}
    rpc = pb.RpcHttp(
        method=request.method,
        url=f"https://localhost{request.path}" + (f"?{urlencode(request.query)}" if request.query else ""),
        headers={name.lower(): value for name, value in request.headers.items()},
        query=query,
        params=dict(request.params),
    )
    if request.body:
        rpc.body.CopyFrom(pb.TypedData(bytes=request.body))
    return rpc


def _apply_binding_data(metadata: dict[str, Any], body: str) -> None:
    """host src/WebJobs.Script/Utility.cs ApplyBindingData, called by WorkerFunctionInvoker
    .TransformInput when the trigger value is a string: a JSON object body adds its top-level
    non-array properties to the binding data, overwriting keys case-insensitively."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return
    if not isinstance(parsed, dict):
        return
    for name, value in parsed.items():
        if value is None or isinstance(value, list):
            continue
        existing = next((key for key in metadata if key.lower() == name.lower()), name)
        metadata[existing] = value if isinstance(value, dict) else _jvalue_string(value)


def _jvalue_string(value: Any) -> str:
    """(string)JValue: InvariantCulture, so booleans read True/False."""
    return str(value) if not isinstance(value, bool) else ("True" if value else "False")


# -- Service Bus ------------------------------------------------------------------------------


@dataclass
class ServiceBusMessage:
    """A ServiceBusReceivedMessage, the fields the extension copies into binding data."""

    body: bytes
    message_id: str | None
    delivery_count: int = 1
    correlation_id: str | None = None
    content_type: str | None = "application/json"
    application_properties: dict[str, Any] = field(default_factory=dict)
    sequence_number: int = 1
    lock_token: str = field(default_factory=lambda: str(uuid.uuid4()))
    enqueued: datetime = field(default_factory=lambda: datetime.now(UTC))
    subject: str | None = None
    session_id: str | None = None  # a session-enabled entity's messages carry one


def _message_properties(message: ServiceBusMessage) -> dict[str, Any]:
    """sb src/Triggers/ServiceBusTriggerBindingStrategy.cs AddBindingData: the host drops null
    values (ScriptInvocationContextExtensions.ShouldSkipBindingData), so absent properties are
    absent keys. Subject doubles as Label, ApplicationProperties as UserProperties."""
    expires = message.enqueued + timedelta(days=14)
    values: dict[str, Any] = {
        "DeliveryCount": message.delivery_count,
        "LockToken": message.lock_token,
        "ExpiresAtUtc": DotNetDate(expires),
        "ExpiresAt": DotNetDate(expires, offset=True),
        "EnqueuedTimeUtc": DotNetDate(message.enqueued),
        "EnqueuedTime": DotNetDate(message.enqueued, offset=True),
        "MessageId": message.message_id,
        "ContentType": message.content_type,
        "SequenceNumber": message.sequence_number,
        "CorrelationId": message.correlation_id,
        "Subject": message.subject,
        "Label": message.subject,
        "ApplicationProperties": message.application_properties,
        "UserProperties": message.application_properties,
        "SessionId": message.session_id,
    }
    return {key: value for key, value in values.items() if value is not None}


@dataclass(frozen=True)
class StorageQueueMessage:
    """A queue message as the Storage Queues extension has it once dequeued (its body decoded
    from base64, host.json messageEncoding's default)."""

    body: bytes
    dequeue_count: int = 1
    id: str = field(default_factory=lambda: str(uuid.uuid4()))
    pop_receipt: str = field(default_factory=lambda: uuid.uuid4().hex)
    inserted: datetime = field(default_factory=lambda: datetime.now(UTC))


def storage_queue(binding: Mapping[str, Any], message: StorageQueueMessage) -> Invocation:
    """One queue message (azure-sdk-for-net sdk/storage/Microsoft.Azure.WebJobs.Extensions.
    Storage.Queues QueueTriggerBinding.CreateBindingDataContract): the body as a string (the
    default type), and DequeueCount (long), Id, PopReceipt (strings), InsertionTime,
    ExpirationTime and NextVisibleTime (DateTimeOffset), QueueTrigger (the text)."""
    text = _utf8(message.body)
    metadata = {"QueueTrigger": text, "DequeueCount": message.dequeue_count, "Id": message.id,
                "PopReceipt": message.pop_receipt, "InsertionTime": DotNetDate(message.inserted, offset=True),
                "ExpirationTime": DotNetDate(message.inserted + timedelta(days=7), offset=True),
                "NextVisibleTime": DotNetDate(datetime.now(UTC) + timedelta(minutes=10), offset=True)}  # fmt: skip
    return Invocation({binding["name"]: text}, metadata)


@dataclass
class Blob:
    """A blob as the Storage Blobs extension reads it for its trigger."""

    container: str
    name: str
    content: bytes
    metadata: dict[str, str] = field(default_factory=dict)
    modified: datetime = field(default_factory=lambda: datetime.now(UTC))  # Last-Modified


def blob(binding: Mapping[str, Any], found: Blob) -> Invocation:
    """A blob trigger's run (azure-sdk-for-net sdk/storage/Microsoft.Azure.WebJobs.Extensions.
    Storage.Blobs Triggers/BlobTriggerBinding.CreateBindingData): the content as bytes, and
    BlobTrigger (``<container>/<blob>``), Uri, Properties (the SDK's BlobProperties, serialised
    by ToRpcDefault: PascalCase names, enums as numbers, an ETag without public properties as
    ``{}``), Metadata, and the path's tokens (``{name}``)."""
    modified = DotNetDate(found.modified, offset=True)
    properties = {"ContentLength": len(found.content), "ContentType": "application/x-ndjson", "ETag": {},
                  "LastModified": modified, "CreatedOn": modified, "BlobType": 0, "ContentHash": None,
                  "Metadata": found.metadata}  # fmt: skip
    metadata = {"BlobTrigger": f"{found.container}/{found.name}", "name": found.name,
                "Uri": f"https://account.blob.core.windows.net/{found.container}/{found.name}",
                "Properties": properties, "Metadata": found.metadata}  # fmt: skip
    return Invocation({binding["name"]: found.content}, metadata)


def _actions() -> dict[str, Any]:
    """MessageActions and friends: objects without public properties, serialised as {}."""
    return {"MessageReceiver": {}, "MessageActions": {}, "SessionActions": {}, "ReceiveActions": {}}


def servicebus(binding: Mapping[str, Any], message: ServiceBusMessage) -> Invocation:
    """One message (cardinality one). The input's .NET type follows the binding's dataType
    (host src/WebJobs.Script/Binding/GeneralScriptBindingProvider.cs GetRequestedType; the
    extension registers BindToTrigger without a rule, so sdk JobHostMetadataProvider
    .GetDefaultType gives string): "binary" → byte[] (sb MessageToByteArrayConverter), unset
    or "string" → string (sb MessageToStringConverter), whose JSON properties the host then
    merges into the trigger metadata."""
    metadata = {**_message_properties(message), **_actions()}
    if str(binding.get("dataType", "")).lower() == "binary":
        return Invocation({binding["name"]: message.body}, metadata)
    text = _utf8(message.body)
    _apply_binding_data(metadata, text)
    return Invocation({binding["name"]: text}, metadata)


def servicebus_batch(binding: Mapping[str, Any], messages: list[ServiceBusMessage]) -> Invocation:
    """cardinality many: the same keys + "Array" (sb AddBindingData for ServiceBusReceivedMessage[]).
    Bodies: "binary" → byte[][] (collection_bytes), "string" → string[] (collection_string),
    unset → object[], each body deserialised as JSON (sdk PocoTriggerArgumentBinding), which
    fails the whole batch on a body that is not JSON."""
    columns = [_message_properties(m) for m in messages]

    def column(key: str) -> list[Any]:
        return [c.get(key) for c in columns]

    metadata: dict[str, Any] = {
        "DeliveryCountArray": column("DeliveryCount"),
        "SequenceNumberArray": Longs(column("SequenceNumber")),
        "ExpiresAtUtcArray": column("ExpiresAtUtc"),
        "ExpiresAtArray": column("ExpiresAt"),
        "EnqueuedTimeUtcArray": column("EnqueuedTimeUtc"),
        "EnqueuedTimeArray": column("EnqueuedTime"),
        "ApplicationPropertiesArray": column("ApplicationProperties"),
        "UserPropertiesArray": column("UserProperties"),
        **_actions(),
    }
    for key in ("MessageId", "LockToken", "ContentType", "CorrelationId", "Subject", "Label"):
        metadata[f"{key}Array"] = Strings(value or "" for value in column(key))
    data_type = str(binding.get("dataType", "")).lower()
    bodies: Any
    if data_type == "binary":
        bodies = ByteArrays(m.body for m in messages)
    elif data_type == "string":
        bodies = Strings(_utf8(m.body) for m in messages)
    else:
        try:
            bodies = [json.loads(m.body) for m in messages]
        except ValueError as error:
            raise HostBindingError(f"the host cannot bind the batch: a body is not JSON ({error})") from None
    return Invocation({binding["name"]: bodies}, metadata)


def _utf8(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        raise HostBindingError("the host cannot read the body as a string (not UTF-8)") from None


# -- Event Grid, HTTP, timer --------------------------------------------------------------------


def cloudevent(binding: Mapping[str, Any], event: Mapping[str, Any]) -> Invocation:
    """eg src/Config/EventGridExtensionConfigProvider.cs binds each event of the delivery as a
    JObject → json (compact); eg src/TriggerBinding/EventGridTriggerAttributeBindingProvider.cs
    gives only ``data`` as binding data (absent when the event has none)."""
    metadata = {"data": event["data"]} if event.get("data") is not None else {}
    return Invocation({binding["name"]: dict(event)}, metadata)


def http(binding: Mapping[str, Any], request: Http) -> Invocation:
    """The trigger value is the HttpRequest (host HttpScriptBinding.DefaultType) → RpcHttp. The
    worker announces RpcHttpTriggerMetadataRemoved, so the host drops the HttpRequest-valued
    entries ($request, req) and keeps ext src/WebJobs.Extensions.Http/
    HttpTriggerAttributeBindingProvider.cs GetRequestBindingData: Query and Headers as
    dictionaries, each query parameter but ``code`` and each route value as a string, and a JSON
    object body's top-level properties."""
    metadata: dict[str, Any] = {"Query": dict(request.query), "Headers": dict(request.headers)}
    metadata.update({k: v for k, v in request.query.items() if k != "code"})
    metadata.update(request.params)
    if request.body and request.headers.get("Content-Type", "").startswith("application/json"):
        _apply_binding_data(metadata, request.body.decode("utf-8", "replace"))
    return Invocation({binding["name"]: request}, metadata)


def timer(binding: Mapping[str, Any], *, past_due: bool = False) -> Invocation:
    """ext src/WebJobs.Extensions/Extensions/Timers/TimerInfo.cs serialised by ToRpcDefault;
    ScheduleStatus is null without a schedule monitor (useMonitor false). Binding data: only
    ``TimerTrigger``, DateTime.Now.ToString() (ext Timers/Bindings/TimerTriggerBinding.cs)."""
    now = datetime.now(UTC)
    status = None
    if binding.get("useMonitor", True):
        status = {"Last": DotNetDate(now - timedelta(minutes=15), offset=True), "Next": DotNetDate(now, offset=True),
                  "LastUpdated": DotNetDate(now - timedelta(minutes=15), offset=True)}  # fmt: skip
    info = {"Schedule": {"AdjustForDST": True}, "ScheduleStatus": status, "IsPastDue": past_due}
    return Invocation({binding["name"]: info}, {"TimerTrigger": now.strftime("%m/%d/%Y %H:%M:%S")})


def http_result(pb: Any, response: Any) -> tuple[int, dict[str, str], bytes]:
    """The ``$return`` RpcHttp of an HTTP invocation: status, headers, body."""
    rpc = response.return_value.http
    body = rpc.body
    kind = body.WhichOneof("data")
    raw = body.bytes if kind == "bytes" else (getattr(body, kind).encode() if kind else b"")
    return int(rpc.status_code), dict(rpc.headers), raw


@dataclass(frozen=True)
class HubEvent:
    body: bytes
    sequence_number: int
    properties: dict[str, Any] = field(default_factory=dict)
    partition_key: str | None = None
    enqueued: datetime = field(default_factory=lambda: datetime.now(UTC))  # kept by every replay of the event


def eventhub_batch(binding: Mapping[str, Any], events: list[HubEvent], *, hub: str = "shipments",
                   partition: str = "0") -> Invocation:  # fmt: skip
    """cardinality many, dataType binary: byte[][] bodies (collection_bytes), and the binding
    data of azure-sdk-for-net sdk/eventhub/Microsoft.Azure.WebJobs.Extensions.EventHubs
    src/Triggers/EventHubTriggerBindingStrategy.cs GetBindingData for EventData[]: the
    PartitionContext, then one array per property (PartitionKey, Offset, SequenceNumber,
    EnqueuedTimeUtc, Properties, SystemProperties)."""
    system = [{"SequenceNumber": e.sequence_number, "Offset": str(e.sequence_number * 100),
               "PartitionKey": e.partition_key, "EnqueuedTimeUtc": DotNetDate(e.enqueued)} for e in events]  # fmt: skip
    metadata: dict[str, Any] = {
        "PartitionContext": {
            "ConsumerGroup": "$Default",
            "EventHubName": hub,
            "PartitionId": partition,
            "FullyQualifiedNamespace": "evh.servicebus.windows.net",
        },
        "PartitionKeyArray": Strings(e.partition_key or "" for e in events),
        "OffsetArray": Strings(str(e.sequence_number * 100) for e in events),
        "SequenceNumberArray": Longs(e.sequence_number for e in events),
        "EnqueuedTimeUtcArray": [DotNetDate(e.enqueued) for e in events],
        "PropertiesArray": [e.properties for e in events],
        "SystemPropertiesArray": system,
    }
    return Invocation({binding["name"]: ByteArrays(e.body for e in events)}, metadata)
