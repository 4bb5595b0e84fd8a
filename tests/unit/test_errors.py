"""One root for the module's errors, and outcomes that follow subclasses too."""

from __future__ import annotations

import inspect
from datetime import timedelta

from shared.idempotency import DedupError, Delivery, Effects, IdempotentConsumer, Outcome, errors
from shared.idempotency.config import DedupConfig
from shared.idempotency.errors import StoreUnavailable
from shared.idempotency.keys import DedupKey
from shared.idempotency.stores import Commit


def test_every_error_of_the_module_has_the_one_root() -> None:
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass) if c.__module__ == errors.__name__]
    assert len(classes) == 12 and all(issubclass(c, DedupError) for c in classes)


def test_a_subclass_of_a_transient_error_is_still_transient() -> None:
    class Throttled(StoreUnavailable):
        pass

    def handler(payload: object, context: object) -> Effects:
        raise Throttled("429 after the SDK's retries")

    consumer = IdempotentConsumer("errors", store=None, handler=handler,  # type: ignore[arg-type]
                                  config=DedupConfig(transient_wait=timedelta(0)))  # fmt: skip
    result = consumer.process(Delivery(body=b"{}", message_id="m-1"))
    assert (result.outcome, result.reason) == (Outcome.TRANSIENT, "store_unavailable")


def test_a_commit_names_its_parts() -> None:
    commit = Commit(DedupKey("s", "k"), "p", "fp", [], None, None)  # type: ignore[arg-type]
    assert (commit.partition, commit.fingerprint, commit[1]) == ("p", "fp", "p")
