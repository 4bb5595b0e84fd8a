"""Ledger postings in batches (``cardinality="many"``): the postings of one account share a
partition and commit together, many per request.

The producer sets MessageId = ``<accountId>:<postingId>``, so the partition — the account —
derives from the dedup key alone, and a batch's postings to one account commit together:
on Table Storage, 33 postings (guard + marker + posting each) per transaction."""

from __future__ import annotations

import typing
from typing import Any

import azure.functions as func

from shared.idempotency import Context, Effects, Entity, IdempotentConsumer, InvalidMessage
from shared.idempotency.functions import BODY_AS_BYTES, consumer, on_servicebus_batch, shared_store
from shared.idempotency.keys import DedupKey

bp = func.Blueprint()  # type: ignore[no-untyped-call]  # azure-functions leaves it unannotated

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://example.com/schemas/posting.json",
    "title": "Posting",
    "type": "object",
    "additionalProperties": False,
    "required": ["accountId", "postingId", "amount", "currency"],
    "properties": {
        "accountId": {"type": "string", "pattern": "^[A-Za-z0-9-]{1,64}$"},
        "postingId": {"type": "string", "minLength": 1, "maxLength": 128},
        "amount": {"type": "number", "minimum": -1000000, "maximum": 1000000},
        "currency": {"type": "string", "pattern": "^[A-Z]{3}$"},
    },
}


def message_id(account_id: str, posting_id: str) -> str:
    return f"{account_id}:{posting_id}"


def account_of(key: DedupKey) -> str:
    """The partition rule: the account prefix of the key."""
    return key.id.split(":", 1)[0]


def posting_handler(posting: dict[str, Any], context: Context) -> Effects:
    if context.key.id != message_id(posting["accountId"], posting["postingId"]):
        raise InvalidMessage("key_mismatch", "MessageId must be <accountId>:<postingId>")
    record = {"accountId": posting["accountId"], "amount": float(posting["amount"]), "currency": posting["currency"]}
    return Effects([Entity(f"posting|{posting['postingId']}", record)], {"posted": record["amount"]})


@consumer
def batch_consumer() -> IdempotentConsumer:
    return IdempotentConsumer("ledger", shared_store(), posting_handler, schema=SCHEMA,
                              partition_for=account_of)  # fmt: skip


@bp.function_name("ledger_batch")
@bp.service_bus_queue_trigger(arg_name="messages", queue_name="%LEDGER_QUEUE%", connection="ServiceBusConnection",
                              cardinality="many", data_type=BODY_AS_BYTES)  # fmt: skip
def ledger_batch(messages: typing.List[func.ServiceBusMessage]) -> None:  # noqa: UP006 - the worker rejects list[...]
    on_servicebus_batch(batch_consumer, messages)
