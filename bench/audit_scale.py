"""Benchmark: the audit's replica comparison at cluster scale, on local Spark.

Builds a synthetic snapshot in Spark (no ZooKeeper, no bookies): N ledgers' metadata
(3-bookie ensembles from a pool of 30, WQ 2 or 3, AQ 2, 90 % closed, 10 % open with a LAC,
10 % with two segments, 1 % empty, lengths up to ``--max-entries``) and every bookie's entry
list per ledger as runs (0.5 % of ledgers have a hole on one bookie, 0.1 % of (ledger,
bookie) pairs answered NoSuchLedger). It then runs ``jobs.spark.transform.find_underreplicated``
and forces every row out, reporting wall time and driver peak memory (the Python driver and
the driver JVM).

    .venv/bin/python bench/audit_scale.py [--ledgers 1000000] [--max-entries 1000000]
        [--entries-scale 1,10] [--master local[2]]

Each size runs at every entries scale: time should follow ledgers, not entries.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.spark import schema as spark_schema
from jobs.spark import transform
from jobs.spark.session import build_spark

POOL = 30


def _bookie(expr: F.Column) -> F.Column:
    return F.concat(F.lit("10.1.0."), F.pmod(expr, F.lit(POOL)).cast("string"), F.lit(":3181"))


def snapshot(spark: SparkSession, n: int, max_entries: int) -> tuple[DataFrame, DataFrame]:
    """Synthetic (ledgers, bookie_entries) DataFrames for ``n`` ledgers."""
    h = F.abs(F.xxhash64("id"))
    base = spark.range(n).select(
        F.col("id").alias("ledger_id"),
        (h % 100).alias("r"),
        (F.abs(F.xxhash64("id", F.lit(1))) % max_entries).alias("len"),
        (F.abs(F.xxhash64("id", F.lit(2))) % POOL).alias("b"),
    )
    closed = F.col("r") < 90
    last = F.when(F.col("r") == 0, F.lit(-1).cast("long")).otherwise(F.col("len"))
    ens1 = F.array(_bookie(F.col("b")), _bookie(F.col("b") + 7), _bookie(F.col("b") + 13))
    ens2 = F.array(_bookie(F.col("b")), _bookie(F.col("b") + 19), _bookie(F.col("b") + 13))
    split = F.floor(F.col("len") / 2) + 1
    two = (F.col("r") % 10 == 5) & (F.col("len") > 2)
    seg = F.struct(
        F.lit(0).cast("long").alias("first_entry_id"),
        F.when(two, split - 1)
        .when(closed, last)
        .otherwise(F.lit(None).cast("long"))
        .alias("last_entry_id"),
        ens1.alias("ensemble"),
    )
    seg2 = F.struct(
        split.cast("long").alias("first_entry_id"),
        F.when(closed, last).otherwise(F.lit(None).cast("long")).alias("last_entry_id"),
        ens2.alias("ensemble"),
    )
    ledgers = base.select(
        "ledger_id",
        F.lit(None).cast("string").alias("znode_path"),
        F.lit(0).alias("znode_version"),
        F.when(closed, "CLOSED").otherwise("OPEN").alias("state"),
        F.lit(3).alias("ensemble_size"),
        (2 + (F.col("r") % 2)).cast("int").alias("write_quorum"),
        F.lit(2).alias("ack_quorum"),
        F.when(closed, last).otherwise(F.lit(-1).cast("long")).alias("last_entry_id"),
        F.lit(0).cast("long").alias("length"),
        F.lit("CRC32C").alias("digest_type"),
        F.lit(None).cast("binary").alias("password"),
        F.lit(None).cast("long").alias("ctime"),
        F.when(two, F.array(seg, seg2)).otherwise(F.array(seg)).alias("segments"),
        F.lit(None).cast("string").alias("error"),
    )
    ledgers = ledgers.select(*spark_schema.LEDGER_SCHEMA.fieldNames())
    # One row per (ledger, bookie): each holds [0, len] (entries past LAC/last included).
    bookies = base.select(
        "ledger_id",
        "r",
        "len",
        F.posexplode(
            F.array_distinct(
                F.array(
                    _bookie(F.col("b")),
                    _bookie(F.col("b") + 7),
                    _bookie(F.col("b") + 13),
                    _bookie(F.col("b") + 19),
                )
            )
        ).alias("pos", "bookie_id"),
    ).filter(~((F.col("pos") == 3) & ~((F.col("r") % 10 == 5) & (F.col("len") > 2))))
    hole = (F.abs(F.xxhash64("ledger_id", F.lit(3))) % 200 == 0) & (F.col("pos") == 0)
    noledger = F.abs(F.xxhash64("ledger_id", "pos")) % 1000 == 0
    k = F.floor(F.col("len") / 3)
    run = F.struct(
        F.lit(0).cast("long").alias("first_entry_id"), F.col("len").alias("last_entry_id")
    )
    holed = F.array(
        F.struct(F.lit(0).cast("long").alias("first_entry_id"), (k - 1).alias("last_entry_id")),
        F.struct((k + 10).alias("first_entry_id"), F.col("len").alias("last_entry_id")),
    )
    entries = bookies.select(
        "ledger_id",
        "bookie_id",
        F.when(noledger, "NO_LEDGER").otherwise("OK").alias("status"),
        F.lit("LIST").alias("method"),
        F.when(noledger, F.array().cast(transform.RUNS))
        .when(hole & (k > 0), holed)
        .otherwise(F.array(run))
        .alias("entries"),
        F.array().cast(transform.RUNS).alias("bad_entries"),
        F.array().cast(transform.RUNS).alias("unknown_entries"),
        F.when(F.col("r") >= 90, F.col("len")).alias("lac"),
        F.lit(None).cast("string").alias("error"),
    )
    entries = entries.select(*spark_schema.BOOKIE_ENTRIES_SCHEMA.fieldNames())
    return ledgers, entries


def jvm_peak_mb(spark: SparkSession) -> float:
    """The driver JVM's peak resident set (VmHWM), in MiB."""
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()  # type: ignore[union-attr]
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run_once(spark: SparkSession, n: int, max_entries: int) -> dict[str, float]:
    ledgers, entries = snapshot(spark, n, max_entries)
    lost = transform.lost_bookie_ids(spark.createDataFrame([], spark_schema.BOOKIE_SCHEMA))
    bookies = spark.createDataFrame([], spark_schema.BOOKIE_SCHEMA)
    assert not lost
    t0 = time.perf_counter()
    frags = transform.find_underreplicated(ledgers, bookies, entries)
    stats = frags.agg(
        F.count(F.lit(1)).alias("fragments"),
        F.countDistinct("ledger_id").alias("ledgers"),
        F.sum("missing_entries").alias("missing"),
    ).first()
    wall = time.perf_counter() - t0
    return {
        "ledgers": n,
        "max_entries": max_entries,
        "seconds": wall,
        "fragments": stats["fragments"],
        "flagged_ledgers": stats["ledgers"],
        "missing_entries": stats["missing"] or 0,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ledgers", default="1000000", help="comma-separated ledger counts")
    p.add_argument("--max-entries", type=int, default=1_000_000)
    p.add_argument("--entries-scale", default="1,10", help="comma-separated multipliers")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--shuffle-partitions", type=int, default=8)
    args = p.parse_args()
    spark = build_spark(
        "bkaudit-bench-audit-scale",
        master=args.master,
        overrides={
            "spark.sql.shuffle.partitions": str(args.shuffle_partitions),
            "spark.ui.showConsoleProgress": "false",
            "spark.driver.memory": "4g",
            "spark.sql.execution.arrow.maxRecordsPerBatch": "10000",
        },
    )
    print(f"spark {spark.version} {spark.sparkContext.master}; warming up")
    run_once(spark, 10_000, 1000)
    print(
        f"{'ledgers':>10} {'max entries':>12} {'seconds':>8} {'ledgers/s':>10} "
        f"{'fragments':>9} {'flagged':>8} {'missing entries':>16}"
    )
    for n in (int(x) for x in args.ledgers.split(",")):
        for scale in (int(x) for x in args.entries_scale.split(",")):
            r = run_once(spark, n, args.max_entries * scale)
            print(
                f"{n:>10,} {args.max_entries * scale:>12,} {r['seconds']:>8.1f} "
                f"{n / r['seconds']:>10,.0f} {r['fragments']:>9,} {r['flagged_ledgers']:>8,} "
                f"{r['missing_entries']:>16,}",
                flush=True,
            )
    py_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"driver peak memory: python {py_peak:.0f} MiB, JVM {jvm_peak_mb(spark):.0f} MiB")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
