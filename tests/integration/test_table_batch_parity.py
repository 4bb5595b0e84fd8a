"""The lean transaction path and the Azure SDK's ``submit_transaction`` classify every answer
to a ``$batch`` alike, as the store consumes them (its submit, ``testing.submit_transaction``,
inside store_errors, the seam where both paths' results and errors meet): the same operations
applied with the same ETags, the same refused operation (index, status, code) returned for
the caller to decide on, or the same exception once the store has mapped it
(StoreUnavailable, StoreRefused, or the same HttpResponseError class with the same status
and code).

Each answer is fed to both paths by one local server, for four kinds of transaction (inserts,
replaces, deletes, and a commit's mix: inserts then a step's completion), since the operation
at the failing index must not change the reading. Where the answers come from:

- real, transcribed to the bytes that matter (request ids, dates and long entity bodies cut):
  Azure Table Storage's 404 TableNotFound changeset (Azure/azure-sdk-for-js,
  sdk/tables/data-tables/recordings/node/batch_operations_sasconnectionstring/
  recording_should_handle_sub_request_error.js); its 409 EntityAlreadyExists at index 1 with a
  Content-ID, its success with Content-IDs and a delete answered without an ETag, and its
  top-level 403 in namespaced OData XML (gluwer/azure-table-node, test/test-batch.js, recorded
  from the service); Cosmos DB's Table API answering with LF-only line breaks and a Content-ID
  (Azure/azure-sdk-for-net issue #14272, its entity body shortened);
- synthetic, in the same wire format, for every other status a changeset answer can carry:
  400 (data, deployment), 403 (JSON, XML, header only), 404 for a missing entity at any
  operation and for a missing table, 409 at index 3 or without an index, 412 with and without
  an index or code, 413 (in the changeset and for the whole request), 500/503, Cosmos's error
  part with LF-only line breaks, and answers that are not a changeset at all.

Then what the store makes of them: a delete of an entity already gone is done whether or not
the service names its index (the purge and the sweep race other instances), and a write into a
missing table — Table Storage's TableNotFound, Cosmos DB's Table API's ResourceNotFound for a
write that creates — is a configuration error naming the table. The end of the file runs the
same classification against the real Azurite: an update or a delete of a missing entity inside
a transaction, and a transaction on a missing table."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest
from azure.core import MatchConditions
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.data.tables import TableTransactionError, UpdateMode

from shared.idempotency.errors import ConfigurationError, DedupError, StoreRefused, StoreUnavailable
from shared.idempotency.keys import DedupKey
from shared.idempotency.messages import Entity, utcnow
from shared.idempotency.stores import Commit, DeadLetter, TableStore
from shared.idempotency.stores._azure import error_code, store_errors
from shared.idempotency.stores._expiry import Note
from shared.idempotency.stores._settings import table_store
from shared.idempotency.stores._table_batch import TransactionFailure
from shared.idempotency.stores._table_purge import delete_noted
from shared.idempotency.testing import commits_lean, submit_transaction
from shared.idempotency.testing.azurite import Azurite
from tests.integration.canned import Canned, canned_server

ACCOUNT = "devstoreaccount1", "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
JSON = "application/json;odata=minimalmetadata;streaming=true;charset=utf-8"
ETAG = "W/\"datetime'2026-11-30T12%3A00%3A00.0000000Z'\""
Answer = tuple[int, dict[str, str], bytes]


def entity(rk: str, pk: str = "p") -> dict[str, Any]:
    return {"PartitionKey": pk, "RowKey": rk, "V": 1}


AT_VERSION = {"mode": UpdateMode.REPLACE, "etag": ETAG, "match_condition": MatchConditions.IfNotModified}
# Four operations each, as the store sends them: bare entities are inserts.
TRANSACTIONS: dict[str, list[Any]] = {
    "inserts": [entity(f"r{i}") for i in range(4)],
    "replaces": [("update", entity(f"r{i}"), AT_VERSION) for i in range(4)],
    "deletes": [("delete", entity(f"r{i}"), {"etag": ETAG, "match_condition": MatchConditions.IfNotModified})
                for i in range(4)],
    "commit": [entity("guard"), entity("marker"), entity("order"), ("update", entity("step"), AT_VERSION)],
}  # fmt: skip


def odata(code: str, message: str) -> bytes:
    return json.dumps({"odata.error": {"code": code, "message": {"lang": "en-US", "value": message}}}).encode()


def changeset(*parts: tuple[str, str, bytes], eol: str = "\r\n") -> Answer:
    """A 202 whose changeset holds ``parts``: (status line, part headers, body), the service's shape."""
    batch, change = "batchresponse_5d3c4a5e", "changesetresponse_8c9d6308"
    lines = [f"--{batch}{eol}Content-Type: multipart/mixed; boundary={change}{eol}{eol}"]
    for status, headers, body in parts:
        lines.append(f"--{change}{eol}Content-Type: application/http{eol}Content-Transfer-Encoding: binary{eol}{eol}"
                     f"HTTP/1.1 {status}{eol}{headers.replace(chr(10), eol)}{eol}")  # fmt: skip
        lines.append(body.decode() + eol)
    lines.append(f"--{change}--{eol}--{batch}--{eol}")
    return 202, {"Content-Type": f"multipart/mixed; boundary={batch}"}, "".join(lines).encode()


