"""The lean transaction path speaks the same protocol as the Azure SDK: the same requests
(compared part by part, modulo boundaries, ids and dates; updates and deletes byte for byte)
and the same reading of every answer — success and its ETags, a conflict at each operation
index, a bad entity, a too-large request — from the real Azurite, and from responses in the
shape the Azure Table service documents (tests/integration/test_table_lean_ops.py: what
updates, deletes and single inserts write).
A decoding slip would misclassify messages silently (duplicate vs mismatch is read from the
failing index), so every index and status is pinned here."""

from __future__ import annotations

import json
import math
import re
import threading
import uuid
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from azure.core import MatchConditions
from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential
from azure.core.exceptions import HttpResponseError, ServiceResponseError
from azure.data.tables import (
    EdmType,
    EntityProperty,
    TableClient,
    TableServiceClient,
    TableTransactionError,
    UpdateMode,
)
from hypothesis import given
from hypothesis import strategies as st

from shared.idempotency.errors import StoreUnavailable
from shared.idempotency.stores._azure import store_errors
from shared.idempotency.stores._table_batch import TableTransactions, TransactionFailure, decode, entity_json
from shared.idempotency.stores._transport import pooled_transport
from shared.idempotency.testing.azurite import Azurite

WHEN = datetime(2026, 11, 30, 12, 30, 15, 123456, tzinfo=UTC)
ENTITIES: list[dict[str, Any]] = [
    {"PartitionKey": "p", "RowKey": "strings", "S": "x", "Empty": "", "Unicode": "é🙂", "Quote": 'a"b\\c\n'},
    {"PartitionKey": "p", "RowKey": "numbers", "I": 5, "Neg": -(2**31), "Max": 2**31 - 1, "F": 1.5, "Whole": 10.0,
     "Nan": math.nan, "Inf": math.inf, "MinusInf": -math.inf, "B": True, "No": False},
    {"PartitionKey": "p", "RowKey": "other", "D": WHEN, "Later": WHEN.astimezone(UTC) + timedelta(hours=1),
     "Y": bytes(range(256)), "G": uuid.UUID("12345678-1234-5678-1234-567812345678"), "Missing": None},
    {"PartitionKey": "dedup|orders|%2Fa~", "RowKey": "dedup|orders|o-1|" + "f" * 64, "Kind": "dedup-guard",
     "ExpiresAt": WHEN},
]  # fmt: skip


def parts(body: bytes) -> list[tuple[str, dict[str, str], Any]]:
    """The operations of a $batch body: (request line, headers but dates, JSON body)."""
    found = []
    for chunk in body.split(b"Content-Transfer-Encoding: binary\r\n")[1:]:
        head, _, rest = chunk.partition(b"\r\n\r\n")  # the part's own headers (Content-ID)
        request, _, payload = rest.partition(b"\r\n\r\n")
        line, *headers = request.decode().split("\r\n")
        named = dict(h.split(": ", 1) for h in [*head.decode().split("\r\n"), *headers] if h)
        content = payload.split(b"\r\n--")[0]
        found.append((line, {k: v for k, v in named.items() if k not in ("x-ms-date", "Date")},
                      json.loads(content) if content else None))  # fmt: skip
    return found


def captured(send: Any) -> Any:
    """The $batch request a client sends (through its raw_request_hook)."""
    seen: list[Any] = []
    send(lambda request: seen.append(request.http_request) if "$batch" in request.http_request.url else None)
    [request] = seen
    return request


def test_the_lean_request_is_the_sdks_modulo_boundaries_and_dates(table: tuple[TableServiceClient, str]) -> None:
    service, name = table
    entities = [dict(e, RowKey=e["RowKey"] + "-S") for e in ENTITIES[:3]]
    sdk = captured(lambda hook: service.get_table_client(name).submit_transaction(
        [("create", e) for e in entities], raw_request_hook=hook))  # fmt: skip
    lean_entities = [dict(e, RowKey=e["RowKey"] + "-L") for e in ENTITIES[:3]]
    lean = captured(lambda hook: TableTransactions.of(service, name, raw_request_hook=hook).submit(lean_entities))

    def same(request: Any, suffix: str) -> list[tuple[str, dict[str, str], Any]]:
        body = request.body if request.body is not None else request.content
        return [(line, headers, {k: v.replace(suffix, "") if k == "RowKey" else v for k, v in payload.items()})
                for line, headers, payload in parts(body)]  # fmt: skip

    assert same(lean, "-L") == same(sdk, "-S")  # suffixes of one length: Content-Length compares too
    outer = ("x-ms-version", "DataServiceVersion", "MaxDataServiceVersion", "Accept")
    assert {h: lean.headers[h] for h in outer} == {h: sdk.headers[h] for h in outer}
    assert lean.headers["Content-Type"].split("batch_")[0] == sdk.headers["Content-Type"].split("batch_")[0]
    assert lean.headers["Authorization"].startswith("SharedKey devstoreaccount1:")


