"""What every operator command shares (``audit``, ``replay``, ``resend``, ``resubmit``,
``dead_letters``, ``housekeeping``, each ``python -m shared.idempotency.<command>`` from the app's
root, with the app's interpreter, ``.venv/bin/python``):

- its usage names it as typed;
- the app settings it reads: the environment's, and with ``--settings local.settings.json`` that
  file's ``Values`` beneath them (the environment wins), as the Functions host reads them;
- the app's consumer on the store the settings name, opened without creating anything: its
  tables are checked first, so a mistyped table is refused, never created nor read as empty;
- what it cannot do (a setting, a module, a table, a consumer, an unreachable service) is one
  line on stderr and exit status 2, with nothing written: never a traceback.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from azure.core.exceptions import AzureError

from .errors import ConfigurationError, DedupError, StoreUnavailable

if TYPE_CHECKING:
    from .consumer import IdempotentConsumer

_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text: str) -> str:
    """``text`` safe for a terminal and a tab-separated line. Keys, bodies and reasons come
    from senders: an escape sequence could drive the terminal, a newline forge a verdict.
    What ``str.isprintable`` refuses (C0, DEL, C1, U+2028/U+2029, bidi and other format
    controls, lone surrogates) is escaped as in a Python literal, and so is the backslash,
    so that no two texts print alike."""
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(c if c.isprintable() and c != "\\" else _ESCAPES.get(c) or _escape(ord(c)) for c in text)


def _escape(code: int) -> str:
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def command(module: str, doc: str | None) -> argparse.ArgumentParser:
    """The command's parser: its usage as typed (``python -m <module>``), its description the
    docstring's first paragraph, and ``--settings``. The library's log is the command's to tell
    in one line (silenced), and a terminal that cannot show a character gets its escape."""
    logging.getLogger("idempotency").addHandler(logging.NullHandler())
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=(doc or "").split("\n\n")[0])
    parser.add_argument("--settings", type=Path, metavar="FILE",
                        help="a local.settings.json whose Values are read as app settings, beneath the "
                             "environment's (default: the environment only)")  # fmt: skip
    return parser


def consumer_options(parser: argparse.ArgumentParser) -> None:
    """``--consumer``, ``--consumers`` and ``--declared``: which of the app's consumers."""
    parser.add_argument("--consumer", required=True, help="the consumer's name (its marker scope)")
    parser.add_argument("--consumers", default="consumers", help="the module that declares the app's consumers")
    parser.add_argument("--declared", metavar="FUNCTION",
                        help="the function that declares it (@consumer), where two of the app's share its name "
                             "(an Event Grid consumer and its HTTP route)")  # fmt: skip


def read_settings(path: Path | None) -> None:
    """``path``'s ``Values`` as app settings, each unless the environment sets it already.

    :raises ConfigurationError: the file cannot be read, or holds no ``Values`` object."""
    if path is None:
        return
    try:
        values = json.loads(path.read_text()).get("Values")
    except (OSError, ValueError, AttributeError) as exc:
        raise ConfigurationError(f"--settings {path}: cannot read its Values ({exc})") from None
    if not isinstance(values, dict):
        raise ConfigurationError(f"--settings {path}: no Values object (as local.settings.json holds them)")
    for name, value in values.items():
        if not os.environ.get(str(name)):  # set and empty is unset, as the settings are read
            os.environ[str(name)] = str(value)


@contextmanager
def one_line_errors(tool: str, unreachable: str = "") -> Iterator[None]:
    """An operator's command that cannot run (a setting, an import, a table, the store or the
    broker out of reach) says why in one line on stderr and exits 2: never a traceback."""
    try:
        yield
    except (ConfigurationError, ImportError) as exc:  # our own words: one line once escaped
        print(f"{tool}: error: {printable(str(exc))}", file=sys.stderr)
        raise SystemExit(2) from None
    except StoreUnavailable as exc:
        print(f"{tool}: error: {unreachable or 'cannot reach the store: '}{printable(_first_line(exc))}",
              file=sys.stderr)  # fmt: skip
        raise SystemExit(2) from None
    except (DedupError, AzureError, OSError) as exc:
        which = "cannot reach Service Bus: " if type(exc).__module__.startswith("azure.servicebus") else unreachable
        print(f"{tool}: error: {which}{printable(_first_line(exc))}", file=sys.stderr)
        raise SystemExit(2) from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


@contextmanager
def app_consumer(args: argparse.Namespace) -> Iterator[IdempotentConsumer]:
    """The consumer ``--consumer`` names (``--consumers``, ``--declared``), built inside on the
    store the app settings name (``--settings``), opened without creating anything and its
    tables checked first: what every command runs on.

    :raises ConfigurationError: a setting, a table that does not exist, an unknown or ambiguous
        consumer (each named)."""
    from .functions._app import declared_consumer, using_store
    from .stores import app_store

    read_settings(args.settings)
    store = app_store(create=False)
    store.check_tables()
    with using_store(store):
        try:
            found = declared_consumer(args.consumer, args.consumers, args.declared)
        except ImportError as exc:
            raise ConfigurationError(f"cannot import --consumers {args.consumers}: {exc}") from None
        yield found
