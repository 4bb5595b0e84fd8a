"""`make bench` is not part of `make test`: this keeps every scenario running, through the
delay proxy too, and checks the store round trips the benchmark reports and its
exactly-once check, on the real Azurite, at a size that takes seconds."""

from __future__ import annotations

import os
import platform
import re
import subprocess
from typing import Any
from urllib.parse import urlsplit

import pytest
from azure.data.tables import TableServiceClient

from lab import audit_cost, outbox_cost, purge_cost
from lab.bench import breakdown, instructions
from lab.bench.__main__ import EXACT, PAIRS, ROOT, SCENARIOS, Bench, audit_targets, paired, provenance
from lab.delay_proxy import delayed
from shared.idempotency.messages import utcnow
from shared.idempotency.stores._expiry import SETTLE
from shared.idempotency.testing.azurite import Azurite

pytestmark = pytest.mark.long("the bench's own runs")


def test_every_scenario_runs_and_costs_the_round_trips_it_reports(azurite: Azurite) -> None:
    service = TableServiceClient.from_connection_string(azurite.connection_string)
    tables_before = {t.name for t in service.list_tables()}
    bench = Bench(azurite, azurite.port, 20, concurrency=4)
    measures = {name: scenario(bench) for name, scenario in SCENARIOS.items()}
    assert {t.name for t in service.list_tables()} == tables_before  # each scenario drops its tables
    per_message = {name: m.requests / m.messages for name, m in measures.items()}

    for path in ("SDK", "lean"):
        assert per_message[f"baseline, no dedup ({path})"] == per_message[f"atomic, all new ({path})"] == 1.0
    assert per_message["atomic, 50% duplicates (lean)"] == 1.0  # a duplicate: one refused transaction
    assert per_message["Powertools-style, all new"] == 3.0  # put, effects, update
    assert per_message["Powertools-style, 50% duplicates"] == (10 * 3 + 10 * 2) / 20  # a duplicate: put, read
    assert per_message["atomic, duplicates, hot cache (lean)"] == 0
    assert per_message["two-phase, all new (lean)"] == 2.0  # the claim, then the commit that completes it
    assert per_message["batch of 100 (lean)"] == per_message["batch of 100 (SDK)"] == 1 / 20
    at_20 = {"batch of 100 (lean)": 1 / 20, "read-modify-write, folded batch of 100 (lean)": 2 / 20}  # one batch
    for name, count in EXACT.items():  # what make bench judges exact, at 20 messages
        assert per_message[name] == at_20.get(name, count), name
    assert 1 / 20 <= per_message["source: Event Hubs batch of 100"] <= 4 / 20  # a transaction per bucket met
    # the file's row and the applied rows read, the row marked in progress (read, write), one
    # transaction (20 records x 4 operations), the row read and replaced, done (upsert_if_newer)
    assert per_message["source: blob import, one file"] == 7 / 20
    # parks, commits (a transaction per bucket met), sends, marks sent, unparks
    assert 3 + 1 / 20 <= per_message["source: Event Hubs batch of 100, outbox"] <= 3 + 4 / 20
    assert {name: m.sends for name, m in measures.items() if m.sends} == {
        name: 20 for name in measures if "outbox" in name}  # one send per message, nowhere else  # fmt: skip
    assert all(m.index_requests == 0 for m in measures.values())  # 20 markers: no index row full yet
    assert all(m.messages == 20 and m.violations == 0 for m in measures.values())
    assert all(m.client_cpu > 0 for m in measures.values())


class Recording(Bench):
    """Records each request to a bench table of entities (not the table service, not the
    dead-letter table): an entity-group transaction or a single-entity call, and its path."""

    def __init__(self, azurite: Azurite) -> None:
        super().__init__(azurite, azurite.port, 20, concurrency=4)
        self.kinds: list[str] = []

    def count(self, request: Any) -> None:
        super().count(request)
        http = request.http_request
        table = urlsplit(http.url).path.split("/")[2].split("(")[0]
        if table != "Tables" and not table.endswith("dl"):
            path = "lean" if "idempotency-table-batch" in http.headers["User-Agent"] else "SDK"
            self.kinds.append(f"{'$batch' if table == '$batch' else http.method} ({path})")