class Sent(Exception):
    """Raised from a request hook: the request as built, never sent."""


def built(send: Any) -> bytes:
    """The $batch body a client builds, stopped before it is sent."""
    seen: list[Any] = []

    def hook(request: Any) -> None:
        seen.append(request.http_request)
        raise Sent

    with pytest.raises(Sent):
        send(hook)
    [request] = seen
    return bytes(request.body if request.body is not None else request.content)


def normalized(body: bytes) -> bytes:
    """A $batch body less what differs by client and second: boundaries and dates."""
    body = re.sub(rb"(batch|changeset)_[0-9a-f-]{36}", rb"\1_B", body)
    return re.sub(rb"(x-ms-date|Date): [^\r]+", rb"\1: D", body)


def test_updates_and_deletes_are_the_sdks_bytes(table: tuple[TableServiceClient, str]) -> None:
    """Every operation kind and ETag form, keys the URL must quote: the same body, byte for byte."""
    service, name = table
    weak, strong = "W/\"datetime'2026-11-30T12%3A00%3A00.0000000Z'\"", '"0x8D9"'
    replace = {"mode": UpdateMode.REPLACE}
    operations: list[Any] = [
        ("create", {"PartitionKey": "p'q é", "RowKey": "new", "V": 1}),
        ("update", {"PartitionKey": "p'q é", "RowKey": "o'brien", "V": 2.5, "D": WHEN},
         {**replace, "etag": weak, "match_condition": MatchConditions.IfNotModified}),
        ("update", {"PartitionKey": "p'q é", "RowKey": "a b", "S": "x"}, replace),
        ("update", {"PartitionKey": "p'q é", "RowKey": "é", "S": "y"},
         {**replace, "etag": "bare", "match_condition": MatchConditions.IfNotModified}),  # quoted as the SDK does
        ("delete", {"PartitionKey": "p'q é", "RowKey": "x%y+z&(1),=:;@$!*~''"},
         {"etag": strong, "match_condition": MatchConditions.IfNotModified}),
        ("delete", {"PartitionKey": "p'q é", "RowKey": "'"}),
        ("update", {"PartitionKey": "p'q é", "RowKey": "z"}, {"mode": "replace"}),
        ("upsert", {"PartitionKey": "p'q é", "RowKey": "u", "S": "w"}, replace),  # insert or replace: no If-Match
    ]  # fmt: skip
    sdk = built(lambda hook: service.get_table_client(name).submit_transaction(operations, raw_request_hook=hook))
    lean = built(lambda hook: TableTransactions.of(service, name, raw_request_hook=hook).submit(operations))
    assert normalized(lean) == normalized(sdk)
    assert parts(lean) == parts(sdk)
    verbs = ["POST", "PUT", "PUT", "PUT", "DELETE", "DELETE", "PUT", "PUT"]
    assert [line.split(" ")[0] for line, _, _ in parts(lean)] == verbs
    assert "(PartitionKey='p%27%27q%20%C3%A9',RowKey='o%27%27brien')" in parts(lean)[1][0]
    assert [headers.get("If-Match") for _, headers, _ in parts(lean)] == [None, weak, "*", '"bare"', strong, "*", "*",
                                                                         None]  # fmt: skip


