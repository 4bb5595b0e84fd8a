"""What a proof takes and gives (``prove``, testing/proof.py): the producer's ``Message``, the
``Faults`` to draw, the queue as deployed (``Broker``), the ``Verdict``, and what an invariant is
given: the ``Accepted`` messages and what is ``Stored``."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import timedelta
from typing import Any

import isodate

from ..stores import DedupStore
from ._read_back import entities


@dataclass(frozen=True)
class Accepted:
    """A message its consumer decided: ``decision`` is ``"applied"`` or ``"declined"``."""

    key: str
    message_id: str | None
    payload: Any
    decision: str


class Stored:
    """What is stored, for an invariant: ``entities(name, partition)`` (markers left out) and the store."""

    def __init__(self, store: DedupStore) -> None:
        self.store = store

    def entities(self, name: str | None = None, partition: str | None = None) -> list[dict[str, Any]]:
        return entities(self.store, name, partition)


@dataclass(frozen=True)
class Message:
    """One logical message as its producer sends it: ``body`` a JSON value (sent as its JSON) or
    bytes (sent as they are), ``message_id`` its MessageId (an event's id), ``invalid`` the reason
    its consumer must refuse it with (e.g. ``"schema_violation"``), if it must."""

    body: Any
    message_id: str | None = None
    invalid: str | None = None
    # Service Bus: application properties; Event Grid: the CloudEvent's source, type and subject
    properties: Mapping[str, str] = field(default_factory=dict)

    @property
    def raw(self) -> bytes:
        return self.body if isinstance(self.body, bytes) else json.dumps(self.body).encode()


Invariant = Callable[[list[Accepted], Stored], list[str]]
Workload = Sequence[Message] | Callable[[random.Random, int], Iterable[Message]]


@dataclass(frozen=True)
class Faults:
    """Each a share, drawn from the run's seed: ``rate`` of store requests and settlements meet a
    fault (503, timeout, the answer lost once applied, a crash around the commit, the lock lost
    mid-commit; a crash before the handler, a completion lost); the producer sends ``duplicates``
    of its messages again (some re-serialised), ``twins`` again under the same MessageId with
    another message's body, and ``invalid`` messages of its own (not JSON); ``outage`` seconds
    with the store down once 40 % of the queue is done (a Table store: its Azurite restarted)."""

    rate: float = 0.05
    duplicates: float = 0.3
    twins: float = 0.02
    invalid: float = 0.02
    outage: float = 0.0

    @staticmethod
    def none() -> Faults:
        return Faults(0.0, 0.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True)
class Broker:
    """The queue as deployed: lock duration, max delivery count, the host's lock renewal
    (host.json ``maxAutoLockRenewalDuration``), and how many MessageIds duplicate detection
    remembers (the service keeps a time window: here the last ``duplicate_window`` sends)."""

    lock_duration: timedelta = timedelta(minutes=1)
    max_delivery_count: int = 10
    lock_renewal: timedelta = timedelta(minutes=5)
    duplicate_window: int = 32

    @staticmethod
    def of_app() -> Broker:
        """The app's own: host.json's lock renewal; infra/main.bicep's lockDuration and
        maxDeliveryCount when the template's infra reader is there (lab/infra_checks.py), else
        Service Bus's defaults."""
        from ..functions._host import host_setting, timespan  # host.json, beside shared/

        renewal = timespan(host_setting("extensions", "serviceBus", "maxAutoLockRenewalDuration"))
        broker = Broker() if renewal is None else Broker(lock_renewal=renewal)
        try:
            from lab.infra_checks import ROOT, parameter_values
        except ImportError:
            return broker
        infra = parameter_values(ROOT / "infra")
        lock, count = infra.get("lockDuration"), infra.get("maxDeliveryCount")
        return replace(broker, lock_duration=isodate.parse_duration(lock) if lock else broker.lock_duration,
                       max_delivery_count=int(count) if count else broker.max_delivery_count)  # fmt: skip


@dataclass
class Verdict:
    seed: int
    store: str
    messages: int = 0  # logical messages sent
    sends: int = 0
    dropped_by_detection: int = 0
    deliveries: int = 0
    decided: Counter[str] = field(default_factory=Counter)  # applied, declined, refused (twins), invalid
    outcomes: Counter[str] = field(default_factory=Counter)  # as the consumer reported each delivery
    faults: Counter[str] = field(default_factory=Counter)
    broker_dead_lettered: int = 0
    resubmitted: int = 0  # by an operator: the kit never does
    audit: dict[str, object] = field(default_factory=dict)
    seconds: float = 0.0
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def line(self) -> str:
        """The verdict as one JSON line."""
        counts = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "violations"}
        return json.dumps({"ok": self.ok, **_plain(counts), "violations": self.violations[:20]}, default=str)

    def __str__(self) -> str:
        head = (f"{'PROVEN' if self.ok else 'VIOLATED'} on {self.store}, seed {self.seed}: {self.messages} messages, "
                f"{self.sends} sends, {self.deliveries} deliveries; decided {dict(self.decided)}; faults "
                f"{sum(self.faults.values())}; left in the broker's DLQ {self.broker_dead_lettered}")  # fmt: skip
        shown = "".join(f"\n  - {v}" for v in self.violations[:10])
        more = f"\n  … and {len(self.violations) - 10} more" if len(self.violations) > 10 else ""
        again = f"\n  reproduce: the same call with seed={self.seed}" if self.violations else ""
        return head + shown + more + again


def _plain(value: Any) -> Any:
    """JSON's shapes: mappings with text keys (an audit's are not all text)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [_plain(v) for v in value]
    return value
