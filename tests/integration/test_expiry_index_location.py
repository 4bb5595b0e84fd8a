"""Where the expiry index lives (stores/_expiry.py), on a real Azurite: in the records table
(DEDUP_TABLE) beside the markers it notes, never in the dead-letter table, and invisible to
what reads the data (scan, the full sweep); and every purge run deletes exactly its budget."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from azure.data.tables import TableClient

from shared.idempotency import Entity
from shared.idempotency.keys import DedupKey, encode_key
from shared.idempotency.messages import utcnow
from shared.idempotency.stores import DeadLetter, TableStore, _expiry
from shared.idempotency.stores._expiry import INDEX
from shared.idempotency.stores._records import GUARD_KIND, MARKER_KIND
from shared.idempotency.testing import dead_letter_table, expiry_index
from shared.idempotency.testing.azurite import Azurite
from tests.conftest import new_table_store


def seed(store: TableStore, expired: int, live: int, prefix: str, now: datetime) -> None:
    """Orders with their final markers: ``expired`` a day ago, ``live`` in a day."""
    for i in range(expired + live):
        key = DedupKey("orders", f"{prefix}-{i}")
        expires = now - timedelta(days=1) if i < expired else now + timedelta(days=1)
        store.commit(key, key.id, "fp", [Entity("order", {"orderId": key.id})], None, expires)


def index_rows(table: TableClient) -> list[str]:
    """The expiry index's hour rows in a table (not its cursor): their partitions."""
    return sorted(e["PartitionKey"] for e in table.list_entities()
                  if e["PartitionKey"].startswith(INDEX) and "Notes" in e)  # fmt: skip


def kinds(store: TableStore) -> dict[str, int]:
    found = {"marker": 0, "guard": 0, "business": 0}
    for item in store.scan():
        found["marker" if item.kind == MARKER_KIND else "guard" if item.kind == GUARD_KIND else "business"] += 1
    return found


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "sdk"])
def test_index_rows_are_in_the_records_table_and_the_dead_letter_table_holds_dead_letters_only(
    azurite: Azurite, lean: bool
) -> None:
    store = new_table_store(azurite, lean=lean)
    now = utcnow()
    seed(store, expired=30, live=20, prefix="o", now=now)
    store.dead_letter(DeadLetter("orders", "invalid_json", "not JSON", b"{", message_id="m-1"))
    assert expiry_index(store).flush() == 2  # one row per hour the markers expire in
    written = {f"{INDEX}{store.table.table_name}|{t:%Y%m%d%H}" for t in (now, utcnow())}  # expired: filed now
    assert not any(e["PartitionKey"].startswith(INDEX) for e in dead_letter_table(store).list_entities())
    assert [e["Reason"] for e in dead_letter_table(store).list_entities()] == ["invalid_json"]
    live = f"{INDEX}{store.table.table_name}|{now + timedelta(days=1):%Y%m%d%H}"
    [expired, still] = index_rows(store.table)
    assert expired in written and still == live
    assert kinds(store) == {"marker": 50, "guard": 50, "business": 50}  # scan: no index row as data

    purge = store.purge_expired(utcnow(), budget=41)
    # exactly the budget: 20 markers with their guards, and a guard whose marker stays noted
    assert (purge.scanned, purge.deleted) == (20, 41)
    assert store.purge_expired(utcnow(), budget=1000).deleted == 19
    assert kinds(store) == {"marker": 20, "guard": 20, "business": 50}
    assert index_rows(store.table) == [live]
    assert [e["Reason"] for e in dead_letter_table(store).list_entities()] == ["invalid_json"]  # not due yet


def test_the_full_sweep_deletes_markers_and_guards_never_the_index_rows(azurite: Azurite) -> None:
    """The sweep's filter is on Kind, which index rows do not have; what it deleted, the
    purge then finds gone, passes over, and deletes the rows that noted it."""
    store = new_table_store(azurite)
    seed(store, expired=5, live=2, prefix="o", now=utcnow())
    expiry_index(store).flush()
    assert store.sweep_expired(utcnow(), 1000).deleted == 10
    assert len(index_rows(store.table)) == 2
    purge = store.purge_expired(utcnow(), 1000)
    assert (purge.scanned, purge.deleted) == (5, 0)
    assert len(index_rows(store.table)) == 1  # the live row
    assert kinds(store) == {"marker": 2, "guard": 2, "business": 7}


def test_a_dead_letter_of_a_long_consumer_name_is_purged_too(azurite: Azurite) -> None:
    """A scope longer than an encoded key holds is stored under "~" and its hash: the dead
    letters' purge, which once stopped below "~" (the index's partitions), passed it over."""
    store = new_table_store(azurite)
    store.dead_letter_retention = timedelta(minutes=10)
    scope = "consumer-" + "x" * 500
    assert encode_key(scope).startswith("~")
    store.dead_letter(DeadLetter(scope, "invalid_json", "not JSON", b"{", message_id="m-1"))
    assert store.purge_expired(utcnow() + timedelta(minutes=11), 100).deleted == 1
    assert list(dead_letter_table(store).list_entities()) == []


@pytest.mark.parametrize(("budget", "expired"), [(1, 3), (7, 20), (25, 13), (49, 13)])
def test_every_run_deletes_exactly_its_budget(
    azurite: Azurite, budget: int, expired: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row purged in part is rewritten with the notes left, for the next run (rows of 25
    notes here, not 250: the same boundaries, a tenth of the records)."""
    monkeypatch.setattr(_expiry, "NOTES_PER_ROW", 25)
    store = new_table_store(azurite)
    now = utcnow()
    for prefix in ("first", "second"):
        seed(store, expired=expired, live=0, prefix=prefix, now=now)
    records, runs = 2 * 2 * expired, list[int]()
    while not runs or runs[-1]:
        runs.append(store.purge_expired(utcnow(), budget).deleted)
    assert runs == [budget] * (records // budget) + ([records % budget] if records % budget else []) + [0]
    assert kinds(store) == {"marker": 0, "guard": 0, "business": 2 * expired}
    assert list(dead_letter_table(store).list_entities()) == []