def refused_part(status: str, code: str, message: str, *, content_id: str = "") -> tuple[str, str, bytes]:
    """One refused operation as Azure Table Storage answers it (JSON error body)."""
    headers = (f"Content-ID: {content_id}\n" if content_id else "") + (
        f"X-Content-Type-Options: nosniff\nCache-Control: no-cache\nDataServiceVersion: 3.0;\nContent-Type: {JSON}\n"
    )
    return status, headers, odata(code, message)


def whole(status: int, code: str | None, body: bytes, content_type: str | None = JSON) -> Answer:
    """A refusal of the whole request (not a changeset)."""
    headers = {"x-ms-request-id": "5d3c4a5e", "x-ms-version": "2019-02-02"}
    if code:
        headers["x-ms-error-code"] = code
    if content_type:
        headers["Content-Type"] = content_type
    return status, headers, body


TRACE = "\nRequestId:5d3c4a5e-0002-0063-1b4a-3c5f8e000000\nTime:2026-11-30T12:30:15.1234567Z"
EXISTS, MISSING = "The specified entity already exists.", "The specified resource does not exist."
CONDITION = "The update condition specified in the request was not satisfied."
DENIED = "This request is not authorized to perform this operation using this permission."
APPLIED = "X-Content-Type-Options: nosniff\nCache-Control: no-cache\nDataServiceVersion: 3.0;\n"
SUCCESS = [("204 No Content", f"Content-ID: {i}\n{APPLIED}ETag: {ETAG}\n", b"") for i in range(4)]
COSMOS_CREATED = [("201 Created", f'ETag: W/"datetime\'2020-08-17T18%3A43%3A01.012788{i}Z\'"\nContent-Type: '
                   f"application/json\nContent-ID: {i + 1}\n", b'{"odata.etag":"x","PartitionKey":"p"}')
                  for i in range(4)]  # fmt: skip
ODATA_XML = (
    b'<?xml version="1.0" encoding="utf-8"?><m:error xmlns:m="http://schemas.microsoft.com/ado/2007/08/'
    b'dataservices/metadata"><m:code>AuthenticationFailed</m:code><m:message xml:lang="en-US">Server failed '
    b"to authenticate the request. Make sure the value of Authorization header is formed correctly "
    b"including the signature.\nRequestId:1c91350d\nTime:2014-01-31T10:29:42.3593193Z</m:message></m:error>"
)
STORAGE_XML = (b'<?xml version="1.0" encoding="utf-8"?><Error><Code>AuthorizationPermissionMismatch</Code>'
               b"<Message>0:" + DENIED.encode() + b"</Message></Error>")  # fmt: skip

