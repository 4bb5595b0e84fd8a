"""Updates, deletes and single inserts on the lean path, against the Azure SDK on the real
Azurite: the same operations leave the same entities behind; the ETags returned are the ones
the table then holds, in the operations' order; a stale ETag, a missing entity and an
existing one come back as the failure at its index, as the SDK reports them; keys that the
URL must quote (quotes, spaces, non-ASCII, reserved characters) find their entities."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from azure.core import MatchConditions
from azure.core.credentials import AzureNamedKeyCredential
from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceNotFoundError
from azure.data.tables import EdmType, TableClient, TableEntity, TableServiceClient, TableTransactionError, UpdateMode

from shared.idempotency.stores._table_batch import TableTransactions, TransactionFailure
from shared.idempotency.testing import expiry_index

KEYS = ["o'brien", "a b", "é", "x%y+z&(1),=:;@$!*~''", "plain"]
IF_MATCH = MatchConditions.IfNotModified
Build = Callable[[str, dict[str, str]], list[Any]]  # (PartitionKey, ETag by RowKey) -> operations


def row(pk: str, rk: str, **values: Any) -> dict[str, Any]:
    return {"PartitionKey": pk, "RowKey": rk, **values}


def seed(client: TableClient, pk: str) -> dict[str, str]:
    """One entity per key (with a property a replace removes): their ETags by RowKey."""
    return {rk: client.create_entity(row(pk, rk, V=1, Old="old"))["etag"] for rk in KEYS}


def stored(client: TableClient, pk: str) -> list[dict[str, Any]]:
    rows = client.query_entities("PartitionKey eq @pk", parameters={"pk": pk})
    return sorted(({k: v for k, v in r.items() if k != "PartitionKey"} for r in rows), key=lambda r: r["RowKey"])


def replace(etag: str | None = None) -> dict[str, Any]:
    return {"mode": UpdateMode.REPLACE, **({"etag": etag, "match_condition": IF_MATCH} if etag else {})}


def condition(etag: str) -> dict[str, Any]:
    return {"etag": etag, "match_condition": IF_MATCH}


SCENARIOS: dict[str, Build] = {
    "update with etag": lambda pk, etags: [
        ("update", row(pk, rk, V=2, New=rk), replace(etags[rk])) for rk in KEYS],
    "update unconditional": lambda pk, etags: [
        ("update", row(pk, rk, V=3), replace()) for rk in KEYS],
    "delete with etag": lambda pk, etags: [
        ("delete", row(pk, rk), condition(etags[rk])) for rk in KEYS],
    "delete unconditional": lambda pk, etags: [
        ("delete", row(pk, rk)) for rk in KEYS],
    "upsert: insert or replace": lambda pk, etags: [
        *[("upsert", row(pk, rk, V=5), {"mode": UpdateMode.REPLACE}) for rk in KEYS],
        ("upsert", row(pk, "absent'", V=6), {"mode": UpdateMode.REPLACE})],
    "mixed": lambda pk, etags: [
        ("create", row(pk, "new'one", V=9)),
        ("update", row(pk, "o'brien", V=2), replace(etags["o'brien"])),
        ("delete", row(pk, "a b"), condition(etags["a b"])),
        row(pk, "bare é", V=10),  # a bare entity: an insert
        ("update", row(pk, "é", V=4.5), replace()),
        ("delete", row(pk, "plain")),
        ("update", row(pk, "x%y+z&(1),=:;@$!*~''", Flag=True), {"mode": "replace"}),
    ],
}  # fmt: skip


def kind(operation: Any) -> str:
    return "create" if isinstance(operation, dict) else str(operation[0])


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_operations_leave_what_the_sdks_leave_and_return_the_stored_etags(
    table: tuple[TableServiceClient, str], scenario: str
) -> None:
    service, name = table
    client = service.get_table_client(name)
    build = SCENARIOS[scenario]
    lean_ops, sdk_ops = build("lean", seed(client, "lean")), build("sdk", seed(client, "sdk"))
    etags = TableTransactions.of(service, name).submit(lean_ops)
    sdk = client.submit_transaction([op if isinstance(op, tuple) else ("create", op) for op in sdk_ops])

    assert repr(stored(client, "lean")) == repr(stored(client, "sdk"))
    assert isinstance(etags, list) and len(etags) == len(lean_ops)
    assert [bool(etag) for etag in etags] == ["etag" in answer for answer in sdk]  # a delete's answer: none
    for etag, operation in zip(etags, lean_ops, strict=True):
        entity = operation if isinstance(operation, dict) else operation[1]
        if kind(operation) == "delete":
            assert etag == ""
        else:  # in the operations' order: each the ETag its own entity now has
            assert etag == client.get_entity(entity["PartitionKey"], entity["RowKey"]).metadata["etag"]
    # (Azurite's ETags are times to 100 ns: two entities may share one; the order is checked
    # with distinct ETags in test_table_batch.py's test_etags_are_read_in_the_operations_order.)


def test_the_returned_etags_guard_the_next_update(table: tuple[TableServiceClient, str]) -> None:
    service, name = table
    client, lean = service.get_table_client(name), TableTransactions.of(service, name)
    first = lean.submit([row("p", rk, V=1) for rk in KEYS])
    assert isinstance(first, list)
    second = lean.submit([("update", row("p", rk, V=2), replace(etag)) for rk, etag in zip(KEYS, first, strict=True)])
    assert isinstance(second, list) and not set(first) & set(second)
    stale = lean.submit([("update", row("p", KEYS[0], V=3), replace(first[0]))])
    assert isinstance(stale, TransactionFailure) and stale.version_conflict and stale.index == 0
    assert [e["V"] for e in stored(client, "p")] == [2] * len(KEYS)


def test_a_table_entitys_own_etag_is_the_condition(table: tuple[TableServiceClient, str]) -> None:
    """As the SDK: IfNotModified without an etag takes a TableEntity's metadata["etag"]."""
    service, name = table
    client, lean = service.get_table_client(name), TableTransactions.of(service, name)
    seed(client, "p")
    entity: TableEntity = client.get_entity("p", "o'brien")
    entity["V"] = 2
    done = lean.submit([("update", entity, {"mode": UpdateMode.REPLACE, "match_condition": IF_MATCH})])
    assert isinstance(done, list) and done[0] == client.get_entity("p", "o'brien").metadata["etag"]
    stale = lean.submit([("delete", entity, {"match_condition": IF_MATCH})])  # its ETag is now stale
    assert isinstance(stale, TransactionFailure) and stale.version_conflict


