"""`make chaos` ends with a verdict, never a bare traceback: a section that cannot finish says
which and why in one line, the next sections still run, and the run exits non-zero."""

from __future__ import annotations

import pytest

from lab.chaos import finished
from shared.idempotency.errors import StoreUnavailable


def test_a_section_that_cannot_finish_is_one_line_of_the_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    def down() -> bool:
        raise StoreUnavailable("HTTPConnection(host='127.0.0.1', port=1): [Errno 111] Connection refused\nmore")

    assert finished("outbox", down) is False
    assert finished("sessions", lambda: True) is True
    assert capsys.readouterr().out.strip() == (
        "FAILED: outbox could not finish: StoreUnavailable: HTTPConnection(host='127.0.0.1', port=1): "
        "[Errno 111] Connection refused"
    )