ANSWERS: dict[str, Answer] = {
    # -- real (see the module's docstring) --
    "real: success, Content-IDs, a delete without ETag": changeset(
        *SUCCESS[:3], ("204 No Content", f"Content-ID: 3\n{APPLIED}", b"")),
    "real: 409 at 1 with a Content-ID": changeset(refused_part("409 Conflict", "EntityAlreadyExists",
                                                               f"1:{EXISTS}{TRACE}", content_id="1")),
    "real: 404 TableNotFound": changeset(refused_part("404 Not Found", "TableNotFound",
                                                      f"0:The table specified does not exist.{TRACE}")),
    "real: 403 OData XML for the whole request": whole(403, None, ODATA_XML, "application/xml"),
    "real: Cosmos LF-only success": changeset(*COSMOS_CREATED, eol="\n"),
    # -- synthetic, in the same wire format --
    "409 at 3": changeset(refused_part("409 Conflict", "EntityAlreadyExists", f"3:{EXISTS}{TRACE}")),
    "409 without an index": changeset(refused_part("409 Conflict", "EntityAlreadyExists", EXISTS)),
    "409 another code": changeset(refused_part("409 Conflict", "TableBeingDeleted",
                                               "0:The specified table is being deleted.")),
    "412 at 2": changeset(refused_part("412 Precondition Failed", "UpdateConditionNotSatisfied", f"2:{CONDITION}")),
    "412 without index or code": changeset(("412 Precondition Failed", APPLIED, CONDITION.encode())),
    "404 missing entity at 0": changeset(refused_part("404 Not Found", "ResourceNotFound", f"0:{MISSING}{TRACE}")),
    "404 missing entity at 1": changeset(refused_part("404 Not Found", "ResourceNotFound", f"1:{MISSING}")),
    "404 missing entity at 3": changeset(refused_part("404 Not Found", "ResourceNotFound", f"3:{MISSING}")),
    "404 missing entity without an index": changeset(refused_part("404 Not Found", "ResourceNotFound", MISSING)),
    "404 missing table at 2": changeset(refused_part("404 Not Found", "TableNotFound",
                                                     "2:The table specified does not exist.")),
    "400 data at 1": changeset(refused_part("400 Bad Request", "PropertyValueTooLarge",
                                            "1:The property value exceeds the maximum allowed size (64KB).")),
    "400 duplicate row": changeset(refused_part("400 Bad Request", "InvalidDuplicateRow",
                                                "1:The batch request contains multiple changes with same row key.")),
    "400 deployment": changeset(refused_part("400 Bad Request", "InvalidInput", "0:One of the request inputs is "
                                                                                "not valid.")),
    "403 JSON in the changeset": changeset(refused_part("403 Forbidden", "AuthorizationPermissionMismatch",
                                                        f"0:{DENIED}")),
    "403 XML in the changeset": changeset(("403 Forbidden", "Content-Type: application/xml\n", STORAGE_XML)),
    "403 header only in the changeset": changeset(("403 Forbidden", "x-ms-error-code: AuthorizationFailure\n",
                                                   b"")),
    "413 in the changeset": changeset(refused_part("413 Request Entity Too Large", "RequestBodyTooLarge",
                                                   "0:The request body is too large.")),
    "500 in the changeset": changeset(refused_part("500 Internal Server Error", "InternalError", "0:Try again.")),
    "503 in the changeset": changeset(refused_part("503 Service Unavailable", "ServerBusy", "0:busy")),
    "Cosmos LF-only 409 at 2": changeset(("409 Conflict", "Content-Type: application/json;odata=minimalmetadata\n",
                                          odata("EntityAlreadyExists", f"2:{EXISTS}\nRequestID:c1")), eol="\n"),
    "Cosmos LF-only 404 missing entity": changeset(("404 Not Found", f"Content-Type: {JSON}\n",
                                                    odata("ResourceNotFound", f"1:{MISSING}")), eol="\n"),
    "400 for the whole request": whole(400, "InvalidInput", odata("InvalidInput", "One of the input values is "
                                                                                   "invalid.")),
    "404 ResourceNotFound for the whole request": whole(404, "ResourceNotFound", odata("ResourceNotFound", MISSING)),
    "404 TableNotFound for the whole request": whole(404, "TableNotFound",
                                                     odata("TableNotFound", "The table specified does not exist.")),
    "409 for the whole request": whole(409, "EntityAlreadyExists", odata("EntityAlreadyExists", EXISTS)),
    "412 for the whole request": whole(412, "ConditionNotMet", odata("ConditionNotMet", CONDITION)),
    "413 for the whole request": whole(413, "RequestBodyTooLarge", odata("RequestBodyTooLarge", "too large")),
    "503 for the whole request": whole(503, "ServerBusy", odata("ServerBusy", "busy")),
    "202 that is not a changeset": (202, {"Content-Type": "text/html"}, b"<html>busy</html>"),
    "a changeset answering 2 of 4 operations": changeset(*SUCCESS[:2]),
    "an empty changeset": changeset(),
}  # fmt: skip


