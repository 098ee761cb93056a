"""A version-1 warehouse (tables partitioned by run_id, actions by mode, no properties), as the
previous bkaudit wrote it through delta-rs and delta-spark: the new writers keep appending to
it in its own layout, and ``bkaudit maintain --migrate`` relays it out by run_date without
losing a row, records the properties and the schema version, and is a no-op the second time.
Both Delta readers and writers work on the result."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from bklib.states import ActionKind, ActionStatus, Check, RepairMode, RunStatus
from jobs.cli.main import main as cli_main
from jobs.spark import load
from jobs.spark.schema import BOOKIE_SCHEMA, FRAGMENT_SCHEMA, LEDGER_SCHEMA, spark_schema
from jobs.tables import delta
from jobs.tables.migrate import plan
from jobs.tables.runs import RunRecord, new_run_id
from jobs.tables.schema import (
    ACTIONS,
    AUDIT_RUNS,
    BOOKIES,
    FRAGMENTS,
    LEDGERS,
    PARTITION_BY,
    RUN_DATE,
    SCHEMA_VERSION,
    SCHEMA_VERSION_KEY,
    TABLE_PROPERTIES,
    TABLE_SCHEMAS,
    TRIAGE,
)
from tests.audit_helpers import spark as spark  # the session fixture

pytestmark = pytest.mark.integration

NOW = datetime.now(timezone.utc).replace(microsecond=0)
OLD_PARTITIONS = {
    LEDGERS: ["run_id"],
    BOOKIES: ["run_id"],
    FRAGMENTS: ["run_id"],
    ACTIONS: ["mode"],
}
TABLES = (AUDIT_RUNS, LEDGERS, BOOKIES, FRAGMENTS, ACTIONS, TRIAGE)


def _v1_schema(table: str) -> pa.Schema:
    """The table's schema before run_date existed."""
    schema = TABLE_SCHEMAS[table]
    return pa.schema([f for f in schema if f.name != RUN_DATE])


def _v1_append(path: str, table: str, rows: list[dict[str, Any]]) -> None:
    """The previous bkaudit's delta-rs append: run_id partitions, no table properties."""
    data = pa.Table.from_pylist(rows, schema=_v1_schema(table))
    write_deltalake(
        f"{path}/{table}",
        data,
        mode="append",
        partition_by=OLD_PARTITIONS.get(table) or None,
        schema_mode="merge",
    )


def _fragment(run_id: str, started: datetime, ledger: int) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "check": Check.REPLICAS,
        "detected_at": started,
        "ledger_id": ledger,
        "segment_index": 0,
        "segment_first_entry_id": 0,
        "segment_last_entry_id": 9,
        "bookie_index": 1,
        "bookie_id": "10.0.0.7:3181",
        "reason": "ENTRIES_MISSING",
        "missing_entries": 3,
        "missing_ranges": [{"first_entry_id": 2, "last_entry_id": 4}],
        "severity": "BELOW_WQ",
        "first_detected_at": started,
    }


def _action(run_id: str, audit_run: str, ledger: int, at: datetime) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "mode": RepairMode.REREPLICATE,
        "audit_run_id": audit_run,
        "ledger_id": ledger,
        "segment_first_entry_id": 0,
        "segment_last_entry_id": 9,
        "old_bookie": "10.0.0.7:3181",
        "new_bookie": "10.0.0.8:3181",
        "action": ActionKind.COPY,
        "entries_copied": 3,
        "bytes_copied": 300,
        "no_replica_entries": [5],
        "status": ActionStatus.DONE,
        "error": None,
        "started_at": at,
        "finished_at": at + timedelta(seconds=1),
        "executor": "local",
        "topic": None,
    }


def _v1_audit(path: str, started: datetime, ledgers: int, record: bool = True) -> str:
    run_id = new_run_id(started)
    _v1_append(path, FRAGMENTS, [_fragment(run_id, started, i) for i in range(ledgers)])
    _v1_append(path, LEDGERS, [{"run_id": run_id, "ledger_id": i} for i in range(ledgers)])
    _v1_append(path, BOOKIES, [{"run_id": run_id, "bookie_id": "b1", "state": "writable"}])
    if record:
        run = RunRecord(run_id, started, "zk:2181", Check.REPLICAS, RunStatus.COMPLETED, started)
        _v1_append(path, AUDIT_RUNS, [run.as_row()])
    return run_id


