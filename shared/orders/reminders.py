"""The scheduled example: a daily payment reminder per customer with an open balance —
exactly one per customer and day, however often the day's run starts. ``due`` is the job's
input: replace it with your own query (it must return the same ids for a re-run)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from shared.idempotency import Context, Effects, Entity

SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["customerId", "balance", "currency"],
    "properties": {"customerId": {"type": "string"}, "balance": {"type": "number"}, "currency": {"type": "string"}},
}


def due(day: datetime, customers: int = 5) -> list[tuple[str, dict[str, Any]]]:
    """The example's open balances (a fixed sample); yours come from a query."""
    return [(f"c-{i}", {"customerId": f"c-{i}", "balance": 10.0 * (i + 1), "currency": "EUR"})
            for i in range(customers)]  # fmt: skip


def reminder_handler(balance: dict[str, Any], context: Context) -> Effects:
    """One reminder record per customer and occurrence (the key is ``<occurrence>/<customer>``)."""
    occurrence = context.key.id.partition("/")[0]
    reminder = {**balance, "occurrence": occurrence}
    return Effects([Entity("reminder", reminder)], {"reminded": balance["customerId"]})
