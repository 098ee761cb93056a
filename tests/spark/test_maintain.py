"""``bkaudit maintain`` on real Delta tables: 100 runs written with the table writers, then
partitions and files bounded, the keep rules (latest run per check, open findings, their
repair history, runs still being written), a dry run that changes nothing, and a warehouse
newer than the code refused. One run is written by Spark (delta-spark), the rest by delta-rs:
maintain looks after both alike."""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from bklib.states import ActionKind, ActionStatus, Check, RepairMode, RunStatus
from jobs.cli.main import command_parser
from jobs.cli.main import main as cli_main
from jobs.cli.registry import command
from jobs.commands import maintain
from jobs.commands.listing import list_underreplicated
from jobs.options.units import parse_duration
from jobs.spark import load
from jobs.spark.schema import BOOKIE_SCHEMA, FRAGMENT_SCHEMA, LEDGER_SCHEMA
from jobs.tables import delta, maintenance
from jobs.tables.runs import RunRecord, new_run_id
from jobs.tables.schema import (
    ACTIONS,
    AUDIT_RUNS,
    BOOKIES,
    FRAGMENTS,
    LEDGERS,
    RUN_DATE,
    SCHEMA_VERSION_KEY,
)

NOW = datetime.now(timezone.utc)
KEEP = "30d"
CUTOFF = NOW - timedelta(days=30)
PER_RUN = (FRAGMENTS, LEDGERS, BOOKIES)


def _fragment(run_id: str, check: str, started: datetime, ledger: int) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "check": check,
        "detected_at": started,
        "ledger_id": ledger,
        "segment_index": 0,
        "segment_first_entry_id": 0,
        "segment_last_entry_id": 9,
        "bookie_index": 0,
        "bookie_id": "10.0.0.7:3181",
        "reason": "BOOKIE_LOST",
        "missing_entries": 10,
        "severity": "BELOW_WQ",
        "ledger_state": "CLOSED",
        "first_detected_at": started,
    }


def _action(run_id: str, audit_run: str, ledger: int, status: str, at: datetime) -> dict[str, Any]:
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
        "entries_copied": 10,
        "bytes_copied": 1000,
        "no_replica_entries": None,
        "status": status,
        "error": None,
        "started_at": at,
        "finished_at": at + timedelta(seconds=5),
        "executor": "local",
    }


@dataclass
class Warehouse:
    """A warehouse of audit and repair runs, and the run ids the keep rules are about."""

    path: str
    runs: dict[str, RunRecord] = field(default_factory=dict)
    named: dict[str, str] = field(default_factory=dict)
    with_findings: set[str] = field(default_factory=set)

    def audit(
        self,
        started: datetime,
        check: str = Check.REPLICAS,
        status: str = RunStatus.COMPLETED,
        findings: tuple[int, ...] = (),
        name: str | None = None,
        record: bool = True,
    ) -> str:
        """One audit run, table by table as the local executor writes it."""
        run_id = new_run_id(started)
        rows = [_fragment(run_id, check, started, lid) for lid in findings]
        delta.append_rows(self.path, FRAGMENTS, rows)
        if findings:
            self.with_findings.add(run_id)
        delta.append_rows(self.path, LEDGERS, [{"run_id": run_id, "ledger_id": i} for i in (1, 2)])
        delta.append_rows(
            self.path, BOOKIES, [{"run_id": run_id, "bookie_id": "b1", "state": "writable"}]
        )
        if record:  # False: a run still writing (or that died): no audit_runs row
            run = RunRecord(run_id, started, "zk:2181", check, status, started, {})
            delta.append_rows(self.path, AUDIT_RUNS, [run.as_row()])
            self.runs[run_id] = run
        if name:
            self.named[name] = run_id
        return run_id

    def repair(self, at: datetime, audit_run: str, ledger: int, status: str, name: str) -> str:
        run_id = new_run_id(at)
        delta.append_rows(self.path, ACTIONS, [_action(run_id, audit_run, ledger, status, at)])
        self.named[name] = run_id
        return run_id


