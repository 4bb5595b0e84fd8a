"""Every reason the library gives is in docs/operations.md's list of reasons, and the list
names none it does not give: a user reading a log line or a dead-letter record finds its reason."""

from __future__ import annotations

import re
from pathlib import Path

from shared.idempotency.reasons import Reason

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def test_the_docs_list_every_reason_and_only_those() -> None:
    section = OPERATIONS.read_text().split("### Reasons", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| `(\w+)` \| ", section, re.MULTILINE)
    assert len(listed) == len(set(listed)), "a reason listed twice"
    assert set(listed) == {reason.value for reason in Reason}
