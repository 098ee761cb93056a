"""Benchmark: ``listunderreplicated`` and ``report`` on a warehouse holding 30 days of audits
of a million ledgers, after ``maintain``.

The base is a warehouse that one real audit filled: ``bench/scale.py --ledgers 1000000
--repair --keep-warehouse BASE`` leaves one bookie lost, its ``audit --check lost`` run
(a million ledger rows, the fragments of the lost bookie) and the ``rereplicate`` that repaired
them. This copies that warehouse and adds the same audit, and its repair, once a day for the
``--days`` days before it: every row under a new run id, its timestamps and ``run_date`` moved
back by whole days, the repair's ``audit_run_id`` pointing to the copied audit. Then it runs
``bkaudit maintain`` (default ``--keep 30d``: nothing is old enough to delete; every table's
files are compacted) and times each command ``--repeat`` times, before and after ``maintain``,
as separate processes: wall time, CPU of the process and its peak RSS.

    .venv/bin/python bench/warehouse_history.py BASE [--days 29] [--repeat 3] [--json FILE]
        [--workdir DIR]

With ``--workdir`` the grown warehouse is kept in DIR/wh, and a later run with the same DIR
times the commands on it again without growing it (``maintain`` included: it has little left
to do the second time).

Figures go to docs/benchmarks.md with the command that produced them.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from jobs.tables import delta  # noqa: E402
from jobs.tables.runs import new_run_id  # noqa: E402
from jobs.tables.schema import (  # noqa: E402
    ACTIONS,
    AUDIT_RUNS,
    BOOKIES,
    FRAGMENTS,
    LEDGERS,
    RUN_DATE,
    run_day,
)

PER_AUDIT_RUN = (LEDGERS, BOOKIES, FRAGMENTS)
"""The audit's tables copied by ``run_id``; ``audit_runs`` is written last, as the audit does."""


def _shift_times(table: pa.Table, back: timedelta) -> pa.Table:
    """Every timestamp column of ``table`` moved ``back`` earlier."""
    for i, f in enumerate(table.schema):
        if pa.types.is_timestamp(f.type):
            col = table.column(i)
            table = table.set_column(i, f, pc.subtract(col, pa.scalar(back, pa.duration("us"))))
    return table


def _with(table: pa.Table, name: str, value: Any, type_: pa.DataType) -> pa.Table:
    """``table`` with column ``name`` set to ``value`` on every row."""
    i = table.column_names.index(name)
    return table.set_column(i, table.schema.field(i), pa.array([value] * table.num_rows, type_))


def _stamp(started: datetime, back: timedelta) -> tuple[str, date]:
    when = started - back
    return new_run_id(when), run_day(when)


def grow(wh: str, days: int) -> dict[str, int]:
    """Add ``days`` daily copies of the warehouse's latest completed lost audit (and the repair
    runs that name it) before it; returns the rows written per table."""
    runs = delta.read_arrow(wh, AUDIT_RUNS)
    done = [r for r in runs.to_pylist() if r["status"] == "COMPLETED" and r["check"] == "lost"]
    audit = max(done, key=lambda r: r["started_at"])
    aid = audit["run_id"]
    tables = {
        name: delta.read_arrow(wh, name, filters=[("run_id", "=", aid)]) for name in PER_AUDIT_RUN
    }
    tables = {n: t.drop_columns([RUN_DATE]) for n, t in tables.items()}
    own = runs.filter(pc.equal(runs.column("run_id"), aid))
    acts = delta.read_arrow(wh, ACTIONS, filters=[("audit_run_id", "=", aid)])
    acts = acts.drop_columns([RUN_DATE])
    repair_ids = sorted(set(acts.column("run_id").to_pylist()))
    repair_started = {
        rid: pc.min(acts.filter(pc.equal(acts.column("run_id"), rid)).column("started_at")).as_py()
        for rid in repair_ids
    }
    written = dict.fromkeys([*PER_AUDIT_RUN, AUDIT_RUNS, ACTIONS], 0)
    for k in range(1, days + 1):
        back = timedelta(days=k)
        new_id, day = _stamp(audit["started_at"], back)
        for name, t in tables.items():
            copy = _shift_times(_with(t, "run_id", new_id, pa.string()), back)
            written[name] += delta.append_arrow(wh, name, copy, run_date=day)
        for rid in repair_ids:
            part = acts.filter(pc.equal(acts.column("run_id"), rid))
            rep_id, rep_day = _stamp(repair_started[rid], back)
            part = _with(_with(part, "run_id", rep_id, pa.string()), "audit_run_id", new_id,
                         pa.string())  # fmt: skip
            written[ACTIONS] += delta.append_arrow(wh, ACTIONS, _shift_times(part, back),
                                                   run_date=rep_day)  # fmt: skip
        row = _shift_times(_with(own, "run_id", new_id, pa.string()), back)
        written[AUDIT_RUNS] += delta.append_arrow(wh, AUDIT_RUNS, row)
        print(f"  day -{k}: run {new_id}", file=sys.stderr, flush=True)
    return written


def timed(name: str, argv: list[str]) -> dict[str, Any]:
    """Run ``python -m jobs.cli ARGV`` once: wall time, CPU and peak RSS of the process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "jobs.cli", *argv], cwd=REPO,
                          capture_output=True, text=True)  # fmt: skip
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    if proc.returncode not in (0, 1):
        print(f"{name}: exit {proc.returncode}\n{proc.stderr[-2000:]}", file=sys.stderr)
    # ru_maxrss of children is the largest child so far: a lower bound once a bigger one ran.
    row = {"name": name, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
           "max_rss_mb_so_far": round(after.ru_maxrss / 1024, 1),
           "exit_code": proc.returncode, "last_line": last[:200]}  # fmt: skip
    print(json.dumps(row), flush=True)
    return row


def append_json(path: str | None, results: list[dict[str, Any]]) -> None:
    """Append ``results`` to ``path`` (the --json file), one JSON object per line."""
    if path:
        with open(path, "a") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")


def du_mb(path: Path) -> float:
    return round(sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20, 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("base", help="a warehouse left by bench/scale.py --keep-warehouse")
    p.add_argument("--days", type=int, default=29, help="daily copies added before the audit")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", help="append the results to this file")
    p.add_argument("--workdir", help="keep the grown warehouse here (reused when present)")
    args = p.parse_args()
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bkaudit-history-") as tmp:
        wh = Path(args.workdir or tmp) / "wh"
        if not wh.exists():
            shutil.copytree(args.base, wh)
            t0 = time.monotonic()
            written = grow(str(wh), args.days)
            print(json.dumps({"grow_s": round(time.monotonic() - t0, 1), "rows": written,
                              "warehouse_mb": du_mb(wh)}), flush=True)  # fmt: skip
        out = str(Path(tmp) / "report.html")
        commands = {
            "listunderreplicated": ["listunderreplicated", "--warehouse", str(wh)],
            "report": ["report", "--warehouse", str(wh), "--out", out],
        }
        for when in ("before maintain", "after maintain"):
            if when == "after maintain":
                results.append(timed("maintain", ["maintain", "--warehouse", str(wh)]))
                print(json.dumps({"warehouse_mb": du_mb(wh)}), flush=True)
            for name, argv in commands.items():
                for _ in range(args.repeat):
                    results.append({**timed(f"{name} ({when})", argv), "days": args.days + 1})
    append_json(args.json, results)


if __name__ == "__main__":
    main()
