"""`make bench` is not part of `make test`: this keeps every scenario running and checks
the store round trips the benchmark reports, on the real Azurite, at a size that takes
seconds."""

from __future__ import annotations

from bench.__main__ import SCENARIOS, Bench
from tools.azurite import Azurite


def test_every_scenario_runs_and_costs_the_round_trips_it_reports(azurite: Azurite) -> None:
    bench = Bench(azurite, 20)
    measures = {name: scenario(bench) for name, scenario in SCENARIOS.items()}
    per_message = {name: m.requests / m.messages for name, m in measures.items()}

    assert per_message["raw transaction of 2 inserts"] == per_message["raw transaction of 4 inserts"] == 1.0
    assert per_message["baseline (effects, no dedup)"] == 1.0
    assert per_message["atomic (marker + effects)"] == 1.0
    assert per_message["two-phase (claim, call, complete, commit)"] == 3.0
    assert per_message["duplicates 50%"] == 1.0
    assert per_message["duplicates 90%, hot cache"] == 2 / 20  # the 2 new messages only
    assert per_message["batch of 10"] == 2 / 20
    assert per_message["batch of 100"] == 1 / 20
    assert all(m.messages == 20 for m in measures.values())
    # both sides of the CPU split are read (Azurite's in clock ticks: summed over the run)
    assert sum(m.client_cpu for m in measures.values()) > 0 and sum(m.store_cpu for m in measures.values()) > 0
