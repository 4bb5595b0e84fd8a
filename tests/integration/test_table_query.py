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
from azure.data.tables import EdmType, EntityProperty, TableClient, TableServiceClient

from shared.idempotency.stores import TableStore
from shared.idempotency.stores._azure import error_code
from shared.idempotency.stores._table_batch import TableTransactions
from shared.idempotency.stores._table_query import substituted
from shared.idempotency.testing.azurite import Azurite
from tests.conftest import new_table_store

BETWEEN = "PartitionKey eq @pk and RowKey ge @low and RowKey lt @high"


def both(lean: TableTransactions, store: TableStore, query: str, parameters: dict[str, str],
         limit: int = 1000) -> tuple[list[Any], list[Any]]:  # fmt: skip
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


@pytest.fixture
def service(azurite: Azurite) -> TableServiceClient:
    return TableServiceClient.from_connection_string(azurite.connection_string)


@pytest.fixture
def lean(service: TableServiceClient, store: TableStore) -> TableTransactions:
    """The lean path on the store's table, built as the store builds it (from the account)."""
    return TableTransactions.of(service, store.table.table_name)


def test_every_type_the_store_writes_reads_back_as_the_sdk_reads_it(store: TableStore, lean: TableTransactions) -> None:
    table: TableClient = store.table
    table.create_entity({"PartitionKey": "p", "RowKey": "a", "Text": "é'\"%", "Small": 7,
                         "Typed": EntityProperty(5, EdmType.INT64), "Real": 1.5, "Whole": 2.0, "Nan": math.nan,
                         "Inf": -math.inf, "Yes": True, "When": datetime(2026, 1, 2, 3, 4, 5, 678901, UTC),
                         "Blob": b"\x00\xff", "Id": uuid.UUID(int=42)})  # fmt: skip
    table.create_entity({"PartitionKey": "p", "RowKey": "b"})  # no property of its own
    read, sdk = both(lean, store, "PartitionKey eq @pk", {"pk": "p"})
    assert len(read) == 2 and math.isnan(read[0].pop("Nan")) and math.isnan(sdk[0].pop("Nan"))
    same(read, sdk)


def test_a_time_the_service_wrote_keeps_its_own_text(store: TableStore, lean: TableTransactions) -> None:
    store.table.create_entity({"PartitionKey": "p", "RowKey": "t", "When": datetime(2026, 1, 2, tzinfo=UTC)})
    [read], [sdk] = both(lean, store, "PartitionKey eq @pk", {"pk": "p"})
    assert read.metadata["timestamp"] == sdk.metadata["timestamp"]  # the service's 7-digit text, cut alike
    assert read.metadata["timestamp"].tables_service_value == sdk.metadata["timestamp"].tables_service_value
    same([read], [sdk])


@pytest.mark.parametrize("key", ["o'brien", "%7Eoutbox|x", "a b", "' or RowKey ne '", "é"])
def test_a_parameter_matches_its_own_text_only(store: TableStore, lean: TableTransactions, key: str) -> None:
    for row in (key, key + "x", "other"):
        store.table.create_entity({"PartitionKey": key, "RowKey": row})
    read, sdk = both(lean, store, "PartitionKey eq @pk and RowKey eq @rk", {"pk": key, "rk": key})
    assert [row["RowKey"] for row in read] == [key]
    same(read, sdk)
    read, sdk = both(lean, store, BETWEEN, {"pk": key, "low": key, "high": key + "~"})
    assert [row["RowKey"] for row in read] == [key, key + "x"]
    same(read, sdk)


def test_pages_past_a_thousand_rows_are_followed_up_to_the_limit(store: TableStore, lean: TableTransactions) -> None:
    for start in range(0, 1005, 100):
        lean.submit([{"PartitionKey": "p", "RowKey": f"{n:05}"} for n in range(start, min(start + 100, 1005))])
    for limit in (3, 1000, 1003, 2000):
        read, sdk = both(lean, store, BETWEEN, {"pk": "p", "low": "", "high": "~"}, limit)
        assert len(read) == min(limit, 1005)
        same(read, sdk)


def test_a_missing_table_raises_the_sdks_class_and_code(service: TableServiceClient, lean: TableTransactions) -> None:
    missing = service.get_table_client("missing" + uuid.uuid4().hex[:12])
    with pytest.raises(ResourceNotFoundError) as sdk:
        list(missing.query_entities("PartitionKey eq @pk", parameters={"pk": "p"}))
    with pytest.raises(ResourceNotFoundError) as ours:
        lean.sibling(missing).query("PartitionKey eq @pk", {"pk": "p"}, 10)
    assert (ours.value.status_code, error_code(ours.value)) == (sdk.value.status_code, error_code(sdk.value))


def test_only_text_parameters_are_substituted() -> None:
    assert substituted("RowKey eq @r and X eq @x", {"r": "it's", "x": "@r"}) == "RowKey eq 'it''s' and X eq '@r'"
    with pytest.raises(TypeError, match="text"):
        substituted("N eq @n", {"n": 5})  # type: ignore[dict-item]
