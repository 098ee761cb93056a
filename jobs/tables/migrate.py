"""Relay a version-1 warehouse out in the current layout (``bkaudit maintain --migrate``).

Version 1 partitioned ``ledgers``, ``bookies`` and ``underreplicated_fragments`` by ``run_id``
and ``replication_actions`` by ``mode``, and set no table properties. Version 2 partitions
them by ``run_date`` (the UTC day the run started) and records the retention properties and
the schema version (docs/tables.md). Migrating a table:

1. reads it at one snapshot, adding ``run_date`` to every row: the day of the run's
   ``audit_runs.started_at``, else of its earliest ``detected_at`` / ``started_at``, else
   the day in its run id, else today;
2. overwrites it in one commit with the new partitioning. That commit must be the very
   next version of the table (no commit retries): had any writer appended meanwhile, the
   rows it added would be dropped (delta-rs does not check a schema-changing overwrite
   against concurrent appends), so the attempt is abandoned and made again from the new
   snapshot;
3. checks the row count is unchanged, then sets the properties and the schema version.

The old files stay on disk, unreferenced, until a vacuum older than
``delta.deletedFileRetentionDuration`` deletes them; until then time travel reads the old
layout. Unpartitioned tables (``audit_runs``, ``blast_radius``, ``triage``) only get their
properties. Running it again does nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import date
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from jobs.tables import delta
from jobs.tables.rust_panics import quiet_rust_panics
from jobs.tables.schema import (
    ALL_TABLES,
    AUDIT_RUNS,
    PARTITION_BY,
    RUN_DATE,
    RUN_TIME_COLUMN,
    SCHEMA_VERSION,
    SCHEMA_VERSION_KEY,
    TABLE_PROPERTIES,
    run_day,
)

__all__ = ["MigrationError", "TableMigration", "migrate_table", "migrate_warehouse", "plan"]

log = logging.getLogger(__name__)

ATTEMPTS = 5
"""Tries per table when writers keep committing while it is being rewritten."""


class MigrationError(delta.TableError):
    """A table could not be migrated; the message names it and says what to do."""


@dataclass
class TableMigration:
    """What migrating one table does (or, in a dry run, would do)."""

    name: str
    partitioned_from: list[str]
    rows: int
    relayout: bool
    """True when the data is rewritten; False when only properties are set."""
    done: bool = False

    def describe(self) -> str:
        """One line for the operator."""
        if not self.relayout:
            what = "set table properties and schema version"
        else:
            was = ", ".join(self.partitioned_from) or "nothing"
            now = ", ".join(PARTITION_BY[self.name]) or "nothing"
            what = f"repartition {self.rows} rows by {now} (was {was})"
        return f"{self.name}: {'' if self.done else 'would '}{what}"


def plan(warehouse: str) -> list[TableMigration]:
    """The tables of ``warehouse`` that are not up to date, oldest layout first."""
    out: list[TableMigration] = []
    for name in ALL_TABLES:
        info = delta.table_info(warehouse, name)
        if info is None or info.up_to_date:
            continue
        rows = _count(warehouse, name) if not info.current_layout else 0
        out.append(TableMigration(name, info.partition_columns, rows, not info.current_layout))
    return out


def _count(warehouse: str, name: str) -> int:
    return int(delta.arrow_dataset(warehouse, name).count_rows())


def audit_run_days(warehouse: str) -> dict[str, date]:
    """Each audit run's day, from ``audit_runs.started_at``."""
    rows = delta.read_rows(warehouse, AUDIT_RUNS, columns=["run_id", "started_at"])
    return {r["run_id"]: run_day(r["started_at"]) for r in rows if r["started_at"] is not None}


def _run_days(dataset: Any, name: str, known: Mapping[str, date]) -> dict[str, date]:
    """Days for the run ids of ``dataset`` that ``known`` lacks, from the table's own time
    column (one pass over two columns)."""
    column = RUN_TIME_COLUMN.get(name)
    if column is None or column not in dataset.schema.names:
        return dict(known)
    days = dict(known)
    firsts: dict[str, Any] = {}
    for batch in dataset.to_batches(columns=["run_id", column]):
        table = pa.Table.from_batches([batch])
        grouped = table.group_by("run_id").aggregate([(column, "min")])
        for rid, first in zip(
            grouped.column("run_id").to_pylist(),
            grouped.column(f"{column}_min").to_pylist(),
            strict=True,
        ):
            if rid in days or first is None:
                continue
            if rid not in firsts or first < firsts[rid]:
                firsts[rid] = first
    days.update({rid: run_day(t) for rid, t in firsts.items()})
    return days


