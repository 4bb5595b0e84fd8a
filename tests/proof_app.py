"""The proof kit's own subject (tests/integration/test_proof.py): stock per SKU, changed by
restocks, reservations and releases (MessageId = ``changeId``), as a new user writes it from
the docs — and mutants of it, each a mistake the kit must name.

A reservation takes stock when there is enough (else it is declined: a decision, recorded), and
keeps what it took under its ``reservationId``; a release gives back what its reservation took,
once (the reservation is deleted), and is declined for a reservation that holds nothing."""

from __future__ import annotations

import random
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import azure.functions as func

from shared.idempotency import Context, Declined, Effects, Entity, IdempotentConsumer, InvalidMessage, from_body_field
from shared.idempotency.functions import BODY_AS_BYTES, consumer, on_servicebus, on_storage_queue, shared_store
from shared.idempotency.testing import Accepted, Message, Stored

bp = func.Blueprint()  # type: ignore[no-untyped-call]  # azure-functions leaves it unannotated

SCHEMA = {
    "type": "object",
    "required": ["changeId", "sku", "kind", "quantity"],
    "properties": {
        "changeId": {"type": "string"},
        "sku": {"type": "string"},
        "kind": {"enum": ["restock", "reserve", "release"]},
        "quantity": {"type": "integer", "minimum": 1},
        "reservationId": {"type": "string"},
    },
}


def reads(change: dict[str, Any]) -> list[str]:
    return ["stock", f"reservation|{change.get('reservationId')}"]


def stock_handler(change: dict[str, Any], context: Context) -> Effects:
    if context.key.id != change["changeId"]:  # its records are named by it: another id would be another change's
        raise InvalidMessage("key_mismatch", "the message's key is not its changeId")
    return apply_change(change, context)


def apply_change(change: dict[str, Any], context: Context) -> Effects:
    stock = context.read("stock")
    level = (stock.data or {}).get("level", 0)
    record = Entity(f"change|{change['changeId']}", change)
    if change["kind"] == "restock":
        return Effects([record], changes=[stock.merged({"sku": change["sku"], "level": level + change["quantity"]})])
    reservation = context.read(f"reservation|{change['reservationId']}")
    if change["kind"] == "reserve":
        if level < change["quantity"]:
            return Effects(declined=Declined("insufficient_stock", f"{change['quantity']} asked, {level} left"))
        return Effects([record], changes=[stock.merged({"sku": change["sku"], "level": level - change["quantity"]}),
                                          reservation.replaced({"quantity": change["quantity"]})])  # fmt: skip
    if not reservation.exists:
        return Effects(declined=Declined("no_reservation", change["reservationId"]))
    held = int((reservation.data or {})["quantity"])  # type: ignore[call-overload]
    return Effects(
        [record], changes=[stock.merged({"sku": change["sku"], "level": level + held}), reservation.deleted()]
    )


def build(handler: Callable[[dict[str, Any], Context], Effects], **options: Any) -> IdempotentConsumer:
    return IdempotentConsumer("stock", shared_store(), handler, schema=SCHEMA, partition_from=from_body_field("sku"),
                              reads=reads, **options)  # fmt: skip


@consumer
def stock_consumer() -> IdempotentConsumer:
    return build(stock_handler)


@bp.function_name("proof_stock")
@bp.service_bus_queue_trigger(arg_name="msg", queue_name="stock", connection="ServiceBusConnection",
                              data_type=BODY_AS_BYTES)  # fmt: skip
def on_stock(msg: func.ServiceBusMessage) -> None:
    on_servicebus(stock_consumer, msg)


def workload(rng: random.Random, count: int) -> Iterator[Message]:
    """Changes of 3 hot SKUs: restocks, reservations, and releases of earlier reservations (some
    twice, some of a reservation that was declined)."""
    reservations: list[tuple[str, str]] = []
    for i in range(count):
        sku, roll = f"sku-{rng.randrange(3)}", rng.random()
        change: dict[str, Any] = {"changeId": f"c-{i}", "sku": sku, "quantity": rng.randint(1, 5)}
        if roll < 0.3 or (roll >= 0.75 and not reservations):
            change["kind"] = "restock"
        elif roll < 0.75:
            change |= {"kind": "reserve", "reservationId": f"r-{i}"}
            reservations.append((sku, f"r-{i}"))
        else:
            sku, reservation = rng.choice(reservations)
            change |= {"kind": "release", "sku": sku, "reservationId": reservation}
        yield Message(change, change["changeId"])


def ledger(accepted: list[Accepted], stored: Stored) -> list[str]:
    """Each SKU's level is its applied restocks - reserves + releases, never negative; each
    reservation released at most once, and only an applied one."""
    found, level = [], defaultdict(int)
    reserved = {a.payload["reservationId"]: a.payload["quantity"] for a in accepted
                if a.decision == "applied" and a.payload["kind"] == "reserve"}  # fmt: skip
    released: dict[str, int] = defaultdict(int)
    for change in (a.payload for a in accepted if a.decision == "applied"):
        if change["kind"] == "restock":
            level[change["sku"]] += change["quantity"]
        elif change["kind"] == "reserve":
            level[change["sku"]] -= change["quantity"]
        else:
            released[change["reservationId"]] += 1
            level[change["sku"]] += reserved.get(change["reservationId"], 0)
    found += [f"reservation {r} released {n} times" for r, n in released.items() if n > 1 or r not in reserved]
    stocks = {s["sku"]: s["level"] for s in stored.entities("stock")}
    for sku in sorted({*level, *stocks}):
        if stocks.get(sku, 0) != level[sku] or stocks.get(sku, 0) < 0:
            found.append(f"{sku}: stock {stocks.get(sku, 0)}, ledger {level[sku]}")
    return found


