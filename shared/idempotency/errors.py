"""Errors of the dedup module. Each one maps to exactly one outcome."""

from __future__ import annotations


class InvalidMessage(Exception):
    """The message can never be processed as sent (bad JSON, schema, key): dead-letter."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class StoreUnavailable(Exception):
    """A transient store failure (throttling, 5xx, timeout, connection): retry later."""


class VersionConflict(Exception):
    """A fenced write found another version (HTTP 412): somebody else owns the record."""


class AlreadyClaimed(Exception):
    """A claim found a live marker for the same key."""

    def __init__(self, existing: object) -> None:
        super().__init__("the key is already claimed")
        self.existing = existing
