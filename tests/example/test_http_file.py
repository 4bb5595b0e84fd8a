"""docs/requests.http, the requests a developer sends to `func start`, sent to the app in order: each
answers the status its title announces, so the file never drifts from the routes."""

from __future__ import annotations

import re
from pathlib import Path

import azure.functions as func

from shared.idempotency.testing.azurite import Azurite
from tests.functions import fresh_app, user_function

HTTP_FILE = Path(__file__).resolve().parents[2] / "docs/requests.http"
ROUTES = {"/api/orders": "orders_api", "/api/events": "events_api"}


def requests() -> list[tuple[str, func.HttpRequest]]:
    """(title, request) per `###` section, variables substituted."""
    text = HTTP_FILE.read_text()
    variables = dict(re.findall(r"^@(\w+) = (.*)$", text, re.MULTILINE))
    found = []
    for section in text.split("\n### ")[1:]:
        for name, value in variables.items():
            section = section.replace("{{" + name + "}}", value)
        head, _, body = section.partition("\n\n")
        title, request_line, *header_lines = head.splitlines()
        method, url = request_line.split()
        headers = dict(line.split(": ", 1) for line in header_lines)
        path = "/" + url.split("/", 3)[3]
        found.append((title, func.HttpRequest(method, path, headers=headers, body=body.strip().encode())))
    return found


def test_every_request_in_test_http_gets_the_status_its_title_says(azurite: Azurite) -> None:
    sent = requests()
    assert [request.method for _, request in sent] == ["POST", "POST", "POST", "POST", "OPTIONS"]
    with fresh_app(azurite):
        for title, request in sent:
            response: func.HttpResponse = user_function(ROUTES[request.url])(request)
            expected = int(re.search(r"\b([1-5]\d\d)\b", title).group(1))  # type: ignore[union-attr]
            assert response.status_code == expected, f"{title}: {response.status_code} {response.get_body()!r}"
            assert ("replayed" in title) == ("Idempotent-Replayed" in response.headers), title
