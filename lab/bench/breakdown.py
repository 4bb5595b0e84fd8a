"""A message's client work by component, counted as the scenarios are (lab/bench/instructions.py):
the atomic scenario runs once with each component's calls recorded (their arguments; not
counted), then each component's calls are made again on those arguments, counted: its
instructions per message. What no component holds — the request through azure-core, urllib3
and http.client, the answer read, and the flow's own steps — is the rest. Each component has
its bound (instructions.BOUNDS), so that a regression names its component.

The components are the functions the flow calls for them, patched where the flow looks them up."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from shared.idempotency import consumer, telemetry
from shared.idempotency.stores import _table, _table_batch
from shared.idempotency.stores._expiry import ExpiryIndex

PREFIX = "component: "
SCENARIO = "atomic, all new (lean)"  # the path broken down
Call = tuple[tuple[Any, ...], dict[str, Any]]

# name: (where the flow looks it up, its attribute)
COMPONENTS: dict[str, tuple[Any, str]] = {
    "parse (strict JSON)": (consumer, "parse_json"),
    "schema": (consumer.IdempotentConsumer, "_validate"),
    "fingerprint": (consumer, "_fingerprint"),
    "effect rows and their checks": (_table, "effect_rows"),
    "marker row": (_table.TableStore, "_marker_entity"),
    "transaction encoding": (_table_batch, "encode"),
    "answer decoding": (_table_batch, "decode"),
    "expiry note": (ExpiryIndex, "note"),
    "log and metrics": (telemetry, "record"),
    "span": (telemetry, "span"),
}


@contextmanager
def recorded() -> Iterator[dict[str, list[Call]]]:
    """Every component's calls while inside, with their arguments."""
    calls: dict[str, list[Call]] = {name: [] for name in COMPONENTS}
    saved = {name: vars(owner)[attribute] for name, (owner, attribute) in COMPONENTS.items()}
    for name, (owner, attribute) in COMPONENTS.items():
        setattr(owner, attribute, _recording(saved[name], calls[name]))
    try:
        yield calls
    finally:
        for name, (owner, attribute) in COMPONENTS.items():
            setattr(owner, attribute, saved[name])


def _recording(original: Any, into: list[Call]) -> Any:
    function = original.__func__ if isinstance(original, staticmethod) else original

    def record(*args: Any, **kwargs: Any) -> Any:
        into.append((args, kwargs))
        return function(*args, **kwargs)

    return staticmethod(record) if isinstance(original, staticmethod) else record


def replay(name: str, calls: list[Call]) -> Callable[[], None]:
    """The component's calls made again: a span ended as the flow ends it; the expiry note's on
    a fresh copy of its index each time (its notes are not written, and do not pile up)."""
    owner, attribute = COMPONENTS[name]
    original = vars(owner)[attribute]
    function = original.__func__ if isinstance(original, staticmethod) else original

    def again() -> None:
        if name == "expiry note":
            quiet()
            _shadows.clear()
        for args, kwargs in calls:
            if name == "expiry note":
                args = (_shadow(args[0]), *args[1:])
            made = function(*args, **kwargs)
            if name == "span":
                made.end()

    return again


def quiet() -> None:
    """The copies' flush timers stopped: their notes go nowhere."""
    for shadow in _shadows.values():
        if shadow._timer is not None:
            shadow._timer.cancel()


_shadows: dict[int, ExpiryIndex] = {}


def _shadow(index: ExpiryIndex) -> ExpiryIndex:
    if id(index) not in _shadows:
        shadow = copy.copy(index)
        shadow._pending, shadow._mutex, shadow._timer = {}, threading.Lock(), None
        shadow._write = lambda hour, notes: 0  # type: ignore[method-assign]  # a full row goes nowhere either
        _shadows[id(index)] = shadow
    return _shadows[id(index)]
