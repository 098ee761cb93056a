"""Benchmark: repairing after a lost bookie, on a sandbox (ZooKeeper + Python bookies + Spark).

Two scenarios, each in one run:

* ``bulk``: 4 bookies holding >= 1 GiB of entries (E=3, WQ=2, AQ=2, 64 KiB entries); one is
  stopped; ``audit --check lost`` then ``rereplicate`` copy its replicas. Reports MB/s and
  entries/s of the copy and, measured in the same run, the raw ingest rate of one bookie
  (pipelined adds of the same entry size), with the ratio.
* ``fleet``: 10,000 ledgers / ~1 GiB over 5 bookies (Pulsar-like shapes, 10% left open by
  dead writers); one bookie stopped; reports the time to full replication: audit + repair
  until a ``replicas`` re-audit is clean.

    .venv/bin/python bench/rereplicate_throughput.py bulk [--gib 1.0] [--executor auto]
    .venv/bin/python bench/rereplicate_throughput.py fleet [--ledgers 10000] [--gib 1.0]
        [--executor auto]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import io
import tempfile
import time
from pathlib import Path

from bklib.client.pool import SyncBookieClient
from bklib.digest import digest_manager, master_key
from bklib.meta.model import DigestType
from bklib.testing.sandbox import Sandbox
from bklib.testing.workload import write_ledgers
from jobs.commands.audit import add_audit_arguments, run_audit
from jobs.commands.repair import add_repair_arguments, run_rereplicate
from jobs.spark import load
from jobs.spark.session import build_spark


def _audit(spark, executor: str, zk: str, warehouse: str, check: str) -> tuple[float, dict]:  # type: ignore[no-untyped-def]
    """One audit with ``--executor executor`` (the session is handed over only for spark)."""
    ns = add_audit_arguments(argparse.ArgumentParser()).parse_args(
        ["--zk", zk, "--warehouse", warehouse, "--check", check, "--executor", executor]
    )
    t = time.perf_counter()
    assert run_audit(ns, spark if executor == "spark" else None) == 0
    run = load.latest_run(spark, warehouse)
    assert run is not None
    return time.perf_counter() - t, run["counts"]


def _repair(spark, executor: str, zk: str, warehouse: str) -> tuple[float, int, str]:  # type: ignore[no-untyped-def]
    ns = add_repair_arguments(argparse.ArgumentParser()).parse_args(
        ["--zk", zk, "--warehouse", warehouse, "--grace-period", "0s", "--rate", "0",
         "--executor", executor]
    )  # fmt: skip
    out = io.StringIO()
    t = time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = run_rereplicate(ns, spark if executor == "spark" else None)
    return time.perf_counter() - t, code, out.getvalue()


def _copied(spark, warehouse: str) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    if not load.table_exists(spark, warehouse, load.ACTIONS):
        return 0, 0
    df = load.read_table(spark, warehouse, load.ACTIONS).where(
        "action = 'COPY' AND status = 'DONE'"
    )
    row = df.selectExpr("sum(entries_copied) AS n", "sum(bytes_copied) AS b").first()
    return int(row["n"] or 0), int(row["b"] or 0)


def ingest_rate(zk: str, bookie: str, entry_size: int, total_bytes: int) -> float:
    """Bytes/s one bookie accepts for pipelined adds of ``entry_size`` (a fresh ledger)."""
    lid = 1 << 40
    dm = digest_manager(lid, DigestType.CRC32C, b"ingest")
    key = master_key(b"ingest")
    n = max(1, total_bytes // entry_size)
    payload = b"x" * entry_size
    bodies = [dm.package_entry(e, e - 1, (e + 1) * entry_size, payload) for e in range(256)]
    with SyncBookieClient(zk) as client:
        client.add(bookie, lid, 0, key, bodies[0])  # connect first
        t = time.perf_counter()
        futs: list[concurrent.futures.Future[None]] = []
        for e in range(1, n):
            body = bodies[e % 256]
            futs.append(client.submit(lambda p, e=e, body=body: p.add(bookie, lid, e, key, body)))
            if len(futs) >= 256:
                futs.pop(0).result(60)
        for f in futs:
            f.result(60)
        return (n - 1) * entry_size / (time.perf_counter() - t)


def bulk(args: argparse.Namespace) -> None:
    entry = 64 * 1024
    target_entries = int(args.gib * 1024**3 / entry)
    per_ledger = 1024
    count = max(1, 2 * target_entries // per_ledger)  # randint(1, max) averages max/2
    with tempfile.TemporaryDirectory() as tmp, Sandbox(Path(tmp), 4) as sb:
        t = time.perf_counter()
        written = asyncio.run(
            write_ledgers(
                sb.zk_connect,
                count,
                max_entries=per_ledger,
                payload_size=entry,
                open_fraction=0.0,
                concurrency=8,
                shapes=((3, 2, 2),),
            )
        )
        entries = sum(w.entries for w in written)
        print(
            f"wrote {len(written)} ledgers, {entries} entries, {entries * entry / 1024**3:.2f} "
            f"GiB in {time.perf_counter() - t:.0f}s"
        )
        victim, target = sb.bookie_ids[0], sb.bookie_ids[1]
        spark = build_spark("bkaudit-bench", master="local[2]")
        try:
            raw = ingest_rate(sb.zk_connect, target, entry, 512 * 1024**2)
            print(f"raw ingest of one bookie ({entry // 1024} KiB adds): {raw / 1e6:.1f} MB/s")
            sb.stop_bookie(victim)
            wh = f"{tmp}/wh"
            a_s, counts = _audit(spark, args.executor, sb.zk_connect, wh, "lost")
            print(f"audit lost: {a_s:.1f}s, {counts.get('missing_entries')} missing entries")
            r_s, code, out = _repair(spark, args.executor, sb.zk_connect, wh)
            n, b = _copied(spark, wh)
            print(out.strip())
            print(
                f"rereplicate: {r_s:.1f}s, {n} entries, {b / 1e6:.0f} MB -> {b / 1e6 / r_s:.1f} "
                f"MB/s, {n / r_s:,.0f} entries/s; ratio to raw ingest {b / r_s / raw:.2f} "
                f"(exit {code})"
            )
            c_s, counts = _audit(spark, args.executor, sb.zk_connect, wh, "replicas")
            print(f"re-audit replicas: {c_s:.1f}s, fragments {counts.get('fragments', 0)}")
        finally:
            spark.stop()


def fleet(args: argparse.Namespace) -> None:
    payload = 4096
    per_ledger_bytes = args.gib * 1024**3 / args.ledgers
    max_entries = max(1, round(2 * per_ledger_bytes / payload) - 1)
    with tempfile.TemporaryDirectory() as tmp, Sandbox(Path(tmp), 5) as sb:
        t = time.perf_counter()
        written = asyncio.run(
            write_ledgers(
                sb.zk_connect,
                args.ledgers,
                max_entries=max_entries,
                payload_size=payload,
                concurrency=64,
                shapes=((2, 2, 2), (3, 2, 2), (3, 3, 2)),
            )
        )
        entries = sum(w.entries for w in written)
        print(
            f"wrote {len(written)} ledgers ({sum(not w.closed for w in written)} open), "
            f"{entries} entries, {entries * payload / 1024**3:.2f} GiB in "
            f"{time.perf_counter() - t:.0f}s"
        )
        spark = build_spark("bkaudit-bench", master="local[2]")
        try:
            _audit(
                spark, args.executor, sb.zk_connect, f"{tmp}/warm", "lost"
            )  # JIT and caches warm
            victim = sb.bookie_ids[0]
            sb.stop_bookie(victim)
            wh = f"{tmp}/wh"
            t0 = time.perf_counter()
            a_s, counts = _audit(spark, args.executor, sb.zk_connect, wh, "lost")
            print(
                f"audit lost: {a_s:.1f}s, {counts.get('underreplicated_ledgers')} ledgers "
                "under-replicated"
            )
            rounds = 0
            while True:
                rounds += 1
                r_s, code, _ = _repair(spark, args.executor, sb.zk_connect, wh)
                print(f"rereplicate round {rounds}: {r_s:.1f}s (exit {code})")
                c_s, counts = _audit(spark, args.executor, sb.zk_connect, wh, "replicas")
                print(f"re-audit replicas: {c_s:.1f}s, {counts.get('fragments', 0)} fragments")
                if counts.get("fragments", 0) == 0 or rounds >= 3:
                    break
            total = time.perf_counter() - t0
            n, b = _copied(spark, wh)
            print(
                f"time to full replication: {total:.0f}s ({rounds} repair rounds); "
                f"{n} entries / {b / 1e6:.0f} MB copied; "
                f"{counts.get('ledgers', 0) / total * 60:,.0f} ledgers/min over the whole cycle"
            )
        finally:
            spark.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="scenario", required=True)
    b = sub.add_parser("bulk")
    b.add_argument("--gib", type=float, default=1.0)
    f = sub.add_parser("fleet")
    f.add_argument("--ledgers", type=int, default=10_000)
    f.add_argument("--gib", type=float, default=1.0)
    for p in (b, f):
        p.add_argument(
            "--executor",
            default="auto",
            choices=("auto", "local", "spark"),
            help="executor of the audits and repairs (auto picks local below its limits)",
        )
    args = ap.parse_args()
    (bulk if args.scenario == "bulk" else fleet)(args)


if __name__ == "__main__":
    main()