def test_entities_are_encoded_by_the_sdks_type_rules() -> None:
    from azure.data.tables._serialize import _add_entity_properties  # the SDK's own encoder, as the reference

    typed = {"PartitionKey": "p", "RowKey": "typed", "Big": EntityProperty(2**40, EdmType.INT64),
             "Small": (7, EdmType.INT32), "Text": ("x", EdmType.STRING), "Real": (2, EdmType.DOUBLE),
             "Odd": (math.nan, EdmType.DOUBLE), "When": (WHEN, EdmType.DATETIME), "Raw": (b"\x01", EdmType.BINARY),
             "Id": (uuid.UUID(int=1), EdmType.GUID), "Flag": (True, EdmType.BOOLEAN),
             "Gone": (None, EdmType.STRING)}  # fmt: skip
    for entity in [*ENTITIES, typed]:
        assert entity_json(entity) == _add_entity_properties(entity), entity["RowKey"]
    with pytest.raises(TypeError):
        entity_json({"PartitionKey": "p", "RowKey": "r", "Big": 2**31})
    with pytest.raises(TypeError):
        entity_json({"PartitionKey": "p", "RowKey": "r", "List": [1]})


@given(
    st.datetimes(
        min_value=datetime(1601, 1, 2),
        max_value=datetime(9998, 12, 30),
        timezones=st.one_of(st.just(UTC), st.timezones()),
    ),  # UTC: the fast path
    st.text(max_size=40),
)
def test_times_and_strings_are_encoded_as_the_sdk_encodes_them(when: datetime, text: str) -> None:
    from azure.data.tables._serialize import _add_entity_properties

    entity = {"PartitionKey": "p", "RowKey": "r", "When": when, "Text": text}
    assert entity_json(entity) == _add_entity_properties(entity)


def test_what_the_lean_path_writes_reads_back_as_the_sdk_wrote_it(table: tuple[TableServiceClient, str]) -> None:
    service, name = table
    client: TableClient = service.get_table_client(name)
    etags = TableTransactions.of(service, name).submit([dict(e, PartitionKey="lean") for e in ENTITIES[:3]])
    client.submit_transaction([("create", dict(e, PartitionKey="sdk")) for e in ENTITIES[:3]])
    assert etags == [client.get_entity("lean", e["RowKey"]).metadata["etag"] for e in ENTITIES[:3]]

    def stored(pk: str) -> list[dict[str, Any]]:
        rows = client.query_entities("PartitionKey eq @pk", parameters={"pk": pk})
        return sorted(({k: v for k, v in row.items() if k != "PartitionKey"} for row in rows),
                      key=lambda row: row["RowKey"])  # fmt: skip

    lean, sdk = stored("lean"), stored("sdk")
    assert len(lean) == 3 and repr(lean) == repr(sdk)  # NaN != NaN: compare the representations


@pytest.mark.parametrize("taken", [0, 1, 2, 3])
def test_a_conflict_at_each_index_is_read_as_the_sdk_reads_it(
    table: tuple[TableServiceClient, str], taken: int
) -> None:
    service, name = table
    client = service.get_table_client(name)
    rows = [{"PartitionKey": f"p{taken}", "RowKey": f"r{i}"} for i in range(4)]
    client.create_entity(rows[taken])
    failure = TableTransactions.of(service, name).submit(rows)
    with pytest.raises(TableTransactionError) as sdk:
        client.submit_transaction([("create", row) for row in rows])
    assert isinstance(failure, TransactionFailure)
    assert (failure.index, failure.status, failure.code) == (taken, 409, "EntityAlreadyExists")
    assert (sdk.value.status_code, sdk.value.error_code) == (409, "EntityAlreadyExists")
    assert sdk.value.message.startswith(f"{taken}:")
    assert [e["RowKey"] for e in client.query_entities("PartitionKey eq @pk", parameters={"pk": f"p{taken}"})] == [
        rows[taken]["RowKey"]]  # nothing else written  # fmt: skip


def test_refusals_other_than_a_conflict_raise_with_the_sdks_status(table: tuple[TableServiceClient, str]) -> None:
    service, name = table
    lean = TableTransactions.of(service, name, retry_total=0)
    twice = [{"PartitionKey": "p", "RowKey": "same"}, {"PartitionKey": "p", "RowKey": "same"}]
    with pytest.raises(HttpResponseError) as lean_error:
        lean.submit(twice)
    with pytest.raises(HttpResponseError) as sdk_error:
        service.get_table_client(name).submit_transaction([("create", row) for row in twice])
    assert lean_error.value.status_code == sdk_error.value.status_code
    assert 400 <= (lean_error.value.status_code or 0) < 500

    huge = [{"PartitionKey": "p", "RowKey": f"r{i}", "A": "x" * 30_000, "B": "y" * 30_000} for i in range(100)]  # 6 MB
    with pytest.raises(HttpResponseError) as too_large:
        lean.submit(huge)
    with pytest.raises(HttpResponseError) as sdk_too_large:
        service.get_table_client(name).submit_transaction([("create", row) for row in huge])
    assert too_large.value.status_code == sdk_too_large.value.status_code == 413


