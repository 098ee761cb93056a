"""One cycle of the watch's main loop: confirm the term, then, as the leader, take over (a new
term) or decide once as of now: the lost bookies past ``lostBookieRecoveryDelay`` and the
checks due on the schedule are audited, marked and repaired (:mod:`jobs.watch.decide`'s rules,
:class:`~jobs.watch.audits.WatchAudits`, :class:`~jobs.watch.repair.WatchRepair`).

A cycle fails when it raises, or when an audit it ran did not complete
(:class:`~jobs.watch.audits.AuditIncomplete`: FAILED, or COMPLETED_WITH_ERRORS). Both are
counted the same way, in ``bkaudit_watch_cycle_failures_total``, and ``/healthz`` turns red
after ``--max-failed-cycles`` failed cycles in a row (docs/watch.md, "Metrics and health").
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from bklib.audit.engine import read_ledgers
from bklib.audit.index_keeper import IndexStale, RebuildCause
from bklib.audit.model import LedgerView
from bklib.errors import BKError
from bklib.states import ActionStatus, BookieState, Check, CountKey, Reason
from jobs.runtime.heap_release import release_heap
from jobs.runtime.messages import one_line
from jobs.tables.runs import new_run_id
from jobs.watch.audits import AuditIncomplete, WatchAudits
from jobs.watch.config import WatchConfig
from jobs.watch.decide import LossTracker, Schedule
from jobs.watch.election import Leadership, Stopped
from jobs.watch.first_ledgers import CANDIDATES_PER_LEDGER, FirstLedgers, FirstOutcome
from jobs.watch.http_server import Health
from jobs.watch.index import WatchIndex
from jobs.watch.loss_changes import LossChanges
from jobs.watch.metrics import REACTION_STAGES, WatchMetrics
from jobs.watch.repair import WatchRepair
from jobs.watch.spool import SpoolError
from jobs.watch.warehouse import WatchWarehouse
from jobs.watch.watcher import ClusterSnapshot, ClusterWatcher

__all__ = ["Cycle"]

log = logging.getLogger("jobs.watch")

MARKS_RECHECK = 60.0
"""Seconds between checks of the marks no loss explains that a check left standing (a silent
bookie, a copy that failed): BookKeeper's ReplicationWorker, too, comes back to a marked
ledger it could not finish after a back-off."""


class Cycle:
    """The leader's decisions from one cycle to the next: the loss tracker, the schedule and
    when unfinished work is retried. :meth:`run` is one cycle."""

    def __init__(
        self,
        config: WatchConfig,
        metrics: WatchMetrics,
        health: Health,
        watcher: ClusterWatcher,
        leadership: Leadership,
        warehouse: WatchWarehouse,
        schedule: Schedule | None = None,
    ) -> None:
        self.cfg = config
        self.metrics = metrics
        self.health = health
        self.watcher = watcher
        self.leadership = leadership
        self.warehouse = warehouse
        self.tracker = LossTracker()
        self.tracker_lock = threading.Lock()
        """Held while a repair's :class:`LossChanges` feeds the tracker from its threads."""
        self.schedule = schedule or Schedule(dict(config.every))
        self.retry_at = 0.0
        self.verify_marks_at = 0.0
        """When marks no loss explains are next checked (:meth:`_marks_unexplained`)."""
        self.lost_sessions_seen = 0
        self.audits = WatchAudits(config, metrics, health, warehouse, self.schedule, watcher.zk)
        self.index = WatchIndex(
            watcher.zk, config.ledgers_root, metrics, barrier_timeout=config.index_barrier_timeout
        )
        self.known_marks: dict[int, tuple[str, ...]] = {}
        """The marks the current response's cycle read: those already standing are not
        written again (:meth:`UnderReplicationManager.mark_many`)."""
        self.reacted: dict[str, set[str]] = {stage: set() for stage in REACTION_STAGES}
        """The due bookies whose reaction was timed, per stage (once per loss)."""
        self.reacting = threading.Lock()
        metrics.set_schedule(self.schedule.every)
        self.repair = WatchRepair(config, metrics, leadership, warehouse, watcher)

    def run(self) -> float:
        """Decide and act once; returns how long to sleep unless woken."""
        w = self.watcher
        if w.lost_sessions != self.lost_sessions_seen:
            self.metrics.session_losses.inc(w.lost_sessions - self.lost_sessions_seen)
            self.lost_sessions_seen = w.lost_sessions
        if not w.connected:
            self.leadership.step_down(f"{w.zk.kind} disconnected")
            self.index.close()
            return self.cfg.poll_interval
        # The cycle decides as of this instant, taken before ZooKeeper confirms the term: a
        # process paused after the confirmation (SIGSTOP, a long GC, a frozen VM) must not
        # wake up and count the pause towards a bookie's delay on a view of the old term.
        as_of = time.monotonic()
        leader = self.leadership.elected()
        if not leader:
            self.index.close()  # a standby keeps no feed; the next take-over opens one
            return self.cfg.poll_interval if leader is None else self.cfg.poll_interval * 5
        self.audits.incomplete.clear()
        try:
            if not self.leadership.leading:
                # The take-over reads the whole cluster, so this cycle's check is long past:
                # the term's first decisions wait for the next cycle's.
                self._take_over()
                wait = 0.0
            else:
                wait = self._lead(as_of)
            self.audits.wait_recorded()  # a loss's audit rows, written beside its repair
            if self.audits.incomplete:
                # The work went on with what the audit found; the cycle still failed.
                raise self.audits.incomplete[0]
        except Stopped as exc:
            log.info("watch: %s", exc)
            self.audits.wait_recorded()  # before the watch stops: a spool error still says so
            return 0.0
        except SpoolError:
            raise  # the service stops (run_watch prints it and exits 2)
        except Exception as exc:  # logged, counted, and /healthz turns red if it keeps failing
            # One rule for every failed cycle, whether it raised or its audit did not complete.
            self.health.cycle_failed(one_line(exc))
            self.metrics.cycle_failures.inc()
            log.error(
                "watch: cycle failed (%d in a row): %s",
                self.health.failed_cycles,
                one_line(exc),
                exc_info=not isinstance(exc, AuditIncomplete),  # its line says it all
            )
            return self.cfg.retry_interval
        finally:
            self.audits.record_now()  # however the cycle ended, its audit's rows are written
        self.health.cycle_ok()
        return wait

    def _take_over(self) -> None:
        """A new term: read the cluster afresh, the schedule and history from the tables,
        and audit the lost bookies now (as the Auditor's bookie check does at start)."""
        self.audits.wait_recorded()  # the last term's audit is in the history read below
        self.leadership.begin_term(self.cfg.instance_id)
        self.tracker = LossTracker()
        self.retry_at = self.verify_marks_at = 0.0
        history = self.warehouse.history(self.schedule)
        self.audits.first_seen = history.first_seen
        if history.no_replica is not None:
            self.repair.no_replica = history.no_replica
        self.repair.workers_failed = False  # a new term tries worker processes again
        self.watcher.watch_registrations()
        snap = self.watcher.snapshot()
        self.index.open()  # before the scan: what changes during it is announced
        audit = self.audits.run(Check.LOST)
        if audit is None:
            # Fail closed: without this audit the bookies lost before the take-over are
            # unknown, not absent. The cycle fails and the take-over is retried whole.
            raise self.audits.incomplete[-1]
        self.index.build(audit, RebuildCause.TAKE_OVER)
        lost = {b.bookie_id for b in audit.bookies if b.state == BookieState.LOST}
        del audit  # a million ledgers' views: gone before the term's long life starts
        release_heap()
        marked = {b for bookies in snap.marked.values() for b in bookies}
        self.tracker.seed(snap.available, lost, marked, time.monotonic())
        self.leadership.lead()  # only now: a failed take-over is retried whole
        if self.tracker.due or self.tracker.pending:
            log.info(
                "watch: at take-over, lost bookies due now %s, waiting for the delay %s",
                sorted(self.tracker.due),
                sorted(self.tracker.pending),
            )

    def _delay(self, snap: ClusterSnapshot) -> float:
        if self.cfg.delay_override is not None:
            return self.cfg.delay_override
        # Absent znode: BookKeeper's default lostBookieRecoveryDelay (0); the Auditor would
        # create it from its own configuration.
        return float(snap.delay_znode or 0)

    def _lead(self, now: float) -> float:
        """One leader cycle deciding as of ``now`` (monotonic seconds, taken before the
        cycle's leadership check); returns the sleep until the next thing is due."""
        cfg, m = self.cfg, self.metrics
        snap = self.watcher.snapshot()
        self.index.publish()  # its age and staleness, every cycle
        delay = self._delay(snap)
        became = self.tracker.observe(snap.available, now, delay)
        if became:
            log.info("watch: lost bookies due for repair: %s (delay %gs)", became, delay)
            self.retry_at = 0.0  # a new loss widens the work at once
        m.bookies.labels(BookieState.WRITABLE).set(len(snap.writable))
        m.bookies.labels(BookieState.READONLY).set(len(snap.readonly))
        m.bookies.labels(BookieState.LOST).set(len(self.tracker.pending) + len(self.tracker.due))
        m.set_lost({**self.tracker.pending, **self.tracker.due}, now)
        m.marks.set(len(snap.marked))
        m.paused.set(1 if snap.disabled else 0)
        m.delay.set(delay)
        acted = False
        if self.tracker.due and now >= self.retry_at:
            self.respond(Check.LOST, snap)
            acted = True
        for check in self.schedule.due(time.time()):
            self.leadership.confirm()
            self.respond(check, snap, scheduled=True)
            acted = True
        if not acted and self._marks_unexplained(snap, now):
            self.leadership.confirm()
            changes = self._changes(frozenset(), delay)
            self.repair.verify_marks(sorted(snap.marked), changes)
            self.verify_marks_at = time.monotonic() + MARKS_RECHECK
            if changes.changed:
                self.retry_at = 0.0
            acted = True
        if not acted and self.index.rebuild_due(time.monotonic()):
            # The feed broke on a quiet cluster: rebuild now (a full lost audit, acted on as
            # the schedule's), not at the next loss, which would then wait for the scan.
            self.leadership.confirm()
            self.respond(Check.LOST, snap, scheduled=True)
            acted = True
        if acted:  # the gauges say what the work left, not what it started from
            # The marks' gauge is the next cycle's (its snapshot lists them, within a poll
            # interval): listing them costs two requests a mark, 53 s for 44,000 marks.
            m.bookies.labels(BookieState.LOST).set(
                len(self.tracker.pending) + len(self.tracker.due)
            )
            m.set_lost({**self.tracker.pending, **self.tracker.due}, time.monotonic())
        # Sleep until the next thing is due; a registration change wakes us earlier.
        now = time.monotonic()
        wakes = [now + cfg.poll_interval]
        if self.tracker.due:
            wakes.append(max(self.retry_at, now))
        deadline = self.tracker.next_deadline(delay)
        if deadline is not None:
            wakes.append(deadline)
        nxt = self.schedule.next_due()
        if nxt is not None:
            wakes.append(now + (nxt - time.time()))
        return max(0.0, min(wakes) - now)

    def _changes(self, repairing: frozenset[str], delay: float) -> LossChanges:
        """What a repair asks before each ledger: have the lost bookies changed?"""
        return LossChanges(
            self.watcher,
            self.tracker,
            self.tracker_lock,
            repairing=repairing,
            delay=delay,
            every=self.cfg.poll_interval,
        )

    def _marks_unexplained(self, snap: ClusterSnapshot, now: float) -> bool:
        """Marks stand, and no lost bookie explains them: none is due, none is waiting for
        the delay (a mark naming a bookie within its delay is left until it is due or back).
        They are checked at once, then at most every :data:`MARKS_RECHECK` seconds."""
        return bool(
            snap.marked
            and not snap.disabled
            and not self.tracker.due
            and not self.tracker.pending
            and now >= self.verify_marks_at
        )

    def respond(self, check: str, snap: ClusterSnapshot, scheduled: bool = False) -> None:
        """Audit ``check``; publish marks for what is due; repair it; for a scheduled check
        with findings, audit again. Lost bookies waiting for the delay are left alone. A new
        loss's first ledgers are repaired while its audit reads (:meth:`_first_ledgers`)."""
        self.known_marks = snap.marked
        self.leadership.confirm()
        ids = self._loss_ledgers() if check == Check.LOST and not scheduled else None
        audit_id = new_run_id()
        first, preread = self._first_ledgers(snap, audit_id) if ids else (None, {})
        try:
            job = self._audit(check, ids, audit_id, preread)
            self._act(check, snap, scheduled, job, first)
        finally:
            if first is not None:
                first.join()  # never left running into the next cycle

    def _act(
        self,
        check: str,
        snap: ClusterSnapshot,
        scheduled: bool,
        job: Any,
        first: FirstLedgers | None,
    ) -> None:
        """What :meth:`respond` does with its audit ``job``'s findings."""
        now = time.monotonic()
        if job is None:
            self.retry_at = now + self.cfg.retry_interval
            return
        # The first ledgers' repair may be feeding the tracker from its threads meanwhile.
        with self.tracker_lock:
            lost = {b.bookie_id for b in job.bookies if b.state == BookieState.LOST}
            self.tracker.add_lost(lost - set(self.tracker.due), now)
            # Both halves' count, when a helper scanned half the ledgers (its views stay there).
            unreadable = job.run.counts[CountKey.METADATA_ERRORS]
            named = {f.bookie_id for f in job.findings if f.reason in Reason.WHOLE_BOOKIE}
            # Fail closed: while a ledger is unreadable it may still name a due bookie.
            for b in [] if unreadable else sorted(set(self.tracker.due) - named):
                t0 = self.tracker.resolve(b)
                if t0 is not None:
                    self.metrics.time_to_repair.observe(now - t0)
                    log.info(
                        "watch: bookie %s: no ledger names it any more, %.1fs after its loss",
                        b,
                        now - t0,
                    )
            rows = [self._row(f) for f in job.findings if self._actionable(f)]
            waiting = bool(self.tracker.due)
        if not rows:
            self.retry_at = now + (self.cfg.retry_interval if waiting else 0)
            return
        copying = {r["bookie_id"] for r in rows}
        # The marks first, paused or not (the Auditor's are published for whoever repairs);
        # the audit's rows are written after the first copy (WatchAudits.record_now). The
        # first ledgers were marked by their repair: left out here (a mark written after
        # their repair cleared its own would outlive it), and their repair not waited for
        # (unless it failed: then the audit marks them, and its repair clears what it finds).
        taken = first.ledger_ids if first is not None else frozenset()
        self.repair.mark([r for r in rows if r["ledger_id"] not in taken], self.known_marks)
        self._reacted("marked", copying)
        if first is not None:
            self.audits.record_now()  # the repair has started: the rows need wait no more
        early = first.join() if first is not None else FirstOutcome()
        if early.unmarked:  # its repair failed, maybe before marking them: marked here
            self.repair.mark([r for r in rows if r["ledger_id"] in early.unmarked], None)
        if self.repair.paused():
            log.info(
                "watch: underreplication/disable exists: repair paused (%d fragments)", len(rows)
            )
            self.retry_at = now + self.cfg.retry_interval
            return
        if early.changed:  # decide again with the bookies as they are now
            self.retry_at = 0.0
            return
        # Not repaired twice: what the first ledgers resolved; what they left is retried now.
        rows = [r for r in rows if r["ledger_id"] not in early.resolved]
        if not rows:
            self.retry_at = 0.0  # all done: the next cycle's audit is the re-audit
            return
        repairing = frozenset(r["bookie_id"] for r in rows if r["reason"] == Reason.BOOKIE_LOST)
        changes = self._changes(repairing, self._delay(snap))
        actions = self.repair.repair(
            rows, job.run.run_id, first_done=lambda: self._first_copy(copying), changed=changes
        )
        progressed = any(a["status"] == ActionStatus.DONE for a in actions)
        pending = any(a["status"] not in ActionStatus.FINAL for a in actions)
        # All done, or the lost bookies changed: decide again at once (the next cycle's audit
        # is the re-audit); otherwise retry after the interval (grace period, locks held
        # elsewhere, failures).
        done = (progressed and not pending) or changes.changed
        self.retry_at = 0.0 if done else time.monotonic() + self.cfg.retry_interval
        if scheduled and check != Check.LOST:
            self.leadership.confirm()
            self.audits.run(check)

    def _loss_ledgers(self) -> list[int] | None:
        """The ledgers a loss's audit reads: those the bookie index names for the lost
        bookies, within the delay too (their findings are reported, not acted on, as a full
        scan's are: :meth:`_actionable`); None when the index is stale (a full scan)."""
        ids = self.index.ledgers_for({*self.tracker.due, *self.tracker.pending})
        return None if isinstance(ids, IndexStale) else ids

    def _first_ledgers(
        self, snap: ClusterSnapshot, audit_id: str
    ) -> tuple[FirstLedgers | None, dict[int, LedgerView | None]]:
        """A new loss's first ledgers (:mod:`jobs.watch.first_ledgers`): read now, and
        repaired at once in a thread while audit ``audit_id`` reads the rest; the views read,
        which the audit takes as its own. Nothing when no due bookie awaits its first copy,
        or repair is paused."""
        fresh = set(self.tracker.due) - self.reacted["first_copy"]
        n = self.cfg.first_ledgers
        if not fresh or snap.disabled or n == 0:
            return None, {}
        try:
            views = read_ledgers(
                self.watcher.zk,
                self.index.keeper.ledgers_of_any(fresh)[: n * CANDIDATES_PER_LEDGER],
                root=self.cfg.ledgers_root,
                kind=self.index.kind,
            )
        except BKError as exc:  # the audit reads them, and says what failed
            log.warning("watch: the loss's first ledgers not read: %s", one_line(exc))
            return None, {}
        changes = self._changes(frozenset(self.tracker.due), self._delay(snap))
        first: FirstLedgers

        def finished(rows: list[dict[str, Any]]) -> None:
            self._reacted("first_copy", first.bookies_of(rows))

        first = FirstLedgers(
            views.values(),
            frozenset(self.tracker.due),
            changes,
            repair=lambda reqs, changed: self.repair.first_ledgers(
                reqs, audit_id, finished, changed, known=snap.marked
            ),
            n=n,
        )
        return first.start(), views

    def _audit(
        self,
        check: str,
        ids: list[int] | None,
        run_id: str,
        preread: dict[int, LedgerView | None],
    ) -> Any:
        """The audit a response starts from. A loss reads only the ledgers ``ids`` the bookie
        index names (:meth:`_loss_ledgers`; those in ``preread`` were read already, by
        :meth:`_first_ledgers`), recorded as ``run_id``. A stale index (``ids`` None) is
        rebuilt from a full scan instead; a full ``lost`` audit (the schedule's) reconciles
        the index (:mod:`jobs.watch.index`). A full scan's ledgers are dropped once written
        and indexed: the repair that follows may be long, and needs its findings only."""
        if ids is not None:
            return self.audits.run(check, ids, self.index.kind, run_id=run_id, preread=preread)
        job = self._full_audit(check)
        if job is not None:
            job.forget_ledgers()
            release_heap()
        return job

    def _full_audit(self, check: str) -> Any:
        """A full audit of ``check``; a ``lost`` one rebuilds a stale index or reconciles it."""
        if check != Check.LOST:
            return self.audits.run(check)
        stale = self.index.keeper.stale
        if stale is not None:
            self.index.open()  # a new feed before the scan that rebuilds
            job = self.audits.run(check)
            if job is not None:
                self.index.build(job, stale.cause)
            return job
        with self.index.window() as window:
            job = self.audits.run(check)
            if job is not None:
                self.index.reconcile(job, window)
        return job

    def _first_copy(self, bookies: set[str]) -> None:
        """A loss's first ledger is copied: time it, and let its audit's rows be written
        (they wait so that the marks and the repair's start have the process first)."""
        self._reacted("first_copy", bookies)
        self.audits.record_now()

    def _reacted(self, stage: str, bookies: set[str]) -> None:
        """Time a stage of the reaction to each due bookie in ``bookies``, once per loss."""
        now = time.monotonic()
        with self.tracker_lock:  # a repair's threads may be feeding the tracker (LossChanges)
            due = dict(self.tracker.due)
        with self.reacting:  # the first ledgers' threads time their copies here at once
            self._time_stage(stage, bookies, due, now)

    def _time_stage(self, stage: str, bookies: set[str], due: dict[str, float], now: float) -> None:
        seen = self.reacted[stage]
        seen &= set(due)  # a bookie resolved or back is forgotten
        for b in sorted(bookies & set(due) - seen):
            self.metrics.reaction.labels(stage).observe(now - due[b])
            seen.add(b)
            log.info(
                "watch: bookie %s: %s %.1fs after its loss",
                b,
                stage.replace("_", " "),
                now - due[b],
            )

    def _actionable(self, f: Any) -> bool:
        """Findings the watch repairs: not placement (rereplicate --fix-placement's job), and
        not a lost bookie still within lostBookieRecoveryDelay."""
        if f.reason == Reason.PLACEMENT_VIOLATION:
            return False
        if f.reason in Reason.WHOLE_BOOKIE and f.bookie_id in self.tracker.pending:
            return False
        return not (f.reason == Reason.BOOKIE_LOST and f.bookie_id not in self.tracker.due)

    def _row(self, f: Any) -> dict[str, Any]:
        row = f.as_row()
        row["first_detected_at"] = self.audits.first_seen.get(f.key)
        return dict(row)
