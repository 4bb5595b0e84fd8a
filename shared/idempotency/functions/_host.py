"""What the Functions host is told in host.json (at the app's root, beside shared/) and an app
setting may override (``AzureFunctionsJobHost__<path>``), for the triggers whose settlement
depends on it."""

from __future__ import annotations

import functools
import json
import os
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

HOST_JSON = Path(__file__).resolve().parents[3] / "host.json"


@functools.cache
def host_setting(*path: str) -> Any:
    """host.json's value at ``path`` (``"extensions", "queues", "maxDequeueCount"``), the app
    setting ``AzureFunctionsJobHost__extensions__queues__maxDequeueCount`` over it; None when
    neither sets it."""
    override = os.environ.get("AzureFunctionsJobHost__" + "__".join(path))
    if override:
        return override
    try:
        value: Any = json.loads(HOST_JSON.read_text())
        for part in path:
            value = value[part]
    except (OSError, KeyError, TypeError, ValueError):
        return None
    return value


def timespan(value: Any) -> timedelta | None:
    """A host.json timespan (``[d.]hh:mm:ss``); None for ``-1`` (unbounded) or what is none."""
    found = re.fullmatch(r"(?:(\d+)\.)?(\d+):(\d+):(\d+)", str(value))
    if not found:
        return None
    days, hours, minutes, seconds = (int(part or 0) for part in found.groups())
    return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
