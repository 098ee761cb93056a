"""``bkaudit maintain``'s Delta operations, through delta-rs (no JVM): read what retention
needs, delete rows, compact small files, vacuum, checkpoint, and remove emptied partition
directories (docs/tables.md). What to delete is decided by :mod:`jobs.tables.retention`;
the order of the steps is :mod:`jobs.commands.maintain`'s.

A lost commit race (a writer appending meanwhile) is retried; any other delta-rs error
becomes a one-line :class:`~jobs.tables.delta.TableError` naming the table.
"""

from __future__ import annotations

import os
import re
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

import pyarrow as pa

from jobs.tables import delta
from jobs.tables.retention import (
    AuditRun,
    Deletion,
    RetentionPlan,
    latest_per_check,
    open_finding_candidates,
    open_finding_runs,
    plan_retention,
    repair_runs,
)
from jobs.tables.rust_panics import quiet_rust_panics
from jobs.tables.schema import (
    ACTIONS,
    AUDIT_RUNS,
    BLAST_RADIUS,
    FRAGMENTS,
    PARTITION_BY,
    PULSAR_CHECKS,
    PULSAR_REFERENCES,
    TRIAGE,
    run_day,
)

__all__ = [
    "MaintainError",
    "TableReport",
    "compact",
    "delete_rows",
    "file_stats",
    "read_retention_plan",
    "remove_empty_dirs",
    "run_days",
    "small_files",
    "vacuum",
]


class MaintainError(RuntimeError):
    """Maintenance cannot proceed; the message says why in one line."""


TARGET_FILE_SIZE = 100 * 1024 * 1024
"""Compaction's target file size (delta-rs's default; ``delta.targetFileSize`` overrides)."""


@dataclass
class TableReport:
    """What maintenance did (or would do) to one table."""

    name: str
    rows_deleted: int = 0
    files_before: int = 0
    partitions_before: int = 0
    files_compacted: int = 0
    files_written: int = 0
    files_vacuumed: int = 0
    files_after: int = 0
    partitions_after: int = 0
    dirs_removed: int = 0

    def line(self, dry_run: bool) -> str:
        verb = "would delete" if dry_run else "deleted"
        text = f"{self.name}: {verb} {self.rows_deleted} rows"
        if dry_run:
            text += f"; would compact {self.files_compacted} small files"
            text += f"; would vacuum {self.files_vacuumed} files"
            return f"{text}; {self.files_before} files in {self.partitions_before} partitions"
        text += f"; compacted {self.files_compacted} files into {self.files_written}"
        text += f"; vacuumed {self.files_vacuumed} files"
        return (
            f"{text}; {self.files_before} -> {self.files_after} files, "
            f"{self.partitions_before} -> {self.partitions_after} partitions"
        )


def file_stats(warehouse: str, name: str) -> tuple[int, int]:
    """(data files, partitions) of the table's current version, from its Delta log."""
    table = delta.open_table(warehouse, name)
    adds = pa.table(table.get_add_actions(flatten=True))
    parts = [c for c in adds.column_names if c.startswith("partition.")]
    if not parts:
        return adds.num_rows, 1 if adds.num_rows else 0
    keys = set(zip(*(adds.column(c).to_pylist() for c in parts), strict=True))
    return adds.num_rows, len(keys)


def small_files(warehouse: str, name: str, target: int) -> int:
    """Files a compaction would rewrite: those below ``target`` bytes in a partition with
    more than one of them."""
    adds = pa.table(delta.open_table(warehouse, name).get_add_actions(flatten=True))
    parts = [c for c in adds.column_names if c.startswith("partition.")]
    keys = (
        list(zip(*(adds.column(c).to_pylist() for c in parts), strict=True))
        if parts
        else [()] * adds.num_rows
    )
    small: dict[tuple[Any, ...], int] = defaultdict(int)
    for key, size in zip(keys, adds.column("size_bytes").to_pylist(), strict=True):
        if size < target:
            small[key] += 1
    return sum(n for n in small.values() if n > 1)


