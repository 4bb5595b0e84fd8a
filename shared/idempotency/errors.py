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


class InFlight(Exception):
    """Another delivery holds a live claim on this step: retry later, do not acknowledge."""

    def __init__(self, existing: object) -> None:
        super().__init__("another delivery holds a live claim")
        self.existing = existing


class FingerprintMismatch(Exception):
    """The key was already used with a different payload."""

    def __init__(self, stored_fingerprint: str | None) -> None:
        super().__init__("the key was already processed with a different payload")
        self.stored_fingerprint = stored_fingerprint


class LeaseLost(Exception):
    """Our claim was taken over (our lease had expired): our completion is rejected."""


class DownstreamUnavailable(Exception):
    """A called service failed transiently (or is still working on this key): retry later."""


class DownstreamRejected(Exception):
    """A called service refused the request for good (a 4xx other than 408/409/429)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail
