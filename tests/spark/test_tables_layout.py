"""delta-spark and delta-rs create the same tables: schema (names, types, nullability, order),
partitioning by run_date, retention properties, schema version and protocol; and a run's rows
land in its day's partition whichever writer wrote them."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from bklib.states import ActionKind, ActionStatus, Check, RepairMode, RunStatus
from jobs.spark import load
from jobs.spark.schema import BOOKIE_SCHEMA, FRAGMENT_SCHEMA, LEDGER_SCHEMA
from jobs.tables import delta
from jobs.tables.runs import RunRecord
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
)

# 23:30 UTC: a run that starts late in the day keeps that day, whenever its rows are written.
STARTED = datetime.now(timezone.utc).replace(hour=23, minute=30, second=0, microsecond=0) - (
    timedelta(days=3)
)
RUN_ID = "custom-run"  # not a bkaudit-made id: the day must come from the run, not the id
TABLES = (AUDIT_RUNS, LEDGERS, BOOKIES, FRAGMENTS, ACTIONS)


def _fragment() -> dict[str, Any]:
    return {
        "ledger_id": 5,
        "segment_index": 0,
        "segment_first_entry_id": 0,
        "segment_last_entry_id": 9,
        "bookie_index": 0,
        "bookie_id": "b1",
        "reason": "BOOKIE_LOST",
    }


def _action() -> dict[str, Any]:
    return {
        "run_id": "repair-1",
        "mode": RepairMode.REREPLICATE,
        "audit_run_id": RUN_ID,
        "ledger_id": 5,
        "segment_first_entry_id": 0,
        "segment_last_entry_id": 9,
        "old_bookie": "b1",
        "new_bookie": "b2",
        "action": ActionKind.COPY,
        "entries_copied": 1,
        "bytes_copied": 10,
        "no_replica_entries": None,
        "status": ActionStatus.DONE,
        "error": None,
        "started_at": STARTED,
        "finished_at": STARTED,
        "executor": "x",
        "topic": None,
    }


def _write_local(wh: str, run: RunRecord) -> None:
    """As the local executor writes a run (fragments carry detected_at, the run's start)."""
    frag = {"run_id": RUN_ID, "check": run.check, "detected_at": STARTED, **_fragment()}
    delta.append_rows(wh, FRAGMENTS, [frag], run_date=STARTED.date())
    delta.append_rows(wh, LEDGERS, [{"run_id": RUN_ID, "ledger_id": 5}], run_date=STARTED.date())
    delta.append_rows(
        wh,
        BOOKIES,
        [{"run_id": RUN_ID, "bookie_id": "b1", "state": "lost"}],
        run_date=STARTED.date(),
    )
    delta.append_rows(wh, AUDIT_RUNS, [run.as_row()])
    delta.append_rows(wh, ACTIONS, [_action()])


def _write_spark(spark: SparkSession, wh: str, run: RunRecord) -> None:
    frag = _fragment()
    fragments = spark.createDataFrame(
        [tuple(frag.get(f.name) for f in FRAGMENT_SCHEMA.fields)], FRAGMENT_SCHEMA
    )
    ledgers = spark.createDataFrame(
        [tuple(5 if f.name == "ledger_id" else None for f in LEDGER_SCHEMA.fields)], LEDGER_SCHEMA
    )
    bookies = spark.createDataFrame([("b1", "lost", None, None, None, None, None)], BOOKIE_SCHEMA)
    load.write_run(spark, wh, run, ledgers=ledgers, bookies=bookies, fragments=fragments)
    action = _action()
    load.append_actions(spark, wh, [tuple(action[f] for f in load.ACTIONS_SCHEMA.fieldNames())])


def _layout(wh: str, table: str) -> dict[str, Any]:
    t = DeltaTable(f"{wh}/{table}")
    meta = t.metadata()
    fields = [
        (f["name"], json.dumps(f["type"], sort_keys=True), f["nullable"])
        for f in json.loads(t.schema().to_json())["fields"]
    ]
    proto = t.protocol()
    return {
        "fields": fields,
        "partitions": list(meta.partition_columns),
        "properties": dict(meta.configuration),
        "protocol": (proto.min_reader_version, proto.min_writer_version),
    }


@pytest.mark.timeout(900)  # a SparkSession; slow when the machine is shared
def test_both_writers_create_the_same_tables(spark: SparkSession, tmp_path: Path) -> None:
    run = RunRecord(RUN_ID, STARTED, "zk:2181", Check.LOST, RunStatus.COMPLETED, STARTED)
    local, remote = str(tmp_path / "local"), str(tmp_path / "spark")
    _write_local(local, run)
    _write_spark(spark, remote, run)
    for table in TABLES:
        a, b = _layout(local, table), _layout(remote, table)
        assert a == b, table
        assert a["partitions"] == PARTITION_BY[table]
        assert a["properties"] == {**TABLE_PROPERTIES, SCHEMA_VERSION_KEY: str(SCHEMA_VERSION)}
        assert a["protocol"] == (1, 2)
        if PARTITION_BY[table]:
            for wh in (local, remote):
                days = {r[RUN_DATE] for r in delta.read_rows(wh, table, columns=[RUN_DATE])}
                assert days == {STARTED.date()}, (wh, table)
    # Each reads the other's: the Spark view of the delta-rs tables, filtered by run_id.
    rows = load.run_fragments(spark, local, RUN_ID).collect()
    assert [(r["ledger_id"], r[RUN_DATE]) for r in rows] == [(5, STARTED.date())]
    assert [r["ledger_id"] for r in delta.run_fragments(remote, RUN_ID)] == [5]
