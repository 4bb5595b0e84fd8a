"""Azure Functions entry point (Python v2 programming model): the app registers the
Blueprint of every module in consumers/ and the store's housekeeping timers. Each function is
thin — binding → dedup module → settlement; the flow lives in shared/idempotency."""

from __future__ import annotations

import logging
import os

import azure.functions as func

import consumers
from shared.idempotency import maintenance

# The worker logs at INFO: keep the SDKs' per-request HTTP logging out of the app's logs.
logging.getLogger("azure.core.pipeline.policies.http_logging_policy").setLevel(logging.WARNING)

if os.environ.get("APPLICATIONINSIGHTS_CONNECTION_STRING"):  # on Azure: metrics, traces and logs to App Insights
    from azure.identity import DefaultAzureCredential
    from azure.monitor.opentelemetry import configure_azure_monitor

    configure_azure_monitor(credential=DefaultAzureCredential())  # Entra ID ingestion: local auth is off

app = func.FunctionApp()
for blueprint in [*consumers.blueprints(), maintenance.bp]:
    app.register_functions(blueprint)
