"""The audit's DataFrame transforms: pure, chispa-tested glue around :mod:`bklib.audit`.

Nothing here talks to ZooKeeper or bookies (that is :mod:`jobs.spark.extract`) or writes tables
(:mod:`jobs.spark.load`). The verdict itself, per ledger, is
:func:`bklib.audit.classify.classify_ledger`, run inside ``mapInArrow`` on rows rebuilt as the
engine's types, so Spark and the local executor classify with the same code.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, Row
from pyspark.sql import functions as F

from bklib.audit.accounting import directory_of
from bklib.audit.classify import classify_ledger
from bklib.audit.model import LedgerView, ReplicaReport
from bklib.states import BookieState, CountKey, Reason
from jobs.spark.schema import (
    FRAGMENT_ARROW,
    FRAGMENT_SCHEMA,
)

# ---- DataFrame transforms -------------------------------------------------------------------


def healthy_ledgers(ledgers: DataFrame) -> DataFrame:
    """Ledgers whose metadata was read and parsed."""
    return ledgers.filter(F.col("error").isNull())


def ledgers_per_directory(ledgers: DataFrame) -> dict[str, int]:
    """Scanned ledgers (readable or not) per directory of the ledger tree, for
    :meth:`bklib.audit.engine.ScanPlan.account`."""
    counted = (
        ledgers.select("znode_path")
        .rdd.filter(lambda r: r.znode_path is not None)
        .map(lambda r: directory_of(r.znode_path))
        .countByValue()
    )
    return {str(k): int(v) for k, v in counted.items()}


def metadata_errors(ledgers: DataFrame) -> DataFrame:
    """Znodes that could not be read or parsed: ledger_id, znode_path, error."""
    return ledgers.filter(F.col("error").isNotNull()).select("ledger_id", "znode_path", "error")


def lost_bookie_ids(bookies: DataFrame) -> frozenset[str]:
    """The ids of lost bookies (a small driver-side set; the bookie list is tiny)."""
    return frozenset(
        r.bookie_id for r in bookies.filter(F.col("state") == BookieState.LOST).collect()
    )


def find_underreplicated(
    ledgers: DataFrame,
    bookies: DataFrame,
    bookie_entries: DataFrame | None = None,
) -> DataFrame:
    """Every under-replicated fragment (FRAGMENT_SCHEMA).

    With ``bookie_entries`` None this is the metadata-only ``lost`` check: every segment that
    names a lost bookie. Otherwise each bookie's entry list per ledger is compared with the
    stripes it must hold: closed ledgers up to lastEntryId, others up to the LAC the bookies
    reported; entries beyond are ignored and empty ledgers or segments expect nothing. An
    unreachable bookie, or an id whose read failed, yields BOOKIE_UNREACHABLE, never missing.
    """
    lost = lost_bookie_ids(bookies)
    df = healthy_ledgers(ledgers).drop("password")
    with_replicas = bookie_entries is not None
    if bookie_entries is not None:
        grouped = bookie_entries.groupBy("ledger_id").agg(
            F.max("lac").alias("lac"),
            F.collect_list(
                F.struct(
                    "bookie_id",
                    "status",
                    "method",
                    "entries",
                    "bad_entries",
                    "unknown_entries",
                    "lac",
                    "error",
                )
            ).alias("replicas"),
        )
        df = df.join(grouped, "ledger_id", "left")

    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            out: list[dict[str, Any]] = []
            for row in batch.to_pylist():
                replicas = None
                lac = None
                if with_replicas:
                    replicas = {
                        r["bookie_id"]: ReplicaReport.from_row({**r, "ledger_id": row["ledger_id"]})
                        for r in row["replicas"] or ()
                    }
                    lac = row["lac"]
                found = classify_ledger(LedgerView.from_row(row), lost, replicas, lac)
                out.extend(f.as_row() for f in found)
            if out:
                yield pa.RecordBatch.from_pylist(out, schema=FRAGMENT_ARROW)

    return df.mapInArrow(run, FRAGMENT_SCHEMA)


def keep_still_current(fragments: DataFrame, current: DataFrame) -> DataFrame:
    """Drop findings whose ledger changed or vanished after it was scanned.

    ``current`` comes from re-reading the flagged ledgers: (ledger_id, first_entry_id,
    bookie_id, error). A fragment stays if its ledger still exists and its segment still
    names the bookie (a re-replicated or deleted ledger is not a false alarm), or if the
    re-read failed (an error is no evidence the problem went away).
    """
    seg = current.filter(F.col("error").isNull()).select(
        "ledger_id",
        F.col("first_entry_id").alias("segment_first_entry_id"),
        "bookie_id",
    )
    failed = current.filter(F.col("error").isNotNull()).select("ledger_id").distinct()
    keep = fragments.join(
        seg.distinct(), ["ledger_id", "segment_first_entry_id", "bookie_id"], "left_semi"
    )
    keep_failed = fragments.join(failed, "ledger_id", "left_semi")
    return keep.unionByName(keep_failed).distinct()


def flagged_ledger_ids(fragments: DataFrame) -> DataFrame:
    """Distinct ledger ids with at least one finding."""
    return fragments.select("ledger_id").distinct()


def carry_first_detected(
    fragments: DataFrame, previous: DataFrame | None, detected_at: Any
) -> DataFrame:
    """Add ``first_detected_at``: from the previous run's row for the same (ledger, segment,
    bookie) when there is one, else ``detected_at`` (this run's start)."""
    now = F.lit(detected_at).cast("timestamp")
    if previous is None:
        return fragments.withColumn("first_detected_at", now)
    prev = previous.groupBy("ledger_id", "segment_first_entry_id", "bookie_id").agg(
        F.min("first_detected_at").alias("_prev_first")
    )
    return (
        fragments.join(prev, ["ledger_id", "segment_first_entry_id", "bookie_id"], "left")
        .withColumn("first_detected_at", F.coalesce(F.col("_prev_first"), now))
        .drop("_prev_first")
    )


def aggregate_row(df: DataFrame) -> Row:
    """The one row of an aggregate (``agg`` yields one even over no rows; None would mean a
    broken query, which must not read as zero counts)."""
    row = df.first()
    if row is None:
        raise RuntimeError("a Spark aggregate returned no row")
    return row


def summarize(fragments: DataFrame) -> dict[str, int]:
    """Counts for the run record: fragments per reason, per severity, ledgers, entries."""
    agg = aggregate_row(
        fragments.agg(
            F.count(F.lit(1)).alias("fragments"),
            F.countDistinct("ledger_id").alias("underreplicated_ledgers"),
            F.coalesce(
                F.sum(
                    F.when(F.col("reason") != Reason.BOOKIE_UNREACHABLE, F.col("missing_entries"))
                ),
                F.lit(0),
            ).alias("missing_entries"),
        )
    )
    counts = {
        CountKey.FRAGMENTS: int(agg["fragments"] or 0),
        CountKey.UNDERREPLICATED_LEDGERS: int(agg["underreplicated_ledgers"] or 0),
        CountKey.MISSING_ENTRIES: int(agg["missing_entries"] or 0),
    }
    for r in fragments.groupBy("reason").count().collect():
        counts[CountKey.reason(r["reason"])] = int(r["count"])
    for r in fragments.filter(F.col("severity").isNotNull()).groupBy("severity").count().collect():
        counts[CountKey.severity(r["severity"])] = int(r["count"])
    return counts