def test_two_phase_makes_two_requests_where_the_path_it_replaced_made_three(azurite: Azurite) -> None:
    """The 2x target's comparator is the path before issue 31: the claim (an SDK insert: one
    POST of the entity) and the completion (an SDK replace: one PUT) each on their own, then
    the commit — and no expiry index, which that path did not have."""
    ours, before = Recording(azurite), Recording(azurite)
    assert SCENARIOS["two-phase, all new (lean)"](ours).violations == 0
    assert SCENARIOS["two-phase, 3 requests (SDK claim)"](before).violations == 0
    # after the runs, each exactly-once check's scan (GET); ours also its expiry index row (one
    # insert for up to 250 markers, in the records table beside them), which that path did not have
    assert sorted(ours.kinds) == sorted(["POST (lean)", "$batch (lean)"] * 20 + ["GET (SDK)", "POST (lean)"])
    assert sorted(before.kinds) == sorted(["POST (SDK)", "PUT (SDK)", "$batch (lean)"] * 20 + ["GET (SDK)"])


def test_a_paired_measurement_reports_both_sides_cpu_and_checks_every_run(azurite: Azurite) -> None:
    """The client CPU target reads a ratio of the two sides in the same rounds."""
    result = paired(Bench(azurite, azurite.port, 20, concurrency=4), PAIRS["duplicates"], rounds=2)
    assert result["violations"] == 0 and len(result["round_ratios"]) == 2
    assert result["client_cpu_ms"] > 0 and result["theirs_client_cpu_ms"] > 0
    assert result["client_cpu_ratio"] == result["client_cpu_ms"] / result["theirs_client_cpu_ms"]


def test_the_delay_proxy_adds_its_delay_to_every_round_trip(azurite: Azurite) -> None:
    scenario = SCENARIOS["baseline, no dedup (lean)"]
    direct = scenario(Bench(azurite, azurite.port, 20, concurrency=1))
    with delayed(azurite.port, 25) as port:  # 50 ms per round trip
        slowed = scenario(Bench(azurite, port, 20, concurrency=1))
    assert slowed.requests == direct.requests == 20
    assert slowed.seconds - direct.seconds >= 20 * 0.045  # every request waited both ways


def test_the_purge_scenario_costs_the_same_requests_whatever_the_table_size(azurite: Azurite) -> None:
    """The purge follows the expiry index: a table 10x larger costs it no request more."""
    before = utcnow()
    purge = purge_cost.measure(azurite, 40, (1, 10), repeats=1)  # each run checks all 40 markers were purged
    sizes = purge["per_table_factor"]
    assert sizes["1x"]["requests_per_marker"] == sizes["10x"]["requests_per_marker"] == purge["requests_per_marker"]
    # the cursor, the index's pages (this hour's; within SETTLE after an hour turned, the last
    # hour's too: it is not settled yet), 40 transactions (a marker and its guard each), the
    # index row's delete, the dead letters' page
    pages = {1 + (moment - moment.replace(minute=0, second=0, microsecond=0) < SETTLE) for moment in (before, utcnow())}
    assert purge["requests_per_marker"] in {(1 + n + 40 + 1 + 1) / 40 for n in pages}


def test_the_sweep_scenario_sends_a_backlog_at_two_requests_per_parked_key(azurite: Azurite) -> None:
    sweep = outbox_cost.sustained(azurite, 30, runs=1)  # each run checks all 30 were sent, none failed
    # Per key: read its rows, delete them; the 30 index rows in one transaction; the cursor's read and
    # write and one read per hour since an hour ago (two, or three when the sweep's "now" is in the next hour).
    assert sweep["runs"][0]["requests"] in (2 * 30 + 1 + 2 + 2, 2 * 30 + 1 + 2 + 3)


