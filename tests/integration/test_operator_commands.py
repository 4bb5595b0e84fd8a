"""Every ``python -m`` command docs/operations.md gives an operator, read from the page and
run as written: a new process from the app's root, the app settings pointed at a real
Azurite (tests/integration/operators.py). What each prints is compared with the output the
page shows under it, so the page and the tools cannot drift apart."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

import recipes
from shared.idempotency import Delivery, Outcome, Result
from shared.idempotency.functions.registry import declared
from shared.orders.checks import tracking_by_event
from tests.functions import fresh_app, servicebus_message, user_function
from tests.integration.operators import ROOT, run_tool
from tools.azurite import Azurite

DOC = ROOT / "docs" / "operations.md"
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
COMMAND = re.compile(r"^(?:\.venv/bin/)?python -m (\S+)(.*)$")
MENTION = re.compile(r"python -m ([\w.]+)")
TOOLS = {"shared.idempotency.resubmit", "shared.idempotency.replay"}  # run below, as the page writes them
NOT_RUN = {  # the page's other commands, and where they are run instead
    "client.smoke": "sends to a deployed namespace: tests/client, when SMOKE_SERVICEBUS_NAMESPACE is set",
    "tools.purge_cost": "a measurement (make bench): tests/integration/test_bench.py runs it small",
    "tools.workbook_picture": "redraws docs/workbook.png: tests/unit/test_entry_points.py runs its --help",
}


def documented(module: str) -> list[tuple[list[str], str]]:
    """(argv, the output shown in the plain block right after) of each of the page's sh
    commands of ``module``."""
    blocks = BLOCK.findall(DOC.read_text())
    found = []
    for i, (language, text) in enumerate(blocks):
        for line in text.splitlines() if language == "sh" else []:
            command = COMMAND.match(line.strip())
            if command and command[1] == module:
                shown = blocks[i + 1][1] if i + 1 < len(blocks) and blocks[i + 1][0] == "" else ""
                found.append(([command[1], *command[2].split()], shown))
    return found


def columns(output: str) -> list[list[str]]:
    """Lines as columns: the tools separate them by tabs, the page aligns them with spaces."""
    return [re.split(r"\t|\s{2,}", line.strip()) for line in output.splitlines()]


def an_order(order_id: str, amount: float = 9.5) -> dict[str, Any]:
    return {"orderId": order_id, "customerId": "c-1", "amount": amount, "currency": "EUR",
            "items": [{"sku": "a", "quantity": 2}]}  # fmt: skip


def test_every_command_of_the_page_is_run_here_or_said_where() -> None:
    mentioned = set(MENTION.findall(DOC.read_text()))
    assert mentioned == TOOLS | set(NOT_RUN), "a command the page gives is neither run here nor in NOT_RUN"
    assert all(documented(tool) for tool in TOOLS)


def test_the_resubmit_commands_print_what_the_page_shows(azurite: Azurite, tmp_path: Path) -> None:
    commands = documented("shared.idempotency.resubmit")
    assert len(commands) == 2
    with fresh_app(azurite):
        for order in (an_order("o-17"), an_order("o-20")):
            user_function("orders")(servicebus_message(order, order["orderId"]))
        bodies = [an_order("o-17"), an_order("o-20", amount=12.0), an_order("o-18")]  # the DLQ's export
        (tmp_path / "dead-letters.jsonl").write_text("".join(json.dumps(b) + "\n" for b in bodies))
        for argv, shown in commands:
            # the operator's export, wherever it is: the command as written otherwise
            argv = [str(tmp_path / arg) if arg.endswith(".jsonl") else arg for arg in argv]
            done = run_tool(*argv)
            assert (done.returncode, done.stderr) == (0, ""), done.stderr
            assert columns(done.stdout) == columns(shown), done.stdout


@pytest.mark.parametrize("consumer", ["shipments", "reminders"])
def test_the_replay_command_applies_what_was_parked_once(azurite: Azurite, consumer: str) -> None:
    """The page's command (for shipments), and the same for the other consumer that parks."""
    [(argv, shown)] = documented("shared.idempotency.replay")
    argv = [consumer if arg == "shipments" else arg for arg in argv]
    with fresh_app(azurite):
        if consumer == "shipments":
            parking = recipes.module("shipments").tracking_consumer
        else:
            parking = recipes.module("reminders").reminders_consumer
        built = parking()
        failed = Result(Outcome.TRANSIENT, reason="store_unavailable", detail="503 while the checkpoint moved on")
        for message_id in ("e-41", "e-42"):
            event = ({"shipmentId": message_id, "orderId": "o-1", "status": "picked"} if consumer == "shipments"
                     else {"customerId": message_id, "balance": 12.5, "currency": "EUR"})  # fmt: skip
            assert built.park(Delivery(json.dumps(event).encode(), message_id=message_id), failed).outcome is (
                Outcome.PARKED)  # fmt: skip
        first, again = run_tool(*argv, switched_on=[consumer]), run_tool(*argv, switched_on=[consumer])
        if consumer == "shipments":
            assert tracking_by_event(built.store) == {"e-41": 1, "e-42": 1}
    assert (first.returncode, first.stderr, again.returncode, again.stderr) == (0, "", 0, ""), first.stderr
    assert sorted(columns(first.stdout)[:-1]) == sorted(columns(shown)[:-1]) == [["e-41", "processed"],
                                                                                 ["e-42", "processed"]]  # fmt: skip
    assert columns(first.stdout)[-1] == columns(shown)[-1]
    assert sorted(columns(again.stdout)) == [["e-41", "duplicate"], ["e-42", "duplicate"],
                                             ['{"parked": 2, "duplicate": 2}']]  # fmt: skip


