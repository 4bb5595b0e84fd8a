"""The app's outbox sender: Service Bus through the ``azure-servicebus`` SDK. The Functions
output binding sets only a message's body (no MessageId, no application properties, no
session id: azure-functions-python-library#281), and the outbox needs the MessageId it
chose. One client per instance, on the trigger's own connection settings: managed identity
with ``ServiceBusConnection__fullyQualifiedNamespace`` on Azure, a connection string in
``ServiceBusConnection`` locally."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..config import factory, setting, whole
from ..errors import ConfigurationError, InvalidMessage
from ..messages import Outgoing
from ..outbox import Sender
from ..reasons import Reason

if TYPE_CHECKING:
    from azure.servicebus import ServiceBusClient, ServiceBusMessage


def to_servicebus(message: Outgoing) -> ServiceBusMessage:
    """What goes on the wire: the outbox's MessageId (duplicate detection, the next
    consumer's key), the body as JSON, application properties and the session id."""
    from azure.servicebus import ServiceBusMessage

    return ServiceBusMessage(json.dumps(message.body, ensure_ascii=False, separators=(",", ":")),
                             message_id=message.message_id, application_properties=_properties(message),
                             session_id=message.session_id, content_type="application/json")  # fmt: skip


# Service Bus Standard's message size; a Premium entity's is its maxMessageSizeInKilobytes
# (1 MiB by default, infra sets the setting to match).
DEFAULT_MAX_MESSAGE_BYTES = "262144"
SIMPLE = (str, bool, int, float)  # AMQP application properties hold simple types only, no lists or maps


class ServiceBusSender:
    """Sends each destination's messages in as few calls as its batches allow (a queue or a
    topic: an entity path). The SDK's senders are not thread-safe: one per destination, used
    by one call at a time. ``max_message_bytes``: the destinations' message size limit, which
    ``check`` holds each message to before its commit."""

    def __init__(self, client: ServiceBusClient, *, max_message_bytes: int = int(DEFAULT_MAX_MESSAGE_BYTES)) -> None:
        self._client = client
        self._senders: dict[str, tuple[Any, threading.Lock]] = {}
        self._lock = threading.Lock()
        self.max_message_bytes = max_message_bytes

    def check(self, messages: Sequence[Outgoing]) -> None:
        """InvalidMessage for a message Service Bus can never take, found as the SDK and the
        service would find it: encoded into an empty batch of the destination's size (no
        network). What only the service knows (a destination missing, a role not granted)
        fails the send instead: waited for, parked and alerted, never dropped."""
        from azure.servicebus import ServiceBusMessageBatch
        from azure.servicebus.exceptions import MessageSizeExceededError

        for message in messages:
            what = f"an outgoing message to {message.destination!r}"
            odd = sorted(name for name, value in message.properties.items() if not isinstance(value, SIMPLE))
            if odd:
                raise InvalidMessage(Reason.OUTGOING_REFUSED, f"{what}: properties {odd} are not strings, numbers "
                                     "or booleans (Service Bus application properties hold simple types)")  # fmt: skip
            try:
                ServiceBusMessageBatch(max_size_in_bytes=self.max_message_bytes).add_message(to_servicebus(message))
            except MessageSizeExceededError as exc:
                raise InvalidMessage(Reason.OUTGOING_REFUSED, f"{what} is over {self.max_message_bytes} bytes once "
                                     "encoded (DEDUP_OUTGOING_MAX_BYTES)") from exc  # fmt: skip
            except (TypeError, ValueError) as exc:  # a session id over 128 characters, an int over 32 bits, ...
                raise InvalidMessage(Reason.OUTGOING_REFUSED, f"{what}: {exc}"[:500]) from exc

    def send(self, messages: Sequence[Outgoing]) -> None:
        from azure.servicebus.exceptions import MessageSizeExceededError

        by_destination: dict[str, list[Outgoing]] = {}
        for message in messages:
            by_destination.setdefault(message.destination, []).append(message)
        for destination, group in by_destination.items():
            sender, lock = self._sender(destination)
            with lock:
                batch = sender.create_message_batch()
                for wire in map(to_servicebus, group):
                    try:
                        batch.add_message(wire)
                    except MessageSizeExceededError:
                        if not len(batch):  # too large for any batch (check() refuses it before its commit)
                            raise
                        sender.send_messages(batch)  # this batch is full: send it, start the next
                        batch = sender.create_message_batch()
                        batch.add_message(wire)
                sender.send_messages(batch)

    def _sender(self, destination: str) -> tuple[Any, threading.Lock]:
        with self._lock:  # one AMQP link per entity, created once
            if destination not in self._senders:
                self._senders[destination] = (self._client.get_queue_sender(destination), threading.Lock())
            return self._senders[destination]


