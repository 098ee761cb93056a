"""Pure DataFrame transforms that turn findings into per-ledger repair requests.

One row per ledger, the shape :func:`jobs.rereplicate.request_from_row` reads on the
executors:

* ``bad_bookies``: bookies that must leave every segment naming them (lost or unreachable
  bookies, or the sources of a manual recover);
* ``segment_bookies``: ``(segment_first_entry_id, bookie_id)`` pairs bad in one segment only
  (entries missing, digest mismatch);
* ``detected_segments`` and ``first_detected_at``: for the grace-period rule (null for a
  manual recover);
* ``no_replica``: ``(segment_first_entry_id, bookie_id)`` pairs an earlier run found
  unrecoverable, so they are reported again rather than copied forever.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from jobs.transform import BOOKIE_LOST, BOOKIE_UNREACHABLE

PAIR = T.StructType(
    [
        T.StructField("segment_first_entry_id", T.LongType(), True),
        T.StructField("bookie_id", T.StringType(), True),
    ]
)

REQUEST_SCHEMA = T.StructType(
    [
        T.StructField("ledger_id", T.LongType(), False),
        T.StructField("bad_bookies", T.ArrayType(T.StringType()), False),
        T.StructField("segment_bookies", T.ArrayType(PAIR), False),
        T.StructField("detected_segments", T.ArrayType(T.LongType()), True),
        T.StructField("first_detected_at", T.TimestampType(), True),
        T.StructField("no_replica", T.ArrayType(PAIR), False),
    ]
)

WHOLE_BOOKIE_REASONS = (BOOKIE_LOST, BOOKIE_UNREACHABLE)
"""Reasons that move a bookie out of every segment (a bookie-level problem)."""


def _pair() -> F.Column:
    return F.struct(
        F.col("segment_first_entry_id").cast("long").alias("segment_first_entry_id"),
        F.col("bookie_id").alias("bookie_id"),
    )


def _empty_pairs() -> F.Column:
    return F.array().cast(T.ArrayType(PAIR))


def requests_from_fragments(
    fragments: DataFrame, previous_no_replica: DataFrame | None = None
) -> DataFrame:
    """One request per ledger with findings. ``previous_no_replica``: rows of
    ``replication_actions`` with status NO_REPLICA (ledger_id, segment_first_entry_id,
    old_bookie)."""
    whole = F.col("reason").isin(*WHOLE_BOOKIE_REASONS)
    grouped = fragments.groupBy("ledger_id").agg(
        F.array_sort(F.array_distinct(F.collect_list(F.when(whole, F.col("bookie_id"))))).alias(
            "bad_bookies"
        ),
        F.array_sort(F.array_distinct(F.collect_list(F.when(~whole, _pair())))).alias(
            "segment_bookies"
        ),
        F.array_sort(
            F.array_distinct(F.collect_list(F.col("segment_first_entry_id").cast("long")))
        ).alias("detected_segments"),
        F.min("first_detected_at").alias("first_detected_at"),
    )
    if previous_no_replica is None:
        out = grouped.withColumn("no_replica", _empty_pairs())
    else:
        lost = previous_no_replica.select(
            "ledger_id", "segment_first_entry_id", F.col("old_bookie").alias("bookie_id")
        ).where(F.col("bookie_id").isNotNull() & F.col("segment_first_entry_id").isNotNull())
        lost = lost.groupBy("ledger_id").agg(
            F.array_distinct(F.collect_list(_pair())).alias("no_replica")
        )
        out = grouped.join(lost, "ledger_id", "left").withColumn(
            "no_replica", F.coalesce(F.col("no_replica"), _empty_pairs())
        )
    return out.select(*[F.col(f.name).cast(f.dataType) for f in REQUEST_SCHEMA.fields])


def requests_for_bookies(ledgers: DataFrame, bookies: Sequence[str]) -> DataFrame:
    """Manual recover: one request per ledger whose metadata names any of ``bookies`` (from
    the ``ledgers`` DataFrame of a metadata scan); no detection time, so open ledgers are
    fenced at once, as BookKeeper's recoverBookieData does."""
    wanted = F.array(*[F.lit(b) for b in bookies])
    named = F.array_distinct(F.flatten(F.transform("segments", lambda s: s["ensemble"])))
    return (
        ledgers.where(F.col("error").isNull())
        .withColumn("_named", named)
        .where(F.arrays_overlap("_named", wanted))
        .select(
            F.col("ledger_id").cast("long").alias("ledger_id"),
            F.array_sort(F.array_intersect("_named", wanted)).alias("bad_bookies"),
            _empty_pairs().alias("segment_bookies"),
            F.lit(None).cast(T.ArrayType(T.LongType())).alias("detected_segments"),
            F.lit(None).cast(T.TimestampType()).alias("first_detected_at"),
            _empty_pairs().alias("no_replica"),
        )
    )


def ledgers_naming(ledgers: DataFrame, bookie: str) -> DataFrame:
    """Ledgers (id, state, first entry ids of the segments) whose metadata still names
    ``bookie``: what blocks a decommission."""
    seg_has = F.filter("segments", lambda s: F.array_contains(s["ensemble"], bookie))
    return (
        ledgers.where(F.col("error").isNull())
        .withColumn("_segs", seg_has)
        .where(F.size("_segs") > 0)
        .select(
            "ledger_id",
            "state",
            F.transform("_segs", lambda s: s["first_entry_id"]).alias("segments"),
        )
    )
