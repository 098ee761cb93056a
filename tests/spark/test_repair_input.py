"""The DataFrame glue that feeds the repair (chispa, real local Spark)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from pyspark.sql import SparkSession

from bklib.states import ActionKind, ActionStatus, RepairMode
from jobs.spark import load, repair_input
from jobs.tables.schema import ACTIONS
from tests.audit_helpers import ledgers_df, metadata

T1, T2 = datetime(2026, 11, 1, 10, 0), datetime(2026, 11, 1, 11, 0)


def test_ledgers_with_bookies(spark: SparkSession) -> None:
    ledgers = ledgers_df(
        spark,
        [
            metadata(1, [(0, ["a", "b", "c"])], last=9),
            metadata(2, [(0, ["a", "b", "d"]), (5, ["a", "d", "e"])], last=9),
            metadata(3, [(0, ["c", "d", "e"])]),
        ],
    )
    got = repair_input.ledgers_with_bookies(ledgers, ["d", "e"]).orderBy("ledger_id").collect()
    assert [(r["ledger_id"], sorted(r["named"])) for r in got] == [
        (2, ["a", "b", "d", "e"]),
        (3, ["c", "d", "e"]),
    ]


def test_actions_table_accepts_concurrent_style_appends(
    spark: SparkSession, tmp_path: Path
) -> None:
    warehouse = str(tmp_path)
    row = ("r1", RepairMode.REREPLICATE, "a1", 5, 0, 9, "b1", "b2", ActionKind.COPY, 4, 100, None)
    row += (ActionStatus.DONE, None, T1, T2, "spark")
    load.append_actions(spark, warehouse, [row])
    load.append_actions(spark, warehouse, [(*row[:1], RepairMode.RECOVER, *row[2:])])
    got = load.read_table(spark, warehouse, ACTIONS)
    assert sorted(r["mode"] for r in got.collect()) == [RepairMode.RECOVER, RepairMode.REREPLICATE]
