"""Seeded order streams for the demo and the chaos harness: orders, producer retries
(some re-serialised), same-id/different-payload pairs, and invalid messages."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field


@dataclass(frozen=True)
class LogicalMessage:
    message_id: str | None
    body: bytes
    key: str | None = None  # the dedup key, for messages that must be applied
    invalid_reason: str | None = None  # set for messages that must be dead-lettered
    serialisations: tuple[bytes, ...] = field(default=(), compare=False)  # equal payloads, other bytes


def _order(order_id: str, rng: random.Random) -> dict[str, object]:
    return {
        "orderId": order_id,
        "customerId": f"c-{rng.randrange(1000)}",
        "amount": round(rng.uniform(1, 500), 2),
        "currency": rng.choice(["EUR", "USD", "GBP"]),
        "items": [{"sku": f"sku-{rng.randrange(100)}", "quantity": rng.randint(1, 5)}],
    }


def _reserialised(order: dict[str, object]) -> bytes:
    """Same JSON value, different bytes: reversed key order and other spacing."""
    return json.dumps(dict(reversed(list(order.items()))), indent=1).encode()


def _invalid(i: int, rng: random.Random) -> LogicalMessage:
    order = _order(f"bad-{i}", rng)
    kind = i % 4
    if kind == 0:
        return LogicalMessage(
            f"bad-{i}", b'{"orderId": "bad-' + str(i).encode() + b'", ', invalid_reason="invalid_json"
        )
    if kind == 1:
        return LogicalMessage(
            f"bad-{i}", json.dumps({**order, "amount": -1}).encode(), invalid_reason="schema_violation"
        )
    if kind == 2:
        return LogicalMessage(None, json.dumps(order).encode(), invalid_reason="missing_key")
    return LogicalMessage(f"other-{i}", json.dumps(order).encode(), invalid_reason="key_mismatch")


def generate(count: int, seed: int, mismatch_rate: float = 0.005, invalid_rate: float = 0.01) -> list[LogicalMessage]:
    """``count`` logical messages; a mismatch is a second logical message reusing an
    earlier order's id with another amount."""
    rng = random.Random(seed)
    messages: list[LogicalMessage] = []
    orders: list[dict[str, object]] = []
    for i in range(count):
        roll = rng.random()
        if roll < invalid_rate:
            messages.append(_invalid(i, rng))
        elif roll < invalid_rate + mismatch_rate and orders:
            twin = {**rng.choice(orders), "amount": round(rng.uniform(501, 999), 2)}
            messages.append(LogicalMessage(str(twin["orderId"]), json.dumps(twin).encode(), key=str(twin["orderId"])))
        else:
            order = _order(f"o-{seed}-{i}", rng)
            orders.append(order)
            body = json.dumps(order).encode()
            messages.append(
                LogicalMessage(str(order["orderId"]), body, str(order["orderId"]), None, (_reserialised(order),))
            )
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
