"""The producer side of the example and the post-deployment smoke test. Runs from a
workstation or a pipeline (installed by requirements-dev.txt), not in the function app."""
