"""``bkaudit maintain``: keep the Delta tables of a warehouse healthy (docs/tables.md).

    bkaudit maintain --warehouse W [--keep 30d] [--dry-run] [--migrate] [--vacuum-retention D]

In order, through delta-rs (no JVM):

1. refuse a warehouse written by a newer bkaudit (any table's schema version above this
   code's): one line, exit 2;
2. with ``--migrate``, relay version-1 tables (partitioned by ``run_id``) out by ``run_date``
   and set their properties (:mod:`jobs.tables.migrate`); without it, say which tables need it;
3. delete the runs older than ``--keep``, except those :func:`plan_retention` keeps: the latest
   run of each check, every run holding the last report of an open finding, and the repair
   runs those runs' reports depend on;
4. compact each table's small files (one partition a day, so a day of hourly runs becomes
   a file or two);
5. vacuum the files no version within ``delta.deletedFileRetentionDuration`` references,
   checkpoint the log and drop log entries older than ``delta.logRetentionDuration``, and
   remove the partition directories left empty.

``--dry-run`` reads everything and prints what it would do; it changes nothing.
Exit status: 0 done (or planned), 2 on error.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from typing import Any, TextIO

from bklib.states import RunStatus
from jobs.options.units import parse_duration
from jobs.runtime.messages import one_line

__all__ = [
    "AuditRun",
    "Deletion",
    "MaintainError",
    "RetentionPlan",
    "add_maintain_arguments",
    "build_parser",
    "main",
    "open_finding_runs",
    "plan_retention",
    "run_maintain",
]

log = logging.getLogger("jobs.commands.maintain")

MIN_KEEP = timedelta(days=1)
"""The shortest ``--keep``: rows of a run still being written (no ``audit_runs`` row yet)
are never in a partition this old."""

DELETE_CHUNK = 500
"""Run ids per delete commit (keeps each predicate a reasonable size)."""


class MaintainError(RuntimeError):
    """Maintenance cannot proceed; the message says why in one line."""


DEFAULT_KEEP = "30d"


def add_maintain_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The ``bkaudit maintain`` flags."""
    parser.add_argument("--warehouse", required=True, help="directory or URI of the Delta tables")
    parser.add_argument(
        "--keep",
        type=parse_duration,
        default=parse_duration(DEFAULT_KEEP),
        metavar="DURATION",
        help="delete runs that started longer ago than this (30d, 4w, 36h; at least 1d), "
        "except the latest run of each check and runs with open findings (default 30d)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print what would be deleted, compacted, migrated and vacuumed; change nothing",
    )
    parser.add_argument(
        "--migrate",
        action="store_true",
        help="first relay tables of the old layout (partitioned by run_id) out by run_date "
        "and record the schema version (pause writers meanwhile)",
    )
    parser.add_argument(
        "--vacuum-retention",
        type=parse_duration,
        default=None,
        metavar="DURATION",
        help="vacuum files unreferenced for longer than this (default: each table's "
        "delta.deletedFileRetentionDuration, 7d). Shorter breaks readers and writers still "
        "on an older snapshot",
    )
    return parser


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m jobs.commands.maintain`` (``bkaudit maintain`` builds the same)."""
    from jobs.cli.config import help_epilog

    return add_maintain_arguments(
        argparse.ArgumentParser(
            prog="bkaudit maintain",
            description=DESCRIPTION,
            epilog=help_epilog("maintain"),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )


DESCRIPTION = (
    "Keep the Delta tables healthy: delete runs older than --keep (keeping the latest run "
    "of each check and every run with open findings), compact small files, vacuum; "
    "--migrate relays old tables out by run_date. Exit 0 when done, 2 on error."
)

EXAMPLES = (
    "bkaudit maintain --warehouse /data/bkaudit --keep 30d --dry-run",
    "bkaudit maintain --warehouse /data/bkaudit --migrate      # once, after upgrading",
    "bkaudit maintain --warehouse s3a://ops/bkaudit --keep 90d",
)


def _register_examples() -> None:
    # --help examples live in jobs.cli.config.EXAMPLES; the command brings its own.
    from jobs.cli.config import EXAMPLES as CLI_EXAMPLES

    CLI_EXAMPLES.setdefault("maintain", EXAMPLES)


_register_examples()


# ---- what to keep (pure: rows in, decisions out) -----------------------------------------------


@dataclass(frozen=True)
class AuditRun:
    """One row of ``audit_runs``, as retention needs it."""

    run_id: str
    check: str
    status: str
    started_at: datetime
    finished_at: datetime | None = None

    @property
    def finished(self) -> bool:
        return self.status in RunStatus.FINISHED

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> AuditRun:
        return cls(
            str(row["run_id"]),
            str(row["check"]),
            str(row["status"]),
            row["started_at"],
            row.get("finished_at"),
        )


def _order(run: AuditRun) -> tuple[Any, ...]:
    return (run.started_at, run.run_id)


def latest_per_check(runs: Iterable[AuditRun]) -> dict[str, str]:
    """run_id -> why it is kept, for the latest run of each check and the latest finished one
    (the one ``listunderreplicated`` and ``rereplicate`` read when it is the newest)."""
    keep: dict[str, str] = {}
    by_check: dict[str, list[AuditRun]] = defaultdict(list)
    for r in runs:
        by_check[r.check].append(r)
    for check, mine in by_check.items():
        keep.setdefault(max(mine, key=_order).run_id, f"latest {check} run")
        finished = [r for r in mine if r.finished]
        if finished:
            keep.setdefault(max(finished, key=_order).run_id, f"latest finished {check} run")
    return keep


def open_finding_candidates(runs: Iterable[AuditRun]) -> list[AuditRun]:
    """The runs that may hold the last report of an open finding: per check, the finished
    runs from the latest COMPLETED one on (every finished run when none completed). A
    finding last reported before that run is not open: a later complete audit of the same
    check did not find it."""
    out: list[AuditRun] = []
    by_check: dict[str, list[AuditRun]] = defaultdict(list)
    for r in runs:
        if r.finished:
            by_check[r.check].append(r)
    for mine in by_check.values():
        complete = [r for r in mine if r.status == RunStatus.COMPLETED]
        since = max(complete, key=_order) if complete else None
        out.extend(r for r in mine if since is None or _order(r) >= _order(since))
    return out


FindingKey = tuple[str, int, int, str]
"""(check, ledger_id, segment_first_entry_id, bookie_id): one finding, whichever run saw it."""


def open_finding_runs(
    runs: Iterable[AuditRun],
    fragments: Iterable[Mapping[str, Any]],
    actions: Sequence[Mapping[str, Any]],
) -> dict[str, str]:
    """run_id -> why, for each run that holds the last report of an open finding.

    A finding is a (check, ledger, segment, bookie) in ``underreplicated_fragments``. It is
    **open** when (1) no COMPLETED audit of the same check started after its last report
    (a complete audit that does not list it shows it gone; COMPLETED_WITH_ERRORS may have
    missed it), and (2) no repair run that started after its last report left the ledger
    REPAIRED or SKIPPED (``listunderreplicated``'s rule, :func:`repair_status`). The run of
    that last report is kept; earlier reports of it are not needed (its first detection
    travels on in ``first_detected_at``).

    ``fragments``: rows with run_id, ledger_id, segment_first_entry_id and bookie_id of the
    :func:`open_finding_candidates` runs (other rows are ignored).
    """
    from jobs.commands.listing import RESOLVED, repair_status

    candidates = {r.run_id: r for r in open_finding_candidates(runs)}
    last: dict[FindingKey, AuditRun] = {}
    for f in fragments:
        run = candidates.get(f["run_id"])
        if run is None:
            continue
        key = (run.check, f["ledger_id"], f["segment_first_entry_id"], f["bookie_id"])
        if key not in last or _order(run) > _order(last[key]):
            last[key] = run
    keep: dict[str, str] = {}
    status_since: dict[str, dict[int, tuple[str, dict[str, Any]]]] = {}
    open_count: dict[str, int] = defaultdict(int)
    for (_, ledger_id, _, _), run in last.items():
        if run.run_id not in status_since:
            status_since[run.run_id] = repair_status([dict(a) for a in actions], run.started_at)
        outcome = status_since[run.run_id].get(ledger_id, ("",))[0]
        if outcome not in RESOLVED:
            open_count[run.run_id] += 1
    for run_id, n in open_count.items():
        keep[run_id] = f"last report of {n} open finding{'s' if n != 1 else ''}"
    return keep


@dataclass(frozen=True)
class RepairRun:
    """One repair run, from its ``replication_actions`` rows."""

    run_id: str
    mode: str
    started_at: datetime
    audit_run_ids: frozenset[str]
    ledgers: frozenset[int]


def repair_runs(actions: Iterable[Mapping[str, Any]]) -> list[RepairRun]:
    """The repair runs in ``actions`` rows (run_id, mode, audit_run_id, ledger_id,
    started_at)."""
    rows: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for a in actions:
        rows[a["run_id"]].append(a)
    out = []
    for run_id, mine in rows.items():
        starts = [a["started_at"] for a in mine if a["started_at"] is not None]
        out.append(
            RepairRun(
                run_id,
                str(mine[0]["mode"]),
                min(starts) if starts else datetime.min.replace(tzinfo=timezone.utc),
                frozenset(a["audit_run_id"] for a in mine if a.get("audit_run_id")),
                frozenset(int(a["ledger_id"]) for a in mine),
            )
        )
    return out


@dataclass
class Deletion:
    """The rows of one table to delete: the runs ``run_ids``, plus (with ``before``) every
    row in a partition older than that day whose run is not in ``keep_ids``: runs dropped
    here and rows of runs that never finished writing (no ``audit_runs`` row)."""

    table: str
    run_ids: set[str] = field(default_factory=set)
    before: date | None = None
    keep_ids: set[str] = field(default_factory=set)

    def empty(self) -> bool:
        return not self.run_ids and self.before is None

    def predicates(self) -> list[str]:
        """SQL predicates for delta-rs's delete, one commit each."""
        out = []
        if self.before is not None:
            pred = f"run_date < '{self.before.isoformat()}'"
            if self.keep_ids:
                pred += f" AND run_id NOT IN ({_sql_list(self.keep_ids)})"
            out.append(pred)
        ids = sorted(self.run_ids)
        for i in range(0, len(ids), DELETE_CHUNK):
            out.append(f"run_id IN ({_sql_list(ids[i : i + DELETE_CHUNK])})")
        return out

    def expression(self) -> Any:
        """The same rows as a pyarrow dataset filter (the dry run counts them)."""
        import pyarrow as pa
        import pyarrow.dataset as ds

        expr = ds.field("run_id").isin(sorted(self.run_ids)) if self.run_ids else None
        if self.before is not None:
            old = ds.field("run_date") < pa.scalar(self.before, pa.date32())
            if self.keep_ids:
                old = old & ~ds.field("run_id").isin(sorted(self.keep_ids))
            expr = old if expr is None else expr | old
        return expr


def _sql_list(ids: Iterable[str]) -> str:
    return ", ".join("'" + i.replace("'", "''") + "'" for i in sorted(ids))


@dataclass
class RetentionPlan:
    """Which runs stay and which go, with why."""

    cutoff: datetime
    kept_audit: dict[str, str]
    deleted_audit: set[str]
    kept_repair: dict[str, str]
    deleted_repair: set[str]
    kept_other: dict[str, dict[str, str]] = field(default_factory=dict)
    deleted_other: dict[str, set[str]] = field(default_factory=dict)

    @property
    def cutoff_day(self) -> date:
        return self.cutoff.date()


def plan_retention(
    runs: Sequence[AuditRun],
    *,
    cutoff: datetime,
    open_runs: Mapping[str, str],
    actions: Iterable[Mapping[str, Any]],
    kept_run_ledgers: Mapping[str, set[int]],
    other_runs: Mapping[str, Mapping[str, datetime]] | None = None,
) -> RetentionPlan:
    """Decide retention.

    Audit runs: kept when started at or after ``cutoff``, when the latest (or latest
    finished) run of their check, or when in ``open_runs`` (:func:`open_finding_runs`).
    Repair runs: kept when started at or after ``cutoff``, when the latest of their mode,
    when they worked from a kept audit run, or when they started after an older kept audit
    run and touched one of its ledgers (``kept_run_ledgers``): that run's report shows what
    repairs did since, and must keep showing it. ``other_runs`` (blast_radius, triage: run
    id -> time): kept when recent, or the latest.
    """
    kept: dict[str, str] = {}
    for r in runs:
        if r.started_at >= cutoff:
            kept[r.run_id] = "recent"
    for run_id, why in {**latest_per_check(runs), **open_runs}.items():
        kept.setdefault(run_id, why)
    deleted = {r.run_id for r in runs} - set(kept)

    by_id = {r.run_id: r for r in runs}
    old_kept = [by_id[i] for i in kept if i in by_id and by_id[i].started_at < cutoff]
    repairs = repair_runs(actions)
    kept_repair: dict[str, str] = {}
    latest_mode: dict[str, RepairRun] = {}
    for p in repairs:
        if p.mode not in latest_mode or (p.started_at, p.run_id) > (
            latest_mode[p.mode].started_at,
            latest_mode[p.mode].run_id,
        ):
            latest_mode[p.mode] = p
    for p in repairs:
        if p.started_at >= cutoff:
            kept_repair[p.run_id] = "recent"
        elif latest_mode[p.mode].run_id == p.run_id:
            kept_repair[p.run_id] = f"latest {p.mode} run"
        elif p.audit_run_ids & set(kept):
            kept_repair[p.run_id] = "repairs a kept audit run"
        elif any(
            p.started_at >= r.started_at and p.ledgers & kept_run_ledgers.get(r.run_id, set())
            for r in old_kept
        ):
            kept_repair[p.run_id] = "repair history of a kept audit run"
    deleted_repair = {p.run_id for p in repairs} - set(kept_repair)

    kept_other: dict[str, dict[str, str]] = {}
    deleted_other: dict[str, set[str]] = {}
    for table, times in (other_runs or {}).items():
        mine: dict[str, str] = {i: "recent" for i, t in times.items() if t >= cutoff}
        if times:
            mine.setdefault(max(times, key=lambda i: (times[i], i)), "latest run")
        kept_other[table] = mine
        deleted_other[table] = set(times) - set(mine)
    return RetentionPlan(
        cutoff, kept, deleted, kept_repair, deleted_repair, kept_other, deleted_other
    )


# ---- doing it ----------------------------------------------------------------------------------


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
    import pyarrow as pa

    from jobs.tables import delta

    table = delta._open(warehouse, name)
    adds = pa.table(table.get_add_actions(flatten=True))
    parts = [c for c in adds.column_names if c.startswith("partition.")]
    if not parts:
        return adds.num_rows, 1 if adds.num_rows else 0
    keys = set(zip(*(adds.column(c).to_pylist() for c in parts), strict=True))
    return adds.num_rows, len(keys)


def _small_files(warehouse: str, name: str, target: int) -> int:
    """Files a compaction would rewrite: those below ``target`` bytes in a partition with
    more than one of them."""
    import pyarrow as pa

    from jobs.tables import delta

    adds = pa.table(delta._open(warehouse, name).get_add_actions(flatten=True))
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


TARGET_FILE_SIZE = 100 * 1024 * 1024
"""Compaction's target file size (delta-rs's default; ``delta.targetFileSize`` overrides)."""


def _delete(warehouse: str, deletion: Deletion, dry_run: bool) -> int:
    from deltalake.exceptions import CommitFailedError, DeltaError

    from jobs.tables import delta

    if deletion.empty() or not delta.table_exists(warehouse, deletion.table):
        return 0
    info = delta.table_info(warehouse, deletion.table)
    if info is None:
        return 0
    columns = [f.name for f in delta._open(warehouse, deletion.table).schema().fields]
    if deletion.before is not None and (not info.current_layout or "run_date" not in columns):
        # A version-1 table has no run_date to go by: only the runs named.
        deletion = Deletion(deletion.table, deletion.run_ids)
    if deletion.empty():
        return 0
    if dry_run:
        from jobs.tables.migrate import _dataset

        dataset = _dataset(warehouse, deletion.table)
        return int(dataset.count_rows(filter=deletion.expression()))
    deleted = 0
    for predicate in deletion.predicates():
        for attempt in range(delta.COMMIT_RETRIES):
            try:
                metrics = delta._open(warehouse, deletion.table).delete(predicate)
                deleted += int(metrics.get("num_deleted_rows", 0) or 0)
                break
            except CommitFailedError:
                time.sleep(0.2 * (attempt + 1))
            except DeltaError as exc:
                raise delta._table_error(info.path, exc) from exc
        else:
            raise MaintainError(f"{info.path}: delete kept losing commit races; try again")
    return deleted


def _compact(warehouse: str, name: str, dry_run: bool) -> tuple[int, int]:
    """(files rewritten, files written)."""
    from deltalake.exceptions import CommitFailedError, DeltaError

    from jobs.tables import delta

    if dry_run:
        return _small_files(warehouse, name, TARGET_FILE_SIZE), 0
    for attempt in range(delta.COMMIT_RETRIES):
        try:
            m = delta._open(warehouse, name).optimize.compact()
            return int(m.get("numFilesRemoved", 0)), int(m.get("numFilesAdded", 0))
        except CommitFailedError:  # a writer's commit touched the same files: again
            time.sleep(0.2 * (attempt + 1))
        except DeltaError as exc:
            raise delta._table_error(delta.table_path(warehouse, name), exc) from exc
    raise MaintainError(f"{delta.table_path(warehouse, name)}: compaction kept losing races")


def _vacuum(warehouse: str, name: str, retention: float | None, dry_run: bool) -> int:
    """Files vacuumed (or that would be); then, for real, a checkpoint and the log cleanup."""
    from deltalake.exceptions import DeltaError

    from jobs.tables import delta

    path = delta.table_path(warehouse, name)
    table = delta._open(warehouse, name)
    hours = None if retention is None else int(retention // 3600)
    enforce = hours is None or hours >= _table_retention_hours(table)
    try:
        files = table.vacuum(
            retention_hours=hours, dry_run=dry_run, enforce_retention_duration=enforce
        )
        if not dry_run:
            table = delta._open(warehouse, name)
            table.create_checkpoint()
            table.cleanup_metadata()
    except DeltaError as exc:
        raise delta._table_error(path, exc) from exc
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


def _remove_empty_dirs(warehouse: str, name: str, before: date) -> int:
    """Remove a local table's empty partition directories: ``run_date=`` days up to
    ``before``, the retention cutoff's day (its runs older than the cutoff were deleted, and a
    writer recreates a directory it needs), and old-layout ones (``run_id=``, ``mode=``) the
    current partitioning no longer uses."""
    from jobs.tables import delta
    from jobs.tables.schema import PARTITION_BY

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


def _read_inputs(warehouse: str, cutoff: datetime) -> RetentionPlan:
    """Read what retention needs (audit_runs, the candidates' fragments, the actions, the
    blast_radius and triage run times) and plan."""
    from jobs.tables import delta
    from jobs.tables.schema import (
        ACTIONS,
        AUDIT_RUNS,
        BLAST_RADIUS,
        FRAGMENTS,
        PULSAR_CHECKS,
        PULSAR_REFERENCES,
        TRIAGE,
    )

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


def deletions(plan: RetentionPlan, runs_day: Mapping[str, date]) -> list[Deletion]:
    """The deletes that carry a plan out, ``audit_runs`` first (a run disappears for readers
    before its rows do; a delete cut short leaves rows the next run's orphan rule removes).
    ``runs_day``: each audit and repair run's day."""
    from jobs.tables.schema import (
        ACTIONS,
        AUDIT_RUNS,
        BLAST_RADIUS,
        BOOKIES,
        FRAGMENTS,
        LEDGERS,
        PULSAR_CHECKS,
        PULSAR_REFERENCES,
        TRIAGE,
    )

    day = plan.cutoff_day

    def old_kept(kept: Iterable[str]) -> set[str]:
        # A run's rows are never in a partition before its day: only kept runs of days before
        # the cutoff's need naming to be spared by the partition rule.
        return {i for i in kept if runs_day.get(i, day) < day}

    def named(deleted: Iterable[str]) -> set[str]:
        # Runs the partition rule misses: those of the cutoff's own day.
        return {i for i in deleted if runs_day.get(i, day) >= day}

    out = [Deletion(AUDIT_RUNS, set(plan.deleted_audit))]
    for table in (FRAGMENTS, LEDGERS, BOOKIES):
        out.append(Deletion(table, named(plan.deleted_audit), day, old_kept(plan.kept_audit)))
    out.append(Deletion(ACTIONS, named(plan.deleted_repair), day, old_kept(plan.kept_repair)))
    for table in (BLAST_RADIUS, TRIAGE, PULSAR_CHECKS, PULSAR_REFERENCES):
        out.append(Deletion(table, set(plan.deleted_other.get(table, set()))))
    return out


def maintain(
    warehouse: str,
    *,
    keep: float,
    dry_run: bool = False,
    migrate: bool = False,
    vacuum_retention: float | None = None,
    out: TextIO | None = None,
    now: datetime | None = None,
) -> list[TableReport]:
    """Maintain ``warehouse`` (see the module docstring); prints a line per step to ``out``."""
    from jobs.tables import delta
    from jobs.tables import migrate as migration
    from jobs.tables.schema import ACTIONS, ALL_TABLES, AUDIT_RUNS, TABLE_PROPERTIES, run_day

    stream = out or sys.stdout
    if keep < MIN_KEEP.total_seconds():
        raise MaintainError(f"--keep must be at least 1d (got {keep:g}s)")
    now = now or datetime.now(timezone.utc)
    cutoff = now - timedelta(seconds=keep)
    present = [t for t in ALL_TABLES if delta.table_exists(warehouse, t)]
    if not present:
        raise MaintainError(f"no bkaudit Delta tables under {warehouse}")
    for t in present:
        delta.table_info(warehouse, t)  # refuses a newer schema version before any change
    tag = " (dry run: nothing changes)" if dry_run else ""
    print(f"maintain {warehouse}: keep runs since {cutoff:%Y-%m-%dT%H:%MZ}{tag}", file=stream)

    steps = migration.plan(warehouse)
    if migrate:
        if not dry_run and steps:
            steps = migration.migrate_warehouse(warehouse)
        for step in steps:
            print(f"migrate {step.describe()}", file=stream)
    else:
        old = [s.name for s in steps if s.relayout]
        if old:
            log.warning(
                "tables in the old layout (partitioned by run_id): %s; run "
                "`bkaudit maintain --warehouse %s --migrate`",
                ", ".join(old),
                warehouse,
            )
        for s in steps:
            if not s.relayout and not dry_run:
                delta.set_schema_version(warehouse, s.name, TABLE_PROPERTIES)

    plan = _read_inputs(warehouse, cutoff)
    print(_plan_line("audit runs", plan.kept_audit, plan.deleted_audit), file=stream)
    if ACTIONS in present:
        print(_plan_line("repair runs", plan.kept_repair, plan.deleted_repair), file=stream)
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

    reports: dict[str, TableReport] = {t: TableReport(t) for t in present}
    for t in present:
        reports[t].files_before, reports[t].partitions_before = file_stats(warehouse, t)
    for deletion in deletions(plan, days):
        if deletion.table in reports:
            reports[deletion.table].rows_deleted = _delete(warehouse, deletion, dry_run)
    for t in present:
        r = reports[t]
        r.files_compacted, r.files_written = _compact(warehouse, t, dry_run)
        r.files_vacuumed = _vacuum(warehouse, t, vacuum_retention, dry_run)
        if not dry_run:
            r.dirs_removed = _remove_empty_dirs(warehouse, t, plan.cutoff_day)
        r.files_after, r.partitions_after = file_stats(warehouse, t)
        print(r.line(dry_run), file=stream)
    return [reports[t] for t in present]


def _plan_line(what: str, kept: Mapping[str, str], deleted: set[str]) -> str:
    why: dict[str, int] = defaultdict(int)
    for reason in kept.values():
        why[reason.split(" of ")[0] if reason.startswith("last report") else reason] += 1
    detail = ", ".join(f"{n} {r}" for r, n in sorted(why.items()))
    return (
        f"{what}: {len(kept) + len(deleted)}, keeping {len(kept)}"
        f"{f' ({detail})' if detail else ''}, deleting {len(deleted)}"
    )


def run_maintain(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Entry point (``bkaudit maintain``): 0 done, 2 on error (one line on stderr)."""
    t0 = time.monotonic()
    try:
        maintain(
            args.warehouse,
            keep=args.keep,
            dry_run=args.dry_run,
            migrate=args.migrate,
            vacuum_retention=args.vacuum_retention,
            out=out,
        )
    except Exception as exc:  # SchemaVersionError, MigrationError, unreadable tables: one line
        log.debug("maintain failed", exc_info=True)
        from jobs.tables.delta import TableError

        text = str(exc) if isinstance(exc, (TableError, MaintainError)) else one_line(exc)
        print(
            f"maintain: {text.strip().splitlines()[0] if text.strip() else text}", file=sys.stderr
        )
        return 2
    log.info("maintain: done in %.1fs", time.monotonic() - t0)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m jobs.commands.maintain ...`` entry point (config file and environment apply)."""
    from jobs.cli.config import config_path_from_argv, configure_logging, parse_with_config

    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_with_config(build_parser(), "maintain", argv)
    configure_logging(False, config_path_from_argv(argv))
    return run_maintain(args)


if __name__ == "__main__":
    sys.exit(main())
