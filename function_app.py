"""Azure Functions entry point (Python v2 programming model): the app registers the
Blueprint of every module in consumers/ and the store's housekeeping timers. Each function is
thin — binding → dedup module → settlement; the flow lives in shared/idempotency."""

from __future__ import annotations

import logging

import azure.functions as func

import consumers
from shared.idempotency import maintenance

# The worker logs at INFO: keep the SDKs' per-request HTTP logging out of the app's logs.
logging.getLogger("azure.core.pipeline.policies.http_logging_policy").setLevel(logging.WARNING)

# Telemetry: on Azure the worker configures OpenTelemetry with the Azure Monitor distro
# (host.json "telemetryMode", app setting PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY);
# the dedup module reports through the OpenTelemetry API (shared/idempotency/telemetry.py).

app = func.FunctionApp()
for blueprint in [*consumers.blueprints(), maintenance.bp]:
    app.register_functions(blueprint)
