"""Bad input, fuzzed: ≥10,000 generated deliveries through the `items` function (tests/app.py) on
a real Azurite. Each one ends processed, duplicate, or dead-lettered with a reason;
nothing crashes the worker and nothing is half-written."""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.idempotency.keys import DedupKey, marker_id
from shared.idempotency.stores import DedupStore
from shared.idempotency.stores._codec import ID_LIMIT, bounded
from shared.idempotency.stores._records import GUARD_KIND
from shared.idempotency.telemetry import fields_of
from shared.idempotency.testing.azurite import Azurite
from tests.app import effects_by_item, item, queue_consumer
from tests.functions import fresh_app, servicebus_message, user_function

pytestmark = pytest.mark.long("thousands of generated deliveries")

DELIVERIES_PER_EXAMPLE = 50
EXAMPLES = 205
INJECTIONS = ["' or PartitionKey ne '", "x' or '1' eq '1", "i1') or (RowKey ne '", "%27 or 1 eq 1", "@pk", "\\'"]

message_ids = st.one_of(
    st.none(),
    st.just(""),
    st.sampled_from(INJECTIONS),
    st.text(max_size=40),
    st.text(alphabet=st.characters(codec="utf-8", categories=["Cc", "Cs", "Zs", "So"]), min_size=1, max_size=20),
    st.text(min_size=2000, max_size=2100),
)
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20))
loose_items = st.fixed_dictionaries(
    {},
    optional={
        "id": st.one_of(scalars, st.sampled_from(INJECTIONS)),
        "amount": st.one_of(scalars, st.floats(min_value=0.01, max_value=1e6)),
        "lines": st.one_of(scalars, st.lists(st.dictionaries(st.text(max_size=5), scalars, max_size=3), max_size=3)),
        "extra": scalars,
    },
)


@st.composite
def valid_item(draw: st.DrawFn) -> tuple[str | None, bytes]:
    item_id = draw(st.one_of(st.sampled_from(INJECTIONS), st.text(min_size=1, max_size=60)))
    return item_id, json.dumps(item(item_id, draw(st.sampled_from([1, 9.99, 250.5])))).encode()


bodies = st.one_of(
    st.binary(max_size=200),  # mostly not UTF-8
    st.text(max_size=200).map(str.encode),  # mostly not JSON
    st.sampled_from([b"", b"null", b"[]", b"{}", b"1e999", b"NaN", b'{"a": Infinity}', b"[" * 5000]),
    loose_items.map(lambda d: json.dumps(d).encode()),
    st.one_of(  # rarer: huge bodies (Service Bus Standard allows 256 KB)
        st.integers(min_value=200_000, max_value=260_000).map(lambda n: b'{"id": "' + b"x" * n + b'"}'),
        *[loose_items.map(lambda d: json.dumps(d).encode())] * 6,
    ),
)
deliveries = st.one_of(st.tuples(message_ids, bodies), valid_item(), valid_item().map(lambda d: (None, d[1])))


class Outcomes(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if fields_of(record):
            self.seen.append(fields_of(record))


@pytest.fixture
def outcomes() -> Iterator[Outcomes]:
    handler = Outcomes()
    logger = logging.getLogger("idempotency")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)  # every outcome, the everyday ones included
    yield handler
    logger.removeHandler(handler)


def test_generated_deliveries_are_processed_or_dead_lettered(azurite: Azurite, outcomes: Outcomes) -> None:
    consumer_fn = user_function("items")
    delivered = Counter[str]()
    with fresh_app(azurite):
        store = queue_consumer().store

        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(st.lists(deliveries, min_size=DELIVERIES_PER_EXAMPLE, max_size=DELIVERIES_PER_EXAMPLE))
        def deliver(batch: list[tuple[str | None, bytes]]) -> None:
            for message_id, body in batch:
                before = len(outcomes.seen)
                consumer_fn(servicebus_message(body, message_id))  # must not raise: the store is healthy
                [fields] = outcomes.seen[before:]
                assert fields["outcome"] in {"processed", "duplicate", "invalid", "conflict"}, fields
                if fields["outcome"] in {"invalid", "conflict"}:
                    assert fields["reason"], fields
                delivered[str(fields["outcome"])] += 1

        deliver()
        assert sum(delivered.values()) >= 10_000
        assert delivered["processed"] > 100 and delivered["invalid"] > 5_000 and delivered["duplicate"] > 0

        dead = store.dead_letters(queue_consumer().name)
        refused = [o for o in outcomes.seen if o["outcome"] in {"invalid", "conflict"}]
        recorded = {(bounded(o.get("message_id"), ID_LIMIT), o["reason"]) for o in refused}  # long ids: head + hash
        assert {(d.message_id, d.reason) for d in dead} == recorded
        assert all(d.body is not None and d.reason and d.detail for d in dead)
        assert orphans(store, queue_consumer().name) == []
        for injection in INJECTIONS:  # a key never widens a query: each one finds only itself
            assert set(effects_by_item(store, injection)) <= {injection}


def orphans(store: DedupStore, scope: str) -> list[str]:
    """Half-written state: a marker without its item and posting, effects without their
    marker, a fingerprint guard without its marker."""
    markers: dict[str, str] = {}
    guards: set[str] = set()
    for stored in store.scan():
        if stored.key is not None and not stored.key.step:
            markers[marker_id(stored.key)] = stored.key.id
        elif stored.kind == GUARD_KIND:
            guards.add(stored.name.rsplit("|", 1)[0])
    applied = effects_by_item(store)
    found = [f"marker without effects: {key_id}" for key_id in markers.values()
             if applied.get(key_id) != Counter({"item": 1, "posting": 1})]  # fmt: skip
    found += [f"effects without marker: {key}" for key in applied if marker_id(DedupKey(scope, key)) not in markers]
    found += [f"guard without marker: {row}" for row in guards - markers.keys()]
    return found
