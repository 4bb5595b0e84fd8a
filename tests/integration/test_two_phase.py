"""Effects outside the transaction: a payment API called in a two-phase step, against a
real Azurite and a real local HTTP payment service that honours Idempotency-Key."""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

from lab.payment_service import PaymentService
from shared.idempotency import Effects, IdempotentConsumer, Outcome, StepPolicy
from shared.idempotency.config import DedupConfig
from shared.idempotency.consumer import Handler
from shared.idempotency.downstream import IdempotentHttp
from shared.idempotency.errors import DownstreamRejected, DownstreamUnavailable, InvalidMessage, StoreUnavailable
from shared.idempotency.functions import RetryLater
from shared.idempotency.functions.adapters import servicebus_delivery
from shared.idempotency.keys import DedupKey, consumer_partition
from shared.idempotency.messages import utcnow
from shared.idempotency.reconcile import ESCALATION, escalate_stale_claims
from shared.idempotency.resubmit import check_ids
from shared.idempotency.stores import Marker, State, TableStore
from shared.idempotency.testing import wrapped_handler
from shared.idempotency.testing.azurite import Azurite
from shared.idempotency.testing.faults import Crash
from tests.app import SCHEMA, effects_by_item, item, item_handler, queue_consumer
from tests.functions import fresh_app, servicebus_message, user_function

items = user_function("items")
SHORT_LEASE = "PT1S"


ONCE = Counter({"item": 1, "posting": 1})  # what an item leaves in the store: its record and one posting


def charges_per_item(payments: PaymentService) -> dict[str, int]:
    """The charges the payment API accepted, per item id."""
    return payments.charges_per("itemId")


@pytest.fixture
def payments() -> Iterator[PaymentService]:
    with PaymentService() as service:
        yield service


@pytest.fixture  # its own: the test app with a payment API and a short lease (conftest's items_store has neither)
def app(azurite: Azurite, payments: PaymentService) -> Iterator[TableStore]:
    """The test app, with a payment API and a short lease."""
    with fresh_app(azurite, ITEMS_PAYMENT_URL=payments.url, DEDUP_LEASE=SHORT_LEASE, DEDUP_IN_FLIGHT_WAIT="PT0S"):
        store = queue_consumer().store
        assert isinstance(store, TableStore)
        yield store


def step_marker(store: TableStore, item_id: str, step: str = "charge") -> Marker | None:
    return store.get(DedupKey("items", item_id, step), consumer_partition("items", item_id))


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def lease_expired(store: TableStore, item_id: str) -> bool:
    marker = step_marker(store, item_id)
    return marker is not None and marker.reclaimable(utcnow())


def charge_key(item_id: str) -> str:
    return DedupKey("items", item_id, "charge").downstream_key


def test_a_new_item_is_charged_once_then_written(app: TableStore, payments: PaymentService) -> None:
    body = item()
    items(servicebus_message(body, body["id"]))
    items(servicebus_message(body, body["id"], delivery_count=2))
    assert charges_per_item(payments) == {body["id"]: 1}
    assert effects_by_item(app, body["id"]) == {body["id"]: ONCE}
    marker = step_marker(app, body["id"])
    assert marker is not None and marker.state is State.COMPLETED and marker.result == payments.accepted[0]
    assert payments.requests[charge_key(body["id"])] == 1  # the redelivery replayed the stored result


def test_crash_after_the_call_before_completion_charges_once(app: TableStore, payments: PaymentService) -> None:
    """The step's completion commits with the item (one transaction): a crash before it
    leaves the claim in progress, and the takeover calls again with the same key."""
    body = item()
    real_commit = app.commit_many

    def crash(*args: Any, **kwargs: Any) -> Any:
        raise Crash("worker died after the payment call")

    app.commit_many = crash  # type: ignore[method-assign]
    with pytest.raises(Crash):
        items(servicebus_message(body, body["id"]))
    app.commit_many = real_commit  # type: ignore[method-assign]
    assert effects_by_item(app, body["id"]) == {}
    marker = step_marker(app, body["id"])
    assert marker is not None and marker.state is State.IN_PROGRESS

    wait_until(lambda: lease_expired(app, body["id"]))  # the broker redelivers after the lock
    items(servicebus_message(body, body["id"], delivery_count=2))

    assert payments.requests[charge_key(body["id"])] == 2  # same key, twice
    assert charges_per_item(payments) == {body["id"]: 1}  # charged once
    assert effects_by_item(app, body["id"]) == {body["id"]: ONCE}


