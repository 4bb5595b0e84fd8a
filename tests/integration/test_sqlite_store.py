"""The store author's face is enough: a store on sqlite3 (tests/integration/sqlite_store.py),
written from docs/stores.md with public names only, passes the same contract suite as the
shipped stores."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.idempotency.stores import DedupStore
from shared.idempotency.testing import StoreContract
from tests.integration.sqlite_store import SqliteStore

SOURCE = Path(__file__).with_name("sqlite_store.py")


class TestSqliteStore(StoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[DedupStore]:
        store = SqliteStore(tmp_path / "store.db")
        yield store
        store.close()

    def unreachable_store(self) -> DedupStore:
        return SqliteStore("/nonexistent/directory/store.db")  # sqlite3 cannot open it


def imported_names(source: str) -> list[str]:
    """Every module the source imports and every name it imports from one, dotted parts apart."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [part for alias in node.names for part in alias.name.split(".")]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative import"
            found += (node.module or "").split(".") + [alias.name for alias in node.names]
    return found


def test_the_sqlite_store_imports_only_public_names() -> None:
    names = imported_names(SOURCE.read_text())
    assert "shared" in names and "stores" in names  # the check reads its imports
    assert [name for name in names if name.startswith("_")] == []


def test_the_check_sees_a_private_import() -> None:
    assert "_codec" in imported_names("from shared.idempotency.stores._codec import kept")
    assert "_base" in imported_names("import shared.idempotency.stores._base")
    assert "_x" in imported_names("from shared.idempotency.stores import _x")
