"""Every decision recorded and every outcome exact, on the real stores (memory, Table Storage on
Azurite through each transport): a business "no" (``Effects.declined``) is committed with the
marker, so a later copy gets the same answer whatever the stock has become; the delivery whose
commit applied reports it (``processed`` or ``declined``) exactly once, even when the store's
answer was lost — whichever commit path the message took; a caller's key reused with another
body is the caller's (422 or 409), never a ``conflict``; a message older than its marker can be is
refused (``expired``), never applied."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.core.exceptions import ServiceResponseError

from shared.idempotency import (
    Context,
    Declined,
    Effects,
    Entity,
    IdempotentConsumer,
    InvalidMessage,
    LatestState,
    Outgoing,
    from_body_field,
)
from shared.idempotency.config import EXPIRY_MARGIN, DedupConfig
from shared.idempotency.errors import StoreUnavailable
from shared.idempotency.functions import on_eventgrid, on_http, on_servicebus, on_storage_queue, stored_response
from shared.idempotency.keys import DedupKey
from shared.idempotency.messages import Delivery, Outcome
from shared.idempotency.reasons import Reason
from shared.idempotency.stores import DedupStore, MemoryStore, State
from shared.idempotency.telemetry import fields_of
from shared.idempotency.testing.faults import PassThrough
from tests.conftest import CHANGING_STORES, changing_store
from tests.functions import cloudevent, http_request, servicebus_message, storage_queue_message

SCHEMA = {
    "type": "object",
    "required": ["id", "sku", "quantity"],
    "properties": {"id": {"type": "string"}, "sku": {"type": "string"}, "quantity": {"type": "integer"}},
}
WAIT = DedupConfig(transient_wait=timedelta(seconds=6))  # a lost answer is tried again within the delivery


def move_stock(message: dict[str, Any], context: Context) -> Effects:
    """A restock (quantity > 0) or a reservation (< 0) of one SKU's stock, declined when the
    stock is short: the decision depends on what is stored."""
    stock = context.read("stock")
    level = (stock.data or {}).get("level", 0)
    if level + message["quantity"] < 0:
        return Effects(declined=Declined("insufficient_stock", f"{-message['quantity']} asked, {level} left"))
    return Effects([Entity(f"move|{message['id']}", {"quantity": message["quantity"]})],
                   changes=[stock.merged({"level": level + message["quantity"]})])  # fmt: skip


def stock_consumer(store: DedupStore, *, lazy: bool = False, handler: Any = move_stock,
                   **options: Any) -> IdempotentConsumer:  # fmt: skip
    """Keyed by the move's id, in its SKU's partition; ``lazy``: without ``reads`` (the handler's
    ``context.read`` reads the stock, and the marker with it, when it runs)."""
    reads = None if lazy else (lambda message: ["stock"])
    return IdempotentConsumer("stock", store, handler, schema=SCHEMA, key_source=from_body_field("id"),
                              partition_from=from_body_field("sku"),
                              **{"reads": reads, "config": WAIT, **options})  # fmt: skip


def move(move_id: str, quantity: int, sku: str = "s-1") -> dict[str, Any]:
    return {"id": move_id, "sku": sku, "quantity": quantity}


def delivery(body: dict[str, Any], count: int = 1) -> Delivery:
    return Delivery(json.dumps(body).encode(), delivery_count=count)


def level(store: DedupStore, sku: str = "s-1") -> int:
    found = [e for e in store.read_entities(f"stock|{sku}", "stock", 1) if e.name == "stock"]
    return int(found[0].data["level"]) if found else 0


def moves(store: DedupStore, sku: str = "s-1") -> list[str]:
    return sorted(e.name for e in store.read_entities(f"stock|{sku}", "move|", 1000))


@pytest.fixture(params=CHANGING_STORES)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store(request: pytest.FixtureRequest, kind: str) -> DedupStore:
    return changing_store(request, kind)


# -- declined: recorded, replayed -------------------------------------------------------------------


@pytest.mark.parametrize("lazy", [False, True], ids=["reads", "lazy"])
def test_a_declined_message_gets_the_same_answer_after_the_stock_changed(
    store: DedupStore, lazy: bool, caplog: pytest.LogCaptureFixture
) -> None:
    consumer = stock_consumer(store, lazy=lazy)
    with caplog.at_level(logging.INFO, logger="idempotency"):
        first = consumer.process(delivery(move("r-1", -5)))
    assert (first.outcome, first.reason, first.detail, first.acknowledge) == (
        Outcome.DECLINED, "insufficient_stock", "5 asked, 0 left", True)  # fmt: skip
    logged = [fields_of(r) for r in caplog.records if "outcome" in fields_of(r)]
    assert [(f["outcome"], f["reason"]) for f in logged] == [("declined", "insufficient_stock")]
    assert consumer.process(delivery(move("m-1", 10))).outcome is Outcome.PROCESSED  # restocked meanwhile
    again = stock_consumer(store, lazy=lazy).process(delivery(move("r-1", -5)))  # a producer's retry, elsewhere
    assert (again.outcome, again.reason) == (Outcome.DUPLICATE, Reason.DECLINED)
    assert again.response == {"reason": "insufficient_stock", "detail": "5 asked, 0 left"}
    assert (level(store), moves(store)) == (10, ["move|m-1"])


def test_a_decline_commits_the_records_its_handler_adds_and_carries_no_result(store: DedupStore) -> None:
    def noted(message: dict[str, Any], context: Context) -> Effects:
        effects = move_stock(message, context)
        if effects.declined is None:
            return effects
        return Effects([Entity(f"refusal|{message['id']}", {"why": effects.declined.detail})],
                       result={"no": True} if message["id"] == "r-2" else None, declined=effects.declined)  # fmt: skip

    consumer = stock_consumer(store, handler=noted)
    assert consumer.process(delivery(move("r-1", -5))).outcome is Outcome.DECLINED
    assert [e.data for e in store.read_entities("stock|s-1", "refusal|", 10)] == [{"why": "5 asked, 0 left"}]
    both = consumer.process(delivery(move("r-2", -5)))  # a result beside a decline: the handler's bug
    assert (both.outcome, both.reason) == (Outcome.INVALID, Reason.HANDLER_RESULT)


# -- the applied delivery reports it, exactly once --------------------------------------------------


class LoseNextCommit(PassThrough):
    """The next transaction (a POST to $batch; any write, a single insert too, once ``writes``)
    is applied by Azurite and its answer lost."""

    armed, writes = False, False

    def send(self, request: Any, **kwargs: Any) -> Any:
        answer = self._inner.send(request, **kwargs)
        if self.armed and request.method in ("POST", "PUT") and (self.writes or request.url.endswith("$batch")):
            self.armed = False
            raise ServiceResponseError("injected: the answer was lost after the service applied the request")
        return answer


def lossy_store(request: pytest.FixtureRequest, kind: str, write: str) -> tuple[DedupStore, Callable[[], None]]:
    """A store whose next ``write`` (a commit, or a versioned state's) is applied and its answer
    lost once armed (``arm()``): at the transport for Table Storage, at the method for the memory
    store."""
    if kind != "memory":
        wires: list[LoseNextCommit] = []

        def wire(inner: Any) -> LoseNextCommit:
            wires.append(LoseNextCommit(inner))
            wires[-1].writes = write == "write_state"
            return wires[-1]

        return changing_store(request, kind, wire=wire), lambda: setattr(wires[0], "armed", True)
    store = changing_store(request, kind)
    applies = getattr(store, write)

    def arm() -> None:
        def lost(*args: Any, **kwargs: Any) -> Any:
            setattr(store, write, applies)
            applies(*args, **kwargs)
            raise StoreUnavailable("injected: the answer was lost after the store applied the write")

        setattr(store, write, lost)

    return store, arm


@pytest.fixture
def lossy(request: pytest.FixtureRequest, kind: str) -> tuple[DedupStore, Callable[[], None]]:
    return lossy_store(request, kind, "commit_many")


def noted_step(message: dict[str, Any], context: Context) -> Effects:
    """A two-phase step (its completion commits with the marker), then an insert."""
    context.step("notify", lambda key: {"sent": key})
    return Effects([Entity(f"move|{message['id']}", {"quantity": message["quantity"]})], result={"ok": True})


def consumer_for(path: str, store: DedupStore) -> IdempotentConsumer:
    if path == "insert":  # no read: the conflict on the marker tells the commit was ours
        return stock_consumer(store, lazy=True, handler=lambda m, c: Effects([Entity(f"move|{m['id']}", m)]))
    if path == "step":
        return stock_consumer(store, lazy=True, handler=noted_step)
    return stock_consumer(store, lazy=path == "change-lazy")


@pytest.mark.parametrize("path", ["insert", "step", "change", "change-lazy", "declined"])
def test_an_applied_commit_whose_answer_was_lost_is_reported_once_as_applied(
    lossy: tuple[DedupStore, Callable[[], None]], path: str
) -> None:
    """20 messages, each one's commit applied and its answer lost: the delivery decides it again
    (a retry within its wait) and reports what was committed — processed, or declined — then
    a redelivery reports a duplicate; each applied once."""
    store, arm = lossy
    consumer = consumer_for(path, store)
    expected = Outcome.DECLINED if path == "declined" else Outcome.PROCESSED
    if path != "declined":
        consumer.process(delivery(move("stocked", 1000)))
    reported = []
    for n in range(20):
        body = move(f"m-{n}", -5000 if path == "declined" else -1)
        arm()
        reported.append(consumer.process(delivery(body)).outcome)
        assert stock_consumer(store).process(delivery(body, 2)).outcome is Outcome.DUPLICATE
    assert reported == [expected] * 20
    if path in ("change", "change-lazy"):
        assert level(store) == 1000 - 20
    if path != "declined":
        assert len(moves(store)) == 1 + 20  # the stock's, then each once


def test_a_lost_answer_is_reported_applied_though_a_copy_found_it_committed_meanwhile() -> None:
    """Found by the proof kit (Event Grid sends a copy again while the first delivery still waits):
    the copy finds the marker and the instance's cache learns the key; the first delivery's
    retry must still tell its own commit from a copy's — processed, never a duplicate."""
    store = MemoryStore()
    consumer = stock_consumer(store, lazy=True, handler=lambda m, c: Effects([Entity(f"move|{m['id']}", m)]))
    body, applies = move("m-1", 1), store.commit_many

    def answer_lost(commits: Any) -> Any:
        store.commit_many = applies  # type: ignore[method-assign]
        applies(commits)
        assert consumer.process(delivery(body, 2)).outcome is Outcome.DUPLICATE  # the copy, meanwhile
        raise StoreUnavailable("injected: the answer was lost after the store applied the commit")

    store.commit_many = answer_lost  # type: ignore[method-assign]
    assert consumer.process(delivery(body)).outcome is Outcome.PROCESSED


@pytest.mark.parametrize("lazy", [False, True], ids=["reads", "lazy"])
def test_a_handler_never_decides_again_on_the_state_its_message_left(
    lossy: tuple[DedupStore, Callable[[], None]], lazy: bool
) -> None:
    """A release needs its reservation, and deletes it: decided again on what it left, it would
    be refused (``unknown_reservation``) — dead-lettered though applied. Its marker is read with
    the first entity its handler reads, so a retry after a lost answer and a redelivery after a
    lost settlement stop there: processed once, then a duplicate."""

    def release(message: dict[str, Any], context: Context) -> Effects:
        held = context.read(f"reservation|{message['id']}")
        if not held.exists:
            raise InvalidMessage("unknown_reservation", f"no reservation {message['id']}")
        stock = context.read("stock")
        return Effects(changes=[held.deleted(), stock.merged({"level": stock.data["level"] + held.data["quantity"]})])

    store, arm = lossy
    consumer = stock_consumer(store, lazy=lazy, handler=release)
    if not lazy:
        consumer = stock_consumer(store, handler=release, reads=lambda m: [f"reservation|{m['id']}", "stock"])
    partition = consumer.identify(delivery(move("r-1", 0)))[1]
    store.put_entity(partition, Entity("stock", {"level": 0}))
    store.put_entity(partition, Entity("reservation|r-1", {"quantity": 3}))
    arm()
    assert consumer.process(delivery(move("r-1", 0))).outcome is Outcome.PROCESSED
    assert consumer.process(delivery(move("r-1", 0), 2)).outcome is Outcome.DUPLICATE  # its settlement was lost
    assert level(store) == 3 and not store.dead_letters("stock")


def test_a_versioned_state_whose_answer_was_lost_is_reported_once_as_applied(
    request: pytest.FixtureRequest, kind: str
) -> None:
    """``LatestState`` has no marker: the writer's token is kept with the state, so a retry after a
    lost answer finds its own write (processed), and a redelivery another's (duplicate)."""
    store, arm = lossy_store(request, kind, "write_state")
    consumer = IdempotentConsumer("state", store, lambda m, c: LatestState(Entity("status", {"s": m["s"]}), m["v"]),
                                  key_source=from_body_field("id"), config=WAIT)  # fmt: skip
    reported = []
    for version in range(1, 21):  # a new entity's write (an insert) first, then replacements
        body = {"id": "o-1", "s": f"s{version}", "v": version}
        arm()
        reported.append(consumer.process(delivery(body)).outcome)
        assert consumer.process(delivery(body, 2)).outcome is Outcome.DUPLICATE
    assert reported == [Outcome.PROCESSED] * 20


def test_a_folded_batch_whose_answer_was_lost_reports_each_message_processed_once(
    lossy: tuple[DedupStore, Callable[[], None]],
) -> None:
    store, arm = lossy
    consumer = stock_consumer(store)
    for round_ in range(20):
        batch = [delivery(move(f"m-{round_}-{n}", 1)) for n in range(5)]
        arm()
        assert [r.outcome for r in consumer.process_batch(batch)] == [Outcome.PROCESSED] * 5
    assert level(store) == 100 and len(moves(store)) == 100


def test_an_http_request_whose_answer_was_lost_is_answered_as_new_then_replayed(
    lossy: tuple[DedupStore, Callable[[], None]],
) -> None:
    store, arm = lossy
    route = stock_route(store)
    for n in range(20):
        body = move(f"m-{n}", 1)
        arm()
        first = on_http(lambda: route, http_request(body, idempotency_key=f"k-{n}"))
        again = on_http(lambda: route, http_request(body, idempotency_key=f"k-{n}"))
        assert (first.status_code, "Idempotent-Replayed" in first.headers) == (201, False)
        assert (again.status_code, again.headers.get("Idempotent-Replayed"), again.get_body()) == (
            201, "true", first.get_body())  # fmt: skip
    assert level(store) == 20


# -- HTTP: a decline is a problem, replayed; a reused key is the caller's ---------------------------


def stock_route(store: DedupStore, *, lazy: bool = False) -> IdempotentConsumer:
    def moved(message: dict[str, Any], context: Context) -> Effects:
        effects = move_stock(message, context)
        return effects if effects.declined else Effects(effects.entities, {"id": message["id"]},
                                                        changes=effects.changes)  # fmt: skip

    return stock_consumer(store, lazy=lazy, handler=stored_response(moved, 201, "/api/moves/{id}"),
                          replay_results=True, record_refusals=False, bind_request_keys=True)  # fmt: skip


def test_a_declined_request_is_a_409_problem_with_the_handlers_detail_and_replayed(store: DedupStore) -> None:
    route = stock_route(store)
    first = on_http(lambda: route, http_request(move("r-1", -3), idempotency_key="k-1"))
    problem = json.loads(first.get_body())
    assert (first.status_code, problem["title"], problem["detail"], problem["reason"]) == (
        409, "Declined: insufficient_stock", "3 asked, 0 left", "insufficient_stock")  # fmt: skip
    assert "Idempotent-Replayed" not in first.headers
    stock_consumer(store).process(delivery(move("m-1", 10)))
    for key in ("k-1", "k-2"):  # the client's retry, and under a new key: the same answer
        again = on_http(lambda: route, http_request(move("r-1", -3), idempotency_key=key))
        assert (again.status_code, again.get_body(), again.headers["Idempotent-Replayed"]) == (
            409, first.get_body(), "true")  # fmt: skip
    assert (level(store), moves(store)) == (10, ["move|m-1"])


@pytest.mark.parametrize("lazy", [False, True], ids=["reads", "lazy"])
def test_a_key_reused_with_another_body_is_422_and_never_a_conflict(
    store: DedupStore, lazy: bool, caplog: pytest.LogCaptureFixture
) -> None:
    route = stock_route(store, lazy=lazy)
    assert on_http(lambda: route, http_request(move("m-1", 2), idempotency_key="k-1")).status_code == 201
    with caplog.at_level(logging.INFO, logger="idempotency"):
        reused = on_http(lambda: route, http_request(move("m-1", 3), idempotency_key="k-1"))  # same key, other body
        other = on_http(lambda: route, http_request(move("m-1", 3), idempotency_key="k-2"))  # its business id reused
    assert (reused.status_code, json.loads(reused.get_body())["title"]) == (422, "Idempotency-Key reused")
    assert (other.status_code, json.loads(other.get_body())["title"]) == (409, "Conflict with an earlier request")
    logged = [fields_of(r) for r in caplog.records if "outcome" in fields_of(r)]
    assert [(f["outcome"], f["reason"]) for f in logged] == [("invalid", "idempotency_key_reused"),
                                                             ("invalid", "fingerprint_mismatch")]  # fmt: skip
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # the conflicts alert's, not a caller's
    assert level(store) == 2


def test_a_key_that_is_the_callers_own_reused_with_another_body_is_422(store: DedupStore) -> None:
    """A route keyed by the Idempotency-Key itself (no business key): a mismatch is the key's reuse."""
    route = IdempotentConsumer("notes", store, stored_response(lambda m, c: Effects([Entity("note", m)], m), 201,
                               "/api/notes/{id}"), replay_results=True, record_refusals=False)  # fmt: skip
    assert on_http(lambda: route, http_request({"id": "n-1"}, idempotency_key="k-1")).status_code == 201
    reused = on_http(lambda: route, http_request({"id": "n-2"}, idempotency_key="k-1"))
    assert (reused.status_code, json.loads(reused.get_body())["title"]) == (422, "Idempotency-Key reused")


# -- every trigger settles a decline as handled ---------------------------------------------------


def test_a_declined_message_is_settled_as_handled_on_every_trigger(store: DedupStore) -> None:
    """Service Bus completes it (returns), a Storage queue deletes it (returns), Event Grid gets
    200 (returns); each later copy is a duplicate of the decline, whatever the stock became."""
    queue = stock_consumer(store)
    by_event = IdempotentConsumer("stock", store, lambda envelope, context: move_stock(envelope["data"], context),
                                  key_source=lambda _, envelope: envelope["data"]["id"], reads=lambda _: ["stock"],
                                  partition_from=lambda _, envelope: envelope["data"]["sku"], config=WAIT)  # fmt: skip
    sends = {
        "servicebus": lambda body: on_servicebus(lambda: queue, servicebus_message(body, body["id"])),
        "storage queue": lambda body: on_storage_queue(lambda: queue, storage_queue_message(body)),
        "event grid": lambda body: on_eventgrid(lambda: by_event, cloudevent(body, source="/stock", event_id=body["id"],
                                                                             event_type="stock.moved")),
    }  # fmt: skip
    for n, send in enumerate(sends.values()):
        send(move(f"r-{n}", -5))  # returns: settled as handled
    queue.process(delivery(move("m-1", 100)))
    for n, send in enumerate(sends.values()):
        send(move(f"r-{n}", -5))  # the same decision: nothing applied
    assert (level(store), moves(store)) == (100, ["move|m-1"])
    declined = [store.get(DedupKey("stock", f"r-{n}"), "stock|s-1") for n in range(len(sends))]
    assert [(m.state, m.result["reason"]) for m in declined if m] == [(State.DECLINED, "insufficient_stock")] * 3
    assert store.dead_letters("stock") == []  # handled, not refused


def test_a_decline_whose_messages_wait_for_the_sweep_is_still_answered_and_replayed_as_a_decline(
    store: DedupStore,
) -> None:
    """A decline that sends a message ("sorry, sold out") on a route whose sender is down: the
    messages are parked for the sweep, and the request (and its repeat) still gets the decline."""

    class Down:
        def send(self, messages: Any) -> None:
            raise StoreUnavailable("the namespace is down")

    def regretted(message: dict[str, Any], context: Context) -> Effects:
        effects = move_stock(message, context)
        return Effects(declined=effects.declined, messages=[Outgoing("regrets", {"id": message["id"]})])

    route = stock_consumer(store, handler=stored_response(regretted, 201, "/api/moves/{id}"), replay_results=True,
                           record_refusals=False, bind_request_keys=True, sender=Down())  # fmt: skip
    for key in ("k-1", "k-2"):
        answer = on_http(lambda: route, http_request(move("r-1", -3), idempotency_key=key))
        assert (answer.status_code, json.loads(answer.get_body())["detail"]) == (409, "3 asked, 0 left")


def test_a_batch_whose_messages_share_an_entity_never_refuses_one_its_own_commit_applied(
    lossy: tuple[DedupStore, Callable[[], None]],
) -> None:
    """Without ``reads``, the first message of a batch reads the shared entity (and its own
    marker); the others read it from the batch. Their commit applied, its answer lost, they are
    decided again: the second meets the state it left and refuses — its marker, read then, says it
    was applied. Both processed, nothing dead-lettered."""

    def ship(message: dict[str, Any], context: Context) -> Effects:
        opened = context.read("open")
        if message["id"] not in (opened.data or {}).get("ids", []):
            raise InvalidMessage("unknown_order", f"{message['id']} is not open")
        left = [i for i in opened.data["ids"] if i != message["id"]]  # type: ignore[index]
        return Effects([Entity(f"shipped|{message['id']}", {})], changes=[opened.replaced({"ids": left})])

    store, arm = lossy
    consumer = stock_consumer(store, lazy=True, handler=ship)
    store.put_entity("stock|s-1", Entity("open", {"ids": ["a", "b"]}))
    arm()
    results = consumer.process_batch([delivery(move("a", 0)), delivery(move("b", 0))])
    assert [r.outcome for r in results] == [Outcome.PROCESSED, Outcome.PROCESSED]
    assert store.dead_letters("stock") == [] and len(store.read_entities("stock|s-1", "shipped|", 10)) == 2


def test_only_a_callers_own_key_reused_is_idempotency_key_reused() -> None:
    """From an HTTP caller (``origin``): its request key reused with another body is
    ``idempotency_key_reused``; a business key's, or a versioned state's conflict, keeps its reason
    — all ``invalid``, none a ``conflict``. From a broker, a conflict."""
    store = MemoryStore()
    notes = IdempotentConsumer("notes", store, lambda m, c: Effects([Entity("note", m)]))
    states = IdempotentConsumer("states", store, lambda m, c: LatestState(Entity("s", m), 1),
                                key_source=from_body_field("id"))  # fmt: skip

    def sent(consumer: IdempotentConsumer, body: dict[str, Any], origin: str | None) -> tuple[Outcome, str | None]:
        result = consumer.process(Delivery(json.dumps(body).encode(), message_id="k-1", origin=origin))
        return result.outcome, result.reason

    assert sent(notes, {"n": 1}, "caller")[0] is Outcome.PROCESSED
    assert sent(notes, {"n": 2}, "caller") == (Outcome.INVALID, Reason.IDEMPOTENCY_KEY_REUSED)
    assert sent(states, {"id": "s-1", "v": "a"}, "caller")[0] is Outcome.PROCESSED
    assert sent(states, {"id": "s-1", "v": "b"}, "caller") == (Outcome.INVALID, Reason.VERSION_CONFLICT)
    assert sent(notes, {"n": 2}, None) == (Outcome.CONFLICT, Reason.FINGERPRINT_MISMATCH)


# -- fail closed on expired keys ---------------------------------------------------------------------


def test_a_message_older_than_its_marker_can_be_is_refused_on_every_source(store: DedupStore) -> None:
    """400 days in the queue, past DEDUP_RETENTION (30 days): whether or not its marker was purged,
    it is never applied — dead-lettered ``expired`` and acknowledged; a resent copy carries its
    original's time (``dedup-enqueued-at``) and is refused the same way."""
    consumer = stock_consumer(store, config=DedupConfig(retention=timedelta(days=30)))
    old = datetime.now(UTC) - timedelta(days=400)
    on_servicebus(lambda: consumer, servicebus_message(move("m-1", 5), "m-1", enqueued_time=old, sequence_number=7))
    on_storage_queue(lambda: consumer, storage_queue_message(move("m-2", 5), inserted=old))
    resent = {"dedup-key": "m-3", "dedup-enqueued-at": old.isoformat()}
    on_servicebus(lambda: consumer, servicebus_message(move("m-3", 5), "resent-1", properties=resent))
    recent = datetime.now(UTC) - timedelta(days=29)
    on_servicebus(lambda: consumer, servicebus_message(move("m-4", 5), "m-4", enqueued_time=recent))
    assert (level(store), moves(store)) == (5, ["move|m-4"])
    records = sorted((r.key_id, r.reason) for r in store.dead_letters("stock"))
    assert records == [("m-1", "expired"), ("m-2", "expired"), ("m-3", "expired")]


def test_the_age_limit_is_the_retention_less_the_margin_and_a_copy_is_as_old_as_its_first(store: DedupStore) -> None:
    consumer = stock_consumer(store, config=DedupConfig(retention=timedelta(days=30)))
    limit = datetime.now(UTC) - timedelta(days=30) + EXPIRY_MARGIN
    minute = timedelta(minutes=1)
    on_servicebus(lambda: consumer, servicebus_message(move("m-1", 1), "m-1", enqueued_time=limit - minute))
    on_servicebus(lambda: consumer, servicebus_message(move("m-2", 1), "m-2", enqueued_time=limit + minute))
    later = {"dedup-enqueued-at": (datetime.now(UTC) + timedelta(days=1)).isoformat()}  # never younger than it is
    on_servicebus(lambda: consumer, servicebus_message(move("m-3", 1), "m-3", enqueued_time=limit - minute,
                                                       properties=later))  # fmt: skip
    assert moves(store) == ["move|m-2"]
    assert sorted(r.key_id or "" for r in store.dead_letters("stock")) == ["m-1", "m-3"]
