"""``resubmit --bodies`` judges a message never processed by running its consumer's own
``process`` on a store it never writes: each way processing ends has its verdict — refused
by the handler, by a service, by the store at commit, a failing handler, versioned state —
and a step not done yet is never called. Run as operators run it: a new process from the
app's root, ``--consumers`` a package whose ``__init__`` imports none of its modules, against
a real Azurite."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from azure.data.tables import TableServiceClient

from shared.idempotency import Delivery, Outcome
from shared.idempotency.resubmit import UNSTORED, VERDICTS
from shared.idempotency.stores import DedupStore, app_store
from shared.idempotency.testing.azurite import Azurite
from tests.functions import fresh_app
from tests.integration.operators import run_tool
from tests.integration.resubmit_app.handlers import CALLS, checks_consumer, status_consumer, totals_consumer

APP = "tests.integration.resubmit_app"
CUBED = 2**22  # cubed: 2**66, beyond the Int64 every store holds


@pytest.fixture  # its own: resubmit_app's store, which counts its step's calls (not the test app's items_store)
def store(azurite: Azurite, tmp_path: Path) -> Iterator[DedupStore]:
    """The app on new tables (created as the app creates them); its step's calls counted in a file."""
    with fresh_app(azurite, **{CALLS: str(tmp_path / "calls")}):
        yield app_store()


def body(**payload: Any) -> bytes:
    return json.dumps(payload).encode()


def calls() -> list[str]:
    path = Path(os.environ[CALLS])
    return path.read_text().splitlines() if path.exists() else []


def snapshot(azurite: Azurite) -> dict[str, list[tuple[str, str, str | None]]]:
    """Every entity of the app's two tables, with its ETag: what a write would change."""
    service = TableServiceClient.from_connection_string(azurite.connection_string)
    tables = (os.environ["DEDUP_TABLE"], os.environ["DEDUP_DEADLETTER_TABLE"])
    return {name: sorted((e["PartitionKey"], e["RowKey"], e.metadata["etag"]) for e in
                         service.get_table_client(name).list_entities()) for name in tables}  # fmt: skip


def resubmit(tmp_path: Path, consumer: str, *bodies: bytes) -> tuple[list[list[str]], dict[str, int]]:
    path = tmp_path / "dead-letters.jsonl"
    path.write_bytes(b"\n".join(bodies) + b"\n")
    done = run_tool("shared.idempotency.resubmit", "--consumer", consumer, "--consumers", APP, "--bodies", str(path))
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    *lines, summary = done.stdout.splitlines()
    return [line.split("\t") for line in lines], json.loads(summary)


def test_a_verdict_for_every_way_processing_ends_and_no_effect(
    azurite: Azurite, store: DedupStore, tmp_path: Path
) -> None:
    checks = checks_consumer(store)
    seeded = {  # processed for real before the tool runs
        "ok-2": body(id="ok-2", kind="plain"),
        "d-1": body(id="d-1", kind="declined"),  # its step refused for good, recorded
        "s-2": body(id="s-2", kind="step_then_unstorable", n=CUBED),  # step called, then the store refused
    }
    outcomes = {key: checks.process(Delivery(raw)) for key, raw in seeded.items()}
    assert {k: (r.outcome, r.reason) for k, r in outcomes.items()} == {
        "ok-2": (Outcome.PROCESSED, None), "d-1": (Outcome.INVALID, "downstream_rejected"),
        "s-2": (Outcome.INVALID, "store_refused")}  # fmt: skip
    assert len(calls()) == 1  # s-2's charge

    before = snapshot(azurite)
    lines, summary = resubmit(
        tmp_path, "checks",
        body(id="i-1", kind="invalid"), body(id="r-1", kind="rejected"), body(id="b-1", kind="bug"),
        body(id="m-1", kind="too_many"), body(id="u-1", kind="unstorable", n=CUBED), body(id="s-1", kind="step"),
        seeded["s-2"], seeded["d-1"], body(id="ok-1", kind="plain"), seeded["ok-2"],
    )  # fmt: skip
    assert [line[:2] for line in lines] == [
        ["i-1", "invalid"], ["r-1", "refused"], ["b-1", "fails"], ["m-1", "invalid"], ["u-1", "invalid"],
        ["s-1", "new"], ["s-2", "invalid"], ["d-1", "refused"], ["ok-1", "new"], ["ok-2", "duplicate"]]  # fmt: skip
    reasons = [line[2].removeprefix(VERDICTS[line[1]]).removeprefix(" (").removesuffix(")") for line in lines]
    assert reasons[0] == "not_ours: the handler refuses it"
    assert reasons[1] == "downstream_rejected: HTTP 422: unknown customer"
    assert reasons[2] == "handler_error: KeyError('missing')"
    assert reasons[3].startswith("too_many_effects: 99 entities")
    for i, name in ((4, "cubed"), (6, "charge")):
        assert reasons[i] == f"store_refused: cannot be stored: thing.{name}: a int is not a storable value"
    assert reasons[5].startswith("its step 'charge' calls out first") and "known only by calling" in reasons[5]
    assert (reasons[7], reasons[8], reasons[9]) == ("", UNSTORED, "")
    assert summary == {"duplicate": 1, "refused": 2, "new": 2, "invalid": 4, "fails": 1}
    assert len(calls()) == 1  # no step called: s-1's not done, s-2's read back
    assert snapshot(azurite) == before  # nothing written: no claim, marker, record or index row


def test_versioned_state_is_judged_against_the_version_stored(
    azurite: Azurite, store: DedupStore, tmp_path: Path
) -> None:
    states = status_consumer(store)
    assert states.process(Delivery(body(id="x-1", status="paid", version=2))).outcome is Outcome.PROCESSED
    before = snapshot(azurite)
    versions = [body(id="x-1", status=status, version=v) for v, status in ((1, "placed"), (2, "paid"), (3, "shipped"))]
    lines, summary = resubmit(tmp_path, "states", *versions)
    assert [line[1] for line in lines] == ["stale", "duplicate", "new"]
    assert summary == {"duplicate": 1, "new": 1, "stale": 1}
    assert snapshot(azurite) == before


def test_changes_of_what_is_stored_are_judged_from_a_real_read_and_never_written(
    azurite: Azurite, store: DedupStore, tmp_path: Path
) -> None:
    """A consumer that reads its account's total and changes it: the dry run reads the marker and the
    total as processing does (a duplicate, a key reused under another account, a new credit, one
    whose step has not run), and writes nothing — no marker, no pin, no total, no step called."""
    totals = totals_consumer(store)
    assert totals.process(Delivery(body(id="c-1", account="a-1", amount=5))).outcome is Outcome.PROCESSED
    before = snapshot(azurite)
    lines, summary = resubmit(
        tmp_path, "totals", body(id="c-1", account="a-1", amount=5), body(id="c-1", account="a-2", amount=5),
        body(id="c-2", account="a-1", amount=7), body(id="c-3", account="a-1", amount=1, charge=True),
    )  # fmt: skip
    assert [line[:2] for line in lines] == [["c-1", "duplicate"], ["c-1", "conflict"], ["c-2", "new"],
                                            ["c-3", "new"]]  # fmt: skip
    assert "key_partition_mismatch" in lines[1][2] and "its step 'charge' calls out first" in lines[3][2]
    assert summary == {"duplicate": 1, "conflict": 1, "new": 2}
    assert calls() == [] and snapshot(azurite) == before