def refused_alike(
    service: TableServiceClient, name: str, build: Callable[[str], list[Any]]
) -> tuple[TransactionFailure, TableTransactionError]:
    """(the lean path's failure, the SDK's error) for the same operations on seeded partitions,
    after checking that neither wrote anything."""
    client = service.get_table_client(name)
    seed(client, "lean"), seed(client, "sdk")
    lean_ops, sdk_ops = build("lean"), build("sdk")
    before = stored(client, "lean")
    assert stored(client, "sdk") == before
    failure = TableTransactions.of(service, name).submit(lean_ops)
    with pytest.raises(TableTransactionError) as sdk:
        client.submit_transaction(sdk_ops)
    assert stored(client, "lean") == before and stored(client, "sdk") == before  # nothing written
    assert isinstance(failure, TransactionFailure)
    return failure, sdk.value


def stale(client: TableClient, pk: str, rk: str) -> str:
    """An ETag the entity had before another writer replaced it."""
    etag = str(client.get_entity(pk, rk).metadata["etag"])
    client.update_entity(row(pk, rk, V=7), mode=UpdateMode.REPLACE)
    return etag


@pytest.mark.parametrize("at", [0, 1, 2])
@pytest.mark.parametrize("verb", ["update", "delete"])
def test_a_stale_etag_is_a_version_conflict_at_its_index(
    table: tuple[TableServiceClient, str], verb: str, at: int
) -> None:
    service, name = table
    client = service.get_table_client(name)

    def build(pk: str) -> list[Any]:
        operations: list[Any] = [("create", row(pk, f"n{i}")) for i in range(3)]
        options = condition(stale(client, pk, "o'brien"))
        operations[at] = ("update", row(pk, "o'brien", V=2), {**options, "mode": UpdateMode.REPLACE}) \
            if verb == "update" else ("delete", row(pk, "o'brien"), options)  # fmt: skip
        return operations

    failure, sdk = refused_alike(service, name, build)
    assert (failure.index, failure.status, failure.code) == (at, 412, "UpdateConditionNotSatisfied")
    assert failure.version_conflict and not failure.already_exists and not failure.not_found
    assert (sdk.status_code, sdk.error_code) == (412, "UpdateConditionNotSatisfied")  # type: ignore[attr-defined]
    assert sdk.message.startswith(f"{at}:")


