"""Seeded message streams for the demo and the chaos harness: bodies, producer retries
(some re-serialised), same-id/different-payload pairs, and invalid messages. A body's
shape is the target's: its key first, and an ``amount`` (``order``, ``item``)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field

Body = Callable[[str, random.Random], dict[str, object]]  # (key, rng) -> the body carrying that key


@dataclass(frozen=True)
class LogicalMessage:
    message_id: str | None
    body: bytes
    key: str | None = None  # the dedup key, for messages that must be applied
    invalid_reason: str | None = None  # set for messages that must be dead-lettered
    serialisations: tuple[bytes, ...] = field(default=(), compare=False)  # equal payloads, other bytes


def order(order_id: str, rng: random.Random) -> dict[str, object]:
    """The example's order (consumers/orders.py)."""
    return {
        "orderId": order_id,
        "customerId": f"c-{rng.randrange(1000)}",
        "amount": round(rng.uniform(1, 500), 2),
        "currency": rng.choice(["EUR", "USD", "GBP"]),
        "items": [{"sku": f"sku-{rng.randrange(100)}", "quantity": rng.randint(1, 5)}],
    }


def item(item_id: str, rng: random.Random) -> dict[str, object]:
    """The library tests' item (tests/app.py)."""
    return {"id": item_id, "amount": round(rng.uniform(1, 500), 2)}


def _reserialised(body: dict[str, object]) -> bytes:
    """Same JSON value, different bytes: reversed key order and other spacing."""
    return json.dumps(dict(reversed(list(body.items()))), indent=1).encode()


def _invalid(i: int, rng: random.Random, shape: Body) -> LogicalMessage:
    body = shape(f"bad-{i}", rng)
    kind = i % 4
    if kind == 0:  # cut off after its key
        key_only = json.dumps(dict([next(iter(body.items()))]))
        return LogicalMessage(f"bad-{i}", (key_only[:-1] + ", ").encode(), invalid_reason="invalid_json")
    if kind == 1:
        return LogicalMessage(
            f"bad-{i}", json.dumps({**body, "amount": -1}).encode(), invalid_reason="schema_violation"
        )
    if kind == 2:
        return LogicalMessage(None, json.dumps(body).encode(), invalid_reason="missing_key")
    return LogicalMessage(f"other-{i}", json.dumps(body).encode(), invalid_reason="key_mismatch")


def generate(count: int, seed: int, mismatch_rate: float = 0.005, invalid_rate: float = 0.01,
             body: Body = order) -> list[LogicalMessage]:  # fmt: skip
    """``count`` logical messages of ``body``'s shape; a mismatch is a second logical message
    reusing an earlier one's key with another amount."""
    rng = random.Random(seed)
    messages: list[LogicalMessage] = []
    made: list[tuple[str, dict[str, object]]] = []
    for i in range(count):
        roll = rng.random()
        if roll < invalid_rate:
            messages.append(_invalid(i, rng, body))
        elif roll < invalid_rate + mismatch_rate and made:
            key, original = rng.choice(made)
            twin = {**original, "amount": round(rng.uniform(501, 999), 2)}
            messages.append(LogicalMessage(key, json.dumps(twin).encode(), key=key))
        else:
            key = f"m-{seed}-{i}"
            new = body(key, rng)
            made.append((key, new))
            messages.append(LogicalMessage(key, json.dumps(new).encode(), key, None, (_reserialised(new),)))
    return messages


def sends(messages: list[LogicalMessage], dup_rate: float, seed: int) -> list[tuple[int, bytes]]:
    """The producer's sends: every message once, and with probability ``dup_rate`` again
    (retries after a lost acknowledgement), some of them re-serialised, at a later point
    in the stream — close enough for duplicate detection to drop some, not all.
    Returns (index of the logical message, body sent)."""
    rng = random.Random(seed + 1)
    plan: list[tuple[float, int, bytes]] = []
    for index, message in enumerate(messages):
        plan.append((index, index, message.body))
        position = float(index)
        while rng.random() < dup_rate:
            position += rng.expovariate(1 / 40)
            plan.append((position, index, rng.choice((message.body, *message.serialisations))))
    plan.sort(key=lambda send: send[0])
    return [(index, body) for _, index, body in plan]
