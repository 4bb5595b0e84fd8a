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
import pytest

from tools.host import indexed


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


@pytest.mark.parametrize(
    ("name", "user_function", "bindings"), functions(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_every_binding_annotation_is_one_the_worker_accepts(
    name: str, user_function: Callable[..., Any], bindings: set[str]
) -> None:
    hints = typing.get_type_hints(user_function)  # resolves the string annotations, as the worker does
    parameters = set(inspect.signature(user_function).parameters)
    if "context" in parameters:  # the invocation's func.Context (retry count): no binding
        assert hints.pop("context") is func.Context and parameters.remove("context") is None
    assert parameters == bindings, f"{name}: parameters and bindings differ"
    for parameter in parameters:
        assert worker_accepts(hints[parameter]), f"{name}: {parameter}: {hints[parameter]!r} would fail indexing"


def test_the_check_rejects_what_the_worker_rejects() -> None:
    import azure.functions as func

    assert not worker_accepts(list[func.ServiceBusMessage])
    assert worker_accepts(typing.List[func.ServiceBusMessage])  # noqa: UP006 - the accepted spelling
    assert worker_accepts(func.ServiceBusMessage)