@pytest.mark.parametrize("at", [0, 2])
@pytest.mark.parametrize("operation", ["update", "update with etag", "delete", "delete with etag"])
def test_a_missing_entity_is_not_found_at_its_index(
    table: tuple[TableServiceClient, str], operation: str, at: int
) -> None:
    service, name = table
    etag = "W/\"datetime'2026-11-30T12%3A00%3A00.0000000Z'\""
    forms: dict[str, Callable[[str], tuple[Any, ...]]] = {
        "update": lambda pk: ("update", row(pk, "gone 'é", V=1), replace()),
        "update with etag": lambda pk: ("update", row(pk, "gone 'é", V=1), replace(etag)),
        "delete": lambda pk: ("delete", row(pk, "gone 'é")),
        "delete with etag": lambda pk: ("delete", row(pk, "gone 'é"), condition(etag)),
    }
    missing = forms[operation]

    def build(pk: str) -> list[Any]:
        operations: list[Any] = [("update", row(pk, rk, V=2), replace()) for rk in KEYS[:3]]
        operations[at] = missing(pk)
        return operations

    failure, sdk = refused_alike(service, name, build)
    assert (failure.index, failure.status, failure.code) == (at, 404, "ResourceNotFound")
    assert failure.not_found and not failure.version_conflict
    assert (sdk.status_code, sdk.error_code) == (404, "ResourceNotFound")  # type: ignore[attr-defined]


def test_an_existing_entity_among_updates_is_already_exists(table: tuple[TableServiceClient, str]) -> None:
    service, name = table
    failure, sdk = refused_alike(service, name, lambda pk: [("update", row(pk, "a b", V=2), replace()),
                                                            ("create", row(pk, "é"))])  # fmt: skip
    assert (failure.index, failure.already_exists) == (1, True)
    assert (sdk.status_code, sdk.error_code) == (409, "EntityAlreadyExists")  # type: ignore[attr-defined]


def test_other_refusals_of_updates_still_raise(table: tuple[TableServiceClient, str]) -> None:
    """A property too large in an update: the SDK's status, raised, nothing returned."""
    service, name = table
    client = service.get_table_client(name)
    seed(client, "p")
    huge = [("update", row("p", "é", Big="x" * 40_000), replace())]
    with pytest.raises(HttpResponseError) as lean:
        TableTransactions.of(service, name, retry_total=0).submit(huge)
    with pytest.raises(HttpResponseError) as sdk:
        client.submit_transaction(huge)
    assert lean.value.status_code == sdk.value.status_code == 400
    assert lean.value.error_code == sdk.value.error_code  # type: ignore[attr-defined]


REFUSED: dict[str, Any] = {
    "merge by default": ("update", row("p", "r")),  # the SDK's default mode
    "merge": ("update", row("p", "r"), {"mode": UpdateMode.MERGE}),
    "upsert": ("upsert", row("p", "r")),
    "unknown": ("insert", row("p", "r")),
    "no etag": ("update", row("p", "r"), {"mode": UpdateMode.REPLACE, "match_condition": IF_MATCH}),
    "etag unconditionally": ("delete", row("p", "r"), {"etag": 'W/"x"'}),
    "IfModified": ("delete", row("p", "r"), {"etag": 'W/"x"', "match_condition": MatchConditions.IfModified}),
    "etag with a line break": ("delete", row("p", "r"), {"etag": 'W/"x"\r\nX-Evil: 1', "match_condition": IF_MATCH}),
    "an option": ("create", row("p", "r"), {"timeout": 5}),
    "no RowKey": ("delete", {"PartitionKey": "p"}),
}


@pytest.mark.parametrize("operation", list(REFUSED.values()), ids=list(REFUSED))
def test_operations_the_lean_path_does_not_send_are_refused_before_sending(operation: Any) -> None:
    """A ValueError, never a request (nothing listens at port 1)."""
    lean = TableTransactions("http://127.0.0.1:1/acct", "t", AzureNamedKeyCredential("acct", "a2V5"), retry_total=0)
    with pytest.raises(ValueError):
        lean.submit([operation])


