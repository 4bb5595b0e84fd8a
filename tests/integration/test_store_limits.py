"""What a store can never hold is refused before anything is sent, for that message alone,
and a resubmit's dry run sees the same refusal without writing: Table Storage's limits (a
property of 64 KiB counted in UTF-16, 252 properties, an entity of 1 MiB) on a real Azurite,
Cosmos DB's 2 MB item by its own check."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from shared.idempotency import Context, DedupConfig, Delivery, Effects, Entity, IdempotentConsumer, Outcome
from shared.idempotency.errors import StoreRefused
from shared.idempotency.resubmit import DryRun
from shared.idempotency.stores import CosmosStore, TableStore
from shared.idempotency.testing import transactions_intercepted

TOO_MUCH = {
    "a string over 64 KiB in UTF-16": {"text": "x" * 32_769},
    "non-ASCII text over 64 KiB in UTF-16": {"text": "é" * 32_769},
    "characters past the BMP over 64 KiB in UTF-16 (4 bytes each)": {"text": "\U0001f600" * 16_385},
    "bytes over 64 KiB": {"blob": b"\x00" * 65_537},
    "253 properties": {f"p{i}": i for i in range(253)},
    "an entity over 1 MiB": {f"p{i}": "x" * 30_000 for i in range(18)},
}
FITS = {
    "a string of 64 KiB in UTF-16": {"text": "x" * 32_768},
    "characters past the BMP, 64 KiB in UTF-16": {"text": "\U0001f600" * 16_384},
    "252 properties": {f"p{i}": i for i in range(252)},
}


def writing(data: dict[str, Any]) -> Any:
    def handle(payload: Any, context: Context) -> Effects:
        return Effects([Entity("record", data)])

    return handle


def deliver(store: TableStore, data: dict[str, Any]) -> tuple[IdempotentConsumer, Any]:
    c = IdempotentConsumer("limits", store, writing(data), config=DedupConfig(transient_wait=timedelta(0)))
    return c, c.process(Delivery(b'{"n": 1}', message_id="m-1", delivery_count=1))


@pytest.mark.parametrize("case", list(TOO_MUCH))
def test_an_entity_over_table_storages_limits_is_refused_before_it_is_sent(lean_store: TableStore, case: str) -> None:
    with transactions_intercepted(lean_store) as sent:  # must never be reached
        c, result = deliver(lean_store, TOO_MUCH[case])
        assert (result.outcome, result.reason, sent) == (Outcome.INVALID, "store_refused", [])
        [record] = lean_store.dead_letters("limits")
        assert record.reason == "store_refused" and record.detail == result.detail
        key, partition, _ = c.identify(Delivery(b'{"n": 1}', message_id="m-1"))
        assert lean_store.get(key, partition) is None


@pytest.mark.parametrize("case", list(FITS))
def test_an_entity_at_table_storages_limits_is_stored(lean_store: TableStore, case: str) -> None:
    assert deliver(lean_store, FITS[case])[1].outcome is Outcome.PROCESSED


def test_a_dry_run_refuses_what_the_store_would(lean_store: TableStore) -> None:
    """resubmit --bodies: the store's own limits are known without writing."""
    c = IdempotentConsumer("limits", DryRun(lean_store), writing(TOO_MUCH["an entity over 1 MiB"]),
                           config=DedupConfig(transient_wait=timedelta(0)), record_refusals=False)  # fmt: skip
    result = c.process(Delivery(b'{"n": 1}', message_id="m-2", delivery_count=1))
    assert (result.outcome, result.reason) == (Outcome.INVALID, "store_refused")
    assert list(lean_store.scan()) == []


def test_cosmos_refuses_an_item_over_2_mb_before_sending() -> None:
    cosmos = CosmosStore.__new__(CosmosStore)  # the check reads no server
    cosmos.check_effects([Entity("fits", {"text": "x" * 2_000_000})])
    with pytest.raises(StoreRefused, match="an item holds 2097152"):
        cosmos.check_effects([Entity("big", {"text": "x" * 2_100_000})])
