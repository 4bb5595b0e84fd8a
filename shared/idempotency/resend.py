"""Resubmit what a Service Bus queue dead-lettered, losing nothing on the way.

    python -m shared.idempotency.resend --consumer orders --queue orders [--max 100]

Each dead-lettered message is sent again with a **new MessageId** — duplicate detection drops a
send that reuses an id inside its window, silently (the send succeeds) — and its dedup key in
the application property ``dedup-key``, which the Service Bus trigger takes as the MessageId
(``servicebus_delivery``): the consumer still knows it, and applies it once. The original's first
enqueued time goes in ``dedup-enqueued-at``: a copy is as old as its original, and the consumer
refuses one older than its marker is sure to be kept (``expired``). Its original sequence number
is recorded for the audit (the audit package) before the dead-lettered copy is completed. Sent,
then recorded, then completed: a run that dies between them leaves the copy in the dead-letter
queue, and the next run resends it under the same key (a duplicate).

Ask first what each message would do: ``python -m shared.idempotency.resubmit``. One line per
message (sequence number, the new MessageId, the key), then a JSON summary; exit 2 when it
cannot run (settings, store, Service Bus, unknown consumer). The copy keeps the body, the
application properties, and the session id, correlation id, subject and content type. Queues
only: a subscription's dead letters sent back to their topic would reach every subscription.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from . import facts
from .stores._base import DedupStore

if TYPE_CHECKING:
    from azure.servicebus import ServiceBusClient, ServiceBusReceivedMessage


class Parked(NamedTuple):
    """A message in the dead-letter queue, locked by ``DeadLetterQueue.receive``."""

    sequence: int
    enqueued_at: datetime | None
    message_id: str | None
    body: bytes
    properties: Mapping[str, Any]
    lock: Any  # what ``complete`` needs
    fields: Mapping[str, Any] = {}  # kept as sent: session_id, correlation_id, subject, content_type


class DeadLetterQueue(Protocol):
    """A queue's dead-letter queue, and the queue to send back to (``ServiceBusDeadLetters``)."""

    def receive(self, count: int) -> list[Parked]: ...

    def send(self, body: bytes, message_id: str, properties: Mapping[str, Any], fields: Mapping[str, Any]) -> None: ...

    def complete(self, parked: Parked) -> None: ...


def resend(store: DedupStore, consumer: str, queue: DeadLetterQueue, count: int) -> list[tuple[Parked, str]]:
    """Up to ``count`` dead-lettered messages sent again: each with its new MessageId."""
    done = []
    for parked in queue.receive(count):
        key = parked.properties.get(facts.KEY_PROPERTY) or parked.message_id
        new_id = f"resent-{uuid.uuid4().hex}"
        # kept: the copy is as old as its original (the earliest time known of it)
        first = min(filter(None, (facts.first_enqueued(parked.properties), parked.enqueued_at)), default=None)
        properties = {**parked.properties, **({facts.KEY_PROPERTY: key} if key else {}),
                      **({facts.ENQUEUED_PROPERTY: first.isoformat()} if first else {})}  # fmt: skip
        queue.send(parked.body, new_id, properties, parked.fields)
        facts.record_resent(store, consumer, parked.sequence, parked.enqueued_at)
        queue.complete(parked)
        done.append((parked, new_id))
    return done


class ServiceBusDeadLetters:
    """``DeadLetterQueue`` on Azure: the queue's DLQ received in peek-lock mode, and the queue."""

    def __init__(self, client: ServiceBusClient, queue: str) -> None:
        from azure.servicebus import ServiceBusSubQueue

        self._receiver = client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=5)
        self._sender = client.get_queue_sender(queue)

    def receive(self, count: int) -> list[Parked]:
        found = self._receiver.receive_messages(max_message_count=count, max_wait_time=5)
        return [_parked(m) for m in found]

    def send(self, body: bytes, message_id: str, properties: Mapping[str, Any], fields: Mapping[str, Any]) -> None:
        from azure.servicebus import ServiceBusMessage

        sent = ServiceBusMessage(body, message_id=message_id, application_properties=dict(properties), **fields)  # type: ignore[arg-type]  # what the DLQ gave
        self._sender.send_messages(sent)

    def complete(self, parked: Parked) -> None:
        self._receiver.complete_message(parked.lock)


def _parked(message: ServiceBusReceivedMessage) -> Parked:
    properties = {(k.decode() if isinstance(k, bytes) else str(k)): (v.decode() if isinstance(v, bytes) else v)
                  for k, v in (message.application_properties or {}).items()}  # fmt: skip
    names = ("session_id", "correlation_id", "subject", "content_type")
    fields = {name: value for name in names if (value := getattr(message, name)) is not None}
    return Parked(message.sequence_number or 0, message.enqueued_time_utc, message.message_id, b"".join(message.body),
                  properties, message, fields)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    from .commands import app_consumer, command, consumer_options, one_line_errors, printable
    from .functions._senders import servicebus_client

    parser = command("shared.idempotency.resend", __doc__)
    consumer_options(parser)
    parser.add_argument("--queue", required=True, help="the queue whose dead letters are sent back to it")
    parser.add_argument("--max", type=int, default=100, help="at most this many messages")
    args = parser.parse_args(argv)
    with one_line_errors("resend"), app_consumer(args) as consumer, servicebus_client("resend") as client:
        done = resend(consumer.store, consumer.name, ServiceBusDeadLetters(client, args.queue), args.max)
    for parked, new_id in done:
        key = parked.properties.get(facts.KEY_PROPERTY) or parked.message_id or ""
        print(f"{parked.sequence}\t{new_id}\t{printable(str(key))}")
    print(json.dumps({"resent": len(done)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
