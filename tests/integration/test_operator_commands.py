"""Every ``python -m`` command docs/operations.md gives an operator, read from the page and
run as written: a new process from the app's root, the app settings pointed at a real
Azurite (tests/integration/operators.py). What each prints is compared with the output the
page shows under it, so the page and the tools cannot drift apart. The page names the
example's consumers; here the commands run on the library tests' own (tests/app.py), in their
place (``on_test_app``). tests/example/test_example_operator_commands.py lists the example's."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from shared.idempotency import Delivery, Outcome, Result
from shared.idempotency.functions import shared_store
from shared.idempotency.functions.registry import declared
from shared.idempotency.testing.azurite import Azurite
from tests.app import item, job_consumer, stream_consumer
from tests.functions import fresh_app, servicebus_message, user_function
from tests.integration.operators import ROOT, run_tool
from tests.integration.test_eventhubs import tracked

DOC = ROOT / "docs" / "operations.md"
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
COMMAND = re.compile(r"^(?:\.venv/bin/)?python -m (\S+)(.*)$")
MENTION = re.compile(r"python -m ([\w.]+)")
TOOLS = {
    "shared.idempotency.resubmit",
    "shared.idempotency.replay",
    "shared.idempotency.dead_letter_records",
    "shared.idempotency.housekeeping",
}  # run below, as the page writes them
NOT_RUN = {  # the page's other commands, and where they are run instead
    "lab.client.smoke": "sends to a deployed namespace: tests/example/test_producer_and_smoke.py, when "
    "SMOKE_SERVICEBUS_NAMESPACE is set",
    "lab.purge_cost": "a measurement (make bench): tests/example/test_bench.py runs it small",
    "lab.workbook_picture": "redraws docs/workbook.png: tests/unit/test_entry_points.py runs its --help",
    "shared.idempotency.audit": "peeks a Service Bus entity: tests/integration/test_audit.py runs it against a "
    "namespace when AUDIT_SERVICEBUS_CONNECTION is set, and without one as a user would",
    "shared.idempotency.resend": "receives from a Service Bus DLQ: tests/integration/test_audit.py runs it against a "
    "namespace when AUDIT_SERVICEBUS_CONNECTION is set, without one as a user would, and its function on the "
    "queue model",
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


# The page's consumers (the example's), and the test app's that stand in for them.
IN_PLACE = {"orders": "items", "shipments": "item-stream", "orderId": "id"}


def on_test_app(argv: list[str], consumer: str | None = None) -> list[str]:
    """The page's command on tests/app.py's consumers: each name of the page's in its place
    (``consumer`` for the one named), and ``--consumers tests.app``."""
    return [*((consumer or IN_PLACE[arg]) if arg in ("orders", "shipments") else IN_PLACE.get(arg, arg)
              for arg in argv), "--consumers", "tests.app"]  # fmt: skip


def test_every_command_of_the_page_is_run_here_or_said_where() -> None:
    mentioned = set(MENTION.findall(DOC.read_text()))
    assert mentioned == TOOLS | set(NOT_RUN), "a command the page gives is neither run here nor in NOT_RUN"
    assert all(documented(tool) for tool in TOOLS)


def test_the_resubmit_commands_print_what_the_page_shows(azurite: Azurite, tmp_path: Path) -> None:
    commands = documented("shared.idempotency.resubmit")
    assert len(commands) == 2
    with fresh_app(azurite):
        for body in (item("o-17", 9.5), item("o-20", 9.5)):
            user_function("items")(servicebus_message(body, body["id"]))
        bodies = [item("o-17", 9.5), item("o-20", 12.0), item("o-18", 9.5)]  # the DLQ's export
        (tmp_path / "dead-letters.jsonl").write_text("".join(json.dumps(b) + "\n" for b in bodies))
        for argv, shown in commands:
            # the operator's export, wherever it is: the command as written otherwise
            argv = on_test_app([str(tmp_path / arg) if arg.endswith(".jsonl") else arg for arg in argv])
            done = run_tool(*argv)
            assert (done.returncode, done.stderr) == (0, ""), done.stderr
            assert columns(done.stdout) == columns(shown), done.stdout


@pytest.mark.parametrize("consumer", ["item-stream", "item-job"])
def test_the_replay_command_applies_what_was_parked_once(azurite: Azurite, consumer: str) -> None:
    """The page's command (for the Event Hubs stream), and the same for the other consumer
    that parks (the timer's job)."""
    [(argv, shown)] = documented("shared.idempotency.replay")
    argv = on_test_app(argv, consumer)
    with fresh_app(azurite):
        built = stream_consumer() if consumer == "item-stream" else job_consumer()
        failed = Result(Outcome.TRANSIENT, reason="store_unavailable", detail="503 while the checkpoint moved on")
        deliveries = [Delivery(json.dumps(item(m, 12.5)).encode(), message_id=m) for m in ("e-41", "e-42")]
        assert [r.outcome for r in built.park([(d, failed) for d in deliveries])] == [Outcome.PARKED] * 2
        first, again = run_tool(*argv), run_tool(*argv)
        if consumer == "item-stream":
            assert tracked(built.store) == {"e-41": 1, "e-42": 1}
    assert (first.returncode, first.stderr, again.returncode, again.stderr) == (0, "", 0, ""), first.stderr
    assert sorted(columns(first.stdout)[:-1]) == sorted(columns(shown)[:-1]) == [["e-41", "processed"],
                                                                                 ["e-42", "processed"]]  # fmt: skip
    assert columns(first.stdout)[-1] == columns(shown)[-1]
    assert sorted(columns(again.stdout)) == [["e-41", "duplicate"], ["e-42", "duplicate"],
                                             ['{"parked": 2, "duplicate": 2}']]  # fmt: skip


def test_the_dead_letter_records_command_lists_and_exports_what_the_page_shows(
    azurite: Azurite, tmp_path: Path
) -> None:
    [(argv, shown)] = documented("shared.idempotency.dead_letter_records")
    export = tmp_path / "dead-letters.jsonl"
    argv = on_test_app([str(export) if arg.endswith(".jsonl") else arg for arg in argv])
    with fresh_app(azurite):
        refused = {"id": "o-17", "amount": -1}  # the schema's minimum: 0
        user_function("items")(servicebus_message(refused, "o-17"))
        done = run_tool(*argv)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    lines, expected = columns(done.stdout), columns(shown)
    assert [line[1:4] for line in lines[:-1]] == [line[1:4] for line in expected[:-1]]  # when differs
    assert lines[0][4].startswith("amount") and lines[-1] == expected[-1]
    assert [json.loads(line) for line in export.read_text().splitlines()] == [refused]  # what resubmit --bodies reads


def test_the_housekeeping_command_prints_what_the_page_shows(azurite: Azurite) -> None:
    [(argv, shown)] = documented("shared.idempotency.housekeeping")
    with fresh_app(azurite):
        shared_store()
        done = run_tool(*argv)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    found, expected = json.loads(done.stdout), json.loads(shown)
    assert found.keys() == expected.keys() and found["requests"] > 0  # its reads of the index's hours
    assert {k: v for k, v in found.items() if k != "requests"} == {k: v for k, v in expected.items() if k != "requests"}


# A module, and a package whose ``__init__`` imports none of its modules; some of their consumers.
APPS = {"tests.app": {"items", "item-stream", "item-job"}, "tests.integration.resubmit_app": {"checks", "states"}}


@pytest.mark.parametrize("module", sorted(APPS))
def test_an_unknown_consumer_in_a_fresh_process_lists_every_consumer_of_the_app(azurite: Azurite, module: str) -> None:
    """Nothing imported the consumers' modules before: the tools import them themselves."""
    with fresh_app(azurite):
        shared_store()  # the app's tables, as the app creates them (a command never does)
        expected = {c.name for c in declared(module)}
        assert APPS[module] <= expected
        for tool in sorted(TOOLS - {"shared.idempotency.housekeeping"}):  # the one that takes no consumer
            ids = ["--ids", "o-1"] if tool.endswith("resubmit") else []
            done = run_tool(tool, "--consumer", "nosuch", *ids, "--consumers", module)
            assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
            known = set(done.stderr.split("known: ")[1].strip().split(", "))
            assert known == expected, done.stderr  # the app's, whichever they are


def test_a_parked_record_that_kept_only_the_head_of_its_body_is_never_replayed(azurite: Azurite) -> None:
    """Processing a head would refuse it, or apply something else: the line says to replay it
    from its source, and the run exits 1 (not everything was applied)."""
    [(argv, _)] = documented("shared.idempotency.replay")
    with fresh_app(azurite):
        built = stream_consumer()
        event = item("i-big", note="x" * (1 << 20))  # over the 1 MiB a record keeps
        failed = Result(Outcome.TRANSIENT, reason="store_unavailable", detail="503")
        built.park([(Delivery(json.dumps(event).encode(), message_id="e-big"), failed)])
        [record] = built.store.dead_letters("item-stream")
        assert record.truncated
        done = run_tool(*on_test_app(argv))
        assert tracked(built.store) == {}
    assert (done.returncode, done.stderr) == (1, "")
    [line, summary] = columns(done.stdout)
    assert line[:2] == ["e-big", "truncated"] and line[2].endswith("replay it from its source")
    assert summary == ['{"parked": 1, "truncated": 1}']
