"""The canary: every few minutes the ``send_canaries`` timer sends a small message through each
Service Bus queue and topic the app's triggers read, and a CloudEvent to the Event Grid topic
(EVENTGRID_TOPIC_ENDPOINT) when it has Event Grid triggers; each consumer recognises it
(``facts.is_canary``), commits its marker without running the handler, and logs a heartbeat.
Both ends log an event that the ``dedup-canary-heartbeat`` alert reads
(infra/modules/alerts.bicep): it fires when a consumer has seen no canary of its entity for two
intervals while canaries were sent, when none of an entity's canaries was ever seen, or when the
canaries stopped being sent. A consumer that stopped, or a host that settles without invoking
the function (Azure/azure-functions-host#11879), is found within two intervals, with no
business message needed.

Cost per entity: 288 messages a day (one every 5 minutes); each is one send, one delivery and
one marker write (its store request), and 2 log records. A topic's canary reaches each of its
subscriptions (a subscription with a SQL filter must let ``dedup-canary`` through); an Event
Grid canary reaches each subscription that includes the ``dedup.canary`` event type (infra's
do). HTTP routes get none: a request that does not reach the app fails at its caller."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from . import telemetry
from .facts import CANARY_PREFIX, CANARY_PROPERTY, CANARY_SOURCE, CANARY_TYPE
from .messages import Delivery

if TYPE_CHECKING:
    from azure.servicebus import ServiceBusClient

log = logging.getLogger("idempotency")
INTERVAL = timedelta(minutes=5)  # the timer's schedule, and the alert's ``interval`` (a test holds them equal)
SENT, SEEN = "canary.sent", "canary.seen"  # the heartbeat's two events (customDimensions.dedup_event)


class Entity(NamedTuple):
    """What a trigger reads: a Service Bus queue, or topic (through one of its subscriptions); the
    Event Grid topic."""

    kind: str  # "queue" or "topic" (Service Bus), "eventgrid" (name: the topic's endpoint)
    name: str
    sessions: bool = False  # a session-enabled entity takes only messages with a session id


class Sender(Protocol):
    def send(self, entity: Entity, message_id: str, properties: dict[str, str]) -> None: ...


def send(sender: Sender, entities: Iterable[Entity]) -> None:
    """One canary to each entity, named in its ``dedup-canary`` property (what its consumers
    log). An entity that cannot be sent to is logged and its heartbeat stops (the alert); the
    others are still sent, and the first error is raised at the end."""
    failed: list[Exception] = []
    for entity in entities:
        try:
            sender.send(entity, f"{CANARY_PREFIX}{uuid.uuid4().hex}", {CANARY_PROPERTY: entity.name})
        except Exception as exc:
            log.exception("dedup canary: could not send to %s %r", entity.kind, entity.name)
            failed.append(exc)
            continue
        log.info("dedup canary sent entity=%r", entity.name,
                 extra=telemetry.extra({"event": SENT, "entity": entity.name}))  # fmt: skip
    if failed:
        raise failed[0]


def seen(consumer: str, delivery: Delivery) -> None:
    """A consumer's heartbeat: it committed (or met again) a canary of this entity."""
    entity = str(delivery.properties.get(CANARY_PROPERTY, ""))
    log.info("dedup canary seen consumer=%r entity=%r", consumer, entity,
             extra=telemetry.extra({"event": SEEN, "entity": entity, "consumer": consumer}))  # fmt: skip


class ServiceBusCanaries:
    """Sends canaries with the app's Service Bus client (the triggers' connection settings)."""

    def __init__(self, client: ServiceBusClient) -> None:
        self._client = client

    def send(self, entity: Entity, message_id: str, properties: dict[str, str]) -> None:
        from azure.servicebus import ServiceBusMessage

        if entity.kind == "queue":
            sender = self._client.get_queue_sender(queue_name=entity.name)
        else:
            sender = self._client.get_topic_sender(topic_name=entity.name)
        carried: dict[str | bytes, Any] = {name: value for name, value in properties.items()}
        message = ServiceBusMessage(b"{}", message_id=message_id, application_properties=carried,
                                    session_id=CANARY_PREFIX if entity.sessions else None,
                                    content_type="application/json")  # fmt: skip
        with sender:
            sender.send_messages(message)


class EventGridCanaries:
    """Publishes canaries to an Event Grid topic with the app's identity (Event Grid Data Sender)."""

    def send(self, entity: Entity, message_id: str, properties: dict[str, str]) -> None:
        from azure.core.messaging import CloudEvent
        from azure.eventgrid import EventGridPublisherClient
        from azure.identity import DefaultAzureCredential

        event = CloudEvent(source=CANARY_SOURCE, type=CANARY_TYPE, id=message_id,
                           data={"entity": properties[CANARY_PROPERTY]})  # fmt: skip
        with EventGridPublisherClient(entity.name, DefaultAzureCredential()) as client:
            client.send(event)
