"""The short chaos run that guards the invariants on every change (`make chaos` is the
long one, on the example's orders), and proof that its checker catches what it claims to
catch: on the library tests' `items` function (tests/app.py)."""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from lab.harness import RunConfig, run
from shared.idempotency.facts import CANARY_PREFIX
from shared.idempotency.keys import encode_key
from shared.idempotency.stores import Commit, CommitResult, CommitStatus, TableStore
from shared.idempotency.telemetry import fields_of
from shared.idempotency.testing.azurite import Azurite, NotListening
from tests.targets import ITEMS

# make test keeps the first run (faults and an outage, on the lean transaction path) and the log's;
# the other runs prove one trouble each, or the checker itself
LONG = pytest.mark.long("a run of hundreds of messages under one trouble, or the checker's own proof")


@pytest.fixture
def persistent_azurite() -> Iterator[Azurite]:
    with tempfile.TemporaryDirectory(prefix="chaos-") as data, Azurite(location=Path(data)) as azurite:
        yield azurite


@pytest.mark.parametrize("transactions", ["lean", pytest.param("sdk", marks=LONG)])
def test_faults_and_an_outage_cause_no_double_effect_and_no_loss(
    persistent_azurite: Azurite, transactions: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On both transaction paths (DEDUP_TABLE_TRANSACTIONS): the faults hit each one's requests."""
    monkeypatch.setenv("DEDUP_TABLE_TRANSACTIONS", transactions)
    config = RunConfig(messages=300, workers=6, dup_rate=0.3, fault_rate=0.08, seed=20261130, outage=True,
                       table="chaosshort" + transactions)  # fmt: skip
    report = run(config, persistent_azurite, ITEMS)
    assert report.violations == []
    assert (report.double_effects, report.lost, report.orphans) == (0, 0, 0)
    assert report.store_restarts == 1
    assert sum(report.faults.values()) > 10 and len(report.faults) >= 6
    assert report.deliveries > report.messages  # there really were duplicate deliveries
    assert report.effects_applied == report.messages - report.dead_lettered
    assert report.outcomes["duplicate"] > 0
    assert (report.broker_dead_lettered, report.resubmitted) == (0, 0)  # handled without an operator
    assert report.audit["closes"] is True and report.audit["unaccounted"] == 0
    assert report.audit["received"] == report.sends - report.dropped_by_detection + 1  # and the closing canary


@LONG
def test_the_audit_names_exactly_the_messages_the_host_settled_without_invoking_the_function(
    persistent_azurite: Azurite,
) -> None:
    """Azure/azure-functions-host#11879, beside every other fault: completed at the broker, never
    seen by the function. The consumer cannot know; the audit names each one by sequence number."""
    config = RunConfig(messages=300, workers=6, dup_rate=0.3, fault_rate=0.08, seed=20261206, outage=True,
                       settled_without_invoke=0.03, scheduled_rate=0.1, table="chaosvanished")  # fmt: skip
    report = run(config, persistent_azurite, ITEMS)
    assert report.violations == []  # among them: the audit's unaccounted are exactly these
    assert report.scheduled >= 10  # scheduled messages, numbered before they are delivered: none lost
    assert len(report.vanished) >= 3 and report.audit["unaccounted"] == len(report.vanished)
    assert sorted(report.audit["lost"]) == sorted(seq for seq, _, _ in report.vanished)  # type: ignore[call-overload]
    assert report.audit["closes"] is False and report.audit["canaries"] == 1
    counted = sum(report.audit[k] for k in ("processed", "duplicates", "refused", "dead_lettered", "in_flight"))  # type: ignore[misc]
    assert counted + len(report.vanished) == report.audit["received"]


# At the shipped proportions (lock 1 min -> 2 s: waits, leases and renewal scaled alike), 16
# concurrent calls, abandon redelivering at once, no resubmission: the outage is real time.
TROUBLE = {
    "outage 2 s": {"outage": True, "outage_seconds": 2.0},
    "outage 10 s": {"outage": True, "outage_seconds": 10.0},
    # for the whole run (2,400 messages: about 10 s here)
    "30% of requests 503 throughout": {"throttle_rate": 0.3, "throttle_seconds": 3600.0, "messages": 2400},
}


@LONG
@pytest.mark.parametrize("trouble", TROUBLE)
def test_an_outage_or_throttling_is_waited_out_inside_the_deliveries(persistent_azurite: Azurite, trouble: str) -> None:
    config = RunConfig(**{"messages": 240, "workers": 16, "dup_rate": 0.2, "seed": 7,
                          "table": "trouble" + str(len(trouble)), **TROUBLE[trouble]})  # type: ignore[arg-type]  # fmt: skip
    report = run(config, persistent_azurite, ITEMS)
    assert report.violations == []
    assert (report.broker_dead_lettered, report.double_effects, report.lost, report.resubmitted) == (0, 0, 0, 0)
    assert report.effects_applied == report.messages - report.dead_lettered
    assert report.store_restarts == config.outage
    if config.throttle_rate:
        assert report.faults["throttled_503"] > 1000


@LONG
def test_a_consumer_that_gives_up_at_once_empties_its_delivery_budget(persistent_azurite: Azurite) -> None:
    """The harness sees what the waiting prevents: without it (DEDUP_TRANSIENT_WAIT=0), a 2 s
    outage spends the ten immediate redeliveries and leaves messages in the broker's DLQ."""
    config = RunConfig(messages=240, workers=16, dup_rate=0.2, seed=7, table="givesup", outage=True,
                       outage_seconds=2.0, transient_wait=0.0)  # fmt: skip
    report = run(config, persistent_azurite, ITEMS)
    assert report.broker_dead_lettered > 0 and not report.ok
    assert (report.double_effects, report.lost) == (0, 0)


@LONG
@pytest.mark.parametrize("transactions", ["lean", "sdk"])
def test_two_phase_payments_under_faults_charge_each_item_once(
    persistent_azurite: Azurite, transactions: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claims, and completions folded into the item's transaction, on both paths."""
    monkeypatch.setenv("DEDUP_TABLE_TRANSACTIONS", transactions)
    config = RunConfig(messages=200, workers=6, dup_rate=0.3, fault_rate=0.08, seed=4242, outage=True,
                       payments=True, table="chaospay" + transactions)  # fmt: skip
    report = run(config, persistent_azurite, ITEMS)
    assert report.violations == []
    assert (report.double_effects, report.lost, report.orphans) == (0, 0, 0)
    assert report.payment_charges == report.effects_applied  # one accepted charge per item
    assert report.faults["payment_503"] + report.faults["payment_response_lost"] > 0
    assert report.store_restarts == 1


class NoMarkerStore(TableStore):
    """Broken on purpose: writes the effects without any marker (no dedup at all)."""

    def commit_many(self, commits: Sequence[Commit]) -> list[CommitResult]:
        for commit in commits:
            pk = encode_key(commit.partition)
            self.table.submit_transaction([("upsert", self.effect_entity(pk, effect)) for effect in commit.effects])
        return [CommitResult(CommitStatus.NEW) for _ in commits]


@LONG
def test_the_checker_catches_double_effects_of_a_consumer_without_markers(
    azurite: Azurite, monkeypatch: pytest.MonkeyPatch
) -> None:
    # without the cache of completed keys, which would answer the copies this one process sees
    monkeypatch.setenv("DEDUP_CACHE_SIZE", "0")
    config = RunConfig(messages=150, workers=4, dup_rate=0.5, seed=5, table="chaosbroken")
    report = run(config, azurite, ITEMS, break_store=NoMarkerStore)
    assert report.double_effects > 0
    assert report.orphans > 0  # effects without markers
    assert not report.ok


@LONG
def test_a_store_that_does_not_come_back_is_the_runs_verdict_not_a_crash(
    persistent_azurite: Azurite, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The emulator never listens again after the outage (as a loaded machine once left it): the
    deliveries meet a store that is down until the broker gives up, and the run ends with a report
    that says why — no exception escapes it, nothing is counted as checked."""

    def never(timeout: float = 0) -> Azurite:
        raise NotListening("azurite-table did not listen (kept down by the test)")

    monkeypatch.setattr(persistent_azurite, "start", never)
    config = RunConfig(messages=40, workers=4, dup_rate=0.0, seed=3, outage=True, max_delivery_count=2,
                       transient_wait=0.2, check_wait=1.0, table="keptdown")  # fmt: skip
    report = run(config, persistent_azurite, ITEMS)
    assert not report.ok and report.store_restarts == 0
    assert [v.split(":")[0] for v in report.violations] == [
        "the store did not come back after a 1.5 s outage",
        "the store did not answer within 1 s after the run",
    ]
    assert report.broker_dead_lettered == 0  # not checked: a report of what could not be read, not a guess


@LONG
def test_a_store_slow_to_come_back_is_waited_out(persistent_azurite: Azurite, monkeypatch: pytest.MonkeyPatch) -> None:
    """The emulator takes 4 s more to come back than the outage lasts: the deliveries wait it out or
    go back to the broker, and every message is applied once."""
    start = persistent_azurite.start

    def slow(timeout: float = 120.0) -> Azurite:
        time.sleep(4)
        return start(timeout)

    monkeypatch.setattr(persistent_azurite, "start", slow)
    config = RunConfig(messages=200, workers=8, dup_rate=0.2, seed=5, outage=True, table="slowback")
    report = run(config, persistent_azurite, ITEMS)
    assert report.violations == [] and report.store_restarts == 1
    assert (report.double_effects, report.lost) == (0, 0)
    assert report.effects_applied == report.messages - report.dead_lettered


@pytest.mark.parametrize("shown", [False, True])
def test_the_dedup_log_is_counted_and_on_the_console_only_when_asked(
    azurite: Azurite, shown: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """`lab.demo --verbose` (``show_log``): every outcome's log line reaches the console's
    handlers, the everyday ones included; without it they are counted, and none is shown (the
    closing canary, processed after the run, is the app's own: left out)."""
    config = RunConfig(messages=30, workers=2, dup_rate=0.3, seed=3, table="shownlog" + str(shown), show_log=shown)
    with caplog.at_level("DEBUG"):
        report = run(config, azurite, ITEMS)
    lines = [fields_of(r) for r in caplog.records if "outcome" in fields_of(r)]
    outcomes = Counter(f["outcome"] for f in lines if not str(f["message_id"]).startswith(CANARY_PREFIX))
    assert report.outcomes["processed"] > 0  # the everyday outcome, logged at DEBUG
    assert outcomes == (Counter({k: v for k, v in report.outcomes.items() if v}) if shown else Counter())
