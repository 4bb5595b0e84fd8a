"""``shared.idempotency`` is the library (what `pip install .` installs); ``shared.orders`` and
``shared.ledger`` are the example app's domain."""