def _build(path: Path, runs: int, every_hours: int = 6) -> Warehouse:
    """``runs`` replicas runs every ``every_hours`` hours back from now (a persistent,
    unrepaired finding on ledger 1 in each), plus the runs of the keep rules, 3-45 days old."""
    wh = Warehouse(str(path))
    for i in range(runs):
        started = NOW - timedelta(hours=every_hours * i + 1)
        wh.audit(started, findings=(1,), name="latest replicas" if i == 0 else None)
    day = timedelta(days=1)
    # deep: a single run, 45 days old: the latest of its check, kept.
    wh.audit(NOW - 45 * day, Check.DEEP, name="only deep")
    # sample: a finding on ledger 50, then audits that could not read everything and do not
    # list it, and a repair that failed: open; its last report (S1) is kept.
    wh.audit(NOW - 40 * day, Check.SAMPLE, findings=(50,), name="S1 open")
    wh.audit(NOW - 35 * day, Check.SAMPLE, RunStatus.COMPLETED_WITH_ERRORS, name="S2")
    wh.audit(NOW - 34 * day, Check.SAMPLE, RunStatus.COMPLETED_WITH_ERRORS, name="S3 latest")
    wh.repair(NOW - 38 * day, wh.named["S1 open"], 50, ActionStatus.FAILED, "P failed on S1")
    # lost: a finding on ledger 60 that a repair then fixed: not open; L1 goes.
    wh.audit(NOW - 44 * day, Check.LOST, findings=(60,), name="L1 repaired")
    wh.repair(NOW - 43 * day, wh.named["L1 repaired"], 60, ActionStatus.DONE, "P fixed L1")
    wh.audit(NOW - 42 * day, Check.LOST, RunStatus.COMPLETED_WITH_ERRORS, name="L2 latest")
    wh.repair(NOW - 2 * day, wh.named["latest replicas"], 1, ActionStatus.FAILED, "P recent")
    # Rows of runs with no audit_runs row: one long dead (goes), one being written (stays).
    wh.audit(NOW - 41 * day, findings=(70,), name="orphan", record=False)
    wh.audit(NOW - timedelta(minutes=5), findings=(71,), name="in progress", record=False)
    return wh


def _run_ids(path: str, table: str) -> set[str]:
    return {r["run_id"] for r in delta.read_rows(path, table, columns=["run_id"])}


def _parquet_files(path: str, table: str) -> list[str]:
    root = os.path.join(path, table)
    return [
        os.path.join(d, f)
        for d, _, files in os.walk(root)
        if "_delta_log" not in d
        for f in files
        if f.endswith(".parquet")
    ]


def _partition_dirs(path: str, table: str) -> list[str]:
    return [e for e in os.listdir(os.path.join(path, table)) if e.startswith(f"{RUN_DATE}=")]


def _spark_run(spark: SparkSession, path: str, started: datetime) -> str:
    """One more replicas run, written by delta-spark (the Spark executor's write_run)."""
    run_id = new_run_id(started)
    run = RunRecord(run_id, started, "zk:2181", Check.REPLICAS, RunStatus.COMPLETED, started, {})
    frag = {k: v for k, v in _fragment(run_id, Check.REPLICAS, started, 1).items()}
    fragments = spark.createDataFrame(
        [tuple(frag.get(f.name) for f in FRAGMENT_SCHEMA.fields)], FRAGMENT_SCHEMA
    )
    ledgers = spark.createDataFrame(
        [tuple(1 if f.name == "ledger_id" else None for f in LEDGER_SCHEMA.fields)], LEDGER_SCHEMA
    )
    bookies = spark.createDataFrame(
        [("b1", "writable", None, None, None, None, None)], BOOKIE_SCHEMA
    )
    load.write_run(spark, path, run, ledgers=ledgers, bookies=bookies, fragments=fragments)
    return run_id


@pytest.mark.timeout(900)  # 400 commits; slow when the machine is shared
def test_maintain_bounds_partitions_and_files_of_100_runs_and_keeps_what_it_must(
    tmp_path: Path,
) -> None:
    # Two runs a day for 50 days: more days than --keep, several files per day.
    wh = _build(tmp_path / "wh", runs=100, every_hours=12)
    before_files = len(_parquet_files(wh.path, LEDGERS))
    before_parts = len(_partition_dirs(wh.path, LEDGERS))
    assert before_files >= 108 and before_parts >= 50

    out = io.StringIO()
    reports = maintain.maintain(wh.path, keep=parse_duration(KEEP), vacuum_retention=0.0, out=out)
    text = out.getvalue()

    # Keep rules: recent runs, the latest of each check, the last report of an open finding.
    recent = {i for i, r in wh.runs.items() if r.started_at >= CUTOFF}
    kept = recent | {wh.named[n] for n in ("only deep", "S1 open", "S3 latest", "L2 latest")}
    assert _run_ids(wh.path, AUDIT_RUNS) == kept
    writing = {wh.named["in progress"]}
    assert _run_ids(wh.path, FRAGMENTS) == (kept & wh.with_findings) | writing
    for table in (LEDGERS, BOOKIES):
        assert _run_ids(wh.path, table) == kept | writing, table
    assert wh.named["S2"] not in kept
    assert wh.named["L1 repaired"] not in kept and wh.named["orphan"] not in kept
    # Repair runs: the recent one, and the failed repair that keeps S1's finding open.
    assert _run_ids(wh.path, ACTIONS) == {wh.named["P recent"], wh.named["P failed on S1"]}
    assert "audit runs: " in text and "1 last report" in text

    # Bounded: one partition per day that still has a kept run, one file per partition, and
    # nothing else on disk (vacuumed with zero retention; empty directories removed).
    for table in PER_RUN:
        days = {r[RUN_DATE] for r in delta.read_rows(wh.path, table, columns=[RUN_DATE])}
        files, parts = maintenance.file_stats(wh.path, table)
        assert parts == len(days) <= 36, table
        assert files == parts, table
        assert len(_parquet_files(wh.path, table)) == files, table
        assert len(_partition_dirs(wh.path, table)) == parts, table
    assert maintenance.file_stats(wh.path, AUDIT_RUNS)[0] == 1
    by_name = {r.name: r for r in reports}
    assert by_name[LEDGERS].files_before >= 108
    assert by_name[LEDGERS].partitions_before >= 50 and by_name[LEDGERS].partitions_after <= 36

    # The tables still read as before, through both Delta readers.
    latest = delta.latest_run(wh.path)
    assert latest is not None and latest["run_id"] == wh.named["latest replicas"]
    rows = delta.run_fragments(wh.path, wh.named["latest replicas"])
    assert [r["ledger_id"] for r in rows] == [1]
    assert len(delta.read_rows(wh.path, LEDGERS)) == 2 * len(kept) + 2
    code = list_underreplicated(wh.path, out=io.StringIO())
    assert code == 1  # ledger 1's finding is still there

    # A second pass finds nothing more to delete.
    again = {r.name: r for r in maintain.maintain(wh.path, keep=parse_duration(KEEP), out=out)}
    assert all(r.rows_deleted == 0 for r in again.values())


