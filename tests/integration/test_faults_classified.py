"""Every failure classified once, at the right depth, on the real Azurite: what can never be
stored is refused at the first delivery with its reason (a dead-letter record; HTTP: a 4xx),
what clears by itself is waited out inside the delivery, a handler's own error is retried and
recorded on the last delivery, and a commit applied but answered 500, or answered cut short,
reports ``processed``."""

from __future__ import annotations

import http.client
import itertools
import json
import logging
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import azure.functions as func
import pytest
from azure.core.exceptions import ClientAuthenticationError, HttpResponseError
from azure.core.pipeline.transport import HttpTransport
from azure.data.tables import TableServiceClient

from shared.idempotency import Context, Delivery, Effects, Entity, IdempotentConsumer, Outcome
from shared.idempotency.config import DedupConfig
from shared.idempotency.errors import StoreRefused, StoreUnavailable
from shared.idempotency.functions import RetryLater, shared_store
from shared.idempotency.functions.adapters import REPLAYED, eventgrid_delivery, servicebus_delivery
from shared.idempotency.messages import MAX_RESULT_CHARACTERS
from shared.idempotency.stores import DeadLetter, DedupStore, TableStore
from shared.idempotency.stores import _table as table_store
from shared.idempotency.stores._azure import TRANSPORT, store_errors
from shared.idempotency.stores._table_batch import TableTransactions
from shared.idempotency.stores._table_rows import effect_entity
from shared.idempotency.telemetry import fields_of
from shared.idempotency.testing import entities, using_store
from shared.idempotency.testing.azurite import Azurite
from shared.idempotency.testing.faults import PassThrough, status_response
from tests.app import EVENT_TYPE, effects_by_item, item, queue_consumer
from tests.conftest import new_table_store
from tests.functions import app_settings, fresh_app, servicebus_message, user_function

items, item_state, items_api, item_batch = (user_function(name) for name in
                                            ("items", "item_state", "items_api", "item_batch"))  # fmt: skip


def dead_letters(store: DedupStore, scope: str) -> list[DeadLetter]:
    return store.dead_letters(scope)


# -- fixable shapes are processed -------------------------------------------------------------


def test_nested_non_ascii_data_near_a_propertys_limit_is_processed(items_store: DedupStore) -> None:
    """100 lines of 64-emoji SKUs: 25,800 characters of lines as UTF-8 text (as ASCII escapes,
    which cost 12 characters an emoji, it was over Table Storage's 32 K-character property)."""

    def handler(body: dict[str, Any], context: Context) -> Effects:
        return Effects([Entity("item", {"id": body["id"], "lines": body["lines"]})])  # nested: stored as JSON text

    body = item("i-1", lines=[{"sku": "😀" * 63 + str(i % 10), "quantity": 10_000} for i in range(100)])
    consumer = IdempotentConsumer("items", items_store, handler, config=DedupConfig())
    result = consumer.process(servicebus_delivery(servicebus_message(body, "i-1")))
    assert result.outcome is Outcome.PROCESSED
    [stored] = entities(items_store, "item")
    assert json.loads(stored["lines"]) == body["lines"]
    assert dead_letters(items_store, "items") == []


@pytest.mark.parametrize("version", [2**31, 2**53 - 1])
def test_state_versions_up_to_the_largest_exact_json_integer_are_applied(items_store: DedupStore, version: int) -> None:
    def change(status: str, at: int) -> func.ServiceBusMessage:
        body = {"id": "i-big", "status": status, "version": at}
        return servicebus_message(body, f"i-big:{at}")

    item_state(change("paid", version - 1))
    item_state(change("shipped", version))
    item_state(change("paid", version - 1))  # late: stale
    [state] = entities(items_store, "state")
    stored = state["StateVersion"]
    assert (state["status"], int(getattr(stored, "value", stored))) == ("shipped", version)


# -- what can never be stored is refused at the first delivery, with its reason ----------------


