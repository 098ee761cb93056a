"""The DataFrame transforms that turn findings into per-ledger repair requests (chispa)."""

from __future__ import annotations

from datetime import datetime

from chispa import assert_df_equality
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from jobs import load, repair_input
from tests.audit_helpers import ledgers_df, metadata

FRAG = T.StructType(
    [
        T.StructField("ledger_id", T.LongType()),
        T.StructField("segment_first_entry_id", T.LongType()),
        T.StructField("bookie_id", T.StringType()),
        T.StructField("reason", T.StringType()),
        T.StructField("first_detected_at", T.TimestampType()),
    ]
)
T1, T2 = datetime(2026, 11, 1, 10, 0), datetime(2026, 11, 1, 11, 0)


def test_requests_group_findings_per_ledger(spark: SparkSession) -> None:
    frags = spark.createDataFrame(
        [
            (1, 0, "b1", "BOOKIE_LOST", T2),
            (1, 10, "b1", "BOOKIE_LOST", T1),
            (1, 10, "b3", "ENTRIES_MISSING", T2),
            (2, 0, "b2", "DIGEST_MISMATCH", T1),
            (3, 5, "b4", "BOOKIE_UNREACHABLE", T2),
        ],
        FRAG,
    )
    previous = spark.createDataFrame(
        [(2, 0, "b2"), (9, 0, "b9")],
        "ledger_id long, segment_first_entry_id long, old_bookie string",
    )
    got = repair_input.requests_from_fragments(frags, previous).orderBy("ledger_id")
    expected = spark.createDataFrame(
        [
            (1, ["b1"], [(10, "b3")], [0, 10], T1, []),
            (2, [], [(0, "b2")], [0], T1, [(0, "b2")]),
            (3, ["b4"], [], [5], T2, []),
        ],
        repair_input.REQUEST_SCHEMA,
    )
    assert_df_equality(got, expected, ignore_nullable=True)


def test_requests_for_bookies_and_ledgers_naming(spark: SparkSession) -> None:
    ledgers = ledgers_df(
        spark,
        [
            metadata(1, [(0, ["a", "b", "c"])], last=9),
            metadata(2, [(0, ["a", "b", "d"]), (5, ["a", "d", "e"])], last=9),
            metadata(3, [(0, ["c", "d", "e"])]),
        ],
    )
    got = repair_input.requests_for_bookies(ledgers, ["d", "e"]).orderBy("ledger_id")
    assert [(r["ledger_id"], r["bad_bookies"]) for r in got.collect()] == [
        (2, ["d", "e"]),
        (3, ["d", "e"]),
    ]
    assert {r["detected_segments"] for r in got.collect()} == {None}
    naming = repair_input.ledgers_naming(ledgers, "b").orderBy("ledger_id").collect()
    assert [(r["ledger_id"], list(r["segments"])) for r in naming] == [(1, [0]), (2, [0])]


def test_actions_table_accepts_concurrent_style_appends(spark: SparkSession, tmp_path) -> None:  # type: ignore[no-untyped-def]
    warehouse = str(tmp_path)
    row = ("r1", "rereplicate", "a1", 5, 0, 9, "b1", "b2", "COPY", 4, 100, None, "DONE", None)
    row += (T1, T2)
    load.append_actions(spark, warehouse, [row])
    load.append_actions(spark, warehouse, [(*row[:1], "recover", *row[2:])])
    got = load.read_table(spark, warehouse, load.ACTIONS)
    assert sorted(r["mode"] for r in got.collect()) == ["recover", "rereplicate"]
