"""The Delta tables as the watch writes them: every append goes through the spool
(:mod:`jobs.watch.spool`), so rows the warehouse does not take wait and are written later, in
order, and the repair never waits for the warehouse; whether the warehouse is writable is part
of ``/readyz``. Also the history a new term reads from the tables (docs/watch.md,
"Unreachable warehouse")."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from bklib.states import ActionStatus, CountKey, RunStatus
from jobs.runtime.messages import one_line
from jobs.tables import delta
from jobs.tables.schema import ACTIONS, AUDIT_RUNS
from jobs.watch.config import WatchConfig
from jobs.watch.decide import Schedule
from jobs.watch.http_server import Health
from jobs.watch.metrics import WatchMetrics
from jobs.watch.spool import SpoolWriter, default_spool_dir

__all__ = ["History", "WatchWarehouse"]

log = logging.getLogger("jobs.watch")

UNREACHABLE = "warehouse unreachable"
"""``/readyz``'s reason while the warehouse is not writable or rows wait in the spool."""


@dataclass
class History:
    """What a new term reads from the tables (empty when the warehouse is unreachable)."""

    first_seen: dict[tuple[int, int, str], datetime] = field(default_factory=dict)
    """When each finding of the latest runs was first detected."""
    no_replica: list[dict[str, Any]] | None = None
    """NO_REPLICA actions of earlier runs: reported again, not copied again (None: not read,
    the instance keeps what it knows)."""


class WatchWarehouse:
    """The warehouse of one watch instance, through its spool. ``leading()`` says whether
    this instance leads: only a leader's readiness depends on the warehouse."""

    def __init__(
        self,
        config: WatchConfig,
        metrics: WatchMetrics,
        health: Health,
        leading: Callable[[], bool],
    ) -> None:
        self.cfg = config
        self.metrics = metrics
        self.health = health
        self.leading = leading
        self.spool = SpoolWriter(
            config.warehouse,
            config.spool_dir or default_spool_dir(config.warehouse),
            config.spool_max_bytes,
        )
        self.ok = True
        """The last read or write of the tables worked and nothing waits in the spool."""
        self.flush_error: str | None = None
        self.spooled = False
        """Something waits in the spool (the warehouse is not writable, for /readyz)."""
        self._writing = threading.Lock()
        """One write at a time, in the order they come: a loss's audit rows are written by a
        thread of their own beside its repair (:meth:`jobs.watch.audits.WatchAudits.run`)."""

    @property
    def ready_reason(self) -> str | None:
        """``/readyz``'s reason as far as the warehouse goes; None when writable."""
        return None if self.ok else UNREACHABLE

    def refresh(self) -> None:
        """Re-read what the spool holds (its gauges, and whether anything waits)."""
        files, rows, _size = self.spool.stats()
        self.metrics.spooled_files.set(files)
        self.metrics.spooled_rows.set(rows)
        self.spooled = files > 0

    def outcome(self, ok: bool, exc: BaseException | None = None) -> None:
        """Record how the last read or write of the tables went (``exc``: why it failed)."""
        if not ok:
            self.metrics.warehouse_errors.inc()
            if exc is not None:  # (a spooled write was logged by the spool, with its file)
                log.error("watch: warehouse %s: %s", self.cfg.warehouse, one_line(exc))
        # Rows waiting in the spool mean the tables are behind: not ready either.
        self.ok = ok and not self.spooled
        if self.leading():
            self.health.ready_reason = self.ready_reason

    def flush(self) -> None:
        """Write what the spool holds, oldest first (every cycle, leader or not: the rows
        are of runs already done)."""
        if not self.spooled:
            return
        with self._writing:
            self._flush()

    def _flush(self) -> None:
        files, rows, _ = self.spool.stats()
        ok = self.spool.flush()
        self.refresh()
        if ok and not self.spooled:
            log.info(
                "watch: warehouse %s writable again: %d spooled rows (%d files) written",
                self.cfg.warehouse,
                rows,
                files,
            )
            self.outcome(True)
        elif not ok:
            self.metrics.warehouse_errors.inc()
            if self.spool.last_error != self.flush_error:  # once per new error, not per cycle
                log.error(
                    "watch: warehouse %s still not writable (%s): %d rows (%d files) wait in %s",
                    self.cfg.warehouse,
                    self.spool.last_error or "another instance is flushing",
                    rows,
                    files,
                    self.spool.dir,
                )
            self.ok = False
            if self.leading():
                self.health.ready_reason = UNREACHABLE
        self.flush_error = self.spool.last_error

    def write(
        self,
        batches: list[tuple[str, list[dict[str, Any]]]],
        run_date: Any = None,
        bound: bool = True,
    ) -> None:
        """Append, or spool when the warehouse does not take the rows (nothing is dropped);
        raises :class:`~jobs.watch.spool.SpoolError` past the bound or when the spool
        cannot be written either."""
        with self._writing:
            try:
                results = self.spool.write_many(batches, run_date, bound)
            finally:
                self.refresh()
            self.outcome(all(results))

    def history(self, schedule: Schedule) -> History:
        """Last run of each check (into ``schedule``), first detections of the latest run and
        NO_REPLICA results, from the tables; an unreachable warehouse leaves them empty."""
        wh = self.cfg.warehouse
        out = History()
        try:
            if delta.table_exists(wh, AUDIT_RUNS):
                runs = delta.read_rows(
                    wh, AUDIT_RUNS, columns=["check", "status", "finished_at", "counts"]
                )
                for r in runs:
                    full = CountKey.LEDGERS_FROM_INDEX not in dict(r["counts"] or {})
                    if full and r["status"] in RunStatus.FINISHED and r["finished_at"] is not None:
                        schedule.ran(r["check"], r["finished_at"].timestamp())
                for c, ts in schedule.last.items():
                    self.metrics.last_audit.labels(c).set(ts)
            if delta.table_exists(wh, AUDIT_RUNS):
                out.first_seen.update(delta.first_detections(wh))
            if delta.table_exists(wh, ACTIONS):
                out.no_replica = list(
                    delta.read_rows(
                        wh,
                        ACTIONS,
                        columns=["ledger_id", "segment_first_entry_id", "old_bookie", "status"],
                        filters=[("status", "=", ActionStatus.NO_REPLICA)],
                    )
                )
            self.outcome(True)
        except Exception as exc:  # noqa: BLE001 - /readyz goes red and the rows are spooled
            self.outcome(False, exc)
        return out
