"""A scheduled job: a payment reminder per customer with an open balance, every day at
06:00 UTC — one per customer and day, even when a restart re-runs the day or a second
instance starts it too (shared.idempotency.jobs)."""

from __future__ import annotations

from datetime import timedelta

import azure.functions as func

from shared.idempotency import IdempotentConsumer
from shared.idempotency.functions import consumer, on_schedule, shared_store
from shared.orders.reminders import SCHEMA, due, reminder_handler

EVERY, AT = timedelta(days=1), timedelta(hours=6)
bp = func.Blueprint()  # type: ignore[no-untyped-call]  # azure-functions leaves it unannotated


@consumer
def reminders_consumer() -> IdempotentConsumer:
    return IdempotentConsumer("reminders", shared_store(), reminder_handler, schema=SCHEMA)


@bp.function_name("daily_reminders")
@bp.timer_trigger(arg_name="timer", schedule="0 0 6 * * *", use_monitor=True)
@bp.retry(strategy="fixed_delay", max_retry_count="3", delay_interval="00:01:00")
def daily_reminders(timer: func.TimerRequest, context: func.Context) -> None:
    on_schedule(reminders_consumer, EVERY, AT, due, context)
