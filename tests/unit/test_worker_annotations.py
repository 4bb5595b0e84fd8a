"""The Python worker indexes all functions or none: one annotation it cannot read means no
function loads on Azure. This check runs without the worker (the runtime suite in
tests/runtime proves the same through it): every binding parameter must be annotated with a
class or a ``typing`` generic. On Python 3.11 the worker rejects builtin generics such as
``list[func.ServiceBusMessage]`` ("invalid non-type annotation")."""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from typing import Any

import azure.functions as func

from lab.host import indexed


def worker_accepts(annotation: object) -> bool:
    if isinstance(annotation, types.GenericAlias):  # list[X], dict[K, V]: rejected on 3.11
        return False
    return isinstance(annotation, type) or typing.get_origin(annotation) is not None


def functions() -> list[tuple[str, Callable[..., Any], set[str]]]:
    found = []
    for fn in indexed():
        names = {binding.name for binding in fn.get_bindings() if binding.name != "$return"}
        found.append((fn.get_function_name(), fn.get_user_function(), names))
    return found


def problems(name: str, user_function: Callable[..., Any], bindings: set[str]) -> list[str]:
    """Why the worker would refuse to index this function (nothing: it indexes)."""
    hints = typing.get_type_hints(user_function)  # resolves the string annotations, as the worker does
    parameters = set(inspect.signature(user_function).parameters)
    if "context" in parameters:  # the invocation's func.Context (retry count): no binding
        if hints.pop("context", None) is not func.Context:
            return [f"{name}: context is not annotated func.Context"]
        parameters.remove("context")
    if parameters != bindings:
        return [f"{name}: parameters {sorted(parameters)} and bindings {sorted(bindings)} differ"]
    return [f"{name}: {p}: {hints.get(p)!r} would fail indexing" for p in sorted(parameters)
            if not worker_accepts(hints.get(p))]  # fmt: skip


def test_every_binding_annotation_is_one_the_worker_accepts() -> None:
    """Every function the app indexes, whichever its consumers/ holds (one test, not one per
    function: the library's tests are the same in every app)."""
    found = functions()
    assert found, "the app indexes no function"
    assert [problem for function in found for problem in problems(*function)] == []


def test_the_check_finds_what_would_fail_indexing() -> None:
    def listed(msg: list[func.ServiceBusMessage]) -> None: ...

    def untyped(msg, context: func.Context) -> None: ...  # type: ignore[no-untyped-def]

    def unbound(msg: func.ServiceBusMessage, other: str) -> None: ...

    [listed_problem] = problems("a", listed, {"msg"})
    assert listed_problem.startswith("a: msg: list[") and listed_problem.endswith("would fail indexing")
    assert problems("b", untyped, {"msg"}) == ["b: msg: None would fail indexing"]
    assert problems("c", unbound, {"msg"}) == ["c: parameters ['msg', 'other'] and bindings ['msg'] differ"]


def test_the_check_rejects_what_the_worker_rejects() -> None:
    import azure.functions as func

    assert not worker_accepts(list[func.ServiceBusMessage])
    assert worker_accepts(typing.List[func.ServiceBusMessage])  # noqa: UP006 - the accepted spelling
    assert worker_accepts(func.ServiceBusMessage)