class FileSender:
    """Appends each message as one JSON line to a file: local runs and tests, where there
    is no Service Bus (``DEDUP_SENDER=file``, ``DEDUP_SENDER_FILE``). Never on Azure."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()

    def send(self, messages: Sequence[Outgoing]) -> None:
        lines = "".join(json.dumps({"destination": m.destination, "messageId": m.message_id, "body": m.body,
                                    "properties": dict(m.properties), "sessionId": m.session_id},
                                   ensure_ascii=False) + "\n" for m in messages)  # fmt: skip
        with self._lock, open(self.path, "a", encoding="utf-8") as out:
            out.write(lines)


def app_sender() -> Sender:
    """DEDUP_SENDER: ``servicebus`` (default: the Service Bus trigger's own connection
    settings, no new secret), ``file`` (DEDUP_SENDER_FILE, local), or ``package.module:factory``."""
    name = setting("DEDUP_SENDER", "servicebus")
    if name == "file":
        return FileSender(setting("DEDUP_SENDER_FILE"))
    if name != "servicebus":
        return _imported(name)
    size = whole("DEDUP_OUTGOING_MAX_BYTES", DEFAULT_MAX_MESSAGE_BYTES)
    return ServiceBusSender(servicebus_client("the outbox sends"), max_message_bytes=size)


def servicebus_client(who: str) -> ServiceBusClient:
    """A client on the Service Bus trigger's own connection settings (no new secret):
    ServiceBusConnection (local), or ServiceBusConnection__fullyQualifiedNamespace with the
    app's managed identity (``__clientId``: a user-assigned one)."""
    from azure.servicebus import ServiceBusClient

    connection = os.environ.get("ServiceBusConnection")  # noqa: SIM112 - the host's own setting name
    if connection:
        return ServiceBusClient.from_connection_string(connection)
    namespace = os.environ.get("ServiceBusConnection__fullyQualifiedNamespace")  # noqa: SIM112
    if namespace:
        from azure.identity import DefaultAzureCredential

        client_id = os.environ.get("ServiceBusConnection__clientId")  # noqa: SIM112
        return ServiceBusClient(namespace, DefaultAzureCredential(managed_identity_client_id=client_id))
    raise ConfigurationError(f"{who} with ServiceBusConnection (local) or "
                             "ServiceBusConnection__fullyQualifiedNamespace (managed identity)")  # fmt: skip


def check_sender_settings() -> None:
    """DEDUP_SENDER names a sender, and ``file`` has its DEDUP_SENDER_FILE (the Service Bus
    connection is the triggers' own, which the host checks)."""
    name = setting("DEDUP_SENDER", "servicebus")
    if name == "file":
        setting("DEDUP_SENDER_FILE")
    elif name == "servicebus":
        whole("DEDUP_OUTGOING_MAX_BYTES", DEFAULT_MAX_MESSAGE_BYTES)
    else:
        factory("DEDUP_SENDER", name, "servicebus, file")


def _imported(name: str) -> Sender:
    sender: Sender = factory("DEDUP_SENDER", name, "servicebus, file")()
    return sender


def _properties(message: Outgoing) -> dict[str | bytes, Any]:
    return {name: value for name, value in message.properties.items()}