def test_a_missing_table_is_not_found(azurite: Azurite) -> None:
    """As the SDK: the changeset's TableTransactionError, 404 TableNotFound
    (tests/integration/test_table_batch_parity.py: the store reads both alike)."""
    service = TableServiceClient.from_connection_string(azurite.connection_string, retry_total=0)
    with pytest.raises(TableTransactionError) as missing:
        TableTransactions.of(service, "nosuchtable").submit([{"PartitionKey": "p", "RowKey": "r"}])
    assert (missing.value.status_code, missing.value.error_code) == (404, "TableNotFound")  # type: ignore[attr-defined]


def azure_response(*statuses: str, error: str | None = None) -> bytes:
    """A changeset response as the Azure Table service documents it ("Performing entity group
    transactions": multipart/mixed, one application/http part per answered operation)."""
    body = ["--batchresponse_1\r\nContent-Type: multipart/mixed; boundary=changesetresponse_2\r\n\r\n"]
    for index, status in enumerate(statuses):
        body.append(f"--changesetresponse_2\r\nContent-Type: application/http\r\nContent-Transfer-Encoding: binary"
                    f"\r\n\r\nHTTP/1.1 {status}\r\nContent-ID: {index + 1}\r\nX-Content-Type-Options: nosniff\r\n"
                    "Cache-Control: no-cache\r\nDataServiceVersion: 3.0;\r\n")  # fmt: skip
        if error and not status.startswith("2"):
            body.append("Content-Type: application/json;odata=minimalmetadata;streaming=true;charset=utf-8\r\n\r\n"
                        + error + "\r\n")  # fmt: skip
        else:
            body.append("ETag: W/\"datetime'2026-11-30T12%3A00%3A00.0000000Z'\"\r\n\r\n\r\n")
    body.append("--changesetresponse_2--\r\n--batchresponse_1--\r\n")
    return "".join(body).encode()


def odata_error(code: str, message: str) -> str:
    return json.dumps({"odata.error": {"code": code, "message": {"lang": "en-US", "value": message}}})