def test_insert_returns_the_etag_and_none_when_the_entity_exists(table: tuple[TableServiceClient, str]) -> None:
    service, name = table
    client, lean = service.get_table_client(name), TableTransactions.of(service, name)
    for rk in KEYS:
        etag = lean.insert(row("lean", rk, V=1, S="é", F=1.5, Big=(2**40, EdmType.INT64)))
        client.create_entity(row("sdk", rk, V=1, S="é", F=1.5, Big=(2**40, EdmType.INT64)))
        assert etag and etag == client.get_entity("lean", rk).metadata["etag"]
        assert lean.insert(row("lean", rk, V=2)) is None
        with pytest.raises(ResourceExistsError):
            client.create_entity(row("sdk", rk, V=2))
    assert repr(stored(client, "lean")) == repr(stored(client, "sdk"))


def test_insert_refusals_raise_as_the_sdks(table: tuple[TableServiceClient, str]) -> None:
    service, name = table
    missing = TableTransactions.of(service, "nosuchtable", retry_total=0)
    with pytest.raises(ResourceNotFoundError) as lean_missing:
        missing.insert(row("p", "r"))
    with pytest.raises(ResourceNotFoundError) as sdk_missing:
        service.get_table_client("nosuchtable").create_entity(row("p", "r"))
    assert lean_missing.value.status_code == sdk_missing.value.status_code == 404
    assert lean_missing.value.error_code == "TableNotFound"  # type: ignore[attr-defined]

    huge = row("p", "r", Big="x" * 40_000)
    with pytest.raises(HttpResponseError) as lean_huge:
        TableTransactions.of(service, name, retry_total=0).insert(huge)
    with pytest.raises(HttpResponseError) as sdk_huge:
        service.get_table_client(name).create_entity(huge)
    assert type(lean_huge.value) is type(sdk_huge.value) is HttpResponseError
    assert lean_huge.value.status_code == sdk_huge.value.status_code == 400
    assert lean_huge.value.error_code == "PropertyValueTooLarge"  # type: ignore[attr-defined]


def test_every_write_of_a_lean_store_goes_through_its_transport(table: tuple[TableServiceClient, str]) -> None:
    """Issue 58: commits, completions, changed state, the outbox's rows and their deletes, the
    dead-letter records (one entity, and one cut in parts), the purge and the sweep: the SDK's
    client of the store only reads."""
    from datetime import timedelta

    from shared.idempotency import Entity
    from shared.idempotency.keys import DedupKey
    from shared.idempotency.messages import utcnow
    from shared.idempotency.reasons import Reason
    from shared.idempotency.stores import MAX_DEAD_LETTER_BODY, DeadLetter, Marker, State, TableStore

    service, name = table
    sdk_writes: list[str] = []

    def sdk(request: Any) -> None:
        if request.http_request.method != "GET":
            sdk_writes.append(f"{request.http_request.method} {request.http_request.url}")

    watched = TableServiceClient(service.url, credential=service.credential, raw_request_hook=sdk)
    store = TableStore(watched, name, name + "dl", transactions=TableTransactions.of(service, name))
    watched.create_table_if_not_exists(name + "dl")
    sdk_writes.clear()
    past = utcnow() - timedelta(hours=2)
    store.commit(DedupKey("c", "k-1"), "p", "fp", [Entity("e", {"v": 1})], None, past)  # expired: purged
    claim = store.insert(Marker(DedupKey("c", "k-2", "step"), "p", State.IN_PROGRESS, "fp", utcnow(),
                                utcnow() + timedelta(days=1), lease_until=utcnow(), owner="o"))  # fmt: skip
    assert claim is not None
    store.complete(claim, {"done": True})
    store.upsert_if_newer("p", Entity("state", {"s": 1}), 1)
    store.upsert_if_newer("p", Entity("state", {"s": 2}), 2)
    store.put_entity("p", Entity("~outbox|a", {"x": 1}))
    store.put_entity("p", Entity("~outbox|a", {"x": 2}))
    store.delete_entities("p", ["~outbox|a", "~outbox|gone"])
    for body in (b"small", b"x" * MAX_DEAD_LETTER_BODY):  # one entity; the record and its parts
        store.dead_letter(DeadLetter("c", Reason.INVALID_JSON, "bad", body))
    expiry_index(store).flush()
    store.purge_expired(utcnow(), 100)
    store.sweep_expired(utcnow(), 100)
    assert sdk_writes == []
    assert [d.body for d in store.dead_letters("c")] != []
