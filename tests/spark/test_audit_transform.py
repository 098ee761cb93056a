"""The audit's pure transforms on small hand-built DataFrames (chispa, real local Spark)."""

from __future__ import annotations

from datetime import datetime, timezone

from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bklib.quorum import stripe_count
from bklib.states import Reason, ReplicaStatus
from jobs.spark import schema as spark_schema
from jobs.spark import transform
from tests.audit_helpers import (
    bookies_df,
    entries_df,
    entry_row,
    findings,
    findings_df,
    ledgers_df,
    metadata,
)

BOOKIE_LOST = Reason.BOOKIE_LOST
BOOKIE_UNREACHABLE = Reason.BOOKIE_UNREACHABLE
DIGEST_MISMATCH = Reason.DIGEST_MISMATCH
ENTRIES_MISSING = Reason.ENTRIES_MISSING
STATUS_NO_LEDGER = ReplicaStatus.NO_LEDGER
STATUS_UNREACHABLE = ReplicaStatus.UNREACHABLE

B = [f"10.0.0.{i}:3181" for i in range(8)]
B0, B1, B2, B3, B4, B5 = B[:6]
E3 = [B0, B1, B2]


def eq(actual: DataFrame, expected: DataFrame) -> None:
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)


def full(ledger_id: int, bookies: list[str], last: int, lac: int | None = None) -> list:
    """Every bookie holds [0, last]."""
    return [entry_row(ledger_id, b, [(0, last)], lac=lac) for b in bookies]


# ---- expected stripes ---------------------------------------------------------------------------


def test_missing_entries_are_counted_on_the_stripe_with_severity(spark: SparkSession) -> None:
    mds = [
        metadata(10, [(0, E3)], wq=2, aq=2, last=9),
        metadata(11, [(0, E3)], wq=3, aq=2, last=9),
        metadata(12, [(0, E3)], wq=2, aq=1, last=9),
        metadata(13, [(0, B[:5])], wq=3, aq=2, last=9),
        # Bookies hold entries beyond lastEntryId: ignored.
        metadata(14, [(0, E3)], wq=2, aq=2, last=5),
    ]
    rows = [
        # 10: B0 lacks 4..5; only 5 is on its stripe {0, 2 mod 3}.
        entry_row(10, B0, [(0, 3), (6, 9)]),
        *full(10, [B1, B2], 9),
        # 11: WQ = E, B1 lacks 2..3: two entries with 2 of 3 replicas.
        entry_row(11, B1, [(0, 1), (4, 9)]),
        *full(11, [B0, B2], 9),
        # 12: entry 4 (write set [1, 2]) is on neither of its bookies.
        entry_row(12, B1, [(0, 3), (5, 9)]),
        entry_row(12, B2, [(0, 3), (5, 9)]),
        *full(12, [B0], 9),
        # 13: E=5, WQ=3, entry 4 -> [4, 0, 1] (wrap-around); indices 4 and 0 lack it.
        entry_row(13, B0, [(0, 3), (5, 9)]),
        entry_row(13, B4, [(0, 3), (5, 9)]),
        *full(13, [B1, B2, B3], 9),
        # 14: B0 also holds 6..20, the others stop at 5.
        entry_row(14, B0, [(0, 20)]),
        *full(14, [B1, B2], 5),
    ]
    got = transform.find_underreplicated(
        ledgers_df(spark, mds), bookies_df(spark, B[:5]), entries_df(spark, rows)
    )
    want = findings_df(
        spark,
        [
            (10, 0, B0, ENTRIES_MISSING, 1, 1, "BELOW_AQ"),
            (11, 0, B1, ENTRIES_MISSING, 2, 2, "BELOW_WQ"),
            (12, 0, B1, ENTRIES_MISSING, 1, 0, "NO_REPLICA"),
            (12, 0, B2, ENTRIES_MISSING, 1, 0, "NO_REPLICA"),
            (13, 0, B0, ENTRIES_MISSING, 1, 1, "BELOW_AQ"),
            (13, 0, B4, ENTRIES_MISSING, 1, 1, "BELOW_AQ"),
        ],
    )
    eq(findings(got), want)
    ranges = {
        (r.ledger_id, r.bookie_id): [tuple(x) for x in r.missing_ranges]
        for r in got.select("ledger_id", "bookie_id", "missing_ranges").collect()
    }
    assert ranges[(10, B0)] == [(5, 5)]
    assert ranges[(11, B1)] == [(2, 3)]
    assert ranges[(13, B4)] == [(4, 4)]


