"""The docs' walkthroughs (lab.adopters.WALKTHROUGHS) apply, block by block and under their own
names, to the template's files as they are here (or are found applied already). The library's
walkthrough test follows them under another name in an app with consumers of those names; this
one keeps the docs from drifting away from the template they are written against, and goes
with the example. A file a walkthrough writes whole (its consumer, its test) is the app's own
where the app has one of that name: it is written afresh here, never compared with the app's."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lab import adopters

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("page", "title"), adopters.WALKTHROUGHS, ids=[t[3:] for _, t in adopters.WALKTHROUGHS])
def test_every_block_applies_to_the_template_as_it_is(tmp_path: Path, page: str, title: str) -> None:
    blocks = adopters.walkthrough(ROOT / page, title)
    assert blocks, f"{page}: {title} has no block naming a file"
    for language, path, _ in blocks:  # the files the blocks change, as they are here
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        if language != "python" and (ROOT / path).is_file() and not (tmp_path / path).exists():
            shutil.copy(ROOT / path, tmp_path / path)
    applied = []
    for block in blocks:
        try:
            adopters.apply(tmp_path, *block)
        except adopters.NotApplicable:
            if block[0] != "json":  # a diff that no longer applies: the docs drifted from the template
                raise
            continue  # the app has its own queue of that name: the block is the app's, not checked here
        applied.append(block)
    for block in applied:
        assert adopters.apply(tmp_path, *block) is False  # and each is then found applied
