"""Draw the layout of the dashboard (infra/modules/workbook.json) as docs/workbook.png: its
title and one panel per chart, with the chart's kind and what it shows.

    python -m lab.workbook_picture
"""

from __future__ import annotations

import argparse
import json
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import FancyBboxPatch

from lab.infra_checks import INFRA, ROOT

OUT = ROOT / "docs" / "workbook.png"


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    items = json.loads((INFRA / "modules" / "workbook.json").read_text())["items"]
    charts = [item["content"] for item in items if item["type"] == 3]
    title = next(item["content"]["json"] for item in items if item["type"] == 1).splitlines()
    figure, axes = plt.subplots(figsize=(10, 2 + 2.2 * len(charts)))
    axes.set_xlim(0, 10)
    axes.set_ylim(0, 2 + 2.2 * len(charts))
    axes.axis("off")
    top = 1.2 + 2.2 * len(charts)
    axes.text(0.2, top + 0.4, title[0].lstrip("# "), fontsize=16, weight="bold")
    axes.text(0.2, top, textwrap.fill(title[1], 110), fontsize=8, va="top")
    for row, chart in enumerate(charts):
        y = top - 0.6 - 2.2 * (row + 1)
        axes.add_patch(FancyBboxPatch((0.2, y), 9.6, 1.9, boxstyle="round,pad=0.02", fc="#eef3fb", ec="#4a6fa5"))
        axes.text(0.4, y + 1.6, f"{chart['title']}  —  {chart['visualization']}", fontsize=11, weight="bold", va="top")
        axes.text(0.4, y + 1.15, textwrap.fill(chart["query"], 125), fontsize=6.5, family="monospace", va="top")
    figure.savefig(OUT, dpi=110, bbox_inches="tight")
    print(OUT)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
