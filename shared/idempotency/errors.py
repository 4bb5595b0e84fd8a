"""Errors of the dedup module, all under one root, ``DedupError``. Each maps to exactly
one outcome. A handler must let these through (never catch them broadly): the flow
settles them. ``AlreadyClaimed`` and ``VersionConflict`` are the stores' internal signals."""

from __future__ import annotations

from .reasons import Reason


class DedupError(Exception):
    """The root of every error the dedup module raises or expects from a store."""


class ConfigurationError(DedupError):
    """An app setting is missing or malformed (its name and the expected form are in the message)."""


class InvalidMessage(DedupError):
    """The message can never be processed as sent (bad JSON, schema, key): dead-letter."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class StoreRefused(InvalidMessage):
    """The store refused what this message would write, for good (HTTP 400 or 413: a value
    too large, a type it cannot hold): retrying cannot help, so dead-letter it."""

    def __init__(self, detail: str) -> None:
        super().__init__(Reason.STORE_REFUSED, detail)


class StoreUnavailable(DedupError):
    """A transient store failure (throttling, 5xx, timeout, connection, or access not yet
    granted): wait and retry, never dead-letter."""


class VersionConflict(DedupError):
    """A fenced write found another version (HTTP 412): somebody else owns the record."""


class AlreadyClaimed(DedupError):
    """A claim found a live marker for the same key."""

    def __init__(self, existing: object) -> None:
        super().__init__("the key is already claimed")
        self.existing = existing


class InFlight(DedupError):
    """Another delivery holds a live claim on this step: retry later, do not acknowledge."""

    def __init__(self, existing: object) -> None:
        super().__init__("another delivery holds a live claim")
        self.existing = existing


class FingerprintMismatch(DedupError):
    """The key was already used with a different payload."""

    def __init__(self, stored_fingerprint: str | None) -> None:
        super().__init__("the key was already processed with a different payload")
        self.stored_fingerprint = stored_fingerprint


class LeaseLost(DedupError):
    """Our claim was taken over (our lease had expired): our completion is rejected."""


class DownstreamUnavailable(DedupError):
    """A called service failed transiently (or is still working on this key): retry later."""


class DownstreamRejected(DedupError):
    """A called service refused the request for good (a 4xx other than 408/409/429)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail
