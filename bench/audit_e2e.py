"""Benchmark: end-to-end audit of a sandbox cluster (ZooKeeper + Python bookies + Spark).

Writes N ledgers through the bklib writer, kills one bookie, then times
``bkaudit audit --check lost`` (metadata only) and ``--check replicas`` (every bookie's entry
list for every ledger) on local[2].

    .venv/bin/python bench/audit_e2e.py [--ledgers 10000] [--bookies 4] [--max-entries 20]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from bklib.testing.sandbox import Sandbox
from bklib.testing.workload import write_ledgers
from jobs.commands.audit import add_audit_arguments, run_audit
from jobs.spark.session import build_spark


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ledgers", type=int, default=10_000)
    ap.add_argument("--bookies", type=int, default=4)
    ap.add_argument("--max-entries", type=int, default=20)
    args = ap.parse_args()
    shapes = ((3, 2, 2), (3, 3, 2), (2, 2, 2))
    with tempfile.TemporaryDirectory() as tmp, Sandbox(Path(tmp), args.bookies) as sb:
        t = time.perf_counter()
        written = asyncio.run(
            write_ledgers(
                sb.zk_connect,
                args.ledgers,
                max_entries=args.max_entries,
                payload_size=256,
                concurrency=64,
                shapes=shapes,
            )
        )
        write_s = time.perf_counter() - t
        entries = sum(w.entries for w in written)
        print(f"wrote {len(written)} ledgers / {entries} entries in {write_s:.1f}s")
        sb.kill_bookie(sb.bookie_ids[0])
        sb.wait_unregistered(sb.bookie_ids[0])
        spark = build_spark("bkaudit-bench", master="local[2]")
        try:
            for check in ("lost", "replicas", "lost"):
                ns = add_audit_arguments(argparse.ArgumentParser()).parse_args(
                    ["--zk", sb.zk_connect, "--warehouse", f"{tmp}/wh", "--check", check]
                )
                t = time.perf_counter()
                assert run_audit(ns, spark) == 0
                s = time.perf_counter() - t
                rate = len(written) / s
                print(f"audit --check {check}: {len(written)} ledgers in {s:.1f}s ({rate:,.0f}/s)")
        finally:
            spark.stop()


if __name__ == "__main__":
    main()
