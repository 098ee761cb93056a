"""The watch's spool: table rows that could not be written to the warehouse, kept on local
disk until it can be (docs/watch.md, "Unreachable warehouse").

One file per failed append, ``<ordinal>-<pid>-<table>.jsonl``: a header line (format, table,
warehouse, run_date, row count), then one JSON object per row. Values that JSON lacks are
tagged one-key objects: ``{"$ts": iso}`` (datetime), ``{"$date": iso}``, ``{"$b64": ...}``
(bytes); a real one-key object whose key starts with ``$`` is wrapped in ``{"$obj": ...}``.
Files are written to a temporary name, fsynced, then renamed, so a crash leaves either the
whole file or none. Names sort in write order, and :class:`SpoolWriter` keeps that order:
while anything is spooled, new rows go behind it, so a run's ``audit_runs`` row (what marks
the run finished, :class:`jobs.tables.runs.RunRecord`) never lands before its per-run rows.

Flushing takes an exclusive ``flock`` on the directory's lock file, so instances sharing a
spool never append the same file twice; a file is deleted only after its append committed.
A file whose run ids are already in its table (a crash between the commit and the delete)
is deleted without appending again.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from typing import Any, TypeAlias

import pyarrow as pa

from bklib.durable import fsync_dir, write_atomically
from jobs.runtime.messages import one_line
from jobs.tables import delta
from jobs.tables.delta import TableError
from jobs.tables.schema import TABLE_SCHEMAS

__all__ = [
    "DEFAULT_SPOOL_MAX_BYTES",
    "SpoolBatch",
    "SpoolError",
    "SpoolFullError",
    "SpoolWriter",
    "decode_batch",
    "decode_value",
    "default_spool_dir",
    "encode_batch",
    "encode_value",
    "spool_order",
]

log = logging.getLogger("jobs.watch")

FORMAT = 1
DEFAULT_SPOOL_MAX_BYTES = 512 * 1024 * 1024
"""512 MB: hours of audits of a large cluster before the service stops."""

_NAME = re.compile(r"^(\d{20})-(\d+)-([a-z_]+)\.jsonl$")


class SpoolError(TableError):
    """Rows could not be written to the warehouse nor spooled: the service stops (exit 2)
    rather than drop them silently."""


class SpoolFullError(SpoolError):
    """The spool went above ``--spool-max-bytes``: the service stops rather than grow it."""


def default_spool_dir(warehouse: str) -> str:
    """``$XDG_STATE_HOME`` (else ``~/.local/state``)``/bkaudit/watch-spool/<warehouse hash>``:
    one spool per warehouse, so rows are never flushed into another warehouse."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local/state")
    digest = hashlib.sha256(warehouse.rstrip("/").encode()).hexdigest()[:16]
    return os.path.join(base, "bkaudit", "watch-spool", digest)


# ---- encoding -------------------------------------------------------------------------------


def encode_value(v: Any) -> Any:
    """``v`` as JSON-able data (see the module docstring for the tags)."""
    if isinstance(v, datetime):  # before date: a datetime is a date
        return {"$ts": v.isoformat()}
    if isinstance(v, date):
        return {"$date": v.isoformat()}
    if isinstance(v, (bytes, bytearray, memoryview)):
        return {"$b64": base64.b64encode(bytes(v)).decode("ascii")}
    if isinstance(v, Mapping):
        out = {str(k): encode_value(x) for k, x in v.items()}
        if len(out) == 1 and next(iter(out)).startswith("$"):
            return {"$obj": out}
        return out
    if isinstance(v, (list, tuple)):
        return [encode_value(x) for x in v]
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int):
        return int(v)  # IntEnum and friends: the plain number
    if isinstance(v, float):
        return float(v)
    if isinstance(v, str):
        return str(v)  # StrEnum: the plain text
    raise TypeError(f"cannot spool a {type(v).__name__} value")


