"""An app's consumers package as operators' tools meet it: this ``__init__`` imports none
of its modules (``consumers.py`` declares them), so a tool given
``--consumers tests.integration.resubmit_app`` must import the package's modules itself.
Its handlers refuse a message each way processing can (tests/integration/test_resubmit_dry_run.py)."""
