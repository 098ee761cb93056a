"""The watch's audits: one run of a check in this process (:class:`jobs.local.audit.LocalAudit`,
as ``bkaudit audit`` runs it), its rows written through the warehouse's spool, its metrics; and
whether it completed.

An audit that raised (FAILED) or finished missing something (COMPLETED_WITH_ERRORS: an
unreadable znode, a bookie that did not answer; :mod:`bklib.audit.completeness`) still drives
the repair with what it found, but it is an :class:`AuditIncomplete`: the cycle that ran it
fails, as a cycle that raises does (:meth:`jobs.watch.cycle.Cycle.run`, docs/watch.md
"Metrics and health").
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from bklib.audit.completeness import incomplete_reasons
from bklib.audit.engine import ScanPlan
from bklib.audit.model import LedgerView
from bklib.meta.paths import LayoutKind
from bklib.meta.stores import MetadataStore
from bklib.states import Check, CountKey, RunStatus
from jobs.runs.audit_run import record_interrupted
from jobs.runtime import interrupts
from jobs.runtime.messages import one_line
from jobs.tables.schema import AUDIT_RUNS, LEDGERS, run_day
from jobs.watch.config import WatchConfig, audit_config
from jobs.watch.decide import Schedule, finding_counts
from jobs.watch.http_server import Health
from jobs.watch.metrics import WatchMetrics
from jobs.watch.warehouse import WatchWarehouse

__all__ = ["RECORD_WITHIN", "AuditIncomplete", "WatchAudits"]

log = logging.getLogger("jobs.watch")

RECORD_WITHIN = 10.0
"""Seconds a loss's audit rows wait at most for the first copy before they are written."""


class AuditIncomplete(Exception):
    """An audit of the watch did not complete: it raised (``status`` FAILED, ``run_id`` None
    when no run was started), or it finished missing something (COMPLETED_WITH_ERRORS)."""

    def __init__(self, check: str, run_id: str | None, status: str, why: str) -> None:
        self.check, self.run_id, self.status, self.why = check, run_id, status, why
        super().__init__(f"{check} audit {run_id or '(no run)'} {status}: {why}")


