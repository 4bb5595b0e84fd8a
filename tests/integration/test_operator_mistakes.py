"""Every operator command, for every mistake an operator makes — a mistyped table, a wrong key, an
unreachable store or namespace, an unknown consumer — run as operators run it (a new process
from the app's root): exit 2, one line on stderr naming what is wrong, nothing on stdout, and
the store as it was (no table created, no entity written)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from azure.data.tables import TableServiceClient

from shared.idempotency.functions import shared_store
from shared.idempotency.stores import TableStore
from shared.idempotency.testing import expiry_index
from shared.idempotency.testing.azurite import KEY, Azurite, free_port
from tests.app import item
from tests.functions import app_settings, fresh_app, servicebus_message, user_function
from tests.integration.operators import run_tool

pytestmark = pytest.mark.long("every operator command against every mistake, each in a new process")

APP = ("--consumers", "tests.app")
COMMANDS: dict[str, tuple[str, ...]] = {
    "audit": ("shared.idempotency.audit", "--consumer", "items", "--queue", "items", *APP),
    "audit --save": ("shared.idempotency.audit", "--consumer", "items", "--queue", "items", "--save", *APP),
    "replay": ("shared.idempotency.replay", "--consumer", "item-stream", *APP),
    "resend": ("shared.idempotency.resend", "--consumer", "items", "--queue", "items", *APP),
    "resubmit": ("shared.idempotency.resubmit", "--consumer", "items", "--ids", "o-1", *APP),
    "dead_letter_records": ("shared.idempotency.dead_letter_records", "--consumer", "items", *APP),
    "housekeeping purge": ("shared.idempotency.housekeeping", "purge"),
    "housekeeping sweep": ("shared.idempotency.housekeeping", "sweep"),
    "housekeeping outbox": ("shared.idempotency.housekeeping", "outbox", *APP),
}
WITH_CONSUMER = [name for name, argv in COMMANDS.items() if "--consumer" in argv]
READS_SERVICE_BUS = ["audit", "audit --save", "resend"]
# A namespace nobody listens on (the emulator's form of a connection string: plain AMQP, no TLS).
NOWHERE = "Endpoint=sb://127.0.0.1:{port};SharedAccessKeyName=x;SharedAccessKey=eQ==;UseDevelopmentEmulator=true"


def snapshot(azurite: Azurite) -> dict[str, list[tuple[str, str, str]]]:
    """Every table of the account (a command must create none), with every entity's keys and ETag
    of the app's own (other tests' tables may still be written by their stores' threads)."""
    service = TableServiceClient.from_connection_string(azurite.connection_string)
    app = os.environ["DEDUP_TABLE"]
    return {table.name: sorted((e["PartitionKey"], e["RowKey"], e.metadata["etag"])
                               for e in service.get_table_client(table.name).list_entities())
            if table.name in (app, app + "dl") else [] for table in service.list_tables()}  # fmt: skip


@pytest.fixture
def app(azurite: Azurite) -> Iterator[str]:
    """The app on its tables (created as the app creates them), a message processed, one refused."""
    with fresh_app(azurite, ServiceBusConnection=NOWHERE.format(port=free_port())) as table:
        shared_store()
        user_function("items")(servicebus_message(item("o-1"), "o-1"))
        user_function("items")(servicebus_message(b"not json", "o-2"))
        store = shared_store()
        assert isinstance(store, TableStore)
        expiry_index(store).flush()  # this process's own notes written now, not while a command runs
        yield table


def one_line(azurite: Azurite, command: str, **settings: str) -> str:
    """Runs ``command`` with ``settings``: exit 2, one line on stderr, nothing else, the store as it was."""
    before = snapshot(azurite)
    done = run_tool(*COMMANDS[command], **settings)
    assert (done.returncode, done.stdout) == (2, ""), (done.returncode, done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"{command.removesuffix(' --save')}: error: "), done.stderr
    assert snapshot(azurite) == before, "the command wrote to the store"
    return done.stderr


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("setting", ["DEDUP_TABLE", "DEDUP_DEADLETTER_TABLE"])
def test_a_mistyped_table_is_refused_never_created(azurite: Azurite, app: str, command: str, setting: str) -> None:
    typo = "t" + uuid.uuid4().hex[:16]
    assert f"table '{typo}' does not exist" in one_line(azurite, command, **{setting: typo})


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("fault", ["wrong key", "closed port"])
def test_an_unreachable_or_refusing_store_is_one_line(azurite: Azurite, app: str, command: str, fault: str) -> None:
    if fault == "closed port":
        connection = azurite.connection_string.replace(f":{azurite.port}/", f":{free_port()}/")
    else:
        connection = azurite.connection_string.replace(f"AccountKey={KEY}", "AccountKey=" + "A" * 86 + "==")
    assert "cannot reach the store" in one_line(azurite, command, DEDUP_STORAGE_CONNECTION=connection)


@pytest.mark.parametrize("command", WITH_CONSUMER)
def test_an_unknown_consumer_is_one_line_naming_the_known_ones(azurite: Azurite, app: str, command: str) -> None:
    argv = list(COMMANDS[command])
    argv[argv.index("--consumer") + 1] = "nosuch"
    before = snapshot(azurite)
    done = run_tool(*argv)
    assert (done.returncode, done.stdout, done.stderr.count("\n")) == (2, "", 1), done.stderr
    assert "no consumer named 'nosuch'" in done.stderr and "known: " in done.stderr
    assert snapshot(azurite) == before


def test_a_consumer_name_two_triggers_share_is_refused_unless_the_one_meant_is_named(app: str) -> None:
    """An Event Grid consumer and its HTTP route share ``item-events`` (tests/app.py): which one
    a body is judged by matters (the route's fingerprint holds its caller)."""
    argv = ("shared.idempotency.resubmit", "--consumer", "item-events", "--ids", "e-1", *APP)
    done = run_tool(*argv)
    assert (done.returncode, done.stderr.count("\n")) == (2, 1), done.stderr
    assert "declared by events_consumer, events_api_consumer" in done.stderr and "--declared" in done.stderr
    named = run_tool(*argv, "--declared", "events_api_consumer")
    assert (named.returncode, named.stderr) == (0, ""), named.stderr


@pytest.mark.parametrize("command", READS_SERVICE_BUS)
def test_an_unreachable_namespace_is_one_line_and_nothing_is_written(azurite: Azurite, app: str, command: str) -> None:
    said = one_line(azurite, command)
    assert "cannot reach Service Bus" in said, said


def test_a_settings_file_is_read_beneath_the_environment(azurite: Azurite, app: str, tmp_path: Any) -> None:
    """``--settings local.settings.json``: its Values as app settings, the environment's first."""
    settings = tmp_path / "local.settings.json"
    settings.write_text('{"IsEncrypted": false, "Values": {"DEDUP_TABLE": "nosuchtable"}}')
    done = run_tool(*COMMANDS["resubmit"], "--settings", str(settings), DEDUP_TABLE="")
    assert done.returncode == 2 and "table 'nosuchtable' does not exist" in done.stderr, done.stderr
    with app_settings():
        kept = run_tool(*COMMANDS["resubmit"], "--settings", str(settings))  # the environment's DEDUP_TABLE wins
    assert (kept.returncode, kept.stderr) == (0, ""), kept.stderr


def test_usage_names_the_command_as_typed() -> None:
    for command in {argv[0] for argv in COMMANDS.values()}:
        done = run_tool(command, "--help")
        assert done.returncode == 0 and done.stdout.startswith(f"usage: python -m {command} "), done.stdout[:200]