def delete_rows(warehouse: str, deletion: Deletion, dry_run: bool) -> int:
    """Delete ``deletion``'s rows, one commit per predicate; rows deleted (with ``dry_run``,
    counted and left). A version-1 table (no ``run_date``) loses only the runs named."""
    from deltalake.exceptions import CommitFailedError, DeltaError

    if deletion.empty() or not delta.table_exists(warehouse, deletion.table):
        return 0
    info = delta.table_info(warehouse, deletion.table)
    if info is None:
        return 0
    columns = [f.name for f in delta.open_table(warehouse, deletion.table).schema().fields]
    if deletion.before is not None and (not info.current_layout or "run_date" not in columns):
        # A version-1 table has no run_date to go by: only the runs named.
        deletion = Deletion(deletion.table, deletion.run_ids)
    if deletion.empty():
        return 0
    if dry_run:
        dataset = delta.arrow_dataset(warehouse, deletion.table)
        return int(dataset.count_rows(filter=deletion.expression()))
    deleted = 0
    for predicate in deletion.predicates():
        for attempt in range(delta.COMMIT_RETRIES):
            try:
                with quiet_rust_panics():
                    metrics = delta.open_table(warehouse, deletion.table).delete(predicate)
                deleted += int(metrics.get("num_deleted_rows", 0) or 0)
                break
            except CommitFailedError:
                time.sleep(0.2 * (attempt + 1))
            except DeltaError as exc:
                raise delta.table_error(info.path, exc) from exc
        else:
            raise MaintainError(f"{info.path}: delete kept losing commit races; try again")
    return deleted


def compact(warehouse: str, name: str, dry_run: bool) -> tuple[int, int]:
    """Compact table ``name``'s small files: (files rewritten, files written); with
    ``dry_run``, (files a compaction would rewrite, 0)."""
    from deltalake.exceptions import CommitFailedError, DeltaError

    if dry_run:
        return small_files(warehouse, name, TARGET_FILE_SIZE), 0
    for attempt in range(delta.COMMIT_RETRIES):
        try:
            with quiet_rust_panics():
                m = delta.open_table(warehouse, name).optimize.compact()
            return int(m.get("numFilesRemoved", 0)), int(m.get("numFilesAdded", 0))
        except CommitFailedError:  # a writer's commit touched the same files: again
            time.sleep(0.2 * (attempt + 1))
        except DeltaError as exc:
            raise delta.table_error(delta.table_path(warehouse, name), exc) from exc
    raise MaintainError(f"{delta.table_path(warehouse, name)}: compaction kept losing races")


