"""DEDUP_STORE chooses the app's store by name: the shipped ones, a registered one, or a
user's own ``package.module:factory``; anything else is one clear ConfigurationError."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from shared.idempotency.errors import ConfigurationError
from shared.idempotency.stores import DedupStore, MemoryStore, app_store, register_store
from shared.idempotency.testing import store_names_restored


def test_a_users_own_store_is_chosen_by_module_and_factory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_stores.py").write_text(
        "from shared.idempotency.stores import MemoryStore\n"
        "opened = []\n"
        "def memory(table, dead_letter_table, *, create):\n"
        "    opened.append((table, dead_letter_table, create))\n"
        "    return MemoryStore()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("DEDUP_STORE", "my_stores:memory")
    monkeypatch.setenv("DEDUP_TABLE", "markers")
    assert isinstance(app_store(create=False), MemoryStore)
    assert sys.modules["my_stores"].opened == [("markers", "deadletters", False)]


def test_a_registered_name_chooses_its_factory(monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[str] = []

    def factory(table: str, dead_letter_table: str, *, create: bool) -> DedupStore:
        opened.append(table)
        return MemoryStore()

    with store_names_restored():  # registered for this test only
        register_store("Memory-Test", factory)
        monkeypatch.setenv("DEDUP_STORE", "memory-test")
        assert isinstance(app_store(), MemoryStore) and opened == ["records"]


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("bogus", "use cosmos, table"),
        ("no_such_module_here:factory", "cannot load it"),
        ("shared.idempotency.stores:no_such_factory", "cannot load it"),
        ("shared.idempotency.config:DEFAULT_RETENTION", "is not callable"),
        ("module:", "use cosmos, table"),
    ],
)
def test_a_store_that_cannot_be_chosen_says_why(value: str, says: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEDUP_STORE", value)
    with pytest.raises(ConfigurationError, match=says) as caught:
        app_store()
    assert value in str(caught.value)
