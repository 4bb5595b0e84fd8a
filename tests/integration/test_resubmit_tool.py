"""The resubmission tool as operators run it — ``python -m shared.idempotency.resubmit`` in a
new process from the app's root, the app settings in its environment — on a real Azurite:
one escaped line per id or body plus a summary, never a table created, and one line on
stderr (exit 2) for whatever it cannot do. (``main`` in this process only where a test
replaces part of the library.)"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from azure.data.tables import TableServiceClient

from shared.idempotency import InvalidMessage, resubmit
from shared.idempotency import consumer as consumer_module
from shared.idempotency.functions import shared_store
from shared.idempotency.functions.registry import declared
from shared.idempotency.resubmit import main
from shared.idempotency.testing import reset
from shared.idempotency.testing.azurite import KEY, Azurite, free_port
from tests.app import item
from tests.functions import app_settings, fresh_app, http_request, servicebus_message, user_function
from tests.integration.operators import run_tool

Output = tuple[int, str, str]
APP = "tests.app"  # the library tests' consumers (the example's are in consumers/)


@pytest.fixture
def app(azurite: Azurite) -> Iterator[str]:
    """The app on new tables, created as the app creates them when it opens its store."""
    with fresh_app(azurite) as table:
        shared_store()
        yield table


def process(body: dict[str, Any]) -> None:
    user_function("items")(servicebus_message(body, body["id"]))


def run(*argv: str, consumer: str = "items") -> Output:
    done = run_tool("shared.idempotency.resubmit", "--consumer", consumer, "--consumers", APP, *argv)
    return done.returncode, done.stdout, done.stderr


def run_here(capsys: pytest.CaptureFixture[str], *argv: str) -> Output:
    code = main(["--consumer", "items", "--consumers", APP, *argv])
    out, err = capsys.readouterr()
    return code, out, err


def bodies_file(tmp_path: Path, *bodies: bytes) -> str:
    path = tmp_path / "dead-letters.jsonl"
    path.write_bytes(b"\n".join(bodies) + b"\n")
    return str(path)


def tables(azurite: Azurite) -> set[str]:
    service = TableServiceClient.from_connection_string(azurite.connection_string)
    return {table.name for table in service.list_tables()}


def assert_terminal_safe(text: str) -> None:
    """Nothing but printable characters, the tab separators and the line ends."""
    raw = [char for char in text if not char.isprintable() and char not in "\t\n"]
    assert raw == [], raw


def assert_one_error_line(result: Output, *expected: str) -> str:
    code, out, err = result
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and err.endswith("\n") and err.startswith("resubmit: error: "), err
    assert "Traceback" not in err
    assert_terminal_safe(err)
    for text in expected:
        assert text in err, err
    return err


def verdict_lines(out: str, count: int) -> list[list[str]]:
    """Exactly ``count`` verdict lines of three tab-separated columns, then the summary."""
    assert_terminal_safe(out)
    lines = out.splitlines()
    assert len(lines) == count + 1 and out.count("\n") == count + 1, lines
    json.loads(lines[-1])
    columns = [line.split("\t") for line in lines[:-1]]
    assert all(len(c) == 3 for c in columns), columns
    return columns


# -- 1. terminal-safe output ------------------------------------------------------------

HOSTILE_IDS = {
    "o-\x1b[31mred\x1b[0m\x1b]0;title\x07": "o-\\x1b[31mred\\x1b[0m\\x1b]0;title\\x07",
    "o-x\no-forged\tduplicate\tforged": "o-x\\no-forged\\tduplicate\\tforged",
    "o-\x7f\x9b2J\x85": "o-\\x7f\\x9b2J\\x85",
    "o-\u2028\u2029\u202eevil\u2066\u200f": "o-\\u2028\\u2029\\u202eevil\\u2066\\u200f",
    "o-\udcff-lone": "o-\\udcff-lone",
    "o-back\\x1b": "o-back\\\\x1b",  # a literal backslash never prints like an escape
}


def test_ids_with_control_characters_print_escaped_one_line_each(app: str) -> None:
    done = item()
    process(done)
    code, out, err = run("--ids", done["id"], *HOSTILE_IDS)
    assert (code, err) == (0, "")
    columns = verdict_lines(out, 1 + len(HOSTILE_IDS))
    assert [c[0] for c in columns] == [done["id"], *HOSTILE_IDS.values()]
    assert [c[1] for c in columns] == ["completed"] + ["new"] * len(HOSTILE_IDS)
    assert json.loads(out.splitlines()[-1]) == {"completed": 1, "new": len(HOSTILE_IDS)}


def test_bodies_with_control_characters_print_escaped_one_line_each(app: str, tmp_path: Path) -> None:
    forged = item("o-y\n" + "o-z\tduplicate\tcompleted with this payload")
    escape = item("o-\x1b[2J\x1b[H\u202e")
    bodies = [json.dumps(forged).encode(), json.dumps(escape).encode(),
              b"\x1b[2J\x1b]0;pwned\x07\x9b\x7f not json", b'{"id": "\\u0000\\u001b\\u2028"}']  # fmt: skip
    code, out, err = run("--bodies", bodies_file(tmp_path, *bodies), "--message-id-field", "id")
    assert (code, err) == (0, "")
    columns = verdict_lines(out, len(bodies))
    assert [c[1] for c in columns] == ["new", "new", "invalid", "invalid"]
    assert columns[0][0] == "o-y\\no-z\\tduplicate\\tcompleted with this payload"
    assert columns[1][0] == "o-\\x1b[2J\\x1b[H\\u202e"
    assert columns[2][0].startswith("\\x1b[2J\\x1b]0;pwned\\x07")
    assert "schema_violation" in columns[3][2]
    assert json.loads(out.splitlines()[-1]) == {"new": 2, "invalid": 2}


# -- 5. bodies that are not UTF-8 or hold lone surrogates --------------------------------


def lenient_json(body: bytes) -> Any:
    try:
        return json.loads(body.decode("utf-8"))
    except ValueError as exc:
        raise InvalidMessage("invalid_json", str(exc)) from exc


@pytest.mark.parametrize("parser", ["strict", "lenient"])
def test_bodies_that_are_not_utf8_or_hold_lone_surrogates_are_invalid_and_the_run_goes_on(
    app: str, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parser: str
) -> None:
    """``lenient``: a parser that lets a lone surrogate through in a member name, so that
    the fingerprint (RFC 8785 orders names as UTF-16) is the first to trip on it."""
    if parser == "lenient":
        for module in (consumer_module, resubmit):
            monkeypatch.setattr(module, "parse_json", lenient_json)
    done = item()
    process(done)
    member = json.dumps({**item(), "\ud800": 1}).encode()  # a lone surrogate in a member name
    value = json.dumps(item("o-\udc80")).encode()  # ... in the key itself
    bodies = [b"\xff\xfe\x80 latin-1 \xe9", member, value, b'{"id": "\xed\xa0\x80"}', json.dumps(done).encode()]
    argv = ("--bodies", bodies_file(tmp_path, *bodies), "--message-id-field", "id")
    code, out, err = run_here(capsys, *argv) if parser == "lenient" else run(*argv)
    assert (code, err) == (0, "")
    columns = verdict_lines(out, len(bodies))
    assert [c[1] for c in columns] == ["invalid", "invalid", "invalid", "invalid", "duplicate"]
    assert [c[2].split("(")[1].split(":")[0] for c in columns[:4]] == [
        "invalid_json", "not_i_json", "not_i_json", "invalid_json"]  # fmt: skip


# -- 2. read-only: never creates a table -------------------------------------------------


@pytest.mark.parametrize("source", ["ids", "bodies"])
def test_a_missing_table_is_one_error_line_and_no_table_is_created(
    azurite: Azurite, tmp_path: Path, source: str
) -> None:
    typo = "t" + uuid.uuid4().hex[:16]
    argv = ["--ids", "o-1"] if source == "ids" else ["--bodies", bodies_file(tmp_path, b"not json")]
    before = tables(azurite)
    with fresh_app(azurite), app_settings(DEDUP_TABLE=typo):
        result = run(*argv)
    assert_one_error_line(result, f"table '{typo}' does not exist")
    assert tables(azurite) == before


def test_reading_an_existing_store_creates_no_table(azurite: Azurite, app: str) -> None:
    done = item()
    process(done)
    before = tables(azurite)
    code, out, err = run("--ids", done["id"])
    assert (code, err) == (0, "")
    assert [c[1] for c in verdict_lines(out, 1)] == ["completed"]
    typo = "t" + uuid.uuid4().hex[:16]
    with app_settings(DEDUP_DEADLETTER_TABLE=typo):  # a mistyped table of the two: refused, never created
        assert_one_error_line(run("--ids", done["id"]), f"table '{typo}' does not exist")
    assert tables(azurite) == before and app in before


# -- 3. settings, file, store: one line, exit 2 ------------------------------------------


def test_a_missing_setting_is_one_error_line(app: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEDUP_STORAGE_CONNECTION")
    monkeypatch.delenv("DEDUP_STORAGE_ENDPOINT", raising=False)
    reset()
    assert_one_error_line(run("--ids", "o-1"), "DEDUP_STORAGE_CONNECTION")


def test_a_bad_setting_is_one_escaped_error_line(app: str) -> None:
    with app_settings(DEDUP_LEASE="PT1M\n\x1b[2Jforged"):
        assert_one_error_line(run("--ids", "o-1"), "DEDUP_LEASE")


def test_a_missing_or_unreadable_bodies_file_is_one_error_line(app: str, tmp_path: Path) -> None:
    missing = tmp_path / "dead\x1b[2J\nletters.jsonl"
    err = assert_one_error_line(run("--bodies", str(missing)), "No such file or directory")
    assert "dead\\x1b[2J\\nletters.jsonl" in err
    assert_one_error_line(run("--bodies", str(tmp_path)), "Is a directory")


@pytest.mark.parametrize("fault", ["closed port", "wrong key"])
def test_an_unreachable_or_refusing_store_is_one_error_line(azurite: Azurite, app: str, fault: str) -> None:
    if fault == "closed port":
        connection = azurite.connection_string.replace(f":{azurite.port}/", f":{free_port()}/")
    else:
        connection = azurite.connection_string.replace(f"AccountKey={KEY}", "AccountKey=" + "A" * 86 + "==")
    with app_settings(DEDUP_STORAGE_CONNECTION=connection):
        assert_one_error_line(run("--ids", "o-1"), "cannot reach the store")


# -- 4. an unknown consumer --------------------------------------------------------------


def test_an_unknown_consumer_lists_the_known_ones(app: str) -> None:
    err = assert_one_error_line(run("--ids", "o-1", consumer="nosuch\x1b[2J"), "nosuch\\x1b[2J")
    known = err.split("known: ")[1].strip().split(", ")
    assert set(known) == {c.name for c in declared(APP)}  # every consumer the module declares
    assert os.environ["DEDUP_TABLE"] == app


def test_a_consumers_module_that_cannot_be_imported_is_one_line(app: str) -> None:
    result = run("--consumers", "no_such_consumers", "--ids", "o-1")
    assert_one_error_line(result, "cannot import --consumers no_such_consumers")


def test_the_tool_never_imports_the_function_app(app: str) -> None:
    """It reads the consumers' declarations, not the app: function_app would configure
    telemetry and register the functions (the library never depends on the app). The
    tool runs as ``-m`` runs it; then the process lists what it imported."""
    listing = ("import runpy, sys\ntry:\n    runpy.run_module('shared.idempotency.resubmit', run_name='__main__', "
               "alter_sys=True)\nexcept SystemExit:\n    print(*sorted(m for m in sys.modules if m.partition('.')[0] "
               "in ('consumers', 'function_app', 'tests')))")  # fmt: skip
    done = run_tool("--consumer", "items", "--consumers", APP, "--ids", "o-1", python=["-c", listing])
    *verdicts, last = done.stdout.splitlines()
    imported = set(last.split())
    assert done.returncode == 0 and verdicts[0].startswith("o-1\tnew"), done.stderr
    assert "function_app" not in imported and APP in imported


def test_a_body_an_http_route_committed_is_the_same_payload(app: str, tmp_path: Path) -> None:
    """A route's fingerprint holds its caller: the body it committed is compared with that caller,
    as the commit compared it — a duplicate, not "completed with another payload"."""
    body = item("o-http", 7.0)
    assert user_function("items_api")(http_request(body, idempotency_key="k-1", url="/api/items")).status_code == 201
    other = {**body, "amount": 8.0}
    code, out, err = run("--bodies", bodies_file(tmp_path, json.dumps(body).encode(), json.dumps(other).encode()),
                         consumer="items-api")  # fmt: skip
    assert (code, err) == (0, "")
    assert [c[1] for c in verdict_lines(out, 2)] == ["duplicate", "conflict"]
