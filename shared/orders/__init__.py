"""The example domain: an order creates an order record and one ledger charge."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from shared.idempotency import DedupKey, Effects, Entity, InvalidMessage

SCHEMA: dict[str, Any] = json.loads((Path(__file__).with_name("schema.json")).read_text())

ORDER = "order"
CHARGE = "ledger-charge"


def order_effects(order: dict[str, Any], key: DedupKey) -> Effects:
    """Pure: decides the records; the store commits them with the marker in the order's
    partition. The producer sets MessageId = orderId, so they must agree."""
    if order["orderId"] != key.id:
        raise InvalidMessage("key_mismatch", "the message's key is not its orderId")
    record = {
        "customerId": order["customerId"],
        "amount": float(order["amount"]),
        "currency": order["currency"],
        "items": order["items"],
    }
    charge = {"customerId": order["customerId"], "amount": float(order["amount"]), "currency": order["currency"]}
    return Effects(
        entities=[Entity(ORDER, record), Entity(CHARGE, charge)],
        result={"orderId": order["orderId"], "charged": float(order["amount"]), "currency": order["currency"]},
    )
