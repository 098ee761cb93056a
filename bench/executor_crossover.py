"""The executors' crossover: which of ``local`` and ``spark`` finished each command first, at
each size, from the JSON lines ``bench/scale.py --json FILE`` appends.

Prints a markdown table (command, ledgers, local, Spark, the faster, the ratio) and writes the
chart docs/executors.md shows, in the HTML report's style (``jobs/reports/charts.py``):

    .venv/bin/python bench/executor_crossover.py RESULTS.jsonl [...] \
        --svg docs/img/executor-crossover.svg

Rows are keyed by the measured command's name (``audit lost local``, ``rereplicate spark``
...); when a size was measured more than once, the last line wins.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from jobs.reports.charts import svg_hbar_chart  # noqa: E402

EXECUTORS = ("local", "spark")
COLORS = {"local": "#2563eb", "spark": "#f59e0b"}


def command_of(name: str) -> tuple[str, str] | None:
    """``("audit lost", "local")`` from ``"audit lost local"``; None for other rows."""
    head, _, executor = name.rpartition(" ")
    return (head, executor) if executor in EXECUTORS and head else None


def load(paths: list[str]) -> dict[tuple[str, int], dict[str, float]]:
    """``{(command, ledgers): {executor: wall seconds}}``."""
    out: dict[tuple[str, int], dict[str, float]] = {}
    for path in paths:
        for line in Path(path).read_text().splitlines():
            row = json.loads(line)
            key = command_of(row["name"])
            if key is None or row.get("exit_code") != 0:
                continue
            out.setdefault((key[0], int(row["ledgers"])), {})[key[1]] = float(row["wall_s"])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="+", help="JSON lines from bench/scale.py --json")
    p.add_argument("--svg", help="write the chart here")
    args = p.parse_args()
    table = load(args.results)
    print("| command | ledgers | local | Spark `local[2]` | faster | ratio |")
    print("|---|---|---|---|---|---|")
    rows: list[tuple[str, dict[str, float]]] = []
    for (command, ledgers), walls in sorted(table.items()):
        local, spark = walls.get("local"), walls.get("spark")
        if local is not None and spark is not None:
            faster = "local" if local <= spark else "Spark"
            ratio = f"{max(local, spark) / min(local, spark):.1f} times"
        else:
            faster, ratio = "", ""
        cells = [f"{w:.1f} s" if w is not None else "" for w in (local, spark)]
        print(f"| {command} | {ledgers:,} | {cells[0]} | {cells[1]} | {faster} | {ratio} |")
        for ex in EXECUTORS:
            if ex in walls:
                rows.append((f"{command} · {ledgers:,} · {ex}", {ex: round(walls[ex], 1)}))
    if args.svg:
        svg = svg_hbar_chart("executor-crossover", rows, EXECUTORS, COLORS, unit="s")
        style = "<style>text{font:11px sans-serif;fill:#374151}</style>"
        xmlns = 'role="img" xmlns="http://www.w3.org/2000/svg">'
        svg = svg.replace('role="img">', xmlns + style, 1)
        Path(args.svg).parent.mkdir(parents=True, exist_ok=True)
        Path(args.svg).write_text(svg + "\n")


if __name__ == "__main__":
    main()
