"""The hour an expiry note is filed under (stores/_expiry.py): the UTC hour its marker
expires, whatever the time zone of the time it is given."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from hypothesis import given
from hypothesis import strategies as st

from shared.idempotency.testing import expiry_hour

ZONES = st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-8)),
                         timezone(timedelta(hours=14))])  # fmt: skip


@given(st.datetimes(min_value=datetime(1900, 1, 2), max_value=datetime(9999, 12, 30), timezones=ZONES))
def test_a_note_is_filed_under_the_utc_hour_its_marker_expires(moment: datetime) -> None:
    assert expiry_hour(moment) == f"{moment.astimezone(UTC):%Y%m%d%H}"


def test_the_last_microsecond_of_an_hour_stays_in_it() -> None:
    for year in (1969, 2026, 9000):
        assert expiry_hour(datetime(year, 6, 1, 3, 59, 59, 999_999, tzinfo=UTC)) == f"{year}060103"
        assert expiry_hour(datetime(year, 6, 1, 4, tzinfo=UTC)) == f"{year}060104"
