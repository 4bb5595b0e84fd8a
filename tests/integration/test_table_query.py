"""The lean transport's query (``TableTransactions.query``) reads what the SDK's
``query_entities`` reads, on the real Azurite: the same rows, in the same order, each
property of the same value and type (Int64 as EntityProperty, times with the service's own
text), the same etag and timestamp; parameters that hold quotes and percent signs match
what they say and nothing else; pages past 1,000 rows are followed; a missing table
raises the SDK's class with its code."""

from __future__ import annotations

import math
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables import EdmType, EntityProperty, TableClient

from shared.idempotency.stores import TableStore
from shared.idempotency.stores._azure import error_code
from shared.idempotency.stores._table_batch import TableTransactions
from shared.idempotency.stores._table_query import substituted
from shared.idempotency.testing.azurite import Azurite
from tests.conftest import new_table_store

BETWEEN = "PartitionKey eq @pk and RowKey ge @low and RowKey lt @high"


def both(store: TableStore, query: str, parameters: dict[str, str], limit: int = 1000) -> tuple[list[Any], list[Any]]:
    lean = store._transactions
    assert isinstance(lean, TableTransactions)
    sdk = list(store.table.query_entities(query, parameters=parameters))[:limit]
    return lean.query(query, parameters, limit), sdk


def same(lean: list[Any], sdk: list[Any]) -> None:
    assert [dict(row) for row in lean] == [dict(row) for row in sdk]
    for mine, theirs in zip(lean, sdk, strict=True):
        assert mine.metadata == theirs.metadata
        for name, value in theirs.items():
            assert type(mine[name]).__mro__[1:] == type(value).__mro__[1:] or type(mine[name]) is type(value), name
            if isinstance(value, EntityProperty):
                assert (mine[name].value, mine[name].edm_type) == (value.value, value.edm_type)
            if isinstance(value, datetime):
                assert mine[name].tables_service_value == getattr(value, "tables_service_value")  # noqa: B009


@pytest.fixture
def store(azurite: Azurite) -> TableStore:
    made = new_table_store(azurite, lean=True)
    made.create_tables()
    return made


def test_every_type_the_store_writes_reads_back_as_the_sdk_reads_it(store: TableStore) -> None:
    table: TableClient = store.table
    table.create_entity({"PartitionKey": "p", "RowKey": "a", "Text": "é'\"%", "Small": 7,
                         "Typed": EntityProperty(5, EdmType.INT64), "Real": 1.5, "Whole": 2.0, "Nan": math.nan,
                         "Inf": -math.inf, "Yes": True, "When": datetime(2026, 1, 2, 3, 4, 5, 678901, UTC),
                         "Blob": b"\x00\xff", "Id": uuid.UUID(int=42)})  # fmt: skip
    table.create_entity({"PartitionKey": "p", "RowKey": "b"})  # no property of its own
    lean, sdk = both(store, "PartitionKey eq @pk", {"pk": "p"})
    assert len(lean) == 2 and math.isnan(lean[0].pop("Nan")) and math.isnan(sdk[0].pop("Nan"))
    same(lean, sdk)


def test_a_time_the_service_wrote_keeps_its_own_text(store: TableStore) -> None:
    store.table.create_entity({"PartitionKey": "p", "RowKey": "t", "When": datetime(2026, 1, 2, tzinfo=UTC)})
    [lean], [sdk] = both(store, "PartitionKey eq @pk", {"pk": "p"})
    assert lean.metadata["timestamp"] == sdk.metadata["timestamp"]  # the service's 7-digit text, cut alike
    assert lean.metadata["timestamp"].tables_service_value == sdk.metadata["timestamp"].tables_service_value
    same([lean], [sdk])


@pytest.mark.parametrize("key", ["o'brien", "%7Eoutbox|x", "a b", "' or RowKey ne '", "é"])
def test_a_parameter_matches_its_own_text_only(store: TableStore, key: str) -> None:
    for row in (key, key + "x", "other"):
        store.table.create_entity({"PartitionKey": key, "RowKey": row})
    lean, sdk = both(store, "PartitionKey eq @pk and RowKey eq @rk", {"pk": key, "rk": key})
    assert [row["RowKey"] for row in lean] == [key]
    same(lean, sdk)
    lean, sdk = both(store, BETWEEN, {"pk": key, "low": key, "high": key + "~"})
    assert [row["RowKey"] for row in lean] == [key, key + "x"]
    same(lean, sdk)


def test_pages_past_a_thousand_rows_are_followed_up_to_the_limit(store: TableStore) -> None:
    lean_writes = store._transactions
    for start in range(0, 1005, 100):
        lean_writes.submit([{"PartitionKey": "p", "RowKey": f"{n:05}"} for n in range(start, min(start + 100, 1005))])
    for limit in (3, 1000, 1003, 2000):
        lean, sdk = both(store, BETWEEN, {"pk": "p", "low": "", "high": "~"}, limit)
        assert len(lean) == min(limit, 1005)
        same(lean, sdk)


def test_a_missing_table_raises_the_sdks_class_and_code(store: TableStore) -> None:
    missing = store._service.get_table_client("missing" + uuid.uuid4().hex[:12])
    with pytest.raises(ResourceNotFoundError) as sdk:
        list(missing.query_entities("PartitionKey eq @pk", parameters={"pk": "p"}))
    with pytest.raises(ResourceNotFoundError) as lean:
        store._transactions.sibling(missing).query("PartitionKey eq @pk", {"pk": "p"}, 10)
    assert (lean.value.status_code, error_code(lean.value)) == (sdk.value.status_code, error_code(sdk.value))


def test_only_text_parameters_are_substituted() -> None:
    assert substituted("RowKey eq @r and X eq @x", {"r": "it's", "x": "@r"}) == "RowKey eq 'it''s' and X eq '@r'"
    with pytest.raises(TypeError, match="text"):
        substituted("N eq @n", {"n": 5})  # type: ignore[dict-item]