def test_a_stale_owner_cannot_complete_after_a_takeover(azurite: Azurite, payments: PaymentService) -> None:
    from tests.conftest import new_table_store

    store = new_table_store(azurite)
    stall, release = threading.Event(), threading.Event()

    class StallingHttp(IdempotentHttp):
        """Worker A gets its answer, then stalls past its lease before completing."""

        def post(self, path: str, body: Any, idempotency_key: str) -> Any:
            answer = super().post(path, body, idempotency_key)
            if threading.current_thread().name == "worker-a":
                stall.set()
                release.wait(10)
            return answer

    consumer = IdempotentConsumer("items", store, item_handler(StallingHttp(payments.url)), schema=SCHEMA,
                                  config=DedupConfig(steps=StepPolicy(lease=timedelta(seconds=1)),
                                                     transient_wait=timedelta(0)))  # fmt: skip
    body = item()
    delivery = servicebus_delivery(servicebus_message(body, body["id"]))
    results: dict[str, Any] = {}
    worker_a = threading.Thread(target=lambda: results.update(a=consumer.process(delivery)), name="worker-a")
    worker_a.start()
    assert stall.wait(10)
    wait_until(lambda: lease_expired(store, body["id"]))
    results["b"] = consumer.process(delivery)  # takes the claim over, same downstream key: replayed
    completed_by_b = step_marker(store, body["id"])
    release.set()
    worker_a.join()

    assert results["b"].outcome is Outcome.PROCESSED
    # A's commit (which carries its completion) meets B's: nothing of A's is written
    assert results["a"].outcome is Outcome.DUPLICATE
    after = step_marker(store, body["id"])
    assert completed_by_b is not None and after is not None and after.version == completed_by_b.version
    assert charges_per_item(payments) == {body["id"]: 1}
    assert effects_by_item(store, body["id"]) == {body["id"]: ONCE}


def test_a_live_lease_abandons_the_message_without_calling(app: TableStore, payments: PaymentService) -> None:
    body = item()
    now = utcnow()
    key = DedupKey("items", body["id"], "charge")
    from shared.idempotency.payload import fingerprint

    partition = consumer_partition("items", body["id"])
    app.claim(Marker(key, partition, State.IN_PROGRESS, fingerprint(body), now, now + timedelta(days=1),
                     lease_until=now + timedelta(minutes=5), owner="someone-else"), now)  # fmt: skip
    with pytest.raises(RetryLater) as info:
        items(servicebus_message(body, body["id"]))
    assert info.value.result.outcome is Outcome.IN_FLIGHT
    assert payments.requests == {}
    assert effects_by_item(app, body["id"]) == {}


def test_same_key_different_payload_on_a_step_is_a_conflict_and_not_charged_again(
    app: TableStore, payments: PaymentService
) -> None:
    body = item()
    items(servicebus_message(body, body["id"]))
    items(servicebus_message({**body, "amount": 43.0}, body["id"]))
    assert charges_per_item(payments) == {body["id"]: 1}
    [record] = app.dead_letters("items")
    assert record.reason == "fingerprint_mismatch"


def test_payment_outage_is_transient_and_the_retry_reuses_the_key(app: TableStore, payments: PaymentService) -> None:
    body = item()
    failures = iter(["drop"])  # charged, but the answer never arrives
    payments.hook = lambda key, phase: next(failures, None) if phase == "after" else None
    with pytest.raises(RetryLater) as info:
        items(servicebus_message(body, body["id"]))
    assert info.value.result.reason == "downstream_unavailable"
    marker = step_marker(app, body["id"])  # kept, its lease ended: the next delivery retries at once
    assert marker is not None and marker.state is State.IN_PROGRESS and marker.reclaimable(utcnow())
    items(servicebus_message(body, body["id"], delivery_count=2))
    assert payments.requests[charge_key(body["id"])] == 2
    assert charges_per_item(payments) == {body["id"]: 1}