def _v1_spark_audit(spark: SparkSession, path: str, started: datetime) -> str:
    """The previous bkaudit's Spark append: ``partitionBy("run_id")``, mergeSchema."""
    run_id = new_run_id(started)
    for table, rows in (
        (FRAGMENTS, [_fragment(run_id, started, 100)]),
        (LEDGERS, [{"run_id": run_id, "ledger_id": 100}]),
    ):
        schema = spark_schema(_v1_schema(table))
        df = spark.createDataFrame(
            [tuple(r.get(f) for f in schema.fieldNames()) for r in rows], schema
        )
        df.write.format("delta").mode("append").option("mergeSchema", "true").partitionBy(
            "run_id"
        ).save(f"{path}/{table}")
    run = RunRecord(run_id, started, "zk:2181", Check.REPLICAS, RunStatus.COMPLETED, started)
    load.write_run_record(spark, path, run)  # audit_runs: unpartitioned then and now
    return run_id


def _all_rows(path: str) -> dict[str, list[str]]:
    """Every row of every table, without run_date, in a comparable form."""
    out = {}
    for table in TABLES:
        rows = delta.read_rows(path, table)
        out[table] = sorted(
            repr(sorted((k, v) for k, v in r.items() if k != RUN_DATE)) for r in rows
        )
    return out


