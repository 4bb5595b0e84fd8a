"""The app's declared consumers, for operators' tools (``python -m shared.idempotency.replay``,
``resubmit``): ``declared`` lists every declared consumer, built (with a package: after
importing each of its modules); ``declared_consumer`` finds one by name. Tests rebuild them, or
run them on a store of their own, with ``testing.reset``, ``using_store`` and ``using_sender``.
"""

from ._app import declared, declared_consumer

__all__ = ["declared", "declared_consumer"]
