"""The proof kit (shared.idempotency.testing.prove) on a stock consumer (tests/proof_app.py): proven
on every store, and each mutant of it caught, named by its violation."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest

from shared.idempotency.stores import MemoryStore
from shared.idempotency.testing import Accepted, Azurite, Faults, Message, Proof, Stored, prove
from shared.idempotency.testing.proof import producer_sends
from tests import app, proof_app

ROOT = Path(__file__).resolve().parents[2]
STOCK = Proof(proof_app.on_stock, proof_app.workload, proof_app.ledger)
# make test proves the kit on the memory store (and the example's consumers on the lean transport:
# tests/example/test_example_proofs.py); the long lane on both Table transports and through an outage
ON_TABLES = pytest.mark.long("the kit's own proof on Table Storage, each transport, and a store restarted")


@pytest.mark.parametrize("store", ["memory", pytest.param("table-lean", marks=ON_TABLES),
                                   pytest.param("table-sdk", marks=ON_TABLES)])  # fmt: skip
def test_the_stock_consumer_is_proven_on_every_store(azurite: Azurite, store: str) -> None:
    verdict = STOCK.run(messages=150, store=store, azurite=azurite, seed=7)
    assert verdict.ok, verdict
    assert (
        verdict.faults.total() > 10 and verdict.deliveries > verdict.sends - verdict.dropped_by_detection
    )  # faults met, redeliveries made
    assert verdict.decided["applied"] > 0 and verdict.decided["declined"] > 0
    assert verdict.decided["invalid"] > 0 and verdict.broker_dead_lettered == 0
    assert verdict.audit["closes"] is True


@ON_TABLES
def test_an_outage_restarts_the_store_and_nothing_is_lost() -> None:
    verdict = STOCK.run(messages=120, store="table-lean", seed=3, faults=Faults(outage=1.0))
    assert verdict.ok, verdict


def test_twins_are_refused_and_invalid_messages_recorded_once() -> None:
    messages = [Message({"changeId": f"c-{i}", "sku": "sku-0", "kind": "restock", "quantity": 1}, f"c-{i}")
                for i in range(60)]  # fmt: skip
    messages.append(Message({"changeId": "bad", "sku": "sku-0", "kind": "steal", "quantity": 1}, "bad",
                            invalid="schema_violation"))  # fmt: skip
    verdict = prove(proof_app.on_stock, messages, proof_app.ledger, faults=Faults(twins=0.3), seed=11)
    assert verdict.ok, verdict
    assert verdict.decided["refused"] > 0 and verdict.decided["invalid"] >= 1


class IfMatchStar(MemoryStore):
    """A store that ignores the version a change was read at (If-Match: *)."""

    def _at_versions(self, *args: Any) -> bool:
        return True


MUTANTS = {
    "a change written outside the transaction": (proof_app.on_blind, {}, "invariant:"),
    "an effect applied twice": (proof_app.on_twice, {}, "not decided exactly once"),
    "a version ignored (If-Match: *)": (proof_app.on_stock, {"store": IfMatchStar()}, "invariant:"),
    # refused as invalid when short of stock: a copy that comes after a restock is applied (the
    # decision changed), or none does (a valid message refused)
    "a decision that changes on a redelivery": (
        proof_app.on_fickle,
        {},
        ("a decision that changed", "a valid message refused as invalid"),
    ),
    "a message settled without being applied": (
        proof_app.on_swallowed,
        {"faults": Faults(outage=6.0)},
        "settled without a decision",
    ),
    "a release that keeps its reservation": (proof_app.on_kept, {"faults": Faults.none()}, "invariant: reservation"),
    "a Storage queue consumer keyed by the queue's message id": (
        proof_app.on_queue_by_message_id,
        {},
        "not decided exactly once: message",
    ),
}


@pytest.mark.parametrize("mutant", MUTANTS)
def test_each_mutant_is_caught_and_named(mutant: str) -> None:
    function, options, named = MUTANTS[mutant]
    verdict = prove(function, proof_app.workload, proof_app.ledger, **{"messages": 150, "seed": 5, **options})
    assert not verdict.ok
    assert any(v.startswith(named) for v in verdict.violations), verdict


def test_a_function_is_found_by_its_name_and_a_trigger_not_modelled_is_refused() -> None:
    assert prove("proof_stock", proof_app.workload, proof_app.ledger, messages=30, faults=Faults.none()).ok
    with pytest.raises(LookupError, match="no function of the app is named 'nothing_here'"):
        prove("nothing_here", [])
    for function, trigger in (
        (app.item_state, "serviceBusTrigger \\(sessions\\)"),
        (app.item_stream, "eventHubTrigger"),
    ):
        with pytest.raises(ValueError, match=f"^{trigger}.*: the proof kit models"):
            prove(function, [])


def test_the_same_seed_sends_the_same_messages() -> None:
    """A failure's seed reproduces its workload, its producer's retries, twins and invalid messages
    (and the sequence of fault draws; thread interleavings still vary)."""
    logical = list(proof_app.workload(random.Random(21), 80))
    first, again, other = (producer_sends(logical, Faults(), seed) for seed in (21, 21, 22))
    assert first == again != other
    assert len(first) > len(logical)


def test_make_prove_runs_a_proof_bigger_and_prints_its_verdict_as_one_json_line() -> None:
    done = subprocess.run(["make", "-s", "prove", "PROOF=tests.integration.test_proof:STOCK", "MESSAGES=120",
                           "STORE=memory", "SEED=4"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    verdict = json.loads(done.stdout.splitlines()[-1])
    assert (verdict["ok"], verdict["seed"], verdict["messages"], verdict["violations"]) == (True, 4, 120, [])


@pytest.mark.parametrize(("proof", "said"), [("", "name the proof"), ("tests.nowhere:PROOF", "cannot load"),
                                             ("tests.integration.test_proof:MUTANTS", "not a Proof")])  # fmt: skip
def test_make_prove_without_a_proof_says_why_in_one_line(proof: str, said: str) -> None:
    done = subprocess.run(["make", "-s", "prove", f"PROOF={proof}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    lines = done.stderr.strip().splitlines()  # the reason, then make's own line naming the target
    assert done.returncode == 2 and said in lines[0] and "Traceback" not in done.stderr, done.stderr
    assert len(lines) == 1 or (len(lines) == 2 and "[Makefile" in lines[1]), done.stderr


def shipments_once(accepted: list[Accepted], stored: Stored) -> list[str]:
    shipped = sorted(str(s["itemId"]) for s in stored.entities("shipment"))
    decided = sorted(a.payload["data"]["id"] for a in accepted if a.decision == "applied")
    return [] if shipped == decided else [f"{len(shipped)} shipments stored, {len(decided)} events applied"]


@pytest.mark.parametrize("store", ["memory", pytest.param("table-lean", marks=ON_TABLES)])
def test_an_event_grid_function_is_proven_with_its_delivery_model(azurite: Azurite, store: str) -> None:
    """Event Grid: no duplicate detection, no sequence numbers, the consumer's payload the event's
    envelope; the producer's duplicates and twins, under the store's faults."""
    events = [Message({"id": f"i-{i}"}, f"ev-{i}", properties={"source": "/items", "type": app.EVENT_TYPE})
              for i in range(100)]  # fmt: skip
    verdict = prove(app.item_events, events, shipments_once, store=store, azurite=azurite, seed=9,
                    faults=Faults(twins=0.1))  # fmt: skip
    assert verdict.ok, verdict
    assert verdict.dropped_by_detection == 0 and verdict.decided["applied"] == 100 and verdict.decided["refused"] > 0
    assert verdict.audit == {}  # no sequence numbers: nothing to audit


def items_once(accepted: list[Accepted], stored: Stored) -> list[str]:
    kept = sorted(str(i["itemId"]) for i in stored.entities(app.ITEM))
    applied = sorted(a.key for a in accepted if a.decision == "applied")
    return [] if kept == applied else [f"{len(kept)} items stored, {len(applied)} messages applied"]


@pytest.mark.parametrize("store", ["memory", pytest.param("table-lean", marks=ON_TABLES)])
def test_a_storage_queue_function_is_proven_with_its_delivery_model(azurite: Azurite, store: str) -> None:
    """Storage queues: each enqueue gets the service's own id (a producer's retry too: the consumer
    keys by the body's id), no duplicate detection, no sequence numbers; a message that is not JSON
    is recorded under the id the consumer saw; nothing reaches the poison queue."""
    messages = [Message(app.item(f"i-{i}", i), f"i-{i}") for i in range(100)]
    verdict = prove(app.item_queue, messages, items_once, store=store, azurite=azurite, seed=13,
                    faults=Faults(invalid=0.05))  # fmt: skip
    assert verdict.ok, verdict
    assert verdict.dropped_by_detection == 0 and verdict.sends > 100 and verdict.deliveries > verdict.sends
    assert verdict.decided["applied"] == 100 and verdict.decided["invalid"] > 0 and verdict.decided["refused"] == 0
    assert verdict.faults.total() > 5 and verdict.audit == {}  # faults met; no sequence numbers to audit


def test_a_storage_queue_message_that_keeps_failing_goes_to_the_poison_queue() -> None:
    """The kit's poison queue is the host's: after maxDequeueCount dequeues (host.json), the message
    leaves the queue, and the proof says so."""
    change = {"changeId": "c-1", "sku": "sku-0", "kind": "restock", "quantity": 1}
    verdict = prove(proof_app.on_queue_always_fails, [Message(change, "c-1")], faults=Faults.none())
    assert not verdict.ok and verdict.broker_dead_lettered == 1 and verdict.deliveries == 5, verdict
    assert any(v.startswith("left in the broker's dead-letter queue") for v in verdict.violations), verdict


@pytest.mark.parametrize("store", ["memory", pytest.param("table-lean", marks=ON_TABLES)])
def test_an_http_function_is_proven_with_its_clients_retries(azurite: Azurite, store: str) -> None:
    """HTTP with Idempotency-Key: a client retries after its timeout (a crash, a lost answer: the
    retry may run beside the first), after Retry-After on 409 (a copy in flight) and 503; each
    item stored once, each request answered as the first."""
    requests = [Message(app.item(f"i-{i}", i), f"k-{i}") for i in range(100)]
    verdict = prove(app.items_api, requests, items_once, store=store, azurite=azurite, seed=17)
    assert verdict.ok, verdict
    assert verdict.decided["applied"] == 100 and verdict.deliveries > verdict.sends > 100
    assert verdict.outcomes["duplicate"] > 0 and verdict.faults.total() > 5


def batch_items_once(accepted: list[Accepted], stored: Stored) -> list[str]:
    kept = sorted(str(e.data["itemId"]) for e in stored.store.scan() if e.entity and e.entity.startswith(app.ITEM_OF))
    applied = sorted(a.key for a in accepted if a.decision == "applied")
    return [] if kept == applied else [f"{len(kept)} items stored, {len(applied)} messages applied"]


@pytest.mark.parametrize("store", ["memory", pytest.param("table-lean", marks=ON_TABLES)])
def test_a_service_bus_batch_function_is_proven_with_its_batches(azurite: Azurite, store: str) -> None:
    """cardinality="many": a call gets what the queue holds, up to a batch; it completes, is
    abandoned or lapses as a whole (its committed messages then come back as duplicates)."""
    messages = [Message(app.item(f"i-{i}", i), f"i-{i}") for i in range(150)]
    verdict = prove(app.item_batch, messages, batch_items_once, store=store, azurite=azurite, seed=19)
    assert verdict.ok, verdict
    assert verdict.decided["applied"] == 150 and verdict.decided["invalid"] > 0
    assert verdict.outcomes["duplicate"] > 0 and verdict.audit["closes"] is True