def test_a_lone_surrogate_in_a_member_name_is_refused_and_the_rest_of_the_batch_commits(
    items_store: DedupStore,
) -> None:
    bad = b'{"id": "i-2", "amount": 5, "\\ud800": 1}'
    item_batch([servicebus_message(item("i-1", 5), "i-1"), servicebus_message(bad, "i-2")])  # no RetryLater
    assert len(entities(items_store, None, None)) == 2  # the good item's record and posting
    assert effects_by_item(items_store) == {"i-1": Counter({"item": 1, "posting": 1})}
    [record] = dead_letters(items_store, "item-batch")
    assert (record.reason, record.message_id, record.delivery_count) == ("not_i_json", "i-2", 1)


def test_an_event_with_a_huge_source_is_dead_lettered_with_bounded_fields(items_store: DedupStore) -> None:
    """A 40,000-character source makes a key over the limit; its record still fits the store."""
    event = func.CloudEvent(id="e-1", source="/s" + "x" * 40_000, type=EVENT_TYPE, specversion="1.0",
                            data={"id": "i-1"}, traceparent="00-" + "a" * 40_000)  # fmt: skip
    user_function("item_events")(event)  # acknowledged: refused for good, recorded
    [record] = dead_letters(items_store, "item-events")
    assert record.reason == "key_too_long"
    assert len(record.message_id or "") <= 1024 and "sha256" in (record.message_id or "")
    assert len(record.correlation_id or "") <= 1024
    assert eventgrid_delivery(event).message_id != record.message_id  # bounded, not the raw id


def test_a_value_over_the_stores_limit_is_refused_at_the_first_delivery(
    azurite: Azurite, monkeypatch: pytest.MonkeyPatch
) -> None:
    def handler(payload: dict[str, Any], context: Context) -> Effects:
        return Effects([Entity("note", {"text": "é" * 40_000})])  # 40 K characters: a property holds 32 K

    checking, unchecked = table_store.effect_rows, lambda pk, effects: [effect_entity(pk, e) for e in effects]
    for lean in (False, True):
        for checked in (True, False):  # the store's own check before sending, and the service's answer
            store = new_table_store(azurite, lean=lean)
            monkeypatch.setattr(table_store, "effect_rows", checking if checked else unchecked)
            consumer = IdempotentConsumer("notes", store, handler, config=DedupConfig())
            result = consumer.process(Delivery(body=b"{}", message_id="n-1", delivery_count=1))
            assert (result.outcome, result.reason) == (Outcome.INVALID, "store_refused")
            assert ("a property holds 65536" if checked else "PropertyValueTooLarge") in (result.detail or "")
            [record] = store.dead_letters("notes")
            assert record.reason == "store_refused" and entities(store) == []


RESULTS: dict[str, Any] = {
    "a time": datetime(2026, 12, 1, tzinfo=UTC),
    "a set": {"a"},
    "NaN": float("nan"),
    "too large": "x" * (MAX_RESULT_CHARACTERS + 1),
}


@pytest.mark.parametrize("result", RESULTS)
def test_a_result_that_is_not_storable_json_is_refused_with_its_reason(azurite: Azurite, result: str) -> None:
    store = new_table_store(azurite)
    consumer = IdempotentConsumer("results", store, lambda payload, context: Effects([], RESULTS[result]),
                                  config=DedupConfig())  # fmt: skip
    outcome = consumer.process(Delivery(body=b"{}", message_id="r-1", delivery_count=1))
    expected = "result_too_large" if result == "too large" else "result_not_json"
    assert (outcome.outcome, outcome.reason) == (Outcome.INVALID, expected)
    assert [record.reason for record in store.dead_letters("results")] == [expected]