@pytest.mark.timeout(900)  # a SparkSession; slow when the machine is shared
def test_runs_written_by_spark_are_maintained_alike(spark: SparkSession, tmp_path: Path) -> None:
    wh = Warehouse(str(tmp_path / "wh"))
    old = _spark_run(spark, wh.path, NOW - timedelta(days=35))  # delta-spark's files
    recent = wh.audit(NOW - timedelta(days=1), findings=(1,))
    maintain.maintain(wh.path, keep=parse_duration(KEEP), vacuum_retention=0.0, out=io.StringIO())
    for table in (AUDIT_RUNS, *PER_RUN):
        assert _run_ids(wh.path, table) == {recent}, table
    assert old not in _run_ids(wh.path, LEDGERS)
    assert _partition_dirs(wh.path, LEDGERS) == [f"{RUN_DATE}={(NOW - timedelta(days=1)).date()}"]
    # Spark reads what maintain left.
    assert load.read_table(spark, wh.path, LEDGERS).count() == 2


def _snapshot(path: str) -> dict[str, Any]:
    """Every file under the warehouse with its size, and each table's Delta version."""
    files = {}
    for d, _, names in os.walk(path):
        for n in names:
            full = os.path.join(d, n)
            files[os.path.relpath(full, path)] = os.path.getsize(full)
    versions = {t: delta.open_table(path, t).version() for t in (AUDIT_RUNS, *PER_RUN, ACTIONS)}
    return {"files": files, "versions": versions}


def test_dry_run_changes_nothing_and_says_what_it_would_do(tmp_path: Path) -> None:
    wh = _build(tmp_path / "wh", runs=12)
    before = _snapshot(wh.path)
    out = io.StringIO()
    args = command_parser(command("maintain")).parse_args(
        ["--warehouse", wh.path, "--keep", KEEP, "--dry-run", "--vacuum-retention", "0s"]
    )
    assert maintain.run_maintain(args, out=out) == 0
    assert _snapshot(wh.path) == before
    text = out.getvalue()
    assert "(dry run: nothing changes)" in text
    lines = {line.split(":")[0]: line for line in text.splitlines()}
    # S2, L1 and their rows would go; the old orphan's rows too.
    assert lines[AUDIT_RUNS].startswith(f"{AUDIT_RUNS}: would delete 2 rows")
    assert lines[FRAGMENTS].startswith(f"{FRAGMENTS}: would delete 2 rows")  # L1's and orphan's
    assert lines[LEDGERS].startswith(f"{LEDGERS}: would delete 6 rows")  # S2, L1, orphan
    assert lines[ACTIONS].startswith(f"{ACTIONS}: would delete 1 rows")  # the fix of L1
    assert "would vacuum 0 files" in lines[LEDGERS]


def test_refuses_a_warehouse_newer_than_the_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wh = _build(tmp_path / "wh", runs=2)
    delta.open_table(wh.path, LEDGERS).alter.set_table_properties(
        {SCHEMA_VERSION_KEY: "3"}, raise_if_not_exists=False
    )
    before = _snapshot(wh.path)
    assert cli_main(["maintain", "--warehouse", wh.path, "--keep", "1d"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("maintain: Delta table ")
    assert "schema version 3, newer than this bkaudit's 2" in err[0]
    assert _snapshot(wh.path) == before
    with pytest.raises(delta.SchemaVersionError):
        delta.read_rows(wh.path, LEDGERS)
    with pytest.raises(delta.SchemaVersionError):
        delta.append_rows(wh.path, LEDGERS, [{"run_id": "x", "ledger_id": 1}])
    assert list_underreplicated(wh.path, out=io.StringIO()) == 2  # reads ledgers: refused


def test_keep_must_be_at_least_a_day(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wh = _build(tmp_path / "wh", runs=1)
    args = command_parser(command("maintain")).parse_args(["--warehouse", wh.path, "--keep", "12h"])
    assert maintain.run_maintain(args) == 2
    assert capsys.readouterr().err == "maintain: --keep must be at least 1d (got 43200s)\n"