def decode_value(v: Any) -> Any:
    """The inverse of :func:`encode_value`."""
    if isinstance(v, dict):
        if len(v) == 1:
            ((tag, x),) = v.items()
            if tag == "$ts":
                return datetime.fromisoformat(x)
            if tag == "$date":
                return date.fromisoformat(x)
            if tag == "$b64":
                return base64.b64decode(x)
            if tag == "$obj":
                return {k: decode_value(y) for k, y in x.items()}
        return {k: decode_value(y) for k, y in v.items()}
    if isinstance(v, list):
        return [decode_value(x) for x in v]
    return v


@dataclass(frozen=True)
class SpoolBatch:
    """One failed append: its table, rows, and the ``run_date`` it was appended with."""

    table: str
    rows: list[dict[str, Any]]
    run_date: date | None = None
    warehouse: str | None = None


def encode_batch(batch: SpoolBatch) -> bytes:
    """The file's bytes. Only the table's columns are kept: a ledger's password, which the
    tables never store, never reaches the disk either."""
    columns = TABLE_SCHEMAS[batch.table].names
    header = {
        "format": FORMAT,
        "table": batch.table,
        "warehouse": batch.warehouse,
        "run_date": batch.run_date.isoformat() if batch.run_date else None,
        "rows": len(batch.rows),
    }
    lines = [json.dumps(header, sort_keys=True)]
    for r in batch.rows:
        row = {c: encode_value(r[c]) for c in columns if c in r}
        lines.append(json.dumps(row, separators=(",", ":"), allow_nan=False))
    return ("\n".join(lines) + "\n").encode()


def decode_batch(data: bytes) -> SpoolBatch:
    """Read a file written by :func:`encode_batch`; ValueError if it is not one."""
    lines = data.decode().splitlines()
    if not lines:
        raise ValueError("empty spool file")
    header = json.loads(lines[0])
    if header.get("format") != FORMAT or header.get("table") not in TABLE_SCHEMAS:
        raise ValueError(f"not a spool file of format {FORMAT}: {lines[0][:200]}")
    rows = [decode_value(json.loads(line)) for line in lines[1:] if line]
    if len(rows) != header.get("rows"):
        raise ValueError(f"spool file has {len(rows)} rows, its header says {header.get('rows')}")
    day = header.get("run_date")
    return SpoolBatch(
        header["table"], rows, date.fromisoformat(day) if day else None, header.get("warehouse")
    )


def spool_order(names: Iterable[str]) -> list[str]:
    """The spool files among ``names``, oldest first (temporary and foreign files left out)."""
    return sorted(n for n in names if _NAME.match(n))


# ---- the writer -----------------------------------------------------------------------------

Rows: TypeAlias = "Sequence[Mapping[str, Any]] | pa.Table"
"""A batch's rows: dicts, or an Arrow table in the table's schema (a run's ``ledgers``)."""
Append = Callable[..., Any]
"""``append(warehouse, table, rows, run_date=...)``: :func:`jobs.tables.delta.append_rows`."""
Written = Callable[[str, str, Sequence[str]], bool]
"""``written(warehouse, table, run_ids)``: the table already holds rows of these runs."""