def test_a_handler_returning_nothing_is_refused_with_its_reason(azurite: Azurite) -> None:
    store = new_table_store(azurite)
    consumer = IdempotentConsumer("nothing", store, lambda payload, context: None,  # type: ignore[arg-type,return-value]
                                  config=DedupConfig())  # fmt: skip
    outcome = consumer.process(Delivery(body=b"{}", message_id="r-1", delivery_count=1))
    assert (outcome.outcome, outcome.reason) == (Outcome.INVALID, "handler_result")
    assert "NoneType" in (outcome.detail or "")


def test_a_handlers_own_error_is_retried_and_recorded_on_the_last_delivery(azurite: Azurite) -> None:
    """A redeploy may fix a bug: it is not refused, but the last delivery says why it fails."""
    store = new_table_store(azurite)

    def handler(payload: dict[str, Any], context: Context) -> Effects:
        return Effects([Entity("x", {"n": payload["missing"]})])

    consumer = IdempotentConsumer("buggy", store, handler, config=DedupConfig(max_deliveries=10))
    for count in (1, 9):
        outcome = consumer.process(Delivery(body=b"{}", message_id="b-1", delivery_count=count))
        assert (outcome.outcome, outcome.reason) == (Outcome.TRANSIENT, "handler_error")
        assert store.dead_letters("buggy") == []
    consumer.process(Delivery(body=b"{}", message_id="b-1", delivery_count=10))  # the broker's last
    [record] = store.dead_letters("buggy")
    assert record.reason == "handler_error" and "KeyError" in record.detail and record.delivery_count == 10


def test_a_step_answer_too_large_to_store_is_refused_and_never_called_again(azurite: Azurite) -> None:
    store = new_table_store(azurite)
    calls: list[str] = []

    def call(key: str) -> dict[str, str]:
        calls.append(key)
        return {"receipt": "r" * 70_000}

    def handler(payload: dict[str, Any], context: Context) -> Effects:
        answer = context.step("charge", call)
        return Effects([Entity("item", {"receipt": len(answer)})])

    consumer = IdempotentConsumer("big-answers", store, handler, config=DedupConfig())
    first = consumer.process(Delivery(body=b"{}", message_id="s-1", delivery_count=1))
    again = consumer.process(Delivery(body=b"{}", message_id="s-1", delivery_count=2))
    assert (first.outcome, first.reason) == (Outcome.INVALID, "result_too_large")
    assert (again.outcome, again.reason) == (Outcome.INVALID, "result_too_large")
    assert len(calls) == 1  # the payment was made once, and never repeated
    assert {record.reason for record in store.dead_letters("big-answers")} == {"result_too_large"}


def answered(status: int, code: str | None = None, kind: type[HttpResponseError] = HttpResponseError) -> Exception:
    """What ``store_errors`` makes of a store's answer."""
    error = kind(message=f"answered {status}")
    error.status_code = status
    error.error_code = code  # type: ignore[attr-defined]  # what the SDK sets from the answer, and store_errors reads
    with pytest.raises(Exception) as caught, store_errors():
        raise error
    return caught.value


@pytest.mark.parametrize(("status", "code"), [(400, "PropertyValueTooLarge"), (400, "EntityTooLarge"),
                                              (400, "InvalidDuplicateRow"), (413, None),
                                              (413, "RequestBodyTooLarge")])  # fmt: skip
def test_answers_about_the_messages_own_data_are_refused_for_good(status: int, code: str | None) -> None:
    assert isinstance(answered(status, code), StoreRefused)


