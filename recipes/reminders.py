"""A scheduled job: a payment reminder per customer with an open balance, every day at
06:00 UTC — one per customer and day, even when a restart re-runs the day or a second
instance starts it too (shared.idempotency.jobs). ``due`` is the job's input: replace it
with your own query (it must return the same ids for a re-run)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import azure.functions as func

from shared.idempotency import Context, Effects, Entity, IdempotentConsumer
from shared.idempotency.functions import consumer, on_schedule, shared_store

EVERY, AT = timedelta(days=1), timedelta(hours=6)
bp = func.Blueprint()  # type: ignore[no-untyped-call]  # azure-functions leaves it unannotated

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


@consumer
def reminders_consumer() -> IdempotentConsumer:
    return IdempotentConsumer("reminders", shared_store(), reminder_handler, schema=SCHEMA)


@bp.function_name("daily_reminders")
@bp.timer_trigger(arg_name="timer", schedule="0 0 6 * * *", use_monitor=True)
@bp.retry(strategy="fixed_delay", max_retry_count="3", delay_interval="00:01:00")
def daily_reminders(timer: func.TimerRequest, context: func.Context) -> None:
    on_schedule(reminders_consumer, EVERY, AT, due, context)