def test_a_different_payload_after_a_failed_call_is_refused_here_not_downstream(
    app: TableStore, payments: PaymentService
) -> None:
    body = item()
    drops = iter(["drop"])
    payments.hook = lambda key, phase: next(drops, None) if phase == "after" else None
    with pytest.raises(RetryLater):
        items(servicebus_message(body, body["id"]))  # charged; the answer was lost
    items(servicebus_message({**body, "amount": 1.0}, body["id"]))  # same id, other payload
    assert [r.reason for r in app.dead_letters("items")] == ["fingerprint_mismatch"]
    items(servicebus_message(body, body["id"], delivery_count=2))
    assert charges_per_item(payments) == {body["id"]: 1}
    assert effects_by_item(app, body["id"]) == {body["id"]: ONCE}


def test_reconciliation_escalates_stuck_claims_and_leaves_live_ones(app: TableStore) -> None:
    now = utcnow()
    stuck, recent, live = (DedupKey("items", f"i-{name}-{uuid.uuid4().hex[:6]}", "charge")
                           for name in ("stuck", "recent", "live"))  # fmt: skip
    for key, lease in ((stuck, -timedelta(hours=3)), (recent, -timedelta(minutes=1)), (live, timedelta(minutes=5))):
        app.claim(Marker(key, key.id, State.IN_PROGRESS, "fp", now, now + timedelta(days=1),
                         lease_until=now + lease, owner="w"), now)  # fmt: skip

    escalated = escalate_stale_claims(app, timedelta(hours=1))
    assert [m.key for m in escalated] == [stuck]
    assert escalate_stale_claims(app, timedelta(hours=1)) == []  # the next run: nothing new, no new alert
    records = [r for r in app.dead_letters("items") if r.reason == ESCALATION]
    assert [r.key_id for r in records] == [stuck.id]
    states = {key: app.get(key, key.id).state for key in (stuck, recent, live)}  # type: ignore[union-attr]
    assert states == {stuck: State.ESCALATED, recent: State.IN_PROGRESS, live: State.IN_PROGRESS}


def test_reconciliation_moves_on_past_each_page_of_stuck_claims(app: TableStore) -> None:
    """Escalated claims leave the scan: with 26 stuck claims and 10 a run, three runs
    escalate 10, 10 and 6 distinct claims, and a fourth finds none."""
    now = utcnow()
    keys = [DedupKey("items", f"i-stuck-{i:02d}-{uuid.uuid4().hex[:6]}", "charge") for i in range(26)]
    for key in keys:
        app.claim(Marker(key, key.id, State.IN_PROGRESS, "fp", now, now + timedelta(days=1),
                         lease_until=now - timedelta(hours=3), owner="w"), now)  # fmt: skip
    runs = [escalate_stale_claims(app, timedelta(hours=1), page=4, budget=10) for _ in range(4)]
    assert [len(run) for run in runs] == [10, 10, 6, 0]
    assert {m.key for run in runs for m in run} == set(keys)
    assert len([r for r in app.dead_letters("items") if r.reason == ESCALATION]) == 26


def test_a_declined_charge_is_final_not_stuck(app: TableStore, payments: PaymentService) -> None:
    """A 402 is known to have happened: the step is recorded refused (never called again),
    the message is dead-lettered with the reason, and reconciliation has nothing to escalate."""
    body = item()
    payments.hook = lambda key, phase: "decline" if phase == "before" else None
    items(servicebus_message(body, body["id"]))
    payments.hook = None
    items(servicebus_message(body, body["id"], delivery_count=2))  # e.g. a DLQ resubmission
    assert payments.requests[charge_key(body["id"])] == 1
    marker = step_marker(app, body["id"])
    assert marker is not None and marker.state is State.REFUSED and marker.result["status"] == 402
    assert [r.reason for r in app.dead_letters("items")] == ["downstream_rejected"]  # one record, idempotent
    assert effects_by_item(app, body["id"]) == {}
    assert escalate_stale_claims(app, timedelta(0), now=utcnow() + timedelta(days=1)) == []
    consumer = queue_consumer()  # and a DLQ resubmission would be refused again
    assert [line.verdict for line in check_ids(consumer, [body["id"]])] == ["refused"]


