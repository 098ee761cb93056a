"""The Delta tables through delta-rs (``deltalake``): no JVM.

The local executor appends here; ``listunderreplicated``, the HTML report and the Airflow
support module read here. Tables written by delta-spark and by delta-rs are the same tables:
same schemas (:mod:`jobs.tables.schema`), same partitioning, the default reader 1 / writer 2
protocol. A table whose protocol needs features this delta-rs does not support is refused
before anything is written, with :class:`TableProtocolError` naming the table.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from bklib.states import RunStatus
from jobs.tables.schema import (
    AUDIT_RUNS,
    FRAGMENTS,
    LEDGERS,
    PARTITION_BY,
    TABLE_SCHEMAS,
)

__all__ = [
    "TableError",
    "TableProtocolError",
    "append_rows",
    "check_writable",
    "latest_run",
    "read_rows",
    "table_exists",
    "table_path",
]

log = logging.getLogger(__name__)

COMMIT_RETRIES = 8


class TableError(RuntimeError):
    """A Delta table could not be read or written; the message names the table."""


class TableProtocolError(TableError):
    """A Delta table needs reader or writer features this build cannot honour."""


def _table_error(path: str, exc: BaseException) -> TableError:
    text = str(exc)
    if isinstance(exc, _protocol_errors()) or "Unsupported" in text or "protocol" in text:
        return TableProtocolError(_protocol_message(path, exc))
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return TableError(f"Delta table {path}: {first}")


def _protocol_errors() -> tuple[type[BaseException], ...]:
    from deltalake.exceptions import DeltaProtocolError

    return (DeltaProtocolError,)


def table_path(warehouse: str, name: str) -> str:
    """Where table ``name`` lives under the warehouse directory or URI."""
    return f"{warehouse.rstrip('/')}/{name}"


def table_exists(warehouse: str, name: str) -> bool:
    """True if a Delta table is at ``warehouse/name``."""
    path = table_path(warehouse, name)
    if "://" not in path or path.startswith("file://"):
        local = path.removeprefix("file://")
        return os.path.isdir(os.path.join(local, "_delta_log"))
    from deltalake import DeltaTable

    return bool(DeltaTable.is_deltatable(path))


def _open(warehouse: str, name: str) -> Any:
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError

    path = table_path(warehouse, name)
    try:
        return DeltaTable(path)
    except DeltaError as exc:
        raise _table_error(path, exc) from exc


def _protocol_message(path: str, exc: BaseException) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return (
        f"Delta table {path} uses a protocol this bkaudit's delta-rs cannot honour ({first}); "
        "it was neither read nor written. Use --executor spark, or upgrade bkaudit"
    )


def _check_protocol(table: Any, path: str, write: bool) -> None:
    """Refuse a table whose protocol asks for features delta-rs does not know."""
    from deltalake.exceptions import DeltaError

    try:
        proto = table.protocol()
        if write:
            table.schema()
    except DeltaError as exc:
        raise _table_error(path, exc) from exc
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
    """Raise :class:`TableError` before any work if an existing table among ``names`` cannot
    be appended to by delta-rs."""
    for name in names:
        if table_exists(warehouse, name):
            _check_protocol(_open(warehouse, name), table_path(warehouse, name), write=True)


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
    return read_arrow(warehouse, name, columns=columns, filters=filters).to_pylist()


def read_arrow(
    warehouse: str,
    name: str,
    *,
    columns: Sequence[str] | None = None,
    filters: Sequence[tuple[str, str, Any]] | None = None,
) -> pa.Table:
    """Table ``name`` as an Arrow table (see :func:`read_rows`)."""
    from deltalake.exceptions import DeltaError

    table = _open(warehouse, name)
    _check_protocol(table, table_path(warehouse, name), write=False)
    try:
        dataset = table.to_pyarrow_dataset(
            filesystem=_arrow_filesystem(table_path(warehouse, name))
        )
        expr = None
        import pyarrow.dataset as ds

        for col, op, value in filters or ():
            term = _term(ds.field(col), op, value)
            expr = term if expr is None else expr & term
        wanted = [c for c in columns if c in dataset.schema.names] if columns else None
        return dataset.to_table(columns=wanted, filter=expr)
    except DeltaError as exc:
        raise _table_error(table_path(warehouse, name), exc) from exc


def _arrow_filesystem(path: str) -> Any:
    """Arrow's own file system for a local table, None (delta-rs's default) otherwise.

    delta-rs's default is a ``PyFileSystem`` (Python callbacks into its object store).
    Arrow's I/O threads can still hold it when the interpreter exits, and about one process
    in ten that read a table through it then aborts after its work is done ("terminate
    called without an active exception", exit 134), losing the command's exit status.
    """
    if "://" in path and not path.startswith("file://"):
        return None
    import pyarrow.fs as pa_fs

    return pa_fs.SubTreeFileSystem(
        os.path.abspath(path.removeprefix("file://")), pa_fs.LocalFileSystem()
    )


def _term(field: Any, op: str, value: Any) -> Any:
    if op == "=":
        return field == value
    if op == "!=":
        return field != value
    if op == "in":
        return field.isin(list(value))
    raise ValueError(f"unsupported filter operator {op!r}")


def append_rows(warehouse: str, name: str, rows: Iterable[Mapping[str, Any]]) -> int:
    """Append ``rows`` (dicts keyed by column) to table ``name``, creating it with its schema
    and partitioning if needed; returns the number of rows. Concurrent appends, ours or
    Spark's, never conflict on data: a lost commit race is retried."""
    schema = TABLE_SCHEMAS[name]
    data = pa.Table.from_pylist([dict(r) for r in rows], schema=schema)
    return append_arrow(warehouse, name, data)


def append_arrow(warehouse: str, name: str, data: pa.Table) -> int:
    """Append an Arrow table already in ``name``'s schema (see :func:`append_rows`)."""
    from deltalake import write_deltalake
    from deltalake.exceptions import CommitFailedError, DeltaError

    path = table_path(warehouse, name)
    if table_exists(warehouse, name):
        _check_protocol(_open(warehouse, name), path, write=True)
    for attempt in range(COMMIT_RETRIES):
        try:
            write_deltalake(
                path,
                data,
                mode="append",
                partition_by=PARTITION_BY[name] or None,
                schema_mode="merge",
            )
            return data.num_rows
        except CommitFailedError as exc:
            if attempt + 1 == COMMIT_RETRIES:
                raise _table_error(path, exc) from exc
            log.warning("%s: commit race (%s), retrying", name, exc)
            time.sleep(0.2 * (attempt + 1))
        except DeltaError as exc:
            raise _table_error(path, exc) from exc
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


def run_fragments(
    warehouse: str, run_id: str, filters: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The fragments of one run, optionally filtered by column equality."""
    terms = [("run_id", "=", run_id), *((k, "=", v) for k, v in (filters or {}).items())]
    return read_rows(warehouse, FRAGMENTS, filters=terms)


def run_metadata_errors(warehouse: str, run_id: str) -> list[dict[str, Any]]:
    """Ledger znodes that could not be read in one run: ledger_id, znode_path, error."""
    rows = read_rows(
        warehouse,
        LEDGERS,
        columns=["ledger_id", "znode_path", "error"],
        filters=[("run_id", "=", run_id)],
    )
    return sorted((r for r in rows if r["error"] is not None), key=lambda r: r["ledger_id"])