class SpoolWriter:
    """Appends rows to the warehouse, or spools them when it cannot (or while older rows
    wait), and flushes the spool in order."""

    def __init__(
        self,
        warehouse: str,
        directory: str | os.PathLike[str],
        max_bytes: int = DEFAULT_SPOOL_MAX_BYTES,
        append: Append | None = None,
        written: Written | None = None,
    ) -> None:
        self.warehouse = warehouse
        self.dir = Path(directory)
        self.max_bytes = max_bytes
        self.append: Append = append or delta.append_rows
        self.written: Written = written or _already_written
        self.last_error: str | None = None
        self._ordinal = 0
        # The directory is made when first needed: an instance that never spools leaves none.
        # A crash mid-write left a temporary file (that append was spooled whole or not at
        # all); an old one is removed, a fresh one may be another instance's write.
        for tmp in self.dir.glob(".*.tmp") if self.dir.is_dir() else ():
            with contextlib.suppress(OSError):
                if time.time() - tmp.stat().st_mtime > 600:
                    tmp.unlink()

    # -- state --

    def files(self) -> list[Path]:
        """The spooled files, oldest first."""
        if not self.dir.is_dir():
            return []
        return [self.dir / n for n in spool_order(os.listdir(self.dir))]

    def stats(self) -> tuple[int, int, int]:
        """(files, rows, bytes) spooled now."""
        files = rows = size = 0
        for p in self.files():
            with contextlib.suppress(OSError, ValueError):
                with open(p, "rb") as f:
                    rows += int(json.loads(f.readline()).get("rows", 0))
                size += p.stat().st_size
                files += 1
        return files, rows, size

    # -- writes --

    def write(
        self, table: str, rows: Sequence[Mapping[str, Any]], run_date: date | None = None
    ) -> bool:
        """Append ``rows`` to ``table`` now if nothing older waits and the warehouse takes
        them; else spool them. True if written now. Raises :class:`SpoolFullError` when the
        spool is over its bound (the rows are spooled first: nothing is lost)."""
        return self.write_many([(table, rows)], run_date)[0]

    def write_many(
        self,
        batches: Sequence[tuple[str, Rows]],
        run_date: date | None = None,
        bound: bool = True,
    ) -> list[bool]:
        """:meth:`write` for independent tables (a run's per-run tables): appended in
        parallel when nothing waits, the failed ones spooled in the given order. ``bound``
        False: the bound is checked by the next write (a run's ``audit_runs`` row), so that
        a run is kept whole before the service stops."""
        self.flush()
        live = [(t, r if isinstance(r, pa.Table) else list(r)) for t, r in batches if len(r)]
        if not live:
            return [True] * len(batches)
        errors: dict[int, str | None] = {i: "older rows wait" for i in range(len(live))}
        if not self.files():
            errors = self._append_all(live, run_date)
        results = {i: errors[i] is None for i in errors}
        for i, (table, rows) in enumerate(live):
            if errors[i] is not None:
                listed = delta.arrow_rows(rows) if isinstance(rows, pa.Table) else rows
                batch = SpoolBatch(table, [dict(r) for r in listed], run_date, self.warehouse)
                try:
                    self._spool(batch, errors[i])
                except OSError as exc:
                    raise SpoolError(
                        f"{len(rows)} {table} rows could be written neither to the warehouse "
                        f"{self.warehouse} ({errors[i]}) nor to the spool {self.dir} ({exc}); "
                        "stopping rather than drop them"
                    ) from exc
        if bound:
            self._check_bound()
        done = iter(results.get(i, False) for i in range(len(live)))
        return [next(done) if len(r) else True for _t, r in batches]

    def _append(self, table: str, rows: Rows, run_date: date | None) -> None:
        """One append: an Arrow table as columns, unless the writer was given (it takes
        rows)."""
        if isinstance(rows, pa.Table):
            if self.append is delta.append_rows:
                delta.append_arrow(self.warehouse, table, rows, run_date=run_date)
                return
            rows = delta.arrow_rows(rows)
        self.append(self.warehouse, table, rows, run_date=run_date)

    def _append_all(
        self, live: list[tuple[str, Rows]], run_date: date | None
    ) -> dict[int, str | None]:
        """Append each batch; the error of each that failed (None: committed)."""
        import concurrent.futures

        out: dict[int, str | None] = {}
        # delta-rs releases the GIL: the tables are written in parallel, as the one-shot
        # audit does (jobs.local.audit.LocalAudit.load).
        with concurrent.futures.ThreadPoolExecutor(
            max(1, len(live)), thread_name_prefix="delta"
        ) as pool:
            futures = [pool.submit(self._append, t, r, run_date) for t, r in live]
            for i, f in enumerate(futures):
                try:
                    f.result()
                    out[i] = None
                except Exception as exc:  # noqa: BLE001 - the rows stay spooled, the error kept
                    out[i] = self._failed(live[i][0], exc)
        if all(e is None for e in out.values()):
            self.last_error = None
        return out

    def _failed(self, table: str, exc: BaseException) -> str:
        self.last_error = f"{table}: {one_line(exc)}"
        return self.last_error

    def _spool(self, batch: SpoolBatch, why: str | None) -> Path:
        data = encode_batch(batch)
        self.dir.mkdir(parents=True, exist_ok=True)
        # Names sort in write order: nanoseconds, never going back within this process.
        self._ordinal = max(self._ordinal + 1, time.time_ns())
        name = f"{self._ordinal:020d}-{os.getpid()}-{batch.table}.jsonl"
        # The temporary name starts with a dot: a flush never picks up a half-written file.
        write_atomically(self.dir / name, data, tmp=self.dir / f".{name}.tmp")
        log.warning(
            "watch: spooled %d %s rows to %s (not written to the warehouse %s: %s)",
            len(batch.rows),
            batch.table,
            self.dir / name,
            self.warehouse,
            why,
        )
        return self.dir / name

    def _check_bound(self) -> None:
        files, rows, size = self.stats()
        if size > self.max_bytes:
            raise SpoolFullError(
                f"spool {self.dir} holds {size} bytes ({files} files, {rows} rows), above "
                f"--spool-max-bytes {self.max_bytes}: the warehouse {self.warehouse} has not "
                f"taken rows ({self.last_error or 'unknown error'}); stopping so that none are "
                "lost. They are flushed when the service starts with the warehouse writable"
            )

    # -- flush --

    def flush(self) -> bool:
        """Append the spooled files in order, deleting each once committed; stop at the
        first failure (the order is kept). True when the spool is empty afterwards."""
        if not self.files():
            return True
        with _locked(self.dir / ".lock") as got:
            if not got:  # another instance flushes this spool now
                return False
            for path in self.files():
                try:
                    batch = decode_batch(path.read_bytes())
                except FileNotFoundError:
                    continue  # flushed by another instance before we took the lock
                except ValueError as exc:
                    # Never guess at a damaged file: set it aside, loudly, and go on.
                    bad = path.with_name(path.name + ".bad")
                    os.replace(path, bad)
                    log.error("watch: spool file %s unreadable (%s): moved to %s", path, exc, bad)
                    continue
                if batch.warehouse and batch.warehouse.rstrip("/") != self.warehouse.rstrip("/"):
                    # Rows of another warehouse (--spool-dir shared, --warehouse changed):
                    # never written here. Renamed back, they flush with that --warehouse.
                    aside = path.with_name(path.name + ".foreign")
                    os.replace(path, aside)
                    log.error(
                        "watch: spool file %s holds rows for the warehouse %s, not %s: moved to %s",
                        path,
                        batch.warehouse,
                        self.warehouse,
                        aside,
                    )
                    continue
                try:
                    run_ids = sorted({str(r["run_id"]) for r in batch.rows if "run_id" in r})
                    if not (run_ids and self.written(self.warehouse, batch.table, run_ids)):
                        self.append(
                            self.warehouse, batch.table, batch.rows, run_date=batch.run_date
                        )
                except Exception as exc:  # noqa: BLE001 - the batch stays on disk for a retry
                    self._failed(batch.table, exc)
                    return False
                path.unlink()
                fsync_dir(self.dir)
                log.info(
                    "watch: flushed %d %s rows from %s to %s",
                    len(batch.rows),
                    batch.table,
                    path,
                    self.warehouse,
                )
        self.last_error = None
        return True


def _already_written(warehouse: str, table: str, run_ids: Sequence[str]) -> bool:
    found = delta.read_rows(
        warehouse, table, columns=["run_id"], filters=[("run_id", "in", run_ids)]
    )
    return bool(found)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[bool]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