def test_unreachable_is_never_missing(spark: SparkSession) -> None:
    mds = [
        metadata(20, [(0, E3)], wq=2, aq=2, last=9),
        metadata(21, [(0, E3)], wq=2, aq=2, last=9),
    ]
    rows = [
        # 20: B0 timed out, B1 answered NoSuchLedger (a negative answer), B2 holds all.
        entry_row(20, B0, status=STATUS_UNREACHABLE, error="timed out"),
        entry_row(20, B1, status=STATUS_NO_LEDGER, error="no such ledger"),
        entry_row(20, B2, [(0, 9)]),
        # 21: B0 answered for 0..3, its reads of 4..9 failed: unknown, not missing.
        entry_row(21, B0, [(0, 3)], unknown=[(4, 9)], error="read timed out"),
        *full(21, [B1, B2], 9),
    ]
    got = transform.find_underreplicated(
        ledgers_df(spark, mds), bookies_df(spark, E3), entries_df(spark, rows)
    )
    want = findings_df(
        spark,
        [
            (20, 0, B0, BOOKIE_UNREACHABLE, None, None, None),
            # B0's silence does not lower B1's count: 1 replica left of 2.
            (20, 0, B1, ENTRIES_MISSING, 7, 1, "BELOW_AQ"),
            (21, 0, B0, BOOKIE_UNREACHABLE, None, None, None),
        ],
    )
    eq(findings(got), want)
    unknown = {
        r.ledger_id: r.unknown_entries for r in got.filter(F.col("bookie_id") == B0).collect()
    }
    assert unknown == {20: 7, 21: 4}  # stripe {0, 2 mod 3}: 0 2 3 5 6 8 9, and 5 6 8 9


def test_open_closed_empty_and_multi_segment_ledgers(spark: SparkSession) -> None:
    mds = [
        # 30: open; the highest LAC reported is 5. Entries 6..7 are beyond it.
        metadata(30, [(0, E3)], wq=2, aq=2),
        # 31: open and no bookie reported a LAC: nothing in the last segment is expected.
        metadata(31, [(0, E3)], wq=2, aq=2),
        # 32: closed empty ledger; a bookie without the ledger is fine.
        metadata(32, [(0, E3)], wq=2, aq=2, last=-1),
        # 33: index 1 replaced by B3 from entry 5; B3 lacks 7..9.
        metadata(33, [(0, E3), (5, [B0, B3, B2])], wq=2, aq=2, last=9),
        # 34: an empty last segment (starts after lastEntryId) on a bookie without the ledger.
        metadata(34, [(0, E3), (5, [B0, B1, B4])], wq=2, aq=2, last=4),
    ]
    rows = [
        entry_row(30, B0, [(0, 7)], lac=5),
        entry_row(30, B1, [(0, 3)], lac=4),  # lacks 4 (on its stripe) and 6..7 (beyond LAC)
        entry_row(30, B2, [(0, 5)]),
        entry_row(31, B0, status=STATUS_NO_LEDGER),
        entry_row(31, B1, status=STATUS_NO_LEDGER),
        entry_row(31, B2, status=STATUS_NO_LEDGER),
        entry_row(32, B0, status=STATUS_NO_LEDGER),
        entry_row(32, B1),
        entry_row(32, B2),
        entry_row(33, B0, [(0, 9)]),
        entry_row(33, B1, [(0, 4)]),
        entry_row(33, B2, [(0, 9)]),
        entry_row(33, B3, [(5, 6)]),
        *full(34, [B0, B1, B2], 4),
        entry_row(34, B4, status=STATUS_NO_LEDGER),
    ]
    got = transform.find_underreplicated(
        ledgers_df(spark, mds), bookies_df(spark, B[:5]), entries_df(spark, rows)
    )
    want = findings_df(
        spark,
        [
            (30, 0, B1, ENTRIES_MISSING, 1, 1, "BELOW_AQ"),
            (33, 5, B3, ENTRIES_MISSING, 2, 1, "BELOW_AQ"),  # stripe {1, 0 mod 3}: 7, 9
        ],
    )
    eq(findings(got), want)
    seg = {r.ledger_id: r.segment_last_entry_id for r in got.collect()}
    assert seg == {30: 5, 33: 9}


def test_lost_check_reports_every_segment_naming_a_lost_bookie(spark: SparkSession) -> None:
    mds = [
        metadata(40, [(0, E3)], wq=2, aq=2, last=9),
        metadata(41, [(0, [B0, B1, B3]), (5, E3)], wq=2, aq=2, last=9),
        metadata(42, [(0, E3)], wq=2, aq=2, last=-1),  # empty: still names a dead bookie
        metadata(43, [(0, E3)], wq=3, aq=2),  # open: end unknown without the bookies
        metadata(44, [(0, [B3, B4, B5])], wq=2, aq=2, last=9),  # two of three lost
        metadata(45, [(0, [B0, B1, B3])], wq=2, aq=2, last=9),  # nothing lost
    ]
    bookies = bookies_df(spark, [B0, B1, B3], lost=[B2, B4, B5])
    got = transform.find_underreplicated(ledgers_df(spark, mds), bookies)
    want = findings_df(
        spark,
        [
            (40, 0, B2, BOOKIE_LOST, 6, 1, "BELOW_AQ"),
            (41, 5, B2, BOOKIE_LOST, 3, 1, "BELOW_AQ"),  # segment [5, 9], stripe 5 7 8
            (42, 0, B2, BOOKIE_LOST, 0, 1, "BELOW_AQ"),
            (43, 0, B2, BOOKIE_LOST, None, 2, "BELOW_WQ"),
            # Entries with residue 1 (write set [1, 2]) have no replica left.
            (44, 0, B4, BOOKIE_LOST, 7, 0, "NO_REPLICA"),
            (44, 0, B5, BOOKIE_LOST, 6, 0, "NO_REPLICA"),
        ],
    )
    eq(findings(got), want)


