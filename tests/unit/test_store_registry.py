"""DEDUP_STORE chooses the app's store by name: the shipped ones, a registered one, or a
user's own ``package.module:factory``; anything else (a class, a value, a function of
another signature, one that returns no store) is one clear ConfigurationError."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from shared.idempotency.errors import ConfigurationError
from shared.idempotency.stores import DedupStore, MemoryStore, app_store, register_store
from shared.idempotency.stores._settings import check_store_settings
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


EXPECTED = "a factory `def f(table: str, dead_letter_table: str, *, create: bool) -> DedupStore`"
WRONG_STORES = """
from shared.idempotency.stores import MemoryStore
called = []
class StoreClass(MemoryStore):
    def __init__(self, table, dead_letter_table, *, create):
        called.append("StoreClass")
        super().__init__()
NOT_CALLABLE = MemoryStore()
def keyword_tables(*, tables, create):
    called.append("keyword_tables")
def no_create(table, dead_letter_table):
    called.append("no_create")
def one_table(table, *, create):
    called.append("one_table")
def returns_a_dict(table, dead_letter_table, *, create):
    called.append("returns_a_dict")
    return {"table": table}
def returns_none(table, dead_letter_table, *, create):
    called.append("returns_none")
def accepts_more(table, dead_letter_table, *args, create, region="eu", **kwargs):
    return MemoryStore()
"""


@pytest.fixture
def wrong_stores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A module of things DEDUP_STORE may wrongly name; what was called is listed."""
    (tmp_path / "wrong_stores.py").write_text(WRONG_STORES)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "wrong_stores", raising=False)
    import wrong_stores

    called: list[str] = wrong_stores.called
    return called


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("StoreClass", "names a class"),
        ("NOT_CALLABLE", "NOT_CALLABLE is not callable"),
        ("keyword_tables", "(*, tables, create) cannot be called as f(table, dead_letter_table, create=...)"),
        ("no_create", "(table, dead_letter_table) cannot be called as"),
        ("one_table", "(table, *, create) cannot be called as"),
    ],
)
def test_what_is_not_a_factory_is_refused_before_it_is_called(
    name: str, says: str, wrong_stores: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A class (its constructor is not the factory's call), a value, or a function whose
    signature cannot take ``(table, dead_letter_table, create=...)``: one line naming the
    setting, its value and the factory expected — never a TypeError from inside the call."""
    value = f"wrong_stores:{name}"
    monkeypatch.setenv("DEDUP_STORE", value)
    for opened in (app_store, check_store_settings):  # check_store_settings: at start-up, without a request
        with pytest.raises(ConfigurationError) as caught:
            opened()
        message = str(caught.value)
        assert message.startswith(f"DEDUP_STORE='{value}'") and says in message, message
        assert message.endswith(f"it must name {EXPECTED}") and "\n" not in message
    assert wrong_stores == []  # never called


@pytest.mark.parametrize(("name", "returned"), [("returns_a_dict", "dict"), ("returns_none", "NoneType")])
def test_a_factory_that_returns_no_store_is_refused(
    name: str, returned: str, wrong_stores: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    value = f"wrong_stores:{name}"
    monkeypatch.setenv("DEDUP_STORE", value)
    check_store_settings()  # its signature fits: only the call tells
    with pytest.raises(ConfigurationError) as caught:
        app_store()
    assert str(caught.value) == (f"DEDUP_STORE='{value}': its factory returned a {returned}, not a DedupStore; "
                                 f"it must name {EXPECTED}")  # fmt: skip
    assert wrong_stores == [name]


def test_a_registered_factory_that_returns_no_store_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def factory(table: str, dead_letter_table: str, *, create: bool) -> DedupStore:
        return "not a store"  # type: ignore[return-value]

    with store_names_restored():
        register_store("not-a-store", factory)
        monkeypatch.setenv("DEDUP_STORE", "not-a-store")
        with pytest.raises(ConfigurationError, match="DEDUP_STORE='not-a-store': its factory returned a str"):
            app_store()


def test_a_factory_with_more_parameters_than_needed_is_called(
    wrong_stores: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEDUP_STORE", "wrong_stores:accepts_more")
    check_store_settings()
    assert isinstance(app_store(), MemoryStore)


def test_a_name_that_cannot_be_loaded_says_what_it_must_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEDUP_STORE", "no_such_module_here:factory")
    with pytest.raises(ConfigurationError) as caught:
        app_store()
    assert str(caught.value).endswith(f"; it must name {EXPECTED}")