def _target_schema(source: pa.Schema) -> pa.Schema:
    """The table's own schema (its column order and nullability) plus ``run_date``."""
    if RUN_DATE in source.names:
        i = source.get_field_index(RUN_DATE)
        return source.set(i, pa.field(RUN_DATE, pa.date32()))
    return source.append(pa.field(RUN_DATE, pa.date32()))


def _relaid(dataset: Any, name: str, days: Mapping[str, date]) -> pa.RecordBatchReader:
    """The table's rows, batch by batch, each with ``run_date`` set (existing values kept)."""
    schema = _target_schema(dataset.schema)

    def batches() -> Iterator[pa.RecordBatch]:
        for batch in dataset.to_batches():
            table = pa.Table.from_batches([batch], schema=dataset.schema)
            fill = delta.run_dates(table, RUN_TIME_COLUMN.get(name), days)
            if RUN_DATE in table.column_names:
                i = table.column_names.index(RUN_DATE)
                have = table.column(i).cast(pa.date32())
                table = table.set_column(i, RUN_DATE, pc.coalesce(have, fill))
            else:
                table = table.append_column(pa.field(RUN_DATE, pa.date32()), fill)
            yield from table.select(schema.names).cast(schema).to_batches()

    return pa.RecordBatchReader.from_batches(schema, batches())


def _local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


def migrate_table(warehouse: str, name: str, days: Mapping[str, date]) -> TableMigration:
    """Migrate one table (see the module docstring); returns what was done."""
    from deltalake import CommitProperties, write_deltalake
    from deltalake.exceptions import CommitFailedError, DeltaError

    path = delta.table_path(warehouse, name)
    info = delta.table_info(warehouse, name)
    if info is None:
        raise MigrationError(f"Delta table {path} does not exist")
    step = TableMigration(name, info.partition_columns, 0, not info.current_layout)
    for attempt in range(ATTEMPTS if step.relayout else 0):
        table = delta.open_table(warehouse, name)
        before = table.version()
        dataset = delta.arrow_dataset(warehouse, name, table)
        step.rows = int(dataset.count_rows())
        run_days = _run_days(dataset, name, days)
        data: Any = _relaid(dataset, name, run_days)
        if not _local(path):
            # delta-rs reads a URI through callbacks it cannot serve while it writes.
            data = data.read_all()
        t0 = time.monotonic()
        try:
            with quiet_rust_panics():
                write_deltalake(
                    table,
                    data,
                    mode="overwrite",
                    schema_mode="overwrite",
                    partition_by=PARTITION_BY[name] or None,
                    commit_properties=CommitProperties(
                        max_commit_retries=0,
                        custom_metadata={"bkaudit.operation": f"migrate to v{SCHEMA_VERSION}"},
                    ),
                )
        except CommitFailedError:
            log.warning(
                "%s: written to while being migrated (version %d moved on); again (%d/%d)",
                name,
                before,
                attempt + 1,
                ATTEMPTS,
            )
            time.sleep(0.5 * (attempt + 1))
            continue
        except DeltaError as exc:
            raise delta.table_error(path, exc) from exc
        after = _count(warehouse, name)
        if after != step.rows:  # cannot happen with the guard above; never pass silently
            raise MigrationError(
                f"Delta table {path}: {step.rows} rows before migration, {after} after; "
                f"restore version {before} (RESTORE or time travel) and report a bug"
            )
        log.info(
            "migrate: %s: %d rows relaid out by %s in %.1fs",
            name,
            after,
            ", ".join(PARTITION_BY[name]),
            time.monotonic() - t0,
        )
        break
    else:
        if step.relayout:
            raise MigrationError(
                f"Delta table {path} was written to during each of {ATTEMPTS} migration "
                "attempts: pause the audits and repairs writing to it, then migrate again"
            )
    if not delta.set_schema_version(warehouse, name, TABLE_PROPERTIES):
        current = delta.table_info(warehouse, name)
        if current is None or current.version != SCHEMA_VERSION:
            raise MigrationError(f"Delta table {path}: could not set {SCHEMA_VERSION_KEY}")
    step.done = True
    return step


def migrate_warehouse(warehouse: str, *, dry_run: bool = False) -> list[TableMigration]:
    """Migrate every table of ``warehouse`` that needs it; with ``dry_run`` only say which."""
    steps = plan(warehouse)
    if dry_run or not steps:
        return steps
    days = audit_run_days(warehouse)
    done = []
    for step in steps:
        done.append(migrate_table(warehouse, step.name, days))
    return done
