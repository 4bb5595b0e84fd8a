"""The example domain: an order creates an order record and charges the customer once.

The ledger is append-only, as ledgers are: each posting gets a fresh id. Nothing in the
data itself stops a second posting for the same order; the dedup marker committed in
the same transaction is what does — the pattern's reason to exist.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from azure.data.tables import TableClient

from shared.idempotency import DedupKey, Effects, Entity, InvalidMessage
from shared.idempotency.table_store import encode_key

SCHEMA: dict[str, Any] = json.loads((Path(__file__).with_name("schema.json")).read_text())

ORDER = "order"
CHARGE_PREFIX = "charge|"


def order_effects(order: dict[str, Any], key: DedupKey) -> Effects:
    """Decides the records (no I/O); the store commits them with the marker in the
    order's partition. The producer sets MessageId = orderId, so they must agree."""
    if order["orderId"] != key.id:
        raise InvalidMessage("key_mismatch", "the message's key is not its orderId")
    charge = {
        "orderId": order["orderId"],
        "customerId": order["customerId"],
        "amount": float(order["amount"]),
        "currency": order["currency"],
    }
    return Effects(
        entities=[
            Entity(ORDER, {**charge, "items": order["items"]}),
            Entity(CHARGE_PREFIX + uuid.uuid4().hex, charge),
        ],
        result={"orderId": order["orderId"], "charged": charge["amount"], "currency": order["currency"]},
    )


@dataclass
class OrderEffects:
    orders: int = 0
    charges: int = 0


def effects_by_order(table: TableClient, order_id: str | None = None) -> dict[str, OrderEffects]:
    """What is really in the table, per order id: the ground truth for tests, the demo,
    the chaos harness and the smoke test."""
    if order_id is None:
        entities = table.list_entities(select=["RowKey", "orderId"])
    else:
        entities = table.query_entities(
            "PartitionKey eq @pk", parameters={"pk": encode_key(order_id)}, select=["RowKey", "orderId"]
        )
    found: dict[str, OrderEffects] = {}
    for entity in entities:
        if "orderId" not in entity:
            continue  # a marker
        effects = found.setdefault(entity["orderId"], OrderEffects())
        if entity["RowKey"] == ORDER:
            effects.orders += 1
        else:
            effects.charges += 1
    return found