EXISTS = "The specified entity already exists."
CONDITION = "The update condition specified in the request was not satisfied."
TOO_LARGE = "The property value exceeds the maximum allowed size (64KB)."
ETAG = "W/\"datetime'2026-11-30T12%3A00%3A00.0000000Z'\""
DOCUMENTED = [
    (azure_response("201 Created", "201 Created", "204 No Content"), [ETAG, ETAG, ETAG]),
    (azure_response("409 Conflict", error=odata_error("EntityAlreadyExists", f"0:{EXISTS}\nRequestId:x\nTime:t")),
     TransactionFailure(0, 409, "EntityAlreadyExists", f"0:{EXISTS}\nRequestId:x\nTime:t")),
    (azure_response("409 Conflict", error=odata_error("EntityAlreadyExists", f"3:{EXISTS}")),
     TransactionFailure(3, 409, "EntityAlreadyExists", f"3:{EXISTS}")),
    (azure_response("412 Precondition Failed", error=odata_error("UpdateConditionNotSatisfied", f"2:{CONDITION}")),
     TransactionFailure(2, 412, "UpdateConditionNotSatisfied", f"2:{CONDITION}")),
    (azure_response("400 Bad Request", error=odata_error("PropertyValueTooLarge", f"1:{TOO_LARGE}")),
     TransactionFailure(1, 400, "PropertyValueTooLarge", f"1:{TOO_LARGE}")),
    (azure_response("409 Conflict", error=odata_error("EntityAlreadyExists", EXISTS)),
     TransactionFailure(None, 409, "EntityAlreadyExists", EXISTS)),
    (azure_response("503 Server Unavailable", error="not json"), TransactionFailure(None, 503, "", "not json")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("response", "expected"),
    DOCUMENTED,
    ids=["success", "conflict at 0", "conflict at 3", "412 at 2", "400 at 1", "no index", "not json"],
)
def test_documented_responses_decode_to_the_failing_index_and_status(
    response: bytes, expected: TransactionFailure | list[str]
) -> None:
    assert decode(response, 3) == expected


def answers(*parts: tuple[str, str | None, str | None], eol: str = "\r\n") -> bytes:
    """A changeset response of (status, Content-ID, ETag) answers, in this order (``eol``
    "\\n": Cosmos DB's Table API's line breaks)."""
    body = ["--batchresponse_1\r\nContent-Type: multipart/mixed; boundary=changesetresponse_2\r\n\r\n"]
    for status, content_id, etag in parts:
        body.append("--changesetresponse_2\r\nContent-Type: application/http\r\nContent-Transfer-Encoding: binary"
                    f"\r\n\r\nHTTP/1.1 {status}\r\n" + (f"Content-ID: {content_id}\r\n" if content_id else "")
                    + "DataServiceVersion: 3.0;\r\n" + (f"ETag: {etag}\r\n" if etag else "") + "\r\n\r\n")  # fmt: skip
    body.append("--changesetresponse_2--\r\n--batchresponse_1--\r\n")
    return "".join(body).replace("\r\n", eol).encode()


ORDERS = [
    (answers(("201 Created", None, "a"), ("204 No Content", None, None), ("204 No Content", None, "c")),
     ["a", "", "c"]),  # Azurite's: no Content-ID; a delete's answer has no ETag
    (answers(("201 Created", "1", "a"), ("204 No Content", "2", "b"), ("204 No Content", "3", "c")),
     ["a", "b", "c"]),  # numbered from 1, as the service's documentation shows
    (answers(("204 No Content", "2", "c"), ("201 Created", "0", "a"), ("204 No Content", "1", "b")),
     ["a", "b", "c"]),  # the requests' ids, answered in another order
    (answers(("201 Created", "1", "a"), ("204 No Content", None, "b"), ("204 No Content", "0", "c")),
     ["a", "b", "c"]),  # not every answer numbered: their order
    (answers(("204 No Content", None, None), ("201 Created", None, "b"), ("204 No Content", None, None), eol="\n"),
     ["", "b", ""]),  # LF alone: a delete's answer still ends at its own headers
    (answers(("204 No Content", "2", "c"), ("201 Created", "0", "a"), ("204 No Content", "1", "b"), eol="\n"),
     ["a", "b", "c"]),  # LF alone, ids out of order
]  # fmt: skip


@pytest.mark.parametrize(("response", "etags"), ORDERS,
                         ids=["no ids", "ids from 1", "ids out of order", "some ids", "LF", "LF ids"])  # fmt: skip
def test_etags_are_read_in_the_operations_order(response: bytes, etags: list[str]) -> None:
    assert decode(response, 3) == etags


@pytest.mark.parametrize(
    "body", [b"", b"<html>busy</html>", azure_response("201 Created")], ids=["empty", "html", "1 of 3"]
)
def test_an_answer_that_does_not_account_for_every_operation_is_transient(body: bytes) -> None:
    """A 202 that does not answer each operation may or may not have been applied: never
    "all written" (the message would be acknowledged), but an error the store retries."""
    with pytest.raises(ServiceResponseError):
        decode(body, 3)


def test_a_202_that_is_not_a_changeset_is_transient() -> None:
    """Through the whole client: a server answering 202 with something else."""

    class Answer(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(202)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        key = AzureNamedKeyCredential("acct", "a2V5")
        lean = TableTransactions(f"http://127.0.0.1:{server.server_port}/acct", "t", key, retry_total=0)
        with pytest.raises(StoreUnavailable), store_errors():  # the store: abandon, redeliver
            lean.submit([{"PartitionKey": "p", "RowKey": "r"}])
    finally:
        server.shutdown()


def test_credentials_the_lean_path_cannot_use_are_refused_when_it_is_built() -> None:
    with pytest.raises(ValueError, match="DEDUP_TABLE_TRANSACTIONS=sdk"):
        TableTransactions("https://acct.table.core.windows.net", "t", AzureSasCredential("sv=x&sig=y"))


def test_the_pooled_transport_keeps_the_stores_timeouts() -> None:
    transport = pooled_transport()
    assert (transport.connection_config.timeout, transport.connection_config.read_timeout) == (5, 30)