# -- mutants: each a mistake the kit must name -----------------------------------------------------


def blind_write(change: dict[str, Any], context: Context) -> Effects:
    """Writes the level outside the transaction: a redelivery or a rival writes it again."""
    effects = stock_handler(change, context)
    for step in effects.changes:
        if step.name == "stock" and step.data is not None:
            shared_store().put_entity(change["sku"], Entity("stock", dict(step.data)))
    return Effects(effects.entities, declined=effects.declined)


def kept_reservation(change: dict[str, Any], context: Context) -> Effects:
    """A release that keeps its reservation: a second release gives its quantity back again."""
    effects = stock_handler(change, context)
    return Effects(effects.entities, changes=[c for c in effects.changes if c.data is not None],
                   declined=effects.declined)  # fmt: skip


def fickle(change: dict[str, Any], context: Context) -> Effects:
    """Refuses a reservation without stock as an invalid message: not recorded as a decision,
    so a later copy is decided again, on another level."""
    effects = stock_handler(change, context)
    if effects.declined is not None and effects.declined.reason == "insufficient_stock":
        raise InvalidMessage("schema_violation", "no stock")
    return effects


@consumer
def blind_consumer() -> IdempotentConsumer:
    return build(blind_write)


@consumer
def kept_consumer() -> IdempotentConsumer:
    return build(kept_reservation)


@consumer
def fickle_consumer() -> IdempotentConsumer:
    return build(fickle)


@consumer
def twice_consumer() -> IdempotentConsumer:
    """Keyed by each delivery: every copy is a new message, applied again."""
    return build(apply_change, key_source=lambda message_id, payload: f"{message_id}-{uuid.uuid4().hex[:8]}")


@bp.function_name("proof_blind")
@bp.service_bus_queue_trigger(arg_name="msg", queue_name="stock", connection="ServiceBusConnection",
                              data_type=BODY_AS_BYTES)  # fmt: skip
def on_blind(msg: func.ServiceBusMessage) -> None:
    on_servicebus(blind_consumer, msg)


@bp.function_name("proof_kept")
@bp.service_bus_queue_trigger(arg_name="msg", queue_name="stock", connection="ServiceBusConnection",
                              data_type=BODY_AS_BYTES)  # fmt: skip
def on_kept(msg: func.ServiceBusMessage) -> None:
    on_servicebus(kept_consumer, msg)


@bp.function_name("proof_fickle")
@bp.service_bus_queue_trigger(arg_name="msg", queue_name="stock", connection="ServiceBusConnection",
                              data_type=BODY_AS_BYTES)  # fmt: skip
def on_fickle(msg: func.ServiceBusMessage) -> None:
    on_servicebus(fickle_consumer, msg)


@bp.function_name("proof_twice")
@bp.service_bus_queue_trigger(arg_name="msg", queue_name="stock", connection="ServiceBusConnection",
                              data_type=BODY_AS_BYTES)  # fmt: skip
def on_twice(msg: func.ServiceBusMessage) -> None:
    on_servicebus(twice_consumer, msg)


@bp.function_name("proof_swallowed")
@bp.service_bus_queue_trigger(arg_name="msg", queue_name="stock", connection="ServiceBusConnection",
                              data_type=BODY_AS_BYTES)  # fmt: skip
def on_swallowed(msg: func.ServiceBusMessage) -> None:
    """Returns whatever happened: a message the store could not take is completed, never applied."""
    try:
        on_servicebus(stock_consumer, msg)
    except Exception:  # noqa: BLE001 - the mutant's mistake
        return


def always_down(body: dict[str, Any], context: Context) -> Effects:
    raise ConnectionError("the warehouse API is down")


@consumer
def down_consumer() -> IdempotentConsumer:
    return build(always_down, key_source=from_body_field("changeId"))


@bp.function_name("proof_queue_down")
@bp.queue_trigger(arg_name="msg", queue_name="stock-changes", connection="StorageQueueConnection")
def on_queue_always_fails(msg: func.QueueMessage) -> None:
    """A Storage queue function whose every call fails: the host poisons its message."""
    on_storage_queue(down_consumer, msg)


@consumer
def queue_id_consumer() -> IdempotentConsumer:
    """Keyed by the queue message's id (the default key): the service's, new for a producer's retry."""
    return build(apply_change)


@bp.function_name("proof_queue_by_id")
@bp.queue_trigger(arg_name="msg", queue_name="stock-changes", connection="StorageQueueConnection")
def on_queue_by_message_id(msg: func.QueueMessage) -> None:
    on_storage_queue(queue_id_consumer, msg)
