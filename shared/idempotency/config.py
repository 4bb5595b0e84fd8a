"""Configuration: ``DedupConfig`` and ``StepPolicy``, read from the app settings with the
names and defaults the README documents (docs/configuration.md), and the helpers every
setting is read with (one clear ``ConfigurationError`` for a bad value)."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import isodate

from .errors import ConfigurationError


@dataclass(frozen=True)
class StepPolicy:
    """``lease``: how long a claim is protected from takeover; it must outlive the step's
    call (its timeout) plus clock skew, and lapse while the broker still has deliveries
    left (``make check-leases``). A takeover of a live but slow owner repeats the call with
    the same downstream idempotency key, and the owner's fenced completion is refused, so
    the lease bounds wasted calls, not correctness — for a service that honours the key (one
    that does not needs the step's ``reconcile``). ``in_flight_wait``: how long a delivery
    that meets a live claim waits for it to finish (or lapse, then takes it over) before
    giving the message back to the broker."""

    lease: timedelta = timedelta(minutes=1)
    in_flight_wait: timedelta = timedelta(seconds=10)


DEFAULT_STEPS = StepPolicy()
DEFAULT_LEASE: str = isodate.duration_isoformat(DEFAULT_STEPS.lease)  # PT1M
DEFAULT_IN_FLIGHT_WAIT: str = isodate.duration_isoformat(DEFAULT_STEPS.in_flight_wait)  # PT10S
DEAD_LETTER_RETENTION = timedelta(days=14)  # a store's default, and DEDUP_DEAD_LETTER_RETENTION's
DEFAULT_DEAD_LETTER_RETENTION: str = isodate.duration_isoformat(DEAD_LETTER_RETENTION)  # P14D


DEFAULT_RETENTION = "P30D"
# How much younger than DEDUP_RETENTION a message must be to be applied (half the retention, if
# that is shorter): clock skew between the broker and the app. An older one may have outlived its
# marker, so the consumer refuses it (``expired``); ``make check-retention`` counts it.
EXPIRY_MARGIN = timedelta(hours=1)
DEFAULT_TRANSIENT_WAIT = "PT2M"
DEFAULT_OUTBOX_SWEEP_DELAY = "PT10M"
DEFAULT_PURGE_BUDGET = "1000000"  # records per purge run: the time limit binds first (docs/operations.md)
DEFAULT_OUTBOX_SWEEP_BUDGET = "100000"  # parked keys per sweep run: the time limit binds first
DEFAULT_PURGE_TIME = "PT4M"  # per purge run, every 5 minutes: under functionTimeout (5 min)
DEFAULT_MAX_DELIVERY_COUNT = "10"  # Service Bus's default maxDeliveryCount, and infra's


def setting(name: str, default: str | None = None) -> str:
    value = os.environ.get(name, default)
    if value is None or value == "":
        raise ConfigurationError(f"app setting {name} is required")
    return value


def duration(name: str, default: str) -> timedelta:
    """An ISO-8601 duration setting (days, hours, minutes, seconds)."""
    text = setting(name, default)
    try:
        value = isodate.parse_duration(text)
    except isodate.ISO8601Error as exc:
        raise ConfigurationError(f"{name}={text!r} is not an ISO-8601 duration") from exc
    if not isinstance(value, timedelta) or value < timedelta(0):
        raise ConfigurationError(f"{name}={text!r} must be a non-negative duration in days or less")
    return value


def retention() -> timedelta:
    """DEDUP_RETENTION: how long markers outlive their message."""
    value = duration("DEDUP_RETENTION", DEFAULT_RETENTION)
    if value <= timedelta(0):
        raise ConfigurationError("DEDUP_RETENTION must be positive")
    return value


def dead_letter_retention() -> timedelta:
    """DEDUP_DEAD_LETTER_RETENTION: how long a refused message's record (with its body) is kept."""
    value = duration("DEDUP_DEAD_LETTER_RETENTION", DEFAULT_DEAD_LETTER_RETENTION)
    if value <= timedelta(0):
        raise ConfigurationError("DEDUP_DEAD_LETTER_RETENTION must be positive")
    return value


@dataclass(frozen=True)
class DedupConfig:
    """Every consumer option that the app settings set. ``IdempotentConsumer`` reads it
    from the settings unless given one, so a consumer built in a few lines gets the
    deployed retention, lease, waits and cache."""

    retention: timedelta = timedelta(days=30)
    steps: StepPolicy = DEFAULT_STEPS
    cache_size: int = 10_000
    # How long a delivery waits inside its invocation for a transient failure to clear
    # (Service Bus redelivers an abandoned message at once: without it, an outage spends
    # the whole delivery budget in milliseconds). Triggers with their own delayed retries
    # (Event Grid, HTTP callers) set a shorter wait per delivery.
    transient_wait: timedelta = timedelta(minutes=2)
    # The broker's maxDeliveryCount: the last delivery leaves a dead-letter record of why.
    max_deliveries: int = 10
    # How long after a parked delivery (HTTP, a last delivery) the outbox sweep may send its
    # messages: longer than an invocation runs (functionTimeout), so it never races its send.
    outbox_sweep_delay: timedelta = timedelta(minutes=10)

    @classmethod
    def from_settings(cls) -> DedupConfig:
        """DEDUP_RETENTION, DEDUP_LEASE, DEDUP_IN_FLIGHT_WAIT, DEDUP_CACHE_SIZE,
        DEDUP_TRANSIENT_WAIT, DEDUP_MAX_DELIVERY_COUNT, DEDUP_OUTBOX_SWEEP_DELAY (README, Configuration)."""
        return cls(*(read() for read in SETTINGS))


def problems() -> list[str]:
    """Every setting DedupConfig reads that it cannot use, each named (none: an empty list)."""
    found = []
    for read in SETTINGS:
        try:
            read()
        except ConfigurationError as exc:
            found.append(str(exc))
    return found


def whole(name: str, default: str) -> int:
    value = setting(name, default)
    if not value.isdigit():
        raise ConfigurationError(f"{name}={value!r} must be a whole number")
    return int(value)


def step_policy() -> StepPolicy:
    """DEDUP_LEASE (default 1 min) and DEDUP_IN_FLIGHT_WAIT (default 10 s)."""
    return StepPolicy(
        lease=duration("DEDUP_LEASE", DEFAULT_LEASE),
        in_flight_wait=duration("DEDUP_IN_FLIGHT_WAIT", DEFAULT_IN_FLIGHT_WAIT),
    )


def factory(name: str, value: str, choices: str) -> Any:
    """What a ``package.module:factory`` setting names, imported (a user's own store or
    sender); ConfigurationError naming the setting when it cannot be loaded."""
    module, colon, attribute = value.partition(":")
    if not colon or not module or not attribute:
        raise ConfigurationError(f"{name}={value!r}: use {choices}, or package.module:factory for your own")
    try:
        found = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"{name}={value!r}: cannot load it ({exc})") from exc
    if not callable(found):
        raise ConfigurationError(f"{name}={value!r}: {attribute} is not callable")
    return found


# DedupConfig's fields, in order, each read from its app setting.
SETTINGS: tuple[Callable[[], Any], ...] = (
    retention,
    step_policy,
    lambda: whole("DEDUP_CACHE_SIZE", "10000"),
    lambda: duration("DEDUP_TRANSIENT_WAIT", DEFAULT_TRANSIENT_WAIT),
    lambda: max(1, whole("DEDUP_MAX_DELIVERY_COUNT", DEFAULT_MAX_DELIVERY_COUNT)),
    lambda: duration("DEDUP_OUTBOX_SWEEP_DELAY", DEFAULT_OUTBOX_SWEEP_DELAY),
)