def test_instructions_are_counted_per_message_only_while_messages_are_processed(azurite: Azurite) -> None:
    """Under callgrind: twice the messages, about twice the instructions in all (setup, the
    uncounted first run and the check are not counted), the same count twice, and the ratios
    to the lean baseline judged against their bounds."""
    if reason := instructions.skip_reason():
        pytest.skip(reason)
    names = [instructions.BASELINE, "atomic, all new (lean)"]
    few, more = instructions.measure(azurite, names, 20), instructions.measure(azurite, names, 40)
    for name in names:
        assert 0.9 < more[name] / few[name] < 1.1, (name, few, more)  # per message: the same at any count
    again = instructions.measure(azurite, names, 20)
    assert all(abs(again[name] / few[name] - 1) < 0.01 for name in names), (few, again)
    ratio = instructions.ratios(few)["atomic, all new (lean)"]
    assert 1.0 < ratio < instructions.BOUNDS["atomic, all new (lean)"]  # the marker costs something, within bounds
    measured = {**few, **{name: 0.0 for name in instructions.BOUNDS if name not in few}}
    assert all(instructions.targets(measured).values())
    doubled = {**measured, names[1]: 2 * few[names[1]]}  # twice the work per message: refused
    assert [ok for target, ok in instructions.targets(doubled).items() if target.endswith(names[1])] == [False]


def test_a_messages_work_is_broken_down_by_component_and_a_component_that_grows_is_named(azurite: Azurite) -> None:
    """Each component's calls, recorded on the atomic path and made again under callgrind, count
    some of the message's instructions and less than all of them; 5% more of a message's work
    in one component fails that component's bound, and no other's."""
    if reason := instructions.skip_reason():
        pytest.skip(reason)
    parts = [breakdown.PREFIX + name for name in ("fingerprint", "transaction encoding", "expiry note")]
    counted = instructions.measure(azurite, [instructions.BASELINE, breakdown.SCENARIO, *parts], 20)
    assert all(counted[part] > 0 for part in parts), counted
    assert sum(counted[part] for part in parts) < counted[breakdown.SCENARIO]
    assert counted[parts[0]] < counted[parts[1]]  # a hash of the payload, against four entities' JSON
    baseline = counted[instructions.BASELINE]
    within = {name: 0.99 * bound * baseline for name, bound in instructions.BOUNDS.items()}  # each just in
    measured = {**within, instructions.BASELINE: baseline}
    assert all(instructions.targets(measured).values())
    grown = {**measured, parts[0]: within[parts[0]] + 0.05 * counted[breakdown.SCENARIO]}
    assert [target for target, ok in instructions.targets(grown).items() if not ok] == [
        f"client instructions per message <= {instructions.BOUNDS[parts[0]]}x the lean baseline's: {parts[0]}"
    ]


def test_the_results_say_which_run_wrote_them() -> None:
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    run = provenance(125.4)
    assert run["commit"] == (head.stdout.strip() or "unknown")
    assert (run["python"], run["cores"], run["seconds"]) == (platform.python_version(), os.cpu_count(), 125)
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", run["date"]) and isinstance(run["uncommitted_changes"], bool)


def test_the_audit_closes_its_window_in_a_page_per_thousand_facts_and_two_peeks(azurite: Azurite) -> None:
    """The bench's audit row at a size that takes seconds: 1,200 messages (and the tenth delivered
    twice) need 2 pages of facts, plus the run's 4 requests."""
    audited = audit_cost.measure(azurite, 1200)
    assert audited["closes"] and audited["received"] == 1201  # the canary too
    assert audited["peeks"] == 2
    assert audited["store_requests"] <= 2 + 4, audited
    assert all(audit_targets(audited).values()), audited
    held = audit_cost.measure(azurite, 100, held=600)  # in flight: a peek per 250 more
    assert held["closes"] and held["peeks"] == 2 + 3 and all(audit_targets(held).values()), held