@pytest.mark.parametrize(("status", "code", "kind"), [
    (403, "AuthorizationPermissionMismatch", ClientAuthenticationError),  # the lean path's class
    (403, "AuthorizationPermissionMismatch", HttpResponseError),  # the SDK's, for that code
    (401, "InvalidAuthenticationInfo", ClientAuthenticationError),
    (400, "InvalidHeaderValue", HttpResponseError),  # a deployment's mistake, not the message's
    (400, None, HttpResponseError),
    (503, "ServerBusy", HttpResponseError),
])  # fmt: skip
def test_other_answers_are_waited_for_never_dead_lettered(
    status: int, code: str | None, kind: type[HttpResponseError], caplog: pytest.LogCaptureFixture
) -> None:
    outcome = answered(status, code, kind)
    assert isinstance(outcome, StoreUnavailable) and not isinstance(outcome, StoreRefused)
    if status in (401, 403):  # access refused: the log names the role the app most likely lacks
        assert "Storage Table Data Contributor" in str(outcome) and "Storage Table Data Contributor" in caplog.text


def test_a_store_error_outside_one_messages_data_retries_the_whole_batch(azurite: Azurite) -> None:
    """Only CommitStatus.REFUSED refuses a message: an exception from the commit (here a 400
    refusal raised by the store as a whole) never dead-letters a batch."""
    store = new_table_store(azurite)
    consumer = IdempotentConsumer("batch", store, lambda p, c: Effects([Entity("x", {"n": 1})]),
                                  config=DedupConfig(transient_wait=timedelta(0)))  # fmt: skip

    def refusing(*args: Any, **kwargs: Any) -> Any:
        raise StoreRefused("400 PropertyValueTooLarge: raised for the batch as a whole")

    store.commit_many = refusing  # type: ignore[method-assign]
    results = consumer.process_batch([Delivery(body=b"{}", message_id=f"b-{i}") for i in range(3)])
    assert [(r.outcome, r.reason) for r in results] == [(Outcome.TRANSIENT, "store_unavailable")] * 3
    assert store.dead_letters("batch") == []


# -- HTTP ----------------------------------------------------------------------------------------


def post(body: dict[str, Any], key: str) -> func.HttpResponse:
    headers = {"Content-Type": "application/json", "x-functions-key": "client-a", "Idempotency-Key": key}
    response: func.HttpResponse = items_api(func.HttpRequest("POST", "/api/items", headers=headers,
                                                             body=json.dumps(body).encode()))  # fmt: skip
    return response


def test_an_idempotency_key_reused_with_another_payload_is_422(items_store: DedupStore) -> None:
    first, other = item(), item()
    assert post(first, "k-1").status_code == 201
    reused = post(other, "k-1")
    assert reused.status_code == 422 and reused.mimetype == "application/problem+json"
    assert [i["itemId"] for i in entities(items_store, "item")] == [first["id"]]  # no second item
    replay = post(first, "k-2")  # a new key for an existing item still replays
    assert replay.status_code == 201 and replay.headers.get(REPLAYED) == "true"
    assert post(first, "k-1").headers.get(REPLAYED) == "true"  # the same key and payload: replayed


def test_an_item_id_with_line_breaks_stays_answerable(items_store: DedupStore) -> None:
    body = item("i-\r\nX-Injected: 1 é")
    for key in ("k-a", "k-b"):
        response = post(body, key)
        assert response.status_code == 201
        assert response.headers["Location"] == "/api/items/i-%0D%0AX-Injected%3A%201%20%C3%A9"


def test_a_store_refusal_is_a_4xx_problem_for_http(items_store: DedupStore, monkeypatch: pytest.MonkeyPatch) -> None:
    too_large = lambda pk, effects: [{"PartitionKey": pk, "RowKey": e.name, "x": "é" * 40_000} for e in effects]  # noqa: E731
    monkeypatch.setattr(table_store, "effect_rows", too_large)  # Azurite answers 400 PropertyValueTooLarge
    response = post(item(), "k-r")
    assert response.status_code == 400 and "store_refused" in json.loads(response.get_body())["title"]


# -- a commit applied, its answer lost: reported as what it was ----------------------------------


