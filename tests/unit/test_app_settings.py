"""Bad settings fail the app's start with every problem named, not each message later."""

from __future__ import annotations

import pytest

from shared.idempotency.errors import ConfigurationError
from shared.idempotency.functions import check_app_settings

GOOD = {"DEDUP_STORAGE_CONNECTION": "UseDevelopmentStorage=true"}


def test_the_documented_local_settings_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in GOOD.items():
        monkeypatch.setenv(name, value)
    check_app_settings()


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"DEDUP_STORE": "bogus"}, ["DEDUP_STORE='bogus'"]),
        ({"DEDUP_RETENTION": "30 days"}, ["DEDUP_RETENTION='30 days'"]),
        ({"DEDUP_STORAGE_CONNECTION": ""}, ["DEDUP_STORAGE_CONNECTION"]),
        ({"DEDUP_STORE": "cosmos"}, ["COSMOS_ENDPOINT"]),
        ({"DEDUP_SENDER": "file"}, ["DEDUP_SENDER_FILE"]),
        ({"DEDUP_AUDIT": "orders"}, ["DEDUP_AUDIT: 'orders'"]),
        (
            {"DEDUP_RETENTION": "30 days", "DEDUP_LEASE": "soon", "DEDUP_SENDER": "x:y"},
            ["DEDUP_RETENTION", "DEDUP_LEASE", "DEDUP_SENDER"],
        ),
    ],
)
def test_every_bad_setting_is_named_in_one_error(
    settings: dict[str, str], named: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("DEDUP_STORE", "DEDUP_RETENTION", "DEDUP_LEASE", "DEDUP_SENDER", "COSMOS_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {**GOOD, **settings}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError) as caught:
        check_app_settings()
    message = str(caught.value)
    assert message.startswith("the app settings are not usable") and all(n in message for n in named), message
