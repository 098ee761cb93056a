"""The Delta tables written by delta-rs (local executor) and by delta-spark (Spark executor) are
one set of tables: each reads the other's, and writers of both kinds appending at once lose
nothing."""

from __future__ import annotations

import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from bklib.states import ActionKind, ActionStatus, Executor, RepairMode, RunStatus
from jobs.spark import load
from jobs.tables import delta
from jobs.tables.runs import RunRecord
from jobs.tables.schema import ACTIONS, ACTIONS_SCHEMA, AUDIT_RUNS

T0 = datetime(2026, 11, 23, 10, 0, tzinfo=timezone.utc)


def _action(run_id: str, ledger_id: int, executor: str) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "mode": RepairMode.REREPLICATE,
        "audit_run_id": "a1",
        "ledger_id": ledger_id,
        "segment_first_entry_id": 0,
        "segment_last_entry_id": 9,
        "old_bookie": "b1",
        "new_bookie": "b2",
        "action": ActionKind.COPY,
        "entries_copied": 5,
        "bytes_copied": 500,
        "no_replica_entries": None,
        "status": ActionStatus.DONE,
        "error": None,
        "started_at": T0,
        "finished_at": T0,
        "executor": executor,
        "topic": None,
    }


def test_each_side_reads_the_other_with_the_same_schema(
    spark: SparkSession, tmp_path: Path
) -> None:
    wh = str(tmp_path)
    local = RunRecord("r-local", T0, "zk:2181", "lost", RunStatus.COMPLETED, T0, {"ledgers": 3})
    local.executor = Executor.LOCAL
    delta.append_rows(wh, AUDIT_RUNS, [local.as_row()])
    remote = RunRecord("r-spark", T0, "zk:2181", "deep", RunStatus.FAILED, T0, {}, "boom")
    load.write_run_record(spark, wh, remote)

    via_spark = {r["run_id"]: r.asDict() for r in load.read_table(spark, wh, AUDIT_RUNS).collect()}
    assert via_spark["r-local"]["counts"] == {"ledgers": 3}
    assert via_spark["r-local"]["executor"] == Executor.LOCAL
    assert via_spark["r-local"]["started_at"].replace(tzinfo=None) == T0.replace(tzinfo=None)
    via_rs = {r["run_id"]: r for r in delta.read_rows(wh, AUDIT_RUNS)}
    assert via_rs["r-spark"]["status"] == RunStatus.FAILED and via_rs["r-spark"]["error"] == "boom"
    assert via_rs["r-spark"]["executor"] == Executor.SPARK
    assert via_rs["r-spark"]["started_at"] == T0
    # One schema, whoever wrote first: the Spark view of the delta-rs table matches ours.
    spark_fields = load.read_table(spark, wh, AUDIT_RUNS).schema.fieldNames()
    assert spark_fields == [f.name for f in load.AUDIT_RUNS_SCHEMA.fields]


def test_concurrent_writers_of_both_kinds_lose_nothing(spark: SparkSession, tmp_path: Path) -> None:
    wh = str(tmp_path)
    errors: list[BaseException] = []
    per_writer = 12

    def rs_writer(k: int) -> None:
        try:
            for i in range(per_writer):
                delta.append_rows(wh, ACTIONS, [_action(f"rs{k}", k * 1000 + i, Executor.LOCAL)])
        except BaseException as exc:  # the assertion below reports it
            errors.append(exc)

    def spark_writer() -> None:
        try:
            names = [f.name for f in ACTIONS_SCHEMA]
            for i in range(4):
                row = _action("sp", 9000 + i, Executor.SPARK)
                load.append_actions(spark, wh, [tuple(row[n] for n in names)])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=rs_writer, args=(k,)) for k in range(2)]
    threads.append(threading.Thread(target=spark_writer))
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    rows = delta.read_rows(wh, ACTIONS)
    want = {k * 1000 + i for k in range(2) for i in range(per_writer)} | {9000, 9001, 9002, 9003}
    assert sorted(r["ledger_id"] for r in rows) == sorted(want)
    assert load.read_table(spark, wh, ACTIONS).count() == len(want)


def test_a_table_whose_first_commit_has_not_landed_does_not_exist_yet(
    spark: SparkSession, tmp_path: Path
) -> None:
    # What a writer that lost the creation race sees: the winner's _delta_log, no commit yet.
    for wh in (tmp_path / "spark", tmp_path / "rs"):
        (wh / ACTIONS / "_delta_log").mkdir(parents=True)
        assert not delta.table_exists(str(wh), ACTIONS)
        assert not load.table_exists(spark, str(wh), ACTIONS)
    assert not delta.wait_for_table(str(tmp_path / "rs"), ACTIONS, timeout=0.3)

    names = [f.name for f in ACTIONS_SCHEMA]
    row = _action("sp", 1, Executor.SPARK)
    load.append_actions(spark, str(tmp_path / "spark"), [tuple(row[n] for n in names)])
    delta.append_rows(str(tmp_path / "rs"), ACTIONS, [_action("rs", 2, Executor.LOCAL)])
    assert [r["ledger_id"] for r in delta.read_rows(str(tmp_path / "spark"), ACTIONS)] == [1]
    assert [r["ledger_id"] for r in delta.read_rows(str(tmp_path / "rs"), ACTIONS)] == [2]

    # The loser waits for the winner's commit rather than failing on an empty log.
    late = tmp_path / "late"
    (late / ACTIONS / "_delta_log").mkdir(parents=True)
    creator = threading.Timer(0.5, delta.append_rows, (str(late), ACTIONS, [_action("w", 3, "x")]))
    creator.start()
    try:
        assert delta.wait_for_table(str(late), ACTIONS, timeout=30)
    finally:
        creator.join()
    assert load.table_exists(spark, str(late), ACTIONS)
