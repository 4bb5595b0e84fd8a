"""Ledger postings in batches: the postings of one account share a partition and commit
together, many per request."""

from __future__ import annotations

import typing

import azure.functions as func

from shared import ledger
from shared.idempotency import IdempotentConsumer
from shared.idempotency.functions import BODY_AS_BYTES, consumer, on_servicebus_batch, shared_store

bp = func.Blueprint()  # type: ignore[no-untyped-call]  # azure-functions leaves it unannotated


@consumer
def batch_consumer() -> IdempotentConsumer:
    return IdempotentConsumer("ledger", shared_store(), ledger.posting_handler, schema=ledger.SCHEMA,
                              partition_for=ledger.account_of)  # fmt: skip


@bp.function_name("ledger_batch")
@bp.service_bus_queue_trigger(arg_name="messages", queue_name="%LEDGER_QUEUE%", connection="ServiceBusConnection",
                              cardinality="many", data_type=BODY_AS_BYTES)  # fmt: skip
def ledger_batch(messages: typing.List[func.ServiceBusMessage]) -> None:  # noqa: UP006 - the worker rejects list[...]
    on_servicebus_batch(batch_consumer, messages)
