"""Where the expiry index lives (stores/_expiry.py), on a real Azurite: in the records table
(DEDUP_TABLE) beside the markers it notes, never in the dead-letter table, and invisible to
what reads the data (scan, the full sweep); and the upgrade: rows an earlier version kept in
the dead-letter table are drained by the purge, at one read per run while any is left and
none once the purge found them gone."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
from azure.data.tables import TableClient, TableServiceClient

from lab.azurite import Azurite
from shared.idempotency import Entity
from shared.idempotency.keys import DedupKey, encode_key
from shared.idempotency.messages import utcnow
from shared.idempotency.stores import DeadLetter, TableStore
from shared.idempotency.stores._expiry import DRAINED, INDEX
from shared.idempotency.stores._records import GUARD_KIND, MARKER_KIND
from shared.idempotency.testing import dead_letter_table, earlier_expiry_index, expiry_index
from tests.conftest import new_table_store


def seed(store: TableStore, expired: int, live: int, prefix: str, now: datetime) -> None:
    """Orders with their final markers: ``expired`` a day ago, ``live`` in a day."""
    for i in range(expired + live):
        key = DedupKey("orders", f"{prefix}-{i}")
        expires = now - timedelta(days=1) if i < expired else now + timedelta(days=1)
        store.commit(key, key.id, "fp", [Entity("order", {"orderId": key.id})], None, expires)


def seed_the_earlier_way(store: TableStore, expired: int, live: int, prefix: str, now: datetime) -> None:
    """As a version before this one did: the index over the dead-letter table, and its
    cursor there."""
    with earlier_expiry_index(store) as index:
        seed(store, expired, live, prefix, now)
        index.flush()
    cursor = {"PartitionKey": f"{INDEX}{store.table.table_name}|cursor", "RowKey": "cursor"}
    dead_letter_table(store).upsert_entity({**cursor, "Hour": f"{now - timedelta(days=2):%Y%m%d%H}"})


def index_rows(table: TableClient) -> list[str]:
    """The expiry index's hour rows in a table (not its cursor): their partitions."""
    return sorted(e["PartitionKey"] for e in table.list_entities()
                  if e["PartitionKey"].startswith(INDEX) and "Notes" in e)  # fmt: skip


def library_rows(table: TableClient) -> int:
    return sum(e["PartitionKey"].startswith(INDEX) for e in table.list_entities())


def kinds(store: TableStore) -> dict[str, int]:
    found = {"marker": 0, "guard": 0, "business": 0}
    for item in store.scan():
        found["marker" if item.kind == MARKER_KIND else "guard" if item.kind == GUARD_KIND else "business"] += 1
    return found


class Reads:
    """Counts the requests that read the earlier location (the dead-letter table's index range)."""

    def __init__(self) -> None:
        self.earlier = 0

    def __call__(self, request: Any) -> None:
        url = urlsplit(request.http_request.url)
        if request.http_request.method == "GET" and url.path.endswith("dl()") and INDEX in unquote(url.query):
            self.earlier += 1


def counted_store(azurite: Azurite) -> tuple[TableStore, Reads]:
    reads = Reads()
    return new_table_store(azurite, lean=True, hook=reads), reads


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


# -- upgrade: rows an earlier version kept in the dead-letter table ---------------------------


def test_the_purge_drains_the_rows_an_earlier_version_left_in_the_dead_letter_table(azurite: Azurite) -> None:
    store, reads = counted_store(azurite)
    fresh, fresh_reads = counted_store(azurite)  # a store no earlier version wrote to: the baseline
    now = utcnow()
    seed_the_earlier_way(store, expired=30, live=20, prefix="old", now=now)
    dead = dead_letter_table(store)
    assert len(index_rows(dead)) == 2 and library_rows(dead) == 3  # two hours' rows, the cursor
    seed(store, expired=5, live=0, prefix="new", now=now)

    at = utcnow()
    first = store.purge_expired(at, 1000)
    assert (first.scanned, first.deleted, reads.earlier) == (35, 70, 1)  # the earlier rows' 30 and the new 5
    assert index_rows(dead) == [f"{INDEX}{store.table.table_name}|{now + timedelta(days=1):%Y%m%d%H}"]
    assert kinds(store) == {"marker": 20, "guard": 20, "business": 55}
    fresh.purge_expired(at, 1000)
    assert fresh_reads.earlier == 1  # a first run reads the earlier location once, finds nothing, and says so

    # While a row is left that has not fallen due: one read of it per run, nothing more.
    at = utcnow()
    waiting, baseline = store.purge_expired(at, 1000), fresh.purge_expired(at, 1000)
    assert (waiting.deleted, reads.earlier, fresh_reads.earlier) == (0, 2, 1)
    assert waiting.requests == baseline.requests + 1

    # Its markers expire: deleted, then the row, then the earlier cursor (read last).
    later = utcnow() + timedelta(days=2)
    assert store.purge_expired(later, 1000).deleted == 2 * 20
    assert (library_rows(dead), reads.earlier) == (0, 3)
    assert cursor(store)[DRAINED] is False

    # The next run finds the range empty and says so in its cursor row; after that, no read.
    assert store.purge_expired(later, 1000).deleted == 0
    assert (reads.earlier, cursor(store)[DRAINED]) == (4, True)
    for _ in range(2):
        store.purge_expired(later, 1000)
    assert reads.earlier == 4
    assert kinds(store) == {"marker": 0, "guard": 0, "business": 55}
    assert list(dead.list_entities()) == []


def cursor(store: TableStore) -> Any:
    pk = f"{INDEX}{store.table.table_name}|cursor"
    [row] = store.table.query_entities("PartitionKey eq @pk", parameters={"pk": pk})
    return row


@pytest.mark.parametrize(("budget", "expired"), [(1, 3), (7, 130), (250, 130), (499, 130)])
def test_every_run_deletes_exactly_its_budget_across_the_earlier_and_the_new_rows(
    azurite: Azurite, budget: int, expired: int
) -> None:
    """The earlier rows first (a row purged in part is rewritten where it is), then the new."""
    store = new_table_store(azurite)
    now = utcnow()
    seed_the_earlier_way(store, expired=expired, live=0, prefix="old", now=now)
    seed(store, expired=expired, live=0, prefix="new", now=now)
    records, runs = 2 * 2 * expired, list[int]()
    while not runs or runs[-1]:
        runs.append(store.purge_expired(utcnow(), budget).deleted)
    assert runs == [budget] * (records // budget) + ([records % budget] if records % budget else []) + [0]
    assert kinds(store) == {"marker": 0, "guard": 0, "business": 2 * expired}
    assert list(dead_letter_table(store).list_entities()) == []


def test_two_apps_sharing_a_dead_letter_table_each_drain_only_their_own_earlier_rows(azurite: Azurite) -> None:
    service = TableServiceClient.from_connection_string(azurite.connection_string)
    shared = "d" + uuid.uuid4().hex[:12]
    first, second = (TableStore(service, "t" + uuid.uuid4().hex[:12], shared) for _ in range(2))
    now = utcnow()
    for store in (first, second):
        store.create_tables()
        seed_the_earlier_way(store, expired=3, live=0, prefix="old", now=now)
    assert first.purge_expired(utcnow(), 1000).deleted == 6
    assert library_rows(dead_letter_table(second)) == 2  # the second app's row and cursor, untouched
    assert kinds(second)["marker"] == 3
    assert second.purge_expired(utcnow(), 1000).deleted == 6
    assert library_rows(dead_letter_table(second)) == 0
