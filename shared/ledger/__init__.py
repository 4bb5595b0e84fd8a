"""The batch example: postings to accounts, consumed in batches (``cardinality="many"``).

The producer sets MessageId = ``<accountId>:<postingId>``, so the partition — the account —
derives from the dedup key alone, and a batch's postings to one account commit together:
on Table Storage, 33 postings (guard + marker + posting each) per transaction.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from shared.idempotency import Context, Effects, Entity, InvalidMessage
from shared.idempotency.keys import DedupKey

SCHEMA: dict[str, Any] = json.loads((Path(__file__).with_name("schema.json")).read_text())


def message_id(account_id: str, posting_id: str) -> str:
    return f"{account_id}:{posting_id}"


def account_of(key: DedupKey) -> str:
    """The partition rule: the account prefix of the key."""
    return key.id.split(":", 1)[0]


def posting_handler(posting: dict[str, Any], context: Context) -> Effects:
    if context.key.id != message_id(posting["accountId"], posting["postingId"]):
        raise InvalidMessage("key_mismatch", "MessageId must be <accountId>:<postingId>")
    record = {"accountId": posting["accountId"], "amount": float(posting["amount"]), "currency": posting["currency"]}
    return Effects([Entity(f"posting|{posting['postingId']}", record)], {"posted": record["amount"]})