@pytest.mark.timeout(900)  # a SparkSession; slow when the machine is shared
def test_old_layout_warehouse_is_appended_to_then_migrated_without_losing_a_row(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wh = str(tmp_path / "wh")
    days = [NOW - timedelta(days=d, hours=2) for d in (9, 5, 1)]
    runs = [_v1_audit(wh, t, ledgers=3 + i) for i, t in enumerate(days)]
    orphan = _v1_audit(wh, NOW - timedelta(days=7), ledgers=1, record=False)
    spark_run = _v1_spark_audit(spark, wh, NOW - timedelta(days=3))
    repair = new_run_id(days[1] + timedelta(hours=1))
    _v1_append(
        wh, ACTIONS, [_action(repair, runs[1], i, days[1] + timedelta(hours=1)) for i in range(3)]
    )
    _v1_append(
        wh,
        TRIAGE,
        [
            {
                "run_id": "t1",
                "triaged_at": NOW,
                "ledger_id": 1,
                "class": "WQ1",
                "audit_run_id": runs[2],
            }
        ],
    )
    for table, parts in OLD_PARTITIONS.items():
        assert DeltaTable(f"{wh}/{table}").metadata().partition_columns == parts

    # Until migrated, the new writers append in the old layout (and add run_date).
    new_local = new_run_id(NOW - timedelta(hours=1))
    delta.append_rows(wh, LEDGERS, [{"run_id": new_local, "ledger_id": 7}])
    delta.append_rows(wh, ACTIONS, [_action("rep-2", new_local, 7, NOW - timedelta(minutes=30))])
    load.append_actions(
        spark,
        wh,
        [tuple(_action("rep-3", new_local, 8, NOW)[f] for f in load.ACTIONS_SCHEMA.fieldNames())],
    )
    assert DeltaTable(f"{wh}/{LEDGERS}").metadata().partition_columns == ["run_id"]
    assert {s.name for s in plan(wh) if s.relayout} == set(OLD_PARTITIONS)

    before = _all_rows(wh)
    versions = {t: DeltaTable(f"{wh}/{t}").version() for t in TABLES}
    assert (
        cli_main(["maintain", "--warehouse", wh, "--migrate", "--keep", "3650d", "--dry-run"]) == 0
    )
    assert {t: DeltaTable(f"{wh}/{t}").version() for t in TABLES} == versions
    assert "migrate ledgers: would repartition 15 rows by run_date (was run_id)" in (
        capsys.readouterr().out
    )

    assert cli_main(["maintain", "--warehouse", wh, "--migrate", "--keep", "3650d"]) == 0
    out = capsys.readouterr().out
    assert "migrate ledgers: repartition 15 rows by run_date (was run_id)" in out
    assert "migrate replication_actions: repartition 5 rows by run_date (was mode)" in out
    assert "migrate audit_runs: set table properties and schema version" in out

    # Not a row lost or changed, every table in the current layout with its properties.
    assert _all_rows(wh) == before
    for table in TABLES:
        meta = DeltaTable(f"{wh}/{table}").metadata()
        assert meta.partition_columns == PARTITION_BY[table], table
        config = dict(meta.configuration)
        assert config[SCHEMA_VERSION_KEY] == str(SCHEMA_VERSION), table
        assert all(config[k] == v for k, v in TABLE_PROPERTIES.items()), table
    assert plan(wh) == []

    # run_date: the audit run's day; the orphan's from detected_at; a repair run's first action.
    def day_of(table: str) -> dict[str, date]:
        rows = delta.read_rows(wh, table, columns=["run_id", RUN_DATE])
        got: dict[str, set[date]] = {}
        for r in rows:
            got.setdefault(r["run_id"], set()).add(r[RUN_DATE])
        assert all(len(v) == 1 for v in got.values()), got
        return {k: v.pop() for k, v in got.items()}

    want = {rid: t.date() for rid, t in zip(runs, days, strict=True)}
    want[orphan] = (NOW - timedelta(days=7)).date()
    want[spark_run] = (NOW - timedelta(days=3)).date()
    assert day_of(FRAGMENTS) == want
    assert day_of(LEDGERS) == {**want, new_local: (NOW - timedelta(hours=1)).date()}
    assert day_of(ACTIONS) == {
        repair: (days[1] + timedelta(hours=1)).date(),
        "rep-2": (NOW - timedelta(minutes=30)).date(),
        "rep-3": NOW.date(),
    }

    # Both Delta engines read and append to the migrated tables; run_id filters still work.
    assert load.read_table(spark, wh, LEDGERS).count() == 15
    assert [r["ledger_id"] for r in delta.run_fragments(wh, runs[0])] == [0, 1, 2]
    later = RunRecord(new_run_id(NOW), NOW, "zk:2181", Check.LOST, RunStatus.COMPLETED, NOW)
    fragments = spark.createDataFrame([], FRAGMENT_SCHEMA)
    ledgers = spark.createDataFrame([], LEDGER_SCHEMA)
    bookies = spark.createDataFrame([], BOOKIE_SCHEMA)
    load.write_run(spark, wh, later, ledgers=ledgers, bookies=bookies, fragments=fragments)
    delta.append_rows(wh, LEDGERS, [{"run_id": "after", "ledger_id": 9}], run_date=NOW.date())
    assert DeltaTable(f"{wh}/{LEDGERS}").metadata().partition_columns == [RUN_DATE]
    assert delta.latest_run(wh)["run_id"] == later.run_id  # type: ignore[index]

    # Migrating again does nothing.
    assert cli_main(["maintain", "--warehouse", wh, "--migrate", "--keep", "3650d"]) == 0
    assert "migrate " not in capsys.readouterr().out


def test_migration_run_dates_when_audit_runs_says_nothing(tmp_path: Path) -> None:
    """Ledgers of a run with no audit_runs row and an id without a time stamp: today (the
    next maintain's orphan rule removes them after --keep)."""
    wh = str(tmp_path / "wh")
    _v1_append(wh, LEDGERS, [{"run_id": "custom-id", "ledger_id": 1}])
    before = datetime.now(timezone.utc).date()
    assert cli_main(["maintain", "--warehouse", wh, "--migrate", "--keep", "30d"]) == 0
    after = datetime.now(timezone.utc).date()  # the run may straddle midnight
    rows = delta.read_rows(wh, LEDGERS)
    assert [r["run_id"] for r in rows] == ["custom-id"]
    assert rows[0][RUN_DATE] in (before, after)
