"""Handlers whose payload's ``kind`` says how processing ends: refused by the handler, by
a service, by the store at commit, a bug, a step that calls out, or a commit. Imported by
the tests without declaring any consumer; ``consumers.py`` declares them."""

from __future__ import annotations

import os
from typing import Any

from shared.idempotency import (
    Context,
    DownstreamRejected,
    Effects,
    Entity,
    IdempotentConsumer,
    InvalidMessage,
    LatestState,
    from_body_field,
)
from shared.idempotency.stores import DedupStore

CALLS = "RESUBMIT_APP_CALLS"  # a file: one line per downstream call made


def call(key: str) -> dict[str, Any]:
    """The downstream call of step ``charge``: leaves a line in the file CALLS names."""
    with open(os.environ[CALLS], "a") as calls:
        calls.write(key + "\n")
    return {"id": "ch-" + key[-8:]}


def refuse(key: str) -> dict[str, Any]:
    raise DownstreamRejected(402, "card declined")


def checks(payload: dict[str, Any], context: Context) -> Effects:
    kind = payload["kind"]
    if kind == "invalid":
        raise InvalidMessage("not_ours", "the handler refuses it")
    if kind == "rejected":  # a service's refusal of a call that changes nothing (a validation)
        raise DownstreamRejected(422, "unknown customer")
    if kind == "bug":
        return Effects([Entity("thing", {"missing": payload["missing"]})])
    if kind == "too_many":
        return Effects([Entity(f"thing{i}", {}) for i in range(99)])
    if kind in ("step", "step_then_unstorable"):
        charged = context.step("charge", call)
        value: Any = payload["n"] ** 3 if kind == "step_then_unstorable" else charged["id"]
        return Effects([Entity("thing", {"charge": value})])
    if kind == "declined":
        context.step("charge", refuse)
    if kind == "unstorable":  # a computed value beyond Int64: no store holds it
        return Effects([Entity("thing", {"cubed": payload["n"] ** 3})])
    return Effects([Entity("thing", {"kind": kind})], {"ok": True})


def credit(payload: dict[str, Any], context: Context) -> Effects:
    """A credit changes its account's total (read, then changed at the version read); with
    ``charge``, a step calls out first."""
    charged = context.step("charge", call) if payload.get("charge") else None
    total = context.read("total")
    balance = (total.data or {}).get("balance", 0) + payload["amount"]
    return Effects([Entity(f"credit|{payload['id']}", {"amount": payload["amount"], "charge": charged})],
                   changes=[total.merged({"balance": balance})])  # fmt: skip


def status(payload: dict[str, Any], context: Context) -> LatestState:
    return LatestState(Entity("status", {"status": payload["status"]}), int(payload["version"]))


def checks_consumer(store: DedupStore) -> IdempotentConsumer:
    return IdempotentConsumer("checks", store, checks, key_source=from_body_field("id"))


def status_consumer(store: DedupStore) -> IdempotentConsumer:
    return IdempotentConsumer("states", store, status, key_source=from_body_field("id"))


def totals_consumer(store: DedupStore) -> IdempotentConsumer:
    return IdempotentConsumer("totals", store, credit, key_source=from_body_field("id"),
                              partition_from=from_body_field("account"), reads=lambda payload: ["total"])  # fmt: skip
