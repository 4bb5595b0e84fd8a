"""The producer side of the example and the post-deployment smoke test. Runs from a
workstation or a pipeline (installed by tests/requirements.txt), not in the function app."""
