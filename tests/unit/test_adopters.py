"""lab/adopters.py's own parts (the paths themselves run in `make test-adopters`): a
walkthrough's blocks applied once and found applied after, an app's own file or lines where a
block writes or changes them said so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab import adopters

README = """# App

## Start your own app

```python consumers/new.py
X = 1
```

```diff settings.json
-  "A": 1,
+  "A": 1,
+  "B": 2,
```

## Next
"""


def test_a_walkthrough_is_applied_once_and_found_applied_after(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text(README)
    (tmp_path / "consumers").mkdir()
    (tmp_path / "settings.json").write_text('{\n  "A": 1,\n  "C": 3\n}\n')
    blocks = adopters.walkthrough(tmp_path / "README.md", "## Start your own app")
    assert [(language, path) for language, path, _ in blocks] == [("python", "consumers/new.py"),
                                                                  ("diff", "settings.json")]  # fmt: skip
    assert [adopters.apply(tmp_path, *block) for block in blocks] == [True, True]
    assert json.loads((tmp_path / "settings.json").read_text()) == {"A": 1, "B": 2, "C": 3}
    assert [adopters.apply(tmp_path, *block) for block in blocks] == [False, False]  # there already


def test_an_apps_own_file_where_a_block_writes_one_is_not_applicable(tmp_path: Path) -> None:
    (tmp_path / "consumers").mkdir()
    (tmp_path / "consumers" / "new.py").write_text("X = 2  # the app's own\n")
    with pytest.raises(adopters.NotApplicable, match=r"consumers/new\.py is this app.s own"):
        adopters.apply(tmp_path, "python", "consumers/new.py", "X = 1\n")
    (tmp_path / "settings.json").write_text('{"A": 9}\n')
    with pytest.raises(adopters.NotApplicable, match="does not apply to this app's"):
        adopters.apply(tmp_path, "diff", "settings.json", '-  "A": 1,\n+  "A": 1,\n+  "B": 2,\n')


def test_a_name_added_to_an_apps_list_is_appended_to_whatever_it_holds(tmp_path: Path) -> None:
    bicep = tmp_path / "main.bicep"
    bicep.write_text("var appQueues = ['payouts']\nvar appStorageQueues = []\n")
    diff = "-var appQueues = []\n+var appQueues = ['invoices']\n"
    assert adopters.apply(tmp_path, "diff", "main.bicep", diff) is True
    assert bicep.read_text() == "var appQueues = ['payouts', 'invoices']\nvar appStorageQueues = []\n"
    assert adopters.apply(tmp_path, "diff", "main.bicep", diff) is False  # there already


def test_a_walkthrough_meeting_an_apps_own_consumer_of_its_name_takes_the_next_free_one(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text(
        "## Add it\n\n```python consumers/refunds.py\nNAME = 'refunds'  # REFUNDS_QUEUE, record_refund\n```\n\n"
        "```diff infra/main.bicep\n-var appQueues = []\n+var appQueues = ['refunds']\n```\n"
    )
    (tmp_path / "consumers").mkdir()
    (tmp_path / "infra").mkdir()
    (tmp_path / "infra" / "main.bicep").write_text("var appQueues = ['refunds2']\n")  # the app's own, too
    (tmp_path / "consumers" / "refunds.py").write_text("X = 1  # the app's own\n")
    blocks = adopters.walkthrough_for(tmp_path, "docs/page.md", "## Add it")
    assert blocks[0][1:] == ("consumers/refunds3.py", "NAME = 'refunds3'  # REFUNDS3_QUEUE, record_refund\n")
    assert [adopters.apply(tmp_path, *block) for block in blocks] == [True, True]
    assert (tmp_path / "infra" / "main.bicep").read_text() == "var appQueues = ['refunds2', 'refunds3']\n"
    assert (tmp_path / "consumers" / "refunds.py").read_text() == "X = 1  # the app's own\n"
    assert adopters.walkthrough_for(tmp_path, "docs/page.md", "## Add it") == blocks  # found followed after
