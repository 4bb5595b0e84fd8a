"""Ledger postings in batches: the postings of one account share a partition and commit
together, many per request."""

from __future__ import annotations

import typing

import azure.functions as func

from shared import ledger
from shared.idempotency import IdempotentConsumer
from shared.idempotency.bindings import BODY_AS_BYTES, acknowledge_or_retry, servicebus_delivery
from shared.idempotency.registry import consumer, shared_store

bp = func.Blueprint()  # type: ignore[no-untyped-call]  # azure-functions leaves it unannotated


@consumer
def batch_consumer() -> IdempotentConsumer:
    return IdempotentConsumer("ledger", shared_store(), ledger.posting_handler, schema=ledger.SCHEMA,
                              partition_for=ledger.account_of)  # fmt: skip


@bp.function_name("ledger_batch")
@bp.service_bus_queue_trigger(arg_name="messages", queue_name="%LEDGER_QUEUE%", connection="ServiceBusConnection",
                              cardinality="many", data_type=BODY_AS_BYTES)  # fmt: skip
def ledger_batch(messages: typing.List[func.ServiceBusMessage]) -> None:  # noqa: UP006 - the worker rejects list[...]
    """With the classic binding a batch completes or is abandoned as a whole: any message
    that must be retried makes the whole batch come back, and its committed messages
    are then cheap duplicates."""
    for result in batch_consumer().process_batch([servicebus_delivery(m) for m in messages]):
        acknowledge_or_retry(result)