def app_stores(connection: str, table: str) -> dict[str, TableStore]:
    """A store per path, built as the app builds it (DEDUP_TABLE_TRANSACTIONS sdk and lean)."""
    found = {}
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DEDUP_STORAGE_CONNECTION", connection)
        for path in ("sdk", "lean"):
            env.setenv("DEDUP_TABLE_TRANSACTIONS", path)
            store = table_store(table, table + "dl", create=False)
            assert isinstance(store, TableStore) and commits_lean(store) == (path == "lean")
            found[path] = store
    return found


@pytest.fixture(scope="module")
def stores() -> Iterator[tuple[Canned, dict[str, TableStore]]]:
    """One server, and a store on it per path (the SDK's submit_transaction, the lean one)."""
    name, key = ACCOUNT
    with canned_server() as server:
        yield server, app_stores(f"DefaultEndpointsProtocol=http;AccountName={name};AccountKey={key};"
                                 f"TableEndpoint=http://127.0.0.1:{server.server_port}/{name};", "orders")  # fmt: skip


def classified(store: TableStore, operations: list[Any]) -> tuple[Any, ...]:
    """What the store makes of a transaction's answer: applied (the ETags), refused for the
    caller to decide on (index, status, code), or the exception the store raises."""
    try:
        with store_errors():
            answer = submit_transaction(store, list(operations))
    except DedupError as exc:  # mapped by the store: the class is the outcome
        return ("raised", type(exc))
    except HttpResponseError as exc:  # passed through: its class, status and code
        return ("raised", type(exc), exc.status_code, error_code(exc) or None)
    except Exception as exc:  # noqa: BLE001 - anything else escapes the store as it is
        return ("raised", type(exc))
    if isinstance(answer, TransactionFailure):
        return ("refused", answer.index, answer.status, answer.code)
    return ("applied", *answer)


@pytest.mark.parametrize("transaction", list(TRANSACTIONS))
@pytest.mark.parametrize("name", list(ANSWERS))
def test_both_paths_classify_each_answer_alike(
    stores: tuple[Canned, dict[str, TableStore]], name: str, transaction: str
) -> None:
    server, by_path = stores
    server.answer = ANSWERS[name]
    sdk, lean = (classified(by_path[path], TRANSACTIONS[transaction]) for path in ("sdk", "lean"))
    assert lean == sdk


# What each answer means to the store, whatever the transaction (pinned: a change in the SDK shows here).
TABLE_NOT_FOUND = ("raised", TableTransactionError, 404, "TableNotFound")
EXPECTED: dict[str, tuple[Any, ...]] = {
    "real: 409 at 1 with a Content-ID": ("refused", 1, 409, "EntityAlreadyExists"),
    "real: 404 TableNotFound": TABLE_NOT_FOUND,
    "real: 403 OData XML for the whole request": ("raised", StoreUnavailable),
    "409 at 3": ("refused", 3, 409, "EntityAlreadyExists"),
    "409 without an index": ("refused", None, 409, "EntityAlreadyExists"),
    "409 another code": ("raised", TableTransactionError, 409, "TableBeingDeleted"),
    "412 at 2": ("refused", 2, 412, "UpdateConditionNotSatisfied"),
    "412 without index or code": ("raised", TableTransactionError, 412, None),
    "404 missing entity at 0": ("refused", 0, 404, "ResourceNotFound"),
    "404 missing entity at 3": ("refused", 3, 404, "ResourceNotFound"),
    "404 missing entity without an index": ("refused", None, 404, "ResourceNotFound"),
    "404 missing table at 2": TABLE_NOT_FOUND,
    "400 data at 1": ("raised", StoreRefused),
    "400 deployment": ("raised", StoreUnavailable),
    "403 JSON in the changeset": ("raised", StoreUnavailable),
    "403 XML in the changeset": ("raised", StoreUnavailable),
    "413 in the changeset": ("raised", StoreRefused),
    "413 for the whole request": ("raised", StoreRefused),
    "503 in the changeset": ("raised", StoreUnavailable),
    "Cosmos LF-only 409 at 2": ("refused", 2, 409, "EntityAlreadyExists"),
    "Cosmos LF-only 404 missing entity": ("refused", 1, 404, "ResourceNotFound"),
    "404 TableNotFound for the whole request": ("raised", ResourceNotFoundError, 404, "TableNotFound"),
    "202 that is not a changeset": ("raised", StoreUnavailable),
    "a changeset answering 2 of 4 operations": ("raised", StoreUnavailable),
    "an empty changeset": ("raised", StoreUnavailable),
}


