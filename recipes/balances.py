"""Account balances: each entry — a credit or a debit, keyed by its own ``entryId`` — recorded
once, and its account's running balance changed in the same transaction as the marker.

The producer sets MessageId = ``entryId``. The entry, the balance and the marker live in the
account's partition (``partition_from``: the body's ``accountId``), so that they commit together;
the handler reads the balance (``context.read``) and returns it changed at the version read, so
that two entries of one account never both apply to the same balance: the store refuses the
second commit, and that entry is decided again from a fresh read. A duplicate costs the one read
that finds its marker, and never runs the handler. Amounts are kept in cents (integers): a total
is then exact whatever the order of its entries."""

from __future__ import annotations

from typing import Any

import azure.functions as func

from shared.idempotency import Context, Effects, Entity, IdempotentConsumer, InvalidMessage, from_body_field
from shared.idempotency.functions import BODY_AS_BYTES, consumer, on_servicebus, shared_store

bp = func.Blueprint()  # type: ignore[no-untyped-call]  # azure-functions leaves it unannotated

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://example.com/schemas/entry.json",
    "title": "Entry",
    "type": "object",
    "required": ["entryId", "accountId", "direction", "amount"],
    "properties": {
        "entryId": {"type": "string", "minLength": 1, "maxLength": 128},
        "accountId": {"type": "string", "pattern": "^[A-Za-z0-9-]{1,64}$"},
        "direction": {"enum": ["credit", "debit"]},
        "amount": {"type": "number", "minimum": 0, "maximum": 1000000},
    },
}
BALANCE = "balance"  # the account's entity the handler reads and changes


def cents(entry: dict[str, Any]) -> int:
    """The entry's signed amount in cents."""
    return round(float(entry["amount"]) * 100) * (1 if entry["direction"] == "credit" else -1)


def entry_handler(entry: dict[str, Any], context: Context) -> Effects:
    if context.key.id != entry["entryId"]:
        raise InvalidMessage("key_mismatch", "the message's key is not its entryId")
    balance = context.read(BALANCE)
    now = (balance.data or {}).get("cents", 0) + cents(entry)
    record = {"accountId": entry["accountId"], "direction": entry["direction"], "cents": cents(entry)}
    return Effects([Entity(f"entry|{entry['entryId']}", record)], result={"balanceCents": now},
                   changes=[balance.merged({"accountId": entry["accountId"], "cents": now})])  # fmt: skip


@consumer
def balances_consumer() -> IdempotentConsumer:
    return IdempotentConsumer("balances", shared_store(), entry_handler, schema=SCHEMA,
                              partition_from=from_body_field("accountId"), reads=lambda entry: [BALANCE])  # fmt: skip


@bp.function_name("account_balances")
@bp.service_bus_queue_trigger(
    arg_name="msg", queue_name="%BALANCES_QUEUE%", connection="ServiceBusConnection", data_type=BODY_AS_BYTES
)
def account_balances(msg: func.ServiceBusMessage) -> None:
    on_servicebus(balances_consumer, msg)  # returning completes the message, raising abandons it
