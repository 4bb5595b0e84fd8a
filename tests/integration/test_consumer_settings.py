"""A consumer built as the README shows it ("Start your own app") gets the deployed
settings: retention, lease, wait and cache come from the app settings by default."""

from __future__ import annotations

from datetime import timedelta

import pytest

from shared.idempotency import Context, Delivery, Effects, Entity, IdempotentConsumer, Outcome
from shared.idempotency.config import DedupConfig
from shared.idempotency.errors import ConfigurationError
from shared.idempotency.keys import DedupKey
from shared.idempotency.messages import utcnow
from shared.idempotency.stores import TableStore
from tests.functions import app_settings


def on_invoice(invoice: dict[str, float], context: Context) -> Effects:
    return Effects(entities=[Entity("invoice", {"total": invoice["total"]})], result={"ok": True})


def test_the_readme_consumer_keeps_markers_for_the_deployed_retention(table_store: TableStore) -> None:
    with app_settings(DEDUP_RETENTION="P60D", DEDUP_LEASE="PT2M", DEDUP_IN_FLIGHT_WAIT="PT3S"):
        consumer = IdempotentConsumer("invoices", table_store, on_invoice)
        config = DedupConfig.from_settings()
    assert (config.retention, config.steps.lease, config.steps.in_flight_wait) == (
        timedelta(days=60), timedelta(minutes=2), timedelta(seconds=3))  # fmt: skip
    result = consumer.process(Delivery(body=b'{"total": 9.5}', message_id="inv-1"))
    assert result.outcome is Outcome.PROCESSED
    key = DedupKey("invoices", "inv-1")
    marker = table_store.get(key, consumer.partition_of(key))
    assert marker is not None and marker.expires_at > utcnow() + timedelta(days=59)


def test_a_bad_cache_size_is_a_clear_configuration_error() -> None:
    with app_settings(DEDUP_CACHE_SIZE="lots"), pytest.raises(ConfigurationError, match="DEDUP_CACHE_SIZE"):
        DedupConfig.from_settings()
