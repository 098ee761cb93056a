"""Benchmark: how fast an operator gets small answers, as a new process each time.

On a sandbox of ``--ledgers`` ledgers with one bookie killed, times (wall, process start
included, median of ``--repeat`` runs):

* ``bkaudit audit --check lost`` with ``--executor local`` and with ``--executor spark``;
* ``bkaudit listunderreplicated`` (delta-rs, no JVM), and the same report read through Spark
  (a SparkSession reading the latest run's fragments, which is what the command did before
  the local executor existed).

Goals: audit ``lost`` <= 3 s and ``listunderreplicated`` <= 2 s with the local path.
``--metadata oxia`` runs the sandbox on Oxia (Pulsar's driver) and audits it through
``--metadata-uri metadata-store:oxia://...``.

    .venv/bin/python bench/small_answers.py [--ledgers 200] [--repeat 5] [--metadata oxia]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bklib.testing.sandbox import Sandbox
from bklib.testing.workload import write_ledgers

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from tests.cli_helpers import byte_compile  # noqa: E402

SPARK_LIST = """
import sys
from jobs.spark import load
from jobs.spark.session import build_spark
import pyarrow as pa
from jobs.commands.listing import format_report
from jobs.tables.schema import FRAGMENTS_TABLE_SCHEMA
spark = build_spark("bench-list", overrides={"spark.ui.showConsoleProgress": "false"})
wh = sys.argv[1]
run = load.latest_run(spark, wh)
frags = [r.asDict(recursive=True) for r in load.run_fragments(spark, wh, run["run_id"]).collect()]
print(format_report(run, pa.Table.from_pylist(frags, schema=FRAGMENTS_TABLE_SCHEMA), []))
"""


def timed(cmd: list[str], repeat: int) -> tuple[float, list[float]]:
    """Median and all wall times of ``cmd`` run ``repeat`` times (each must exit 0 or 1)."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        times.append(time.perf_counter() - t)
        if proc.returncode not in (0, 1):
            raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return statistics.median(times), times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ledgers", type=int, default=200)
    ap.add_argument("--bookies", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--metadata", choices=["zookeeper", "oxia"], default="zookeeper")
    args = ap.parse_args()
    byte_compile()  # as an installed package is
    py = sys.executable
    with (
        tempfile.TemporaryDirectory() as tmp,
        Sandbox(Path(tmp) / "sb", args.bookies, metadata=args.metadata) as sb,
    ):
        written = asyncio.run(write_ledgers(sb.zk_connect, args.ledgers, max_entries=60))
        victim = sb.bookie_ids[0]
        sb.kill_bookie(victim)
        sb.wait_unregistered(victim)
        wh = f"{tmp}/wh"
        print(
            f"{len(written)} ledgers on {args.bookies} bookies ({args.metadata}), {victim} killed"
        )
        where = ["--metadata-uri", sb.metadata_uri]
        results = {}
        for executor in ("local", "spark"):
            cmd = [py, "-m", "jobs.cli", "audit", *where, "--warehouse", wh]
            cmd += ["--check", "lost", "--executor", executor]
            results[f"audit --check lost --executor {executor}"] = timed(cmd, args.repeat)
        cmd = [py, "-m", "jobs.cli", "listunderreplicated", "--warehouse", wh]
        results["listunderreplicated (delta-rs)"] = timed(cmd, args.repeat)
        results["same report through Spark"] = timed([py, "-c", SPARK_LIST, wh], args.repeat)
        for name, (median, all_times) in results.items():
            shown = ", ".join(f"{t:.2f}" for t in all_times)
            print(f"{name:<44} median {median:6.2f}s  ({shown})")
        a = results["audit --check lost --executor spark"][0]
        b = results["audit --check lost --executor local"][0]
        c = results["same report through Spark"][0]
        d = results["listunderreplicated (delta-rs)"][0]
        print(f"audit lost: local is {a / b:.1f}x faster than spark")
        print(f"listunderreplicated: delta-rs is {c / d:.1f}x faster than Spark")


if __name__ == "__main__":
    main()
