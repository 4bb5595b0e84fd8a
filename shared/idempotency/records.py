"""The marker model: what the store keeps per (consumer, message) key."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from .errors import InvalidMessage
from .keys import DedupKey

JSON = Any  # a value that json.dumps accepts

MAX_RESULT_CHARACTERS = 30_000  # of a stored result as compact JSON: one Table property holds 32 K
_compact = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode

MARKER_KIND = "dedup-marker"
GUARD_KIND = "dedup-guard"


class State(StrEnum):
    IN_PROGRESS = "in_progress"  # claimed; an external effect may be under way
    COMPLETED = "completed"  # effects committed; the result can be replayed
    REFUSED = "refused"  # a step's call was refused for good (a final 4xx): never called again
    ESCALATED = "escalated"  # in progress long past its lease: operators were alerted, once


def check_result(value: JSON, what: str) -> None:
    """A result is stored with its marker and replayed: JSON (no NaN, no sets or times),
    at most MAX_RESULT_CHARACTERS once serialised; else InvalidMessage."""
    try:
        size = len(_compact(value))
    except (TypeError, ValueError) as exc:
        raise InvalidMessage("result_not_json", f"{what} must be JSON: {exc}"[:500]) from exc
    if size > MAX_RESULT_CHARACTERS:
        raise InvalidMessage("result_too_large", f"{what} is {size} characters of JSON; "
                             f"at most {MAX_RESULT_CHARACTERS} are stored")  # fmt: skip


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Entity:
    """A business record written with a marker. ``name`` is unique within the message's
    partition (Table RowKey, Cosmos id suffix); the store places it beside the marker."""

    name: str
    data: dict[str, JSON]


@dataclass(frozen=True)
class Marker:
    key: DedupKey
    partition: str
    state: State
    fingerprint: str
    created_at: datetime
    expires_at: datetime
    lease_until: datetime | None = None  # only while in progress
    owner: str | None = None  # the claim's token: tells our own lost write from a rival's
    result: JSON = None
    version: str | None = field(default=None, compare=False)  # the store's ETag

    @property
    def claimed(self) -> bool:
        """Not final yet: in progress, escalated or not."""
        return self.state in (State.IN_PROGRESS, State.ESCALATED)

    @property
    def final(self) -> bool:
        return self.state in (State.COMPLETED, State.REFUSED)

    def reclaimable(self, now: datetime) -> bool:
        """An expired marker, or a claim whose owner's lease has run out, may be taken
        over — always with a write fenced by ``version``."""
        if self.expires_at <= now:
            return True
        return self.claimed and self.lease_until is not None and self.lease_until <= now


@dataclass(frozen=True)
class StoredItem:
    """One stored record as a verifier sees it. A Cosmos document that is its own marker
    has both a ``key`` and an ``entity``."""

    name: str  # RowKey / id, as stored
    kind: str | None  # MARKER_KIND, GUARD_KIND, or None for business data only
    key: DedupKey | None  # set on markers
    entity: str | None  # the business entity's name, set on business data
    data: dict[str, JSON]