class WatchAudits:
    """Runs the leader's audits and remembers what the term needs of them: when each finding
    was first detected, and the audits of the current cycle that did not complete."""

    def __init__(
        self,
        config: WatchConfig,
        metrics: WatchMetrics,
        health: Health,
        warehouse: WatchWarehouse,
        schedule: Schedule,
        session: MetadataStore,
    ) -> None:
        self.cfg = config
        self.session = session
        """The watch's one store session: every audit reads over it."""
        self.metrics = metrics
        self.health = health
        self.warehouse = warehouse
        self.schedule = schedule
        self.first_seen: dict[tuple[int, int, str], datetime] = {}
        """When each finding was first detected (grace period of open ledgers)."""
        self.incomplete: list[AuditIncomplete] = []
        """This cycle's audits that did not complete (cleared as each cycle starts)."""
        self._recording: threading.Thread | None = None
        self._record_error: BaseException | None = None
        self._may_record = threading.Event()
        """Set once the loss's rows may be written (:meth:`record_now`)."""

    def run(
        self,
        check: str,
        ledger_ids: Sequence[int] | None = None,
        kind: LayoutKind | None = None,
        run_id: str | None = None,
        preread: Mapping[int, LedgerView | None] | None = None,
    ) -> Any:
        """One audit run of ``check`` in this process, written to the tables (a warehouse
        failure is logged and counted: the findings still drive the repair). None if it
        raised. Either way, an audit that did not complete is added to :attr:`incomplete`.

        With ``ledger_ids`` (and their layout ``kind``), a ``lost`` audit of those ledgers
        only (:class:`~jobs.watch.indexed_audit.IndexedLostAudit`): it does not count as the
        schedule's run of the check, and its rows are written by a thread of their own once
        :meth:`record_now` lets it, while the caller marks and repairs what it found (a
        loss's reaction need not wait for the tables); :meth:`wait_recorded` waits for
        them. ``run_id``: the run's id, chosen by a caller whose repair starts before the
        audit ends; ``preread``: views of some of ``ledger_ids`` the caller read a moment
        ago, before that repair could change them (:mod:`jobs.watch.first_ledgers`)."""
        from jobs.local.audit import LocalAudit
        from jobs.watch.indexed_audit import IndexedLostAudit

        self.wait_recorded()  # one run's rows after another's, never interleaved
        cfg = self.cfg
        config = audit_config(cfg, check)
        if run_id is not None:
            config = replace(config, run_id=run_id)
        started = time.time()
        job: Any = None
        try:
            if ledger_ids is None:
                plan = ScanPlan.read(self.session, cfg.ledgers_root)
                job = LocalAudit(config, plan, self.session)
                self.metrics.full_scans.inc()
            else:
                assert kind is not None and check == Check.LOST
                job = IndexedLostAudit(
                    config, ScanPlan((), kind), self.session, ledger_ids, preread or {}
                )
            job.run_steps()  # the audit's steps and its session guard, as `bkaudit audit`'s
        except Exception as exc:  # noqa: BLE001 - counted FAILED; the cycle fails; retried
            run_id = job.run.run_id if job is not None else None
            self._incomplete(AuditIncomplete(check, run_id, RunStatus.FAILED, one_line(exc)))
            self.metrics.audits.labels(check, RunStatus.FAILED).inc()
            return None
        except BaseException as exc:  # SIGINT, SIGTERM: recorded INTERRUPTED, the watch stops
            signum = interrupts.signal_of(exc)
            if signum is not None and job is not None:
                run = job.run
                write = lambda: self.warehouse.write([(AUDIT_RUNS, [run.as_row()])])  # noqa: E731
                record_interrupted(run, signum, write)
                self.metrics.audits.labels(check, RunStatus.INTERRUPTED).inc()
            raise
        self.health.heartbeat()
        checked = time.time()
        self._first_detected(job, None if ledger_ids is None else set(ledger_ids))
        if ledger_ids is None:
            self._write(job, check, started, checked, full=True)
            self._count(job, check, started, full=True)
        else:
            self._count(job, check, started, full=False)
            self._may_record.clear()
            self._recording = threading.Thread(
                target=self._record_later, args=(job, check, started, checked),
                name="audit-rows",
            )  # fmt: skip
            self._recording.start()
        return job

    def record_now(self) -> None:
        """Let the thread of a loss's audit write its rows. It waits for this (a second or
        three of one core at 44,000 ledgers) so that the marks and the repair's start have
        the process first; the cycle says when: at the first copy, or at its end (and the
        thread waits :data:`RECORD_WITHIN` seconds at most)."""
        self._may_record.set()

    def wait_recorded(self) -> None:
        """Wait for the rows of the audit being recorded by its thread, if any (letting it
        write them now); raise what writing them raised (a spool past its bound stops the
        watch, as in this thread)."""
        self.record_now()
        thread, self._recording = self._recording, None
        if thread is not None:
            thread.join()
        error, self._record_error = self._record_error, None
        if error is not None:
            raise error

    def _record_later(self, job: Any, check: str, started: float, checked: float) -> None:
        # Not longer than RECORD_WITHIN: a repair that copies nothing for long (every ledger
        # locked elsewhere, or with no replica) must not leave its audit unrecorded meanwhile.
        self._may_record.wait(RECORD_WITHIN)
        try:
            self._write(job, check, started, checked, full=False)
        except BaseException as exc:  # noqa: BLE001 - raised in the cycle's thread instead
            log.error("watch: %s audit %s: its rows not written: %s", check, job.run.run_id,
                      one_line(exc))  # fmt: skip
            self._record_error = exc

    def _write(self, job: Any, check: str, started: float, checked: float, full: bool) -> None:
        """Write ``job``'s rows (through the spool) and log the run. A run written later by
        its thread finished when it was checked, not when its rows went out."""
        done = None if full else datetime.fromtimestamp(checked, timezone.utc)
        run = self._load(job, done)
        log.info(
            "watch: %s audit %s: %d ledgers%s, %d under-replicated fragments (%.1fs, its rows "
            "%.1fs)",
            check,
            run.run_id,
            job.run.counts[CountKey.LEDGERS],
            "" if full else " (those the index names)",
            len(job.findings),
            checked - started,
            time.time() - checked,
        )

    def _count(self, job: Any, check: str, started: float, full: bool) -> None:
        """Count ``job`` in the metrics (at once, whether or not its rows are written yet:
        they are what the cycle acts on), and note it if it did not complete."""
        job.settle()
        run = job.run
        if full:
            self.schedule.ran(check, started)
            # The run's own finished_at, so the gauge is the audit_runs row's figure (as the
            # take-over's reading of the table sets it). A run of the index's ledgers is no
            # run of the schedule: the overdue alert watches full scans.
            self.metrics.last_audit.labels(check).set(run.finished_at.timestamp())
        self.metrics.audits.labels(check, run.status).inc()
        frags, ledgers = finding_counts(f.as_row() for f in job.findings)
        self.metrics.set_findings(check, frags, ledgers)
        self.metrics.set_unknown(check, job.findings, run.counts)
        if run.status != RunStatus.COMPLETED:
            # Its findings are still acted on (the cluster comes first); the cycle fails.
            why = incomplete_reasons(run.counts)
            self._incomplete(AuditIncomplete(check, run.run_id, run.status, why))

    def _incomplete(self, failure: AuditIncomplete) -> None:
        log.error("watch: %s", failure)
        self.incomplete.append(failure)

    def _load(self, job: Any, finished_at: datetime | None = None) -> Any:
        """The run's rows as :meth:`jobs.local.audit.LocalAudit.load` writes them (per-run
        tables first, ``audit_runs`` last), through the spool. first_detected_at comes from
        this instance's memory (seeded from the tables at take-over), which needs no read of
        an unreachable warehouse."""
        run = job.run
        # The ledgers' rows as Arrow columns, not a dict each (a million at a take-over).
        tables: list[tuple[str, Any]] = [
            (t, list(rows)) for t, rows in job.row_sources(self.first_seen) if t != LEDGERS
        ]
        tables.append((LEDGERS, job.ledgers_arrow()))
        day = run_day(run.started_at)
        # The bound is checked with the audit_runs row: a run is spooled whole, or not at all.
        self.warehouse.write(tables, day, False)
        run.finished_at = finished_at or datetime.now(timezone.utc)
        self.warehouse.write([(AUDIT_RUNS, [run.as_row()])])
        return run

    def _first_detected(self, job: Any, scope: set[int] | None) -> None:
        """Remember when each of ``job``'s findings was first detected; forget the findings
        it no longer has, among the ledgers it read (``scope``; None: all of them)."""
        started = job.run.started_at
        current = {f.key for f in job.findings}
        self.first_seen = {
            k: v
            for k, v in self.first_seen.items()
            if k in current or (scope is not None and k[0] not in scope)
        }
        for k in current:
            self.first_seen.setdefault(k, started)