# A "not found" of a write that creates (an insert, at the index named or at every operation when
# none is): no entity was missing, the table was (Cosmos DB's Table API answers a missing table so):
# it raises as a missing table does, never a decision. Where the transaction differs, by transaction.
COSMOS_MISSING_TABLE = ("raised", TableTransactionError, 404, "ResourceNotFound")
BY_TRANSACTION: dict[str, dict[str, tuple[Any, ...]]] = {
    "404 missing entity at 0": {"inserts": COSMOS_MISSING_TABLE, "commit": COSMOS_MISSING_TABLE},
    "404 missing entity at 3": {"inserts": COSMOS_MISSING_TABLE},
    "404 missing entity without an index": {"inserts": COSMOS_MISSING_TABLE},
    "Cosmos LF-only 404 missing entity": {"inserts": COSMOS_MISSING_TABLE, "commit": COSMOS_MISSING_TABLE},
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_each_answer_means_what_the_store_expects(stores: tuple[Canned, dict[str, TableStore]], name: str) -> None:
    server, by_path = stores
    server.answer = ANSWERS[name]
    for path, store in by_path.items():
        for kind, transaction in TRANSACTIONS.items():
            assert classified(store, transaction) == BY_TRANSACTION.get(name, {}).get(kind, EXPECTED[name]), path


@pytest.mark.parametrize("name", ["404 missing entity without an index", "404 missing entity at 1",
                                  "Cosmos LF-only 404 missing entity"])  # fmt: skip
def test_deleting_what_another_instance_deleted_first_is_no_error(
    stores: tuple[Canned, dict[str, TableStore]], name: str
) -> None:
    """The purge and the sweep race other instances: a delete of an entity already gone is
    answered 404, with the operation's index or (as Azure answers it) without: done either way."""
    server, by_path = stores
    server.answer = ANSWERS[name]
    for store in by_path.values():
        before = server.received
        store.delete_entities("p", ["gone", "gone too", "gone as well"])
        alone = name == "404 missing entity without an index"  # which one? each on its own
        assert server.received - before == (1 + 3 if alone else 3), name  # an index: each left out in turn


@pytest.mark.parametrize(("name", "requests"), [("404 missing entity without an index", 1 + 4),
                                               ("412 without an index", 1 + 2)])  # fmt: skip
def test_the_purge_deletes_each_marker_alone_when_the_service_does_not_say_which_failed(
    stores: tuple[Canned, dict[str, TableStore]], name: str, requests: int
) -> None:
    """Two noted markers and their guards in one transaction, refused without an index: each
    delete goes alone — one gone is passed over, one rewritten (412) keeps its guard — rather than
    the whole partition left to the weekly sweep."""
    server, by_path = stores
    rewritten = changeset(refused_part("412 Precondition Failed", "UpdateConditionNotSatisfied", CONDITION))
    server.answer = ANSWERS.get(name) or rewritten
    notes = [Note("p", "m1", ETAG, "g1"), Note("p", "m2", ETAG, "g2")]
    for store in by_path.values():
        assert delete_noted(partial(submit_transaction, store), "p", notes) == (0, requests)


@pytest.mark.parametrize(("name", "write"), [
    ("Cosmos LF-only 404 missing entity", "a commit"), ("404 missing entity without an index", "a commit"),
    ("404 TableNotFound for the whole request", "a commit"), ("real: 404 TableNotFound", "a commit"),
    ("404 TableNotFound for the whole request", "a dead letter"),
    ("404 ResourceNotFound for the whole request", "a dead letter"),
    ("404 ResourceNotFound for the whole request", "an upsert")])  # fmt: skip
def test_a_write_into_a_missing_table_names_the_table_on_both_paths(
    stores: tuple[Canned, dict[str, TableStore]], name: str, write: str
) -> None:
    """Table Storage says TableNotFound; Cosmos DB's Table API says ResourceNotFound, where no
    entity can be missing (an insert): a configuration error naming the table, never a decided
    "not found" (a commit read as lease_lost), on both paths."""
    server, by_path = stores
    server.answer = ANSWERS[name]
    for store in by_path.values():
        with pytest.raises(ConfigurationError, match=r"table 'orders(dl)?' does not exist"):
            if write == "a commit":
                store.commit_many([Commit(DedupKey("c", "k"), "p", "fp", [Entity("e", {"n": 1})], None, utcnow())])
            elif write == "a dead letter":
                store.dead_letter(DeadLetter("c", "invalid_json", "", b"{"))
            else:
                store.put_entity("p", Entity("e", {"n": 1}))


def test_the_real_success_answers_give_every_etag_in_order(stores: tuple[Canned, dict[str, TableStore]]) -> None:
    server, by_path = stores
    server.answer = ANSWERS["real: success, Content-IDs, a delete without ETag"]
    assert classified(by_path["lean"], TRANSACTIONS["commit"]) == ("applied", ETAG, ETAG, ETAG, "")
    server.answer = ANSWERS["real: Cosmos LF-only success"]
    etags = classified(by_path["lean"], TRANSACTIONS["inserts"])[1:]
    assert etags == tuple(f"W/\"datetime'2020-08-17T18%3A43%3A01.012788{i}Z'\"" for i in range(4))


# -- the same, against the real Azurite ----------------------------------------------------


def gone(pk: str, kind: str, options: dict[str, Any], rk: str = "gone") -> tuple[Any, ...]:
    return (kind, entity(rk, pk), options)


UNCONDITIONAL = {"mode": UpdateMode.REPLACE}
AT_ETAG = {"etag": ETAG, "match_condition": MatchConditions.IfNotModified}
# (operations on partition pk, the index of the one whose entity is missing)
MISSING_ENTITY: dict[str, Callable[[str], tuple[list[Any], int]]] = {
    "update at 0": lambda pk: ([gone(pk, "update", UNCONDITIONAL), entity("new", pk)], 0),
    "update at its ETag at 2": lambda pk: ([entity("a", pk), entity("b", pk), gone(pk, "update", AT_VERSION)], 2),
    "delete at 1": lambda pk: ([entity("a", pk), gone(pk, "delete", {})], 1),
    "delete at its ETag at 0": lambda pk: ([gone(pk, "delete", AT_ETAG), gone(pk, "delete", {}, "gone too")], 0),
}  # fmt: skip


@pytest.mark.parametrize("case", list(MISSING_ENTITY))
def test_a_missing_entity_in_a_transaction_is_not_found_on_both_paths(azurite: Azurite, case: str) -> None:
    by_path = app_stores(azurite.connection_string, "t" + uuid.uuid4().hex[:16])
    by_path["sdk"].create_tables()
    found = {}
    for path, store in by_path.items():
        operations, at = MISSING_ENTITY[case](path)
        found[path] = classified(store, operations)
    assert found["lean"] == found["sdk"] == ("refused", at, 404, "ResourceNotFound")
    assert list(by_path["sdk"].table.list_entities()) == []  # nothing written, on either path


@pytest.mark.parametrize("transaction", list(TRANSACTIONS))
def test_a_transaction_on_a_missing_table_raises_alike_on_both_paths(azurite: Azurite, transaction: str) -> None:
    by_path = app_stores(azurite.connection_string, "nosuchtable" + uuid.uuid4().hex[:8])
    found = {path: classified(store, TRANSACTIONS[transaction]) for path, store in by_path.items()}
    assert found["lean"] == found["sdk"] == TABLE_NOT_FOUND