def test_the_timer_function_runs_reconciliation(app: TableStore, caplog: pytest.LogCaptureFixture) -> None:
    now = utcnow()
    key = DedupKey("items", f"i-timer-{uuid.uuid4().hex[:6]}", "charge")
    app.claim(Marker(key, key.id, State.IN_PROGRESS, "fp", now, now + timedelta(days=1),
                     lease_until=now - timedelta(hours=2), owner="w"), now)  # fmt: skip
    with caplog.at_level("ERROR", logger="idempotency"):
        user_function("reconcile_claims")(None)
    assert any(key.id in record.getMessage() for record in caplog.records)


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "sdk"])
def test_a_message_with_a_step_costs_two_store_requests(azurite: Azurite, lean: bool) -> None:
    """The claim before the call, then one transaction: the marker, the effects and the
    step's completion (fenced by the claim's ETag). On both transaction paths."""
    from tests.conftest import new_table_store

    sent: list[str] = []
    store = new_table_store(azurite, lean=lean, hook=lambda request: sent.append(request.http_request.method))
    calls: list[str] = []

    def call(key: str) -> dict[str, str]:
        calls.append(key)
        return {"id": key}

    def handler(payload: dict[str, Any], context: Any) -> Any:
        charge = context.step("charge", call)
        effects = item_handler()(payload, context)
        assert isinstance(effects, Effects)
        return Effects([*effects.entities], result={"charge": charge["id"]})

    consumer = IdempotentConsumer("items", store, handler, schema=SCHEMA, config=DedupConfig(cache_size=0))
    deliveries = [servicebus_delivery(servicebus_message(o, o["id"])) for o in (item() for _ in range(20))]
    sent.clear()
    assert {consumer.process(d).outcome for d in deliveries} == {Outcome.PROCESSED}
    assert len(sent) == 2 * 20 and len(calls) == 20
    for delivery in deliveries:  # each step completed by its message's transaction
        item_id = json.loads(delivery.body)["id"]
        marker = step_marker(store, item_id)
        assert marker is not None and marker.state is State.COMPLETED and marker.result == {"id": charge_key(item_id)}
    sent.clear()
    assert {consumer.process(d).outcome for d in deliveries} == {Outcome.DUPLICATE}
    # a redelivery: the claim meets the completed step (refused insert, one read), the commit its guard
    assert len(sent) == 3 * 20 and len(calls) == 20


def test_a_handler_failing_after_its_step_leaves_the_step_completed(app: TableStore, payments: PaymentService) -> None:
    """No commit to carry the completion: it is written on its own, so the redelivery
    neither waits for the lease nor calls again."""
    body = item()

    def failing_after(handler: Handler) -> Handler:
        def failing(payload: Any, context: Any) -> Any:
            handler(payload, context)
            raise RuntimeError("a bug after the charge")

        return failing

    with wrapped_handler(queue_consumer(), failing_after), pytest.raises(RetryLater):
        items(servicebus_message(body, body["id"]))
    marker = step_marker(app, body["id"])
    assert marker is not None and marker.state is State.COMPLETED
    items(servicebus_message(body, body["id"], delivery_count=2))
    assert payments.requests[charge_key(body["id"])] == 1
    assert charges_per_item(payments) == {body["id"]: 1}


def test_a_claim_taken_over_during_the_call_fails_the_commit_that_carries_its_completion(azurite: Azurite) -> None:
    """The fence, through the consumer: the message's transaction carries the completion at the
    claim's ETag; a rival's takeover moved body, so nothing of the message is written."""
    from tests.conftest import new_table_store

    store = new_table_store(azurite, lean=True)
    body = item()

    def handler(payload: dict[str, Any], context: Any) -> Any:
        def call(key: str) -> Any:
            mine = step_marker(store, payload["id"])  # taken over while the call runs
            assert mine is not None and mine.version
            store.replace(Marker(mine.key, mine.partition, State.IN_PROGRESS, mine.fingerprint, utcnow(),
                                 mine.expires_at, lease_until=utcnow() + timedelta(minutes=5), owner="rival"),
                          mine.version)  # fmt: skip
            return {"id": key}

        context.step("charge", call)
        return item_handler()(payload, context)

    consumer = IdempotentConsumer("items", store, handler, schema=SCHEMA,
                                  config=DedupConfig(transient_wait=timedelta(0)))  # fmt: skip
    result = consumer.process(servicebus_delivery(servicebus_message(body, body["id"])))
    assert (result.outcome, result.reason) == (Outcome.TRANSIENT, "lease_lost")
    assert effects_by_item(store, body["id"]) == {}  # no item, no marker
    rival = step_marker(store, body["id"])
    assert rival is not None and rival.owner == "rival" and rival.state is State.IN_PROGRESS


