"""The Delta tables through delta-rs (``deltalake``): no JVM.

The local executor appends here; ``listunderreplicated``, the HTML report, ``bkaudit
maintain`` and the Airflow support module read here. Tables written by delta-spark and by
delta-rs are the same tables: same schemas (:mod:`jobs.tables.schema`), same partitioning by
``run_date``, same table properties, the default reader 1 / writer 2 protocol
(docs/tables.md). Refused before anything is read or written, each with a one-line error
naming the table: a protocol needing features this delta-rs does not support
(:class:`TableProtocolError`), and a schema version newer than this code's
(:class:`SchemaVersionError`).

A table still in the version-1 layout (partitioned by ``run_id``) is appended to in its own
layout, with a warning once per process, until ``bkaudit maintain --migrate`` relays it out.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from bklib.states import RunStatus
from jobs.tables.error_text import delta_rs_cause
from jobs.tables.object_store import arrow_s3_filesystem, delta_storage_options, is_s3
from jobs.tables.rust_panics import quiet_rust_panics
from jobs.tables.schema import (
    AUDIT_RUNS,
    FRAGMENTS,
    FRAGMENTS_TABLE_SCHEMA,
    LEDGERS,
    PARTITION_BY,
    RUN_DATE,
    RUN_TIME_COLUMN,
    SCHEMA_VERSION,
    SCHEMA_VERSION_KEY,
    TABLE_PROPERTIES,
    TABLE_SCHEMAS,
    run_day,
    run_day_from_id,
    storage_schema,
    utc_today,
)
from jobs.tables.writer_tag import commit_metadata

__all__ = [
    "SchemaVersionError",
    "TableError",
    "TableInfo",
    "TableProtocolError",
    "append_rows",
    "arrow_dataset",
    "arrow_rows",
    "check_schema_version",
    "check_writable",
    "first_detections",
    "latest_run",
    "open_table",
    "read_rows",
    "rows_to_arrow",
    "run_dates",
    "run_days",
    "run_filters",
    "schema_version",
    "set_schema_version",
    "table_error",
    "table_exists",
    "table_info",
    "table_path",
    "with_run_date",
]

log = logging.getLogger(__name__)

COMMIT_RETRIES = 8


class TableError(RuntimeError):
    """A Delta table could not be read or written; the message names the table."""


class TableProtocolError(TableError):
    """A Delta table needs reader or writer features this build cannot honour."""


class SchemaVersionError(TableError):
    """A table's ``bkaudit.schemaVersion`` is newer than this code's (or unreadable): a newer
    bkaudit wrote the warehouse, and this one must neither read nor write it."""


def schema_version(properties: Mapping[str, str | None], path: str = "table") -> int | None:
    """The bkaudit schema version in a table's properties; None when absent (a version-1
    table, or one whose creator died before setting it). Raises :class:`SchemaVersionError`
    for a value that is not a positive integer."""
    raw = properties.get(SCHEMA_VERSION_KEY)
    if raw is None:
        return None
    try:
        version = int(str(raw).strip())
    except ValueError:
        version = 0
    if version < 1:
        raise SchemaVersionError(
            f"Delta table {path}: table property {SCHEMA_VERSION_KEY}={raw!r} is not a "
            "schema version; this bkaudit neither reads nor writes it"
        )
    return version


def check_schema_version(properties: Mapping[str, str | None], path: str) -> int | None:
    """:func:`schema_version`, refusing a version newer than :data:`SCHEMA_VERSION` with a
    one-line :class:`SchemaVersionError` (the commands exit 2 on it)."""
    version = schema_version(properties, path)
    if version is not None and version > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"Delta table {path} has bkaudit schema version {version}, newer than this "
            f"bkaudit's {SCHEMA_VERSION}: it was neither read nor written; upgrade bkaudit"
        )
    return version


def table_error(path: str, exc: BaseException) -> TableError:
    """A delta-rs error as a one-line :class:`TableError` naming the table at ``path`` (a
    :class:`TableProtocolError` for features this delta-rs cannot honour), for callers that
    operate on a table directly (``bkaudit maintain``, the migration) to raise ``from exc``."""
    text = str(exc)
    if isinstance(exc, _protocol_errors()) or "Unsupported" in text or "protocol" in text:
        return TableProtocolError(_protocol_message(path, exc))
    if is_s3(path) and any(w in text for w in ("S3 error", "error sending request")):
        why = _s3_unreachable(path)
        if why is not None:  # delta-rs's own text may stop at "error sending request"
            return TableError(f"Delta table {path}: the store cannot be reached: {why}")
    return TableError(f"Delta table {path}: {delta_rs_cause(exc)}")


def _s3_unreachable(path: str) -> str | None:
    """Why the S3 store of ``path`` does not answer, or None (it answers, or there is no S3
    client to ask: the Airflow worker's environment has delta-rs only)."""
    try:
        from jobs.tables.s3_probe import unreachable_reason
    except ImportError:
        return None
    return unreachable_reason(path)


def _protocol_errors() -> tuple[type[BaseException], ...]:
    from deltalake.exceptions import DeltaProtocolError

    return (DeltaProtocolError,)


def table_path(warehouse: str, name: str) -> str:
    """Where table ``name`` lives under the warehouse directory or URI."""
    return f"{warehouse.rstrip('/')}/{name}"


def is_local(path: str) -> bool:
    """True for a path on this machine's file system (plain or ``file://``), which delta-rs
    and ``os`` read directly; False for an object-store URI."""
    return "://" not in path or path.startswith("file://")


def _has_commit(log_dir: str) -> bool:
    # A writer creating the table makes _delta_log before its first commit lands: until then
    # the table does not exist (opening it fails with "no files in log segment").
    try:
        names = os.listdir(log_dir)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return any(n.endswith(".json") or ".checkpoint" in n for n in names)


def table_exists(warehouse: str, name: str) -> bool:
    """True if a Delta table with at least one commit is at ``warehouse/name``."""
    path = table_path(warehouse, name)
    if is_local(path):
        local = path.removeprefix("file://")
        return _has_commit(os.path.join(local, "_delta_log"))
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    # Not DeltaTable.is_deltatable: it holds the GIL while it retries an unreachable store
    # (seconds), and the watch's ZooKeeper session, kept alive by another thread, expires.
    try:
        DeltaTable(path, storage_options=delta_storage_options(path) or None)
    except TableNotFoundError:
        return False
    except OSError as exc:
        raise table_error(path, exc) from exc
    return True


def open_table(warehouse: str, name: str) -> Any:
    """Table ``name``'s ``deltalake.DeltaTable`` at its latest version, for operations beyond
    reading and appending (delete, compact, vacuum, relayout); a delta-rs error becomes a
    one-line :class:`TableError`. Nothing is checked: call :func:`table_info` first to refuse
    a protocol or schema version this code cannot honour."""
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError

    path = table_path(warehouse, name)
    try:
        return DeltaTable(path, storage_options=delta_storage_options(path) or None)
    except (DeltaError, OSError) as exc:
        raise table_error(path, exc) from exc


def _protocol_message(path: str, exc: BaseException) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return (
        f"Delta table {path} uses a protocol this bkaudit's delta-rs cannot honour ({first}); "
        "it was neither read nor written. Use --executor spark, or upgrade bkaudit"
    )


def _check_protocol(table: Any, path: str, write: bool) -> None:
    """Refuse a table whose protocol asks for features delta-rs does not know, or whose
    schema version is newer than this code's."""
    from deltalake.exceptions import DeltaError

    try:
        proto = table.protocol()
        properties = dict(table.metadata().configuration)
        if write:
            table.schema()
    except DeltaError as exc:
        raise table_error(path, exc) from exc
    check_schema_version(properties, path)
    if proto.min_reader_version > 3 or proto.min_writer_version > 7:
        raise TableProtocolError(
            _protocol_message(
                path,
                RuntimeError(
                    f"reader v{proto.min_reader_version} / writer v{proto.min_writer_version}"
                ),
            )
        )


def check_writable(warehouse: str, names: Iterable[str]) -> None:
    """Raise :class:`TableError` before any work if the warehouse cannot be written or reached
    (:mod:`jobs.tables.warehouse_probe`), or an existing table among ``names`` cannot be
    appended to by delta-rs. With no ``names`` only the warehouse is checked: what the
    commands ask before they read the cluster, whichever executor will write."""
    from jobs.tables.warehouse_probe import WarehouseUnusable, probe_warehouse

    try:
        probe_warehouse(warehouse)
    except WarehouseUnusable as exc:
        raise TableError(str(exc)) from None
    for name in names:
        if table_exists(warehouse, name):
            _check_protocol(open_table(warehouse, name), table_path(warehouse, name), write=True)


def read_rows(
    warehouse: str,
    name: str,
    *,
    columns: Sequence[str] | None = None,
    filters: Sequence[tuple[str, str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Rows of table ``name`` as dicts (timestamps as aware datetimes); empty when the table
    does not exist. ``filters`` are ``(column, op, value)`` triples, pushed to partitions."""
    if not table_exists(warehouse, name):
        return []
    return arrow_rows(read_arrow(warehouse, name, columns=columns, filters=filters))


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def arrow_rows(table: pa.Table, *, keep_micros: bool = False) -> list[dict[str, Any]]:
    """``table.to_pylist()``, made column by column: pyarrow builds each time-zone-aware
    datetime through the time zone database (about 7 µs), where UTC microseconds need only an
    addition (about 1 µs). Tens of thousands of findings and actions carry timestamps.
    ``keep_micros`` leaves UTC timestamps as microseconds since the epoch, for rows whose
    times are only compared with each other."""
    if table.num_columns == 0:
        return list(table.to_pylist())
    columns: list[list[Any]] = []
    for field_, column in zip(table.schema, table.columns, strict=True):
        t = field_.type
        if pa.types.is_timestamp(t) and t.unit == "us" and t.tz in ("UTC", "+00:00"):
            stamps = column.cast(pa.int64()).to_pylist()
            columns.append(stamps if keep_micros else [
                None if m is None else _EPOCH + timedelta(microseconds=m) for m in stamps
            ])  # fmt: skip
        else:
            columns.append(column.to_pylist())
    names = table.column_names
    return [dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]


def read_arrow(
    warehouse: str,
    name: str,
    *,
    columns: Sequence[str] | None = None,
    filters: Sequence[tuple[str, str, Any]] | None = None,
) -> pa.Table:
    """Table ``name`` as an Arrow table (see :func:`read_rows`)."""
    from deltalake.exceptions import DeltaError

    table = open_table(warehouse, name)
    _check_protocol(table, table_path(warehouse, name), write=False)
    try:
        dataset = arrow_dataset(warehouse, name, table)
        expr = None
        import pyarrow.dataset as ds

        for col, op, value in filters or ():
            term = _term(ds.field(col), op, value)
            expr = term if expr is None else expr & term
        wanted = [c for c in columns if c in dataset.schema.names] if columns else None
        return dataset.to_table(columns=wanted, filter=expr)
    except DeltaError as exc:
        raise table_error(table_path(warehouse, name), exc) from exc
    except (pa.ArrowException, OSError) as exc:
        raise _read_error(table_path(warehouse, name), exc) from exc


def _read_error(path: str, exc: BaseException) -> TableError:
    """A failed read of a table's files as one line naming the table; on S3, an outage is
    said as such (Arrow reports a file it could not fetch as "0 bytes")."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    why = _s3_unreachable(path) if is_s3(path) else None
    if why is not None:
        return TableError(f"Delta table {path} cannot be read: {why}")
    return TableError(f"Delta table {path} cannot be read: {first}")


def _arrow_filesystem(path: str) -> Any:
    """Arrow's own file system for a table: local, or S3 (:func:`arrow_s3_filesystem`); None
    (delta-rs's default) for other object stores.

    delta-rs's default is a ``PyFileSystem`` (Python callbacks into its object store).
    Arrow's I/O threads can still hold it when the interpreter exits, and about one process
    in ten that read a table through it then aborts after its work is done ("terminate
    called without an active exception", exit 134), losing the command's exit status.
    """
    if is_s3(path):
        return arrow_s3_filesystem(path)
    if "://" in path and not path.startswith("file://"):
        return None
    import pyarrow.fs as pa_fs

    return pa_fs.SubTreeFileSystem(
        os.path.abspath(path.removeprefix("file://")), pa_fs.LocalFileSystem()
    )


def arrow_dataset(warehouse: str, name: str, table: Any = None) -> Any:
    """Table ``name``'s files (of ``table``, an :func:`open_table` result, when given) as an
    Arrow dataset, read through Arrow's own file system when local (delta-rs's Python file
    system cannot be called back while delta-rs writes): for counting and relaying rows."""
    table = table if table is not None else open_table(warehouse, name)
    return table.to_pyarrow_dataset(filesystem=_arrow_filesystem(table_path(warehouse, name)))


def _term(field: Any, op: str, value: Any) -> Any:
    if op == "=":
        return field == value
    if op == "!=":
        return field != value
    if op == "in":
        return field.isin(list(value))
    if op == ">=":
        return field >= value
    raise ValueError(f"unsupported filter operator {op!r}")


@dataclass
class TableInfo:
    """What the Delta log says about one table: enough to decide on migration and maintenance."""

    name: str
    path: str
    version: int | None
    """The bkaudit schema version property (None: not set)."""
    partition_columns: list[str]
    properties: dict[str, str] = field(default_factory=dict)
    delta_version: int = 0

    @property
    def current_layout(self) -> bool:
        """Partitioned the way this code creates the table."""
        return self.partition_columns == PARTITION_BY[self.name]

    @property
    def up_to_date(self) -> bool:
        """Current layout, schema version and retention properties: nothing to migrate."""
        return (
            self.current_layout
            and self.version == SCHEMA_VERSION
            and all(self.properties.get(k) == v for k, v in TABLE_PROPERTIES.items())
        )


def table_info(warehouse: str, name: str) -> TableInfo | None:
    """The layout of table ``name`` (None when it does not exist). Refuses, like every read,
    a protocol or schema version this code cannot honour."""
    if not table_exists(warehouse, name):
        return None
    path = table_path(warehouse, name)
    table = open_table(warehouse, name)
    _check_protocol(table, path, write=False)
    meta = table.metadata()
    properties = {k: v for k, v in dict(meta.configuration).items() if v is not None}
    return TableInfo(
        name=name,
        path=path,
        version=schema_version(properties, path),
        partition_columns=list(meta.partition_columns),
        properties=properties,
        delta_version=int(table.version()),
    )


_warned_legacy: set[str] = set()
_warned_lock = threading.Lock()


def _warn_legacy(path: str, partition_columns: Sequence[str], warehouse: str) -> None:
    with _warned_lock:
        if path in _warned_legacy:
            return
        _warned_legacy.add(path)
    log.warning(
        "Delta table %s is partitioned by %s (schema version 1); appending in that layout. "
        "Relay it out by run_date with `bkaudit maintain --warehouse %s --migrate`",
        path,
        ", ".join(partition_columns) or "nothing",
        warehouse,
    )


def create_table(warehouse: str, name: str) -> None:
    """Create table ``name`` empty, with its schema, partitioning and properties, unless some
    writer (ours or Spark's) got there first. The schema version goes in a second commit:
    delta-rs takes only ``delta.*`` properties at creation. A ``_delta_log`` left without a
    commit (a writer killed while creating it) is created over."""
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError

    path = table_path(warehouse, name)
    try:
        with quiet_rust_panics():
            DeltaTable.create(
                path,
                schema=storage_schema(TABLE_SCHEMAS[name]),
                mode="ignore",
                partition_by=PARTITION_BY[name] or None,
                configuration=dict(TABLE_PROPERTIES),
                storage_options=delta_storage_options(path) or None,
            )
    except DeltaError as exc:  # lost a creation race: the winner's table is as good
        if not wait_for_table(warehouse, name):
            raise table_error(path, exc) from exc
    except OSError as exc:  # the store: unreachable, refused
        raise table_error(path, exc) from exc
    set_schema_version(warehouse, name)


def wait_for_table(warehouse: str, name: str, timeout: float = 10.0) -> bool:
    """True once table ``name`` exists, waiting up to ``timeout`` seconds: a writer that won
    the creation race makes its _delta_log directory a moment before its first commit."""
    path = table_path(warehouse, name)
    local = is_local(path)
    log_dir = os.path.join(path.removeprefix("file://"), "_delta_log")
    deadline = time.monotonic() + timeout
    while not table_exists(warehouse, name):
        # No log directory: nobody is creating it, so the failure was not a race (an
        # unwritable warehouse fails at once rather than after the timeout).
        if time.monotonic() > deadline or (local and not os.path.isdir(log_dir)):
            return False
        time.sleep(0.2)
    return True


def set_schema_version(
    warehouse: str, name: str, properties: Mapping[str, str] | None = None
) -> bool:
    """Record :data:`SCHEMA_VERSION` (and ``properties``) on a table already in the current
    layout that lacks them; True if a commit was made. Never on a version-1 layout: that is
    the migration's job."""
    from deltalake.exceptions import CommitFailedError, DeltaError

    path = table_path(warehouse, name)
    for attempt in range(COMMIT_RETRIES):
        table = open_table(warehouse, name)
        meta = table.metadata()
        current = {k: v for k, v in dict(meta.configuration).items() if v is not None}
        check_schema_version(current, path)
        if list(meta.partition_columns) != PARTITION_BY[name]:
            return False
        wanted = {**(properties or {}), SCHEMA_VERSION_KEY: str(SCHEMA_VERSION)}
        missing = {k: v for k, v in wanted.items() if current.get(k) != v}
        if not missing:
            return False
        try:
            with quiet_rust_panics():
                table.alter.set_table_properties(missing, raise_if_not_exists=False)
            return True
        except CommitFailedError:
            time.sleep(0.1 * (attempt + 1))
        except DeltaError as exc:
            raise table_error(path, exc) from exc
    raise TableError(f"Delta table {path}: could not set its properties (commit races)")


def with_run_date(name: str, data: pa.Table, run_date: date | None = None) -> pa.Table:
    """``data`` with its ``run_date`` column filled where missing or null, for the tables
    partitioned by it: ``run_date`` if given, else per run id the day of the run's earliest
    :data:`~jobs.tables.schema.RUN_TIME_COLUMN` value (fragments: detected_at, the audit's
    start; actions: the run's first action), else the day in a :func:`new_run_id` id, else
    today (UTC). Spark's writer applies the same rule (:mod:`jobs.spark.load`)."""
    if RUN_DATE not in TABLE_SCHEMAS[name].names:
        return data
    have = data.column(RUN_DATE) if RUN_DATE in data.column_names else None
    if have is not None and have.null_count == 0:
        return data
    if run_date is not None or data.num_rows == 0:
        fill = pa.array([run_date] * data.num_rows, pa.date32())
    else:
        fill = run_dates(data, RUN_TIME_COLUMN.get(name))
    column = fill if have is None else pc.coalesce(have.cast(pa.date32()), fill)
    if have is None:
        return data.append_column(pa.field(RUN_DATE, pa.date32()), column)
    return data.set_column(data.column_names.index(RUN_DATE), RUN_DATE, column)


def run_dates(
    data: pa.Table, time_column: str | None, known: Mapping[str, date] | None = None
) -> pa.ChunkedArray:
    """The run's day for each row of ``data`` (see :func:`with_run_date`): ``known`` days by
    run id first (the migration passes audit_runs' started_at), then the time column, the
    run id's stamp, today."""
    run_ids = data.column("run_id")
    unique = pc.unique(run_ids)
    today = utc_today()
    days: list[date] = []
    for rid in unique.to_pylist():
        day = (known or {}).get(rid)
        if day is None and time_column is not None and time_column in data.column_names:
            first = pc.min(pc.filter(data.column(time_column), pc.equal(run_ids, rid))).as_py()
            day = run_day(first) if first is not None else None
        days.append(day or run_day_from_id(rid) or today)
    index = pc.index_in(run_ids, value_set=unique)
    return pc.take(pa.array(days, pa.date32()), index)


def append_rows(
    warehouse: str,
    name: str,
    rows: Iterable[Mapping[str, Any]],
    *,
    run_date: date | None = None,
) -> int:
    """Append ``rows`` (dicts keyed by column) to table ``name``, creating it with its schema,
    partitioning and properties if needed; returns the number of rows. ``run_date`` (the UTC
    day the run started) fills rows that do not carry one (see :func:`with_run_date`).
    Concurrent appends, ours or Spark's, never conflict on data: a lost commit race is
    retried."""
    return append_arrow(
        warehouse, name, rows_to_arrow(rows, TABLE_SCHEMAS[name]), run_date=run_date
    )


ROWS_PER_BATCH = 65_536
"""Rows converted to Arrow at a time by :func:`rows_to_arrow`."""


def rows_to_arrow(
    rows: Iterable[Mapping[str, Any]], schema: pa.Schema, per_batch: int = ROWS_PER_BATCH
) -> pa.Table:
    """``rows`` as an Arrow table in ``schema``, converted ``per_batch`` rows at a time: a
    lazy ``rows`` (a million ledgers' rows) never exists whole as Python dicts, only as
    Arrow's compact columns."""
    batches: list[pa.RecordBatch] = []
    chunk: list[dict[str, Any]] = []
    for r in rows:
        chunk.append(r if isinstance(r, dict) else dict(r))
        if len(chunk) >= per_batch:
            batches.append(pa.RecordBatch.from_pylist(chunk, schema=schema))
            chunk = []
    if chunk or not batches:
        batches.append(pa.RecordBatch.from_pylist(chunk, schema=schema))
    return pa.Table.from_batches(batches, schema=schema)


def append_arrow(warehouse: str, name: str, data: pa.Table, *, run_date: date | None = None) -> int:
    """Append an Arrow table already in ``name``'s schema (see :func:`append_rows`)."""
    from deltalake import CommitProperties, write_deltalake
    from deltalake.exceptions import CommitFailedError, DeltaError

    path = table_path(warehouse, name)
    data = with_run_date(name, data, run_date)
    if not table_exists(warehouse, name):
        create_table(warehouse, name)
    for attempt in range(COMMIT_RETRIES):
        table = open_table(warehouse, name)
        _check_protocol(table, path, write=True)
        # Append in the table's own partitioning: the current one, or a version-1 table's
        # until it is migrated (delta-rs refuses a mismatch).
        parts = list(table.metadata().partition_columns)
        if parts != PARTITION_BY[name]:
            _warn_legacy(path, parts, warehouse)
        try:
            with quiet_rust_panics():
                write_deltalake(
                    table,
                    data,
                    mode="append",
                    partition_by=parts or None,
                    schema_mode="merge",
                    commit_properties=CommitProperties(custom_metadata=commit_metadata()),
                )
            return int(data.num_rows)
        except CommitFailedError as exc:
            if attempt + 1 == COMMIT_RETRIES:
                raise table_error(path, exc) from exc
            log.warning("%s: commit race (%s), retrying", name, exc)
            time.sleep(0.2 * (attempt + 1))
        except DeltaError as exc:
            if "artition" in str(exc) and attempt + 1 < COMMIT_RETRIES:
                # Migrated under us (partitioning changed since we opened it): reopen.
                log.warning("%s: %s; reopening the table", name, exc)
                continue
            raise table_error(path, exc) from exc
        except OSError as exc:  # the store: unreachable, refused, full
            raise table_error(path, exc) from exc
    return 0


def latest_run(warehouse: str, run_id: str | None = None) -> dict[str, Any] | None:
    """The latest finished audit run (or run ``run_id``, whatever its status), or None."""
    runs = read_rows(warehouse, AUDIT_RUNS)
    if run_id is not None:
        runs = [r for r in runs if r["run_id"] == run_id]
    else:
        runs = [r for r in runs if r["status"] in RunStatus.FINISHED]
    if not runs:
        return None
    best = max(
        runs,
        key=lambda r: (
            r["finished_at"] is not None,
            r["finished_at"] or r["started_at"],
            r["started_at"],
        ),
    )
    best["counts"] = dict(best["counts"] or {})
    return best


def first_detections(warehouse: str) -> dict[tuple[int, int, str], datetime]:
    """First detection of each finding of the latest audit run in ``warehouse``, by
    ``(ledger_id, segment_first_entry_id, bookie_id)``: what the next run carries forward."""
    first: dict[tuple[int, int, str], datetime] = {}
    prev = latest_run(warehouse)
    if prev is None:
        return first
    if not table_exists(warehouse, FRAGMENTS):
        return first
    for r in read_rows(
        warehouse,
        FRAGMENTS,
        columns=["ledger_id", "segment_first_entry_id", "bookie_id", "first_detected_at"],
        filters=run_filters(warehouse, FRAGMENTS, prev),
    ):
        key = (r["ledger_id"], r["segment_first_entry_id"], r["bookie_id"])
        t = r["first_detected_at"]
        if t is not None and (key not in first or t < first[key]):
            first[key] = t
    return first


def run_days(run: Mapping[str, Any]) -> list[date]:
    """Every day under which a run's rows can be filed (:func:`with_run_date`, and Spark's
    writer): each day from its start to its finish (or today), and the day its id names."""
    first = run_day(run["started_at"])
    end = run.get("finished_at") or datetime.now(timezone.utc)
    # At least the start's day, even with a finish stamped before it (a clock stepped back).
    span = max((run_day(end) - first).days, 0)
    days = {first + timedelta(days=n) for n in range(span + 1)}
    named = run_day_from_id(run["run_id"])
    return sorted(days | ({named} if named else set()))


def run_filters(
    warehouse: str, name: str, run: str | Mapping[str, Any]
) -> list[tuple[str, str, Any]]:
    """Filters that select one run's rows of table ``name``. Given the run's ``audit_runs``
    row, they also name the partitions its rows can be in (:func:`run_days`), so a month of
    million-row runs is not read to find one; given only its id, or on a table of the old
    layout (partitioned by run_id), they filter by run_id alone."""
    if isinstance(run, str):
        return [("run_id", "=", run)]
    terms: list[tuple[str, str, Any]] = [("run_id", "=", run["run_id"])]
    parts = list(open_table(warehouse, name).metadata().partition_columns)
    if parts == [RUN_DATE]:
        terms.append((RUN_DATE, "in", run_days(run)))
    return terms


def run_fragments(
    warehouse: str,
    run: str | Mapping[str, Any],
    filters: Mapping[str, Any] | None = None,
    *,
    columns: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """The fragments of one run (its ``audit_runs`` row, or its id: see :func:`run_filters`),
    optionally filtered by column equality; only ``columns`` when given (an incident at a
    million ledgers has tens of thousands of fragments)."""
    return arrow_rows(run_fragments_arrow(warehouse, run, filters, columns=columns))


def run_fragments_arrow(
    warehouse: str,
    run: str | Mapping[str, Any],
    filters: Mapping[str, Any] | None = None,
    *,
    columns: Sequence[str] | None = None,
) -> pa.Table:
    """:func:`run_fragments` as an Arrow table: empty, with the columns asked for, when the
    warehouse has no fragments table yet."""
    if not table_exists(warehouse, FRAGMENTS):
        wanted = columns or FRAGMENTS_TABLE_SCHEMA.names
        return FRAGMENTS_TABLE_SCHEMA.empty_table().select(
            [c for c in wanted if c in FRAGMENTS_TABLE_SCHEMA.names]
        )
    terms = run_filters(warehouse, FRAGMENTS, run)
    terms += [(k, "=", v) for k, v in (filters or {}).items()]
    return read_arrow(warehouse, FRAGMENTS, columns=columns, filters=terms)


def run_metadata_errors(warehouse: str, run: str | Mapping[str, Any]) -> list[dict[str, Any]]:
    """Ledger znodes that could not be read in one run: ledger_id, znode_path, error. The
    run's million rows are filtered in Arrow; only the unreadable ones become dicts."""
    if not table_exists(warehouse, LEDGERS):
        return []
    table = read_arrow(
        warehouse,
        LEDGERS,
        columns=["ledger_id", "znode_path", "error"],
        filters=run_filters(warehouse, LEDGERS, run),
    )
    rows = arrow_rows(table.filter(pc.is_valid(table.column("error"))))
    return sorted(rows, key=lambda r: r["ledger_id"])