def vacuum(warehouse: str, name: str, retention: float | None, dry_run: bool) -> int:
    """Files vacuumed (or that would be); then, for real, a checkpoint and the log cleanup."""
    from deltalake.exceptions import DeltaError

    path = delta.table_path(warehouse, name)
    table = delta.open_table(warehouse, name)
    hours = None if retention is None else int(retention // 3600)
    enforce = hours is None or hours >= _table_retention_hours(table)
    try:
        with quiet_rust_panics():
            files = table.vacuum(
                retention_hours=hours, dry_run=dry_run, enforce_retention_duration=enforce
            )
            if not dry_run:
                table = delta.open_table(warehouse, name)
                table.create_checkpoint()
                table.cleanup_metadata()
    except DeltaError as exc:
        raise delta.table_error(path, exc) from exc
    return len(files)


def _table_retention_hours(table: Any) -> int:
    raw = str(
        dict(table.metadata().configuration).get("delta.deletedFileRetentionDuration")
        or "interval 7 days"
    )
    m = re.fullmatch(r"\s*interval\s+(\d+)\s+(\w+?)s?\s*", raw.lower())
    if not m:
        return 168
    n, unit = int(m.group(1)), m.group(2)
    per = {"second": 1 / 3600, "minute": 1 / 60, "hour": 1, "day": 24, "week": 168}
    return int(n * per.get(unit, 24))


def remove_empty_dirs(warehouse: str, name: str, before: date) -> int:
    """Remove a local table's empty partition directories: ``run_date=`` days up to
    ``before``, the retention cutoff's day (its runs older than the cutoff were deleted, and a
    writer recreates a directory it needs), and old-layout ones (``run_id=``, ``mode=``) the
    current partitioning no longer uses."""
    path = delta.table_path(warehouse, name)
    if "://" in path and not path.startswith("file://"):
        return 0
    root = path.removeprefix("file://")
    removed = 0
    for entry in sorted(os.listdir(root)) if os.path.isdir(root) else ():
        col, sep, value = entry.partition("=")
        full = os.path.join(root, entry)
        if not sep or not os.path.isdir(full):
            continue
        # Hadoop's local file system leaves a hidden .crc next to each file delta-spark
        # wrote; vacuum deletes the data files only. A directory of just those is empty.
        left = os.listdir(full)
        if any(not (n.startswith(".") and n.endswith(".crc")) for n in left):
            continue
        stale = col not in PARTITION_BY[name]
        if col == "run_date":
            try:
                stale = date.fromisoformat(value) <= before
            except ValueError:
                stale = False
        if stale:
            try:
                for n in left:
                    os.remove(os.path.join(full, n))
                os.rmdir(full)
                removed += 1
            except OSError:  # a writer just put a file there: keep it
                pass
    return removed


def read_retention_plan(warehouse: str, cutoff: datetime) -> RetentionPlan:
    """Read what retention needs (audit_runs, the candidates' fragments, the actions, the
    blast_radius and triage run times) and plan."""
    runs = [
        AuditRun.from_row(r)
        for r in delta.read_rows(
            warehouse, AUDIT_RUNS, columns=["run_id", "check", "status", "started_at"]
        )
    ]
    actions = delta.read_rows(
        warehouse,
        ACTIONS,
        columns=["run_id", "mode", "audit_run_id", "ledger_id", "action", "status", "started_at"],
    )
    key_cols = ["run_id", "ledger_id", "segment_first_entry_id", "bookie_id"]
    candidates = [r.run_id for r in open_finding_candidates(runs)]
    fragments = (
        delta.read_rows(
            warehouse, FRAGMENTS, columns=key_cols, filters=[("run_id", "in", candidates)]
        )
        if candidates
        else []
    )
    open_runs = open_finding_runs(runs, fragments, actions)
    # The ledgers of kept runs older than the cutoff, for their repair history.
    kept_first = {**latest_per_check(runs), **open_runs}
    old = [r.run_id for r in runs if r.run_id in kept_first and r.started_at < cutoff]
    kept_ledgers: dict[str, set[int]] = defaultdict(set)
    if old:
        for f in delta.read_rows(
            warehouse, FRAGMENTS, columns=["run_id", "ledger_id"], filters=[("run_id", "in", old)]
        ):
            kept_ledgers[f["run_id"]].add(int(f["ledger_id"]))
    other: dict[str, dict[str, datetime]] = {}
    for table, column in (
        (BLAST_RADIUS, "computed_at"),
        (TRIAGE, "triaged_at"),
        (PULSAR_CHECKS, "started_at"),
        (PULSAR_REFERENCES, "detected_at"),
    ):
        times: dict[str, datetime] = {}
        for r in delta.read_rows(warehouse, table, columns=["run_id", column]):
            t = r[column]
            if t is not None and (r["run_id"] not in times or t < times[r["run_id"]]):
                times[r["run_id"]] = t
        other[table] = times
    return plan_retention(
        runs,
        cutoff=cutoff,
        open_runs=open_runs,
        actions=actions,
        kept_run_ledgers=kept_ledgers,
        other_runs=other,
    )


def run_days(warehouse: str) -> dict[str, date]:
    """Each audit and repair run's day (the ``run_date`` partition its rows are in), which
    :func:`~jobs.tables.retention.deletions` needs to name the runs a partition rule misses."""
    days: dict[str, date] = {}
    for row in delta.read_rows(warehouse, AUDIT_RUNS, columns=["run_id", "started_at"]):
        days[row["run_id"]] = run_day(row["started_at"])
    for p in repair_runs(
        delta.read_rows(
            warehouse,
            ACTIONS,
            columns=["run_id", "mode", "audit_run_id", "ledger_id", "started_at"],
        )
    ):
        days[p.run_id] = run_day(p.started_at)
    return days
