"""The app's declared consumers, for operators' tools and tests (the app itself needs only
``@consumer`` and ``shared_store`` from the Functions face).

- ``declared`` lists every declared consumer, built (with a package: after importing each of
  its modules); ``declared_consumer`` finds one by name, as operators' tools do;
- ``reset`` rebuilds them all after the settings changed; ``using_store`` and
  ``using_sender`` run every consumer on a store or an outbox sender of your choice (an
  in-memory one in unit tests).
"""

from ._app import declared, declared_consumer, reset, using_sender, using_store

__all__ = ["declared", "declared_consumer", "reset", "using_sender", "using_store"]
