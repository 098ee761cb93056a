"""Blast radius of every bookie and rack over N synthetic ledgers.

    .venv/bin/python bench/blast_radius.py [--ledgers 1000000] [--bookies 30] [--racks 5]
                                           [--executor local|spark] [--master local[2]]
                                           [--processes 2]

The computation part of ``bkaudit blastradius`` on synthetic ledgers: a Pulsar-like mix of
E/WQ/AQ (2/2/2, 3/2/2, 3/3/2, 4/3/2), 1 to 3 segments, 5% open ledgers, bookie 0 lost, topics
on every ledger. ``local`` runs :func:`bklib.audit.blast_radius.blast_radius` in this process on
LedgerViews built in memory; ``spark`` generates the ledger rows inside Spark tasks, persists
them, and times :func:`jobs.spark.blast_radius.blast_radius_df` (one blast_radius per
partition, merged on the driver). Goal: 1M ledgers in at most 60 s on this project's 2-core
machine. The metadata scan (about 12,000 ledgers/s) is not included: see
bench/metadata_scan.py. The machine is shared: the load average is printed with the figures,
and ``local`` also prints the CPU time the computation took.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from collections.abc import Iterator
from typing import Any

from bklib.audit.blast_radius import ScopeImpact, blast_radius
from bklib.audit.model import LedgerView, SegmentSpan
from bklib.meta.model import LedgerState

SHAPES = ((2, 2, 2), (3, 2, 2), (3, 3, 2), (4, 3, 2))


def synthetic_view(lid: int, bookies: list[str], rng: random.Random) -> LedgerView:
    e, wq, aq = rng.choice(SHAPES)
    nseg = rng.choice((1, 1, 1, 2, 3))
    last = rng.randint(0, 50_000)
    starts = sorted(rng.sample(range(1, last + 1), nseg - 1)) if last >= nseg else []
    firsts = [0, *starts]
    open_ = rng.random() < 0.05
    segs = []
    for k, f in enumerate(firsts):
        end: int | None = firsts[k + 1] - 1 if k + 1 < len(firsts) else last
        if open_ and k + 1 == len(firsts):
            end = None
        segs.append(SegmentSpan(f, end, tuple(rng.sample(bookies, e))))
    return LedgerView(
        ledger_id=lid,
        state=(LedgerState.OPEN if open_ else LedgerState.CLOSED).name,
        ensemble_size=e,
        write_quorum=wq,
        ack_quorum=aq,
        last_entry_id=-1 if open_ else last,
        segments=tuple(segs),
        topic=f"persistent://t{lid % 7}/ns/topic-{lid % 5000}",
        component="managed-ledger",
    )


def synthetic(n: int, bookies: list[str], seed: int = 1, start: int = 0) -> list[LedgerView]:
    """Ledgers ``start .. start + n - 1``; each is seeded by its id, so Spark tasks build
    the same ledgers as the local run."""
    rng = random.Random()
    out = []
    for lid in range(start, start + n):
        rng.seed(seed * 1_000_003 + lid)
        out.append(synthetic_view(lid, bookies, rng))
    return out


def cluster(n_bookies: int, n_racks: int) -> tuple[list[str], dict[str, str], frozenset[str]]:
    bookies = [f"10.0.{i // 250}.{i % 250}:3181" for i in range(n_bookies)]
    racks = {b: f"/rack-{i % n_racks}" for i, b in enumerate(bookies)}
    lost = frozenset(bookies[:1]) if n_bookies > 10 else frozenset()
    return bookies, racks, lost


def run_local(args: argparse.Namespace) -> tuple[list[ScopeImpact], str]:
    bookies, racks, lost = cluster(args.bookies, args.racks)
    t0 = time.monotonic()
    views = synthetic(args.ledgers, bookies)
    t1, c1 = time.monotonic(), time.process_time()
    kw: dict[str, Any] = {"racks": racks, "gone": lost, "writable": frozenset(bookies) - lost}
    if args.processes > 1:
        from jobs.commands.blastradius import parallel_blast_radius

        rows = parallel_blast_radius(views, bookies, processes=args.processes, **kw)
    else:
        rows = blast_radius(views, bookies, **kw)
    t2, c2 = time.monotonic(), time.process_time()
    cpu = "" if args.processes > 1 else f"{c2 - c1:.1f}s CPU, "
    return rows, (
        f"local, {args.processes} process(es): built {len(views)} views in {t1 - t0:.1f}s; "
        f"blast radius in {t2 - t1:.1f}s ({cpu}{len(views) / (t2 - t1):,.0f} ledgers/s)"
    )


def run_spark(args: argparse.Namespace) -> tuple[list[ScopeImpact], str]:
    import pyarrow as pa

    from jobs.spark.blast_radius import blast_radius_df
    from jobs.spark.schema import LEDGER_SCHEMA
    from jobs.spark.session import build_spark
    from jobs.tables.schema import LEDGER_SCHEMA as LEDGER_ARROW

    spark = build_spark(
        "bench-blast-radius",
        master=args.master,
        overrides={"spark.ui.showConsoleProgress": "false", "spark.ui.enabled": "false"},
    )
    bookies, racks, lost = cluster(args.bookies, args.racks)
    parts = args.partitions or spark.sparkContext.defaultParallelism

    def generate(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            ids = batch.column("id").to_pylist()
            if ids:
                views = synthetic(len(ids), bookies, start=ids[0])
                yield pa.RecordBatch.from_pylist([v.as_row() for v in views], LEDGER_ARROW)

    t0 = time.monotonic()
    df = spark.range(0, args.ledgers, numPartitions=parts).mapInArrow(generate, LEDGER_SCHEMA)
    df = df.persist()
    assert df.count() == args.ledgers
    t1 = time.monotonic()
    rows = blast_radius_df(
        df,
        bookies,
        racks=racks,
        gone=lost,
        missing={},
        writable=frozenset(bookies) - lost,
        min_racks=2,
    )
    t2 = time.monotonic()
    df.unpersist()
    return rows, (
        f"spark {spark.sparkContext.master}, {parts} partitions: generated {args.ledgers} "
        f"ledger rows in {t1 - t0:.1f}s; blast radius in {t2 - t1:.1f}s "
        f"({args.ledgers / (t2 - t1):,.0f} ledgers/s)"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--ledgers", type=int, default=1_000_000)
    p.add_argument("--bookies", type=int, default=30)
    p.add_argument("--racks", type=int, default=5)
    p.add_argument("--executor", choices=("local", "spark"), default="local")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--partitions", type=int, default=0, help="spark: default parallelism")
    p.add_argument(
        "--processes", type=int, default=1, help="local: forked workers, as bkaudit uses"
    )
    args = p.parse_args()
    load0 = os.getloadavg()
    rows: list[Any]
    rows, line = (run_spark if args.executor == "spark" else run_local)(args)
    load1 = os.getloadavg()
    worst = max((r for r in rows if r.scope == "bookie"), key=lambda r: r.risk)
    print(
        f"{line}; {args.bookies} bookies, {args.racks} racks; riskiest bookie {worst.name}: "
        f"{worst.ledgers_below_aq} ledgers below AQ, {worst.ledgers_lost} lost; load average "
        f"{load0[0]:.1f} before, {load1[0]:.1f} after"
    )


if __name__ == "__main__":
    main()