@pytest.mark.parametrize("switched_on", [[], sorted(recipes.MODULES.values())], ids=["default", "every recipe"])
def test_an_unknown_consumer_in_a_fresh_process_lists_every_consumer_of_the_app(
    azurite: Azurite, switched_on: list[str]
) -> None:
    """Nothing imported the consumers' modules before: the tools import them themselves."""
    with fresh_app(azurite):
        modules = ["consumers", *(recipes.module(name).__name__ for name in switched_on)]
        expected = {c.name for module in modules for c in declared(module)}
        assert {"orders", "order-events"} <= expected
        for tool in sorted(TOOLS):
            ids = ["--ids", "o-1"] if tool.endswith("resubmit") else []
            done = run_tool(tool, "--consumer", "nosuch", *ids, switched_on=switched_on)
            assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
            known = set(done.stderr.split("known: ")[1].strip().split(", "))
            assert known == expected, done.stderr  # the app's, whichever they are


def test_a_parked_record_that_kept_only_the_head_of_its_body_is_never_replayed(azurite: Azurite) -> None:
    """Processing a head would refuse it, or apply something else: the line says to replay it
    from its source, and the run exits 1 (not everything was applied)."""
    [(argv, _)] = documented("shared.idempotency.replay")
    with fresh_app(azurite):
        tracking_consumer = recipes.module("shipments").tracking_consumer

        built = tracking_consumer()
        event = {"shipmentId": "s-big", "orderId": "o-1", "status": "x" * (1 << 20)}  # over the 1 MiB a record keeps
        failed = Result(Outcome.TRANSIENT, reason="store_unavailable", detail="503")
        built.park(Delivery(json.dumps(event).encode(), message_id="e-big"), failed)
        [record] = built.store.dead_letters("shipments")
        assert record.truncated
        done = run_tool(*argv, switched_on=["shipments"])
        assert tracking_by_event(built.store) == {}
    assert (done.returncode, done.stderr) == (1, "")
    [line, summary] = columns(done.stdout)
    assert line[:2] == ["e-big", "truncated"] and line[2].endswith("replay it from its source")
    assert summary == ['{"parked": 1, "truncated": 1}']
