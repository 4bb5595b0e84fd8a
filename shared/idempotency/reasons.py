"""Why a delivery ended as it did: ``Result.reason`` and the dead-letter record's reason."""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    """Why a delivery ended as it did (``Result.reason``, the dead-letter record's reason):
    the library's own. A handler's ``InvalidMessage`` may carry a reason of its own."""

    # transient: nothing acknowledged
    STORE_UNAVAILABLE = "store_unavailable"
    DOWNSTREAM_UNAVAILABLE = "downstream_unavailable"
    LEASE_LOST = "lease_lost"  # a step's claim was taken over
    CLAIMED_ELSEWHERE = "claimed_elsewhere"  # another delivery holds a live claim
    DEAD_LETTER_FAILED = "dead_letter_failed"  # a refusal could not be recorded
    DISPATCH_FAILED = "dispatch_failed"  # committed, but its outgoing messages not sent
    HANDLER_ERROR = "handler_error"  # the handler raised: a bug, retried, never acknowledged
    CONTENDED = "contended"  # an entity it changes moved since it was read: decided again from a fresh read
    # acknowledged
    COMPLETED_RECENTLY = "completed_recently"  # a duplicate this instance saw completed
    DECLINED = "declined"  # a copy of a message its handler declined: the decline replayed
    OUTBOX_PARKED = "outbox_parked"  # committed; its messages left for the outbox sweep
    PARKED = "parked"  # recorded for replay: the source moved on (Event Hubs)
    # refused: dead-lettered with the reason
    INVALID_JSON = "invalid_json"
    NOT_I_JSON = "not_i_json"
    TOO_DEEP = "too_deep"
    DUPLICATE_MEMBER = "duplicate_member"
    SCHEMA_VIOLATION = "schema_violation"
    MISSING_KEY = "missing_key"
    KEY_TOO_LONG = "key_too_long"
    KEY_MISMATCH = "key_mismatch"
    IDEMPOTENCY_KEY_REUSED = "idempotency_key_reused"
    FINGERPRINT_MISMATCH = "fingerprint_mismatch"
    EXPIRED = "expired"  # first enqueued longer ago than its marker is sure to be kept: never applied
    KEY_PARTITION_MISMATCH = "key_partition_mismatch"  # the key was processed under another partition
    VERSION_CONFLICT = "version_conflict"
    HANDLER_RESULT = "handler_result"
    TOO_MANY_EFFECTS = "too_many_effects"
    RESULT_NOT_JSON = "result_not_json"
    RESULT_TOO_LARGE = "result_too_large"
    TOO_MANY_MESSAGES = "too_many_messages"
    OUTGOING_NAMES = "outgoing_names"
    OUTGOING_DESTINATION = "outgoing_destination"
    OUTGOING_NOT_JSON = "outgoing_not_json"
    OUTGOING_REFUSED = "outgoing_refused"
    STORE_REFUSED = "store_refused"
    DOWNSTREAM_REJECTED = "downstream_rejected"
    ITEMS_FAILED = "items_failed"
    FILE_TOO_LARGE = "file_too_large"  # an import's file, refused whole
    FILE_MALFORMED = "file_malformed"
    # found by the audit (the audit package), not by a delivery
    UNACCOUNTED = "unaccounted"  # a sequence number neither the consumer nor the broker holds: lost


# What clears by itself, so a delivery waits for it (``wait.py``). A handler's own exception
# does not (the same code fails the same way): it goes back to the broker at once.
WAITED_OUT = frozenset({Reason.STORE_UNAVAILABLE, Reason.DOWNSTREAM_UNAVAILABLE, Reason.LEASE_LOST,
                        Reason.CLAIMED_ELSEWHERE, Reason.DEAD_LETTER_FAILED, Reason.DISPATCH_FAILED,
                        Reason.CONTENDED})  # fmt: skip
# Refusals whose detail is ours to show an HTTP caller; any other detail (a downstream
# service's answer, a store error) stays in logs and dead-letter records.
PUBLIC = frozenset({Reason.INVALID_JSON, Reason.SCHEMA_VIOLATION, Reason.MISSING_KEY, Reason.KEY_TOO_LONG,
                    Reason.KEY_MISMATCH, Reason.TOO_DEEP, Reason.DUPLICATE_MEMBER, Reason.NOT_I_JSON,
                    Reason.IDEMPOTENCY_KEY_REUSED})  # fmt: skip