class AppliedThen500(PassThrough):
    """The store applies the first transaction, and the client is answered 500."""

    def __init__(self, inner: HttpTransport) -> None:  # type: ignore[type-arg]
        super().__init__(inner)
        self.sent, self._mutex = 0, threading.Lock()

    def send(self, request: Any, **kwargs: Any) -> Any:
        response = super().send(request, **kwargs)
        with self._mutex:
            self.sent += "$batch" in request.url
            first = self.sent == 1 and "$batch" in request.url
        return status_response(request, 500) if first else response


def store_answering_500_once(azurite: Azurite, table: str, lean: bool) -> tuple[TableStore, AppliedThen500]:
    from shared.idempotency.stores._transport import pooled_transport, transaction_transport

    if lean:
        faulty = AppliedThen500(transaction_transport())
        service = TableServiceClient.from_connection_string(azurite.connection_string, **TRANSPORT)
        transactions = TableTransactions.of(service, table, **{**TRANSPORT, "transport": faulty})
        return TableStore(service, table, table + "dl", transactions=transactions), faulty
    faulty = AppliedThen500(pooled_transport())
    service = TableServiceClient.from_connection_string(azurite.connection_string, **TRANSPORT, transport=faulty)
    return TableStore(service, table, table + "dl"), faulty


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "sdk"])
def test_a_commit_applied_then_answered_500_reports_processed(azurite: Azurite, lean: bool) -> None:
    with fresh_app(azurite, DEDUP_TRANSIENT_WAIT="PT10S") as table:
        store, faulty = store_answering_500_once(azurite, table, lean)
        store.create_tables()
        with using_store(store), caplog_outcomes() as outcomes:
            body = item()
            items(servicebus_message(body, body["id"]))  # no RetryLater: waited out
            response = post(item(), "k-h")
        assert faulty.sent >= 3  # the first commit (answered 500), its resend, the HTTP commit
        assert outcomes == ["processed", "processed"]  # never "duplicate" for a first delivery
        assert response.status_code == 201 and REPLAYED not in response.headers
        assert len(entities(store, "item")) == 2


class CutShortProxy(ThreadingHTTPServer):
    """In front of Azurite: every request goes through, and the answer to the first
    transaction is cut short — its headers announce the whole body, half of it arrives, the
    connection closes (an IncompleteRead once the store has applied the commit)."""

    def __init__(self, azurite: Azurite) -> None:
        super().__init__(("127.0.0.1", 0), _Relay)
        self.target, self.to_cut, self.lock = azurite.port, 1, threading.Lock()
        self.connection_string = azurite.connection_string.replace(f":{azurite.port}/", f":{self.server_port}/")


class _Relay(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: CutShortProxy

    def relay(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        upstream = http.client.HTTPConnection("127.0.0.1", self.server.target, timeout=30)
        upstream.request(self.command, self.path, body=body, headers=dict(self.headers))
        answer = upstream.getresponse()
        data = answer.read()
        upstream.close()
        with self.server.lock:
            cut = "$batch" in self.path and self.server.to_cut > 0
            self.server.to_cut -= cut
        self.send_response(answer.status)
        for name, value in answer.getheaders():
            if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data[: len(data) // 2] if cut else data)
        if cut:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_MERGE = relay

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize("path", ["lean", "sdk"])
def test_a_commit_applied_then_cut_short_is_a_store_failure_waited_out(azurite: Azurite, path: str) -> None:
    """The answer to an applied commit arrives cut short: a store failure (not the handler's),
    waited out in the delivery, whose resend meets its own marker: processed once; the
    redelivery is a duplicate. On both transaction paths (DEDUP_TABLE_TRANSACTIONS)."""
    proxy = CutShortProxy(azurite)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        with (
            fresh_app(azurite, DEDUP_TRANSIENT_WAIT="PT10S", DEDUP_TABLE_TRANSACTIONS=path),
            app_settings(DEDUP_STORAGE_CONNECTION=proxy.connection_string),
            caplog_outcomes() as outcomes,
        ):
            body = item()
            items(servicebus_message(body, body["id"]))  # no RetryLater: waited out, then read back
            items(servicebus_message(body, body["id"], delivery_count=2))
            assert proxy.to_cut == 0  # the cut happened
            assert outcomes == ["processed", "duplicate"]
            assert [e["itemId"] for e in entities(shared_store(), "item")] == [body["id"]]
    finally:
        proxy.shutdown()
        proxy.server_close()


class _Outcomes(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        fields = fields_of(record)
        if "outcome" in fields:
            self.seen.append(fields["outcome"])


@contextmanager
def caplog_outcomes() -> Iterator[list[str]]:
    """The outcomes the consumers log, in order."""
    handler, logger = _Outcomes(), logging.getLogger("idempotency")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)  # every outcome, the everyday ones included
    try:
        yield handler.seen
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.mark.parametrize("attempt_seconds", [0.0, 0.15])
def test_a_delivery_waits_with_growing_pauses_and_ends_within_its_wait(
    azurite: Azurite, attempt_seconds: float
) -> None:
    """An outage longer than the wait: several attempts, growing pauses, and the delivery
    goes back to the broker (RetryLater) no later than the wait plus one attempt."""
    with fresh_app(azurite, DEDUP_TRANSIENT_WAIT="PT1.2S"):
        consumer = queue_consumer()
        attempts: list[float] = []

        def unavailable(*args: Any, **kwargs: Any) -> Any:
            attempts.append(time.monotonic())
            time.sleep(attempt_seconds)
            raise StoreUnavailable("503 injected")

        consumer.store.commit_many = unavailable  # type: ignore[method-assign]
        body = item()
        started = time.monotonic()
        with pytest.raises(RetryLater):
            items(servicebus_message(body, body["id"]))
        took = time.monotonic() - started
    pauses = [later - earlier - attempt_seconds for earlier, later in itertools.pairwise(attempts)]
    assert len(attempts) >= 4 and pauses[-1] > pauses[0]  # retried, backing off
    assert took <= 1.2 + attempt_seconds + 0.2  # never past the wait by more than an attempt (and scheduling)


class CutShort(BaseHTTPRequestHandler):
    """Answers a transaction 202, multipart, chunked, and hangs up in the middle of it."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(202)
        self.send_header("Content-Type", "multipart/mixed; boundary=batchresponse_1")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        part = b"--batchresponse_1\r\nContent-Type: multipart/mixed; boundary=changesetresponse_1\r\n\r\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(part) + 400, part))  # a chunk promised longer than sent
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, *args: Any) -> None:
        """Quiet."""


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "sdk"])
def test_an_answer_cut_short_is_transient_on_both_paths(lean: bool) -> None:
    """It may have been applied: transient (the resend then reads the marker back), never a
    handler error (the SDK path let requests' ChunkedEncodingError escape)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), CutShort)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        account, key = "devstoreaccount1", ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
                                            "KBHBeksoGMGw==")  # fmt: skip
        connection = (f"DefaultEndpointsProtocol=http;AccountName={account};AccountKey={key};"
                      f"TableEndpoint=http://127.0.0.1:{server.server_port}/{account};")  # fmt: skip
        service = TableServiceClient.from_connection_string(connection, **{**TRANSPORT, "retry_total": 0})
        lean_path = TableTransactions.of(service, "t", **{**TRANSPORT, "retry_total": 0}) if lean else None
        store = TableStore(service, "t", "tdl", transactions=lean_path)

        def handler(payload: dict[str, Any], context: Context) -> Effects:
            return Effects([Entity("item", {"n": 1})])

        consumer = IdempotentConsumer("cut", store, handler, config=DedupConfig(transient_wait=timedelta(0)))
        result = consumer.process(Delivery(body=b"{}", message_id="c-1", delivery_count=1))
        assert (result.outcome, result.reason) == (Outcome.TRANSIENT, "store_unavailable")
    finally:
        server.shutdown()
        server.server_close()