def test_two_copies_of_a_message_in_one_batch_do_not_wait_for_each_other(azurite: Azurite) -> None:
    """The first copy's completion is written when the second meets its claim: the second
    finds the step completed (no wait, no second call) and the message is a duplicate."""
    from tests.conftest import new_table_store

    store = new_table_store(azurite, lean=True)
    calls: list[str] = []

    def call(key: str) -> dict[str, str]:
        calls.append(key)
        return {"id": key}

    def handler(payload: dict[str, Any], context: Any) -> Any:
        context.step("charge", call)
        return item_handler()(payload, context)

    config = DedupConfig(steps=StepPolicy(in_flight_wait=timedelta(0)), transient_wait=timedelta(0), cache_size=0)
    consumer = IdempotentConsumer("items", store, handler, schema=SCHEMA, config=config)
    body = item()
    delivery = servicebus_delivery(servicebus_message(body, body["id"]))
    results = consumer.process_batch([delivery, delivery])
    assert [r.outcome for r in results] == [Outcome.PROCESSED, Outcome.DUPLICATE]
    assert len(calls) == 1
    marker = step_marker(store, body["id"])
    assert marker is not None and marker.state is State.COMPLETED


class Mailer:
    """A service that ignores idempotency keys (an e-mail gateway): every call sends a mail. Its
    log can be searched by the key a call carried, which is what ``reconcile`` asks."""

    def __init__(self, *, answers_lost: int = 0, down_before_sending: int = 0) -> None:
        self.sent: Counter[str] = Counter()
        self.asked: list[str] = []
        self._answers_lost, self._down = answers_lost, down_before_sending

    def send(self, key: str) -> dict[str, str]:
        if self._down:
            self._down -= 1
            raise DownstreamUnavailable("the gateway is down: nothing sent")
        self.sent[key] += 1
        if self._answers_lost:
            self._answers_lost -= 1
            raise DownstreamUnavailable("the gateway sent it; its answer was lost")
        return {"mail": key}

    def find(self, key: str) -> dict[str, str] | None:
        self.asked.append(key)
        return {"mail": key} if self.sent[key] else None


def mailing(store: TableStore, mailer: Mailer, reconcile: Callable[[str], Any] | None, *,
            wait: float = 0) -> IdempotentConsumer:  # fmt: skip
    def handler(payload: dict[str, Any], context: Any) -> Any:
        context.step("notify", mailer.send, reconcile=reconcile)
        return item_handler()(payload, context)

    return IdempotentConsumer("items", store, handler, schema=SCHEMA,
                              config=DedupConfig(transient_wait=timedelta(seconds=wait)))  # fmt: skip


def notify_key(item_id: str) -> str:
    return DedupKey("items", item_id, "notify").downstream_key


@pytest.mark.parametrize("reconcile", [True, False])
def test_a_step_resumed_after_a_lost_answer_is_reconciled_not_repeated(azurite: Azurite, reconcile: bool) -> None:
    """Spec: a redelivery that meets an uncompleted step reconciles it before it acknowledges. The
    gateway sent the mail but its answer was lost; the redelivery resumes the step and asks
    ``reconcile``, which finds the mail: not sent again. Without ``reconcile`` such a service gets
    the call twice (the downstream key is all that stands between) — what the hook is for."""
    from tests.conftest import new_table_store

    store, mailer, body = new_table_store(azurite, lean=True), Mailer(answers_lost=1), item()
    consumer = mailing(store, mailer, mailer.find if reconcile else None)
    first = consumer.process(servicebus_delivery(servicebus_message(body, body["id"])))
    assert (first.outcome, first.reason, mailer.asked) == (Outcome.TRANSIENT, "downstream_unavailable", [])
    again = consumer.process(servicebus_delivery(servicebus_message(body, body["id"], delivery_count=2)))
    assert again.outcome is Outcome.PROCESSED
    assert mailer.sent[notify_key(body["id"])] == (1 if reconcile else 2)
    assert mailer.asked == ([notify_key(body["id"])] if reconcile else [])
    marker = step_marker(store, body["id"], "notify")
    assert marker is not None and marker.state is State.COMPLETED and marker.result == {"mail": notify_key(body["id"])}
    assert effects_by_item(store, body["id"]) == {body["id"]: ONCE}