def test_lost_bookie_and_missing_entries_combine_per_entry(spark: SparkSession) -> None:
    mds = [metadata(60, [(0, E3)], wq=2, aq=2, last=9)]
    rows = [
        entry_row(60, B0, [(0, 9)]),
        entry_row(60, B1, [(0, 0), (2, 9)]),  # lacks entry 1, whose write set is [1, 2]
    ]
    got = transform.find_underreplicated(
        ledgers_df(spark, mds), bookies_df(spark, [B0, B1], lost=[B2]), entries_df(spark, rows)
    )
    want = findings_df(
        spark,
        [
            (60, 0, B1, ENTRIES_MISSING, 1, 0, "NO_REPLICA"),
            (60, 0, B2, BOOKIE_LOST, 6, 0, "NO_REPLICA"),
        ],
    )
    eq(findings(got), want)


def test_digest_mismatch_rows(spark: SparkSession) -> None:
    mds = [metadata(50, [(0, E3)], wq=2, aq=2, last=9)]
    rows = [entry_row(50, B0, [(0, 9)], bad=[(3, 3)]), *full(50, [B1, B2], 9)]
    got = transform.find_underreplicated(
        ledgers_df(spark, mds), bookies_df(spark, E3), entries_df(spark, rows)
    )
    eq(findings(got), findings_df(spark, [(50, 0, B0, DIGEST_MISMATCH, 1, 1, "BELOW_AQ")]))


def test_huge_ledgers_cost_runs_not_entries(spark: SparkSession) -> None:
    """A trillion-entry ledger with one big hole: answered by arithmetic, instantly."""
    last = 10**12
    hole = (5 * 10**11, 5 * 10**11 + 10**9)
    mds = [metadata(70, [(0, B[:5])], wq=3, aq=2, last=last)]
    rows = [
        entry_row(70, B3, [(0, hole[0] - 1), (hole[1] + 1, last)]),
        *full(70, [B0, B1, B2, B4], last),
    ]
    got = transform.find_underreplicated(
        ledgers_df(spark, mds), bookies_df(spark, B[:5]), entries_df(spark, rows)
    ).collect()
    assert [(r.bookie_id, r.missing_entries, r.severity) for r in got] == [
        (B3, stripe_count(3, hole[0], hole[1], 5, 3), "BELOW_WQ")
    ]


# ---- re-read and carry-over ---------------------------------------------------------------------


def _frags(spark: SparkSession, keys: list[tuple[int, int, str]]) -> DataFrame:
    rows = [
        {
            "ledger_id": lid,
            "segment_index": 0,
            "segment_first_entry_id": first,
            "segment_last_entry_id": 9,
            "bookie_index": 0,
            "bookie_id": b,
            "reason": ENTRIES_MISSING,
        }
        for lid, first, b in keys
    ]
    return spark.createDataFrame(rows, spark_schema.FRAGMENT_SCHEMA)


def test_keep_still_current_drops_deleted_and_changed_ledgers(spark: SparkSession) -> None:
    frags = _frags(spark, [(1, 0, B0), (2, 0, B0), (3, 0, B0), (4, 0, B0)])
    current = spark.createDataFrame(
        [
            (1, 0, B0, None),
            (1, 0, B1, None),
            # 2 was deleted: no rows. 3 had B0 replaced by B5:
            (3, 0, B5, None),
            (3, 0, B1, None),
            # 4 could not be read again: an error is no evidence of a fix.
            (4, None, None, "corrupt metadata"),
        ],
        "ledger_id long, first_entry_id long, bookie_id string, error string",
    )
    got = transform.keep_still_current(frags, current).select("ledger_id").collect()
    assert sorted(r.ledger_id for r in got) == [1, 4]


def test_first_detected_at_is_carried_over(spark: SparkSession) -> None:
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    now = datetime(2026, 1, 2, tzinfo=timezone.utc)
    prev = _frags(spark, [(1, 0, B0), (9, 0, B0)]).withColumn(
        "first_detected_at", F.lit(t0).cast("timestamp")
    )
    cur = _frags(spark, [(1, 0, B0), (2, 0, B1)])
    got = {
        r.ledger_id: r.first_detected_at.replace(tzinfo=timezone.utc)
        for r in transform.carry_first_detected(cur, prev, now).collect()
    }
    assert got == {1: t0, 2: now}
    first = transform.carry_first_detected(cur, None, now).collect()
    assert {r.first_detected_at.replace(tzinfo=timezone.utc) for r in first} == {now}


# ---- the per-ledger core against brute force ----------------------------------------------------
