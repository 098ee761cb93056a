"""``bkaudit maintain``: keep the Delta tables of a warehouse healthy (docs/tables.md).

    bkaudit maintain --warehouse W [--keep 30d] [--dry-run] [--migrate] [--vacuum-retention D]

In order, through delta-rs (no JVM):

1. refuse a warehouse written by a newer bkaudit (any table's schema version above this
   code's): one line, exit 2;
2. with ``--migrate``, relay version-1 tables (partitioned by ``run_id``) out by ``run_date``
   and set their properties (:mod:`jobs.tables.migrate`); without it, say which tables need it;
3. delete the runs older than ``--keep``, except those
   :func:`jobs.tables.retention.plan_retention` keeps: the latest run of each check, every
   run holding the last report of an open finding, and the repair runs those runs' reports
   depend on;
4. compact each table's small files (one partition a day, so a day of hourly runs becomes
   a file or two);
5. vacuum the files no version within ``delta.deletedFileRetentionDuration`` references,
   checkpoint the log and drop log entries older than ``delta.logRetentionDuration``, and
   remove the partition directories left empty.

``--dry-run`` reads everything and prints what it would do; it changes nothing.
Exit status: 0 done (or planned), 2 on error.

This module is the command line and the order of the steps; what to keep is
:mod:`jobs.tables.retention` (pure) and the Delta operations are :mod:`jobs.tables.maintenance`,
imported when the command runs so its flags parse without pyarrow or delta-rs.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, TextIO

from jobs.options.units import parse_duration
from jobs.options.warehouse import WAREHOUSE_HELP
from jobs.runtime.exit_status import ExitStatus
from jobs.runtime.messages import one_line

if TYPE_CHECKING:
    from jobs.tables.maintenance import TableReport
    from jobs.tables.retention import RetentionPlan

__all__ = [
    "MIN_KEEP",
    "add_maintain_arguments",
    "main",
    "maintain",
    "run_maintain",
]

log = logging.getLogger("jobs.commands.maintain")

MIN_KEEP = timedelta(days=1)
"""The shortest ``--keep``: rows of a run still being written (no ``audit_runs`` row yet)
are never in a partition this old."""

DEFAULT_KEEP = "30d"


def add_maintain_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The ``bkaudit maintain`` flags."""
    parser.add_argument("--warehouse", required=True, help=WAREHOUSE_HELP)
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


# ---- the steps, in order ------------------------------------------------------------------------


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
    from jobs.tables import maintenance
    from jobs.tables.schema import ACTIONS

    stream = out or sys.stdout
    if keep < MIN_KEEP.total_seconds():
        raise maintenance.MaintainError(f"--keep must be at least 1d (got {keep:g}s)")
    now = now or datetime.now(timezone.utc)
    cutoff = now - timedelta(seconds=keep)
    present = _present_tables(warehouse)
    tag = " (dry run: nothing changes)" if dry_run else ""
    print(f"maintain {warehouse}: keep runs since {cutoff:%Y-%m-%dT%H:%MZ}{tag}", file=stream)
    _migrate_or_warn(warehouse, migrate=migrate, dry_run=dry_run, out=stream)
    plan = maintenance.read_retention_plan(warehouse, cutoff)
    print(_plan_line("audit runs", plan.kept_audit, plan.deleted_audit), file=stream)
    if ACTIONS in present:
        print(_plan_line("repair runs", plan.kept_repair, plan.deleted_repair), file=stream)
    return _carry_out(warehouse, present, plan, dry_run, vacuum_retention, stream)


def _present_tables(warehouse: str) -> list[str]:
    """The bkaudit tables under ``warehouse``; refuses (before any change) an empty
    warehouse and one whose schema version is newer than this code's."""
    from jobs.tables import delta
    from jobs.tables.maintenance import MaintainError
    from jobs.tables.schema import ALL_TABLES

    present = [t for t in ALL_TABLES if delta.table_exists(warehouse, t)]
    if not present:
        raise MaintainError(f"no bkaudit Delta tables under {warehouse}")
    for t in present:
        delta.table_info(warehouse, t)  # refuses a newer schema version before any change
    return present


def _migrate_or_warn(warehouse: str, *, migrate: bool, dry_run: bool, out: TextIO) -> None:
    """With ``migrate``, relay version-1 tables out (:mod:`jobs.tables.migrate`); without
    it, warn about them and record the schema version on current-layout tables lacking it."""
    from jobs.tables import delta
    from jobs.tables import migrate as migration
    from jobs.tables.schema import TABLE_PROPERTIES

    steps = migration.plan(warehouse)
    if migrate:
        if not dry_run and steps:
            steps = migration.migrate_warehouse(warehouse)
        for step in steps:
            print(f"migrate {step.describe()}", file=out)
        return
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


def _carry_out(
    warehouse: str,
    present: Sequence[str],
    plan: RetentionPlan,
    dry_run: bool,
    vacuum_retention: float | None,
    out: TextIO,
) -> list[TableReport]:
    """Delete what ``plan`` drops, then compact, vacuum and tidy each table; a line each."""
    from jobs.tables import maintenance
    from jobs.tables.retention import deletions

    reports = {t: maintenance.TableReport(t) for t in present}
    for t in present:
        reports[t].files_before, reports[t].partitions_before = maintenance.file_stats(warehouse, t)
    for deletion in deletions(plan, maintenance.run_days(warehouse)):
        if deletion.table in reports:
            reports[deletion.table].rows_deleted = maintenance.delete_rows(
                warehouse, deletion, dry_run
            )
    for t in present:
        r = reports[t]
        r.files_compacted, r.files_written = maintenance.compact(warehouse, t, dry_run)
        r.files_vacuumed = maintenance.vacuum(warehouse, t, vacuum_retention, dry_run)
        if not dry_run:
            r.dirs_removed = maintenance.remove_empty_dirs(warehouse, t, plan.cutoff_day)
        r.files_after, r.partitions_after = maintenance.file_stats(warehouse, t)
        print(r.line(dry_run), file=out)
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
        from jobs.tables.maintenance import MaintainError

        text = str(exc) if isinstance(exc, (TableError, MaintainError)) else one_line(exc)
        print(
            f"maintain: {text.strip().splitlines()[0] if text.strip() else text}", file=sys.stderr
        )
        return ExitStatus.OPERATOR_ERROR
    log.info("maintain: done in %.1fs", time.monotonic() - t0)
    return ExitStatus.OK


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m jobs.commands.maintain ...``: ``bkaudit maintain``."""
    from jobs.cli.main import command_main

    return command_main("maintain", argv)


if __name__ == "__main__":
    sys.exit(main())