def test_a_step_retried_within_its_delivery_is_reconciled_too(azurite: Azurite) -> None:
    """The delivery's own wait retries the message: the same owner resumes its claim, and the
    mail the lost answer hid is found, not sent again."""
    from tests.conftest import new_table_store

    store, mailer, body = new_table_store(azurite, lean=True), Mailer(answers_lost=1), item()
    result = mailing(store, mailer, mailer.find, wait=30).process(
        servicebus_delivery(servicebus_message(body, body["id"]))
    )
    assert result.outcome is Outcome.PROCESSED
    assert (mailer.sent[notify_key(body["id"])], mailer.asked) == (1, [notify_key(body["id"])])


def test_a_step_whose_completion_was_lost_with_the_commit_is_reconciled_within_its_delivery(
    azurite: Azurite,
) -> None:
    """The mail was sent, then the commit that carried its completion and the completion written
    on its own both failed (the store down): the claim is still this delivery's, live. The
    delivery's retry resumes it and asks ``reconcile``: the mail is not sent again."""
    from tests.conftest import new_table_store

    store, mailer, body = new_table_store(azurite, lean=True), Mailer(), item()
    commit_many, replace = store.commit_many, store.replace
    failing = {"commit": 1, "settle": 1}

    def down_once(name: str, write: Callable[..., Any]) -> Callable[..., Any]:
        def written(*args: Any, **kwargs: Any) -> Any:
            if failing[name]:
                failing[name] -= 1
                raise StoreUnavailable(f"{name}: the store is down")
            return write(*args, **kwargs)

        return written

    store.commit_many = down_once("commit", commit_many)  # type: ignore[method-assign]
    store.replace = down_once("settle", replace)  # type: ignore[method-assign]
    result = mailing(store, mailer, mailer.find, wait=30).process(
        servicebus_delivery(servicebus_message(body, body["id"]))
    )
    assert result.outcome is Outcome.PROCESSED and failing == {"commit": 0, "settle": 0}
    assert (mailer.sent[notify_key(body["id"])], mailer.asked) == (1, [notify_key(body["id"])])
    assert effects_by_item(store, body["id"]) == {body["id"]: ONCE}


def test_a_resumed_step_the_service_never_got_is_called_once(azurite: Azurite) -> None:
    """The gateway was down: ``reconcile`` finds nothing, and the call is made, once."""
    from tests.conftest import new_table_store

    store, mailer, body = new_table_store(azurite, lean=True), Mailer(down_before_sending=1), item()
    consumer = mailing(store, mailer, mailer.find)
    assert consumer.process(servicebus_delivery(servicebus_message(body, body["id"]))).outcome is Outcome.TRANSIENT
    again = consumer.process(servicebus_delivery(servicebus_message(body, body["id"], delivery_count=2)))
    assert again.outcome is Outcome.PROCESSED
    assert (mailer.sent[notify_key(body["id"])], mailer.asked) == (1, [notify_key(body["id"])])


UNRESOLVED = InvalidMessage("mail_unknown", "the gateway's log cannot tell whether it was sent")


@pytest.mark.parametrize("raised", [UNRESOLVED, DownstreamRejected(404, "no such log")], ids=["unresolved", "refused"])
def test_a_step_reconcile_cannot_resolve_is_escalated_not_called(azurite: Azurite, raised: Exception) -> None:
    """``reconcile`` raising ``InvalidMessage`` escalates: the message is dead-lettered with its
    reason for an operator, the mail not sent again, the step left in progress — and a lookup
    the service refuses is no refusal of the step either (never recorded refused for good)."""
    from tests.conftest import new_table_store

    store, mailer, body = new_table_store(azurite, lean=True), Mailer(answers_lost=1), item()
    reason = "mail_unknown" if isinstance(raised, InvalidMessage) else "downstream_rejected"

    def unknown(key: str) -> None:
        mailer.asked.append(key)
        raise raised

    consumer = mailing(store, mailer, unknown)
    consumer.process(servicebus_delivery(servicebus_message(body, body["id"])))
    again = consumer.process(servicebus_delivery(servicebus_message(body, body["id"], delivery_count=2)))
    assert (again.outcome, again.reason) == (Outcome.INVALID, reason)
    assert [r.reason for r in store.dead_letters("items")] == [reason]
    assert (mailer.sent[notify_key(body["id"])], len(mailer.asked)) == (1, 1)
    marker = step_marker(store, body["id"], "notify")
    assert marker is not None and marker.state is State.IN_PROGRESS
    assert effects_by_item(store, body["id"]) == {}
