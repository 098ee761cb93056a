"""The ``bkaudit watch`` service: elect, watch the bookies, and on a loss (past
``lostBookieRecoveryDelay``) audit, mark, repair and re-audit in this process; audits on a
schedule besides. Every audit and repair is written to the Delta tables like a one-shot run.

The engine is the one-shot commands': :class:`jobs.local.audit.LocalAudit` for audits, and
:func:`jobs.runs.repair_partition.repair_partition` (the :class:`~bklib.repair.worker.
LedgerRepairer` that ``bkaudit rereplicate`` and ``recover`` run) for repairs, with the same
locks, grace period and compare-and-set. Decisions are :mod:`jobs.watch.decide`'s.

Stale state: every step that changes the cluster (marks, each batch of repairs) first asks
ZooKeeper whether this instance still leads in its current session. A session loss ends the
term; after reconnecting the instance joins the election again and, if elected, starts from a
fresh reading of the cluster (:meth:`WatchService._take_over`).

Unreachable warehouse: rows the tables do not take wait in :mod:`jobs.watch.spool` and are
written later, in order; the repair never waits for the warehouse. Past ``--spool-max-bytes``
the service stops (docs/watch.md, "Unreachable warehouse").
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from bklib.audit.engine import ScanPlan
from bklib.client.pool import DEFAULT_BOOKIE_PROTOCOL, WireProtocol
from bklib.meta.model import DigestType
from bklib.meta.stores import MetadataStore, open_store
from bklib.meta.zkaccess import ZkAuth
from bklib.pulsar.admin import AdminSettings
from bklib.repair.requests import requests_from_findings
from bklib.repair.worker import RepairSettings
from bklib.states import (
    DEFAULT_LEDGERS_ROOT,
    ActionStatus,
    BookieState,
    Check,
    CountKey,
    Executor,
    Reason,
    RepairMode,
    RunStatus,
)
from bklib.tls import TlsSettings
from jobs.runs.audit_run import DEFAULT_READ_RATE, AuditConfig
from jobs.runs.repair_run import RepairConfig, stamp
from jobs.runtime.messages import one_line
from jobs.tables import delta
from jobs.tables.runs import new_run_id
from jobs.tables.schema import ACTIONS, AUDIT_RUNS, run_day
from jobs.watch.decide import LossTracker, Schedule, finding_counts
from jobs.watch.election import LeaderElection
from jobs.watch.metrics import Health, MetricsServer, WatchMetrics
from jobs.watch.spool import DEFAULT_SPOOL_MAX_BYTES, SpoolError, SpoolWriter, default_spool_dir
from jobs.watch.watcher import ClusterSnapshot, ClusterWatcher

__all__ = ["WatchConfig", "WatchService", "audit_config", "repair_config"]

log = logging.getLogger("jobs.watch")


@dataclass
class WatchConfig:
    """Everything the service needs (built by :mod:`jobs.commands.watch` from the flags)."""

    zk: str
    warehouse: str
    ledgers_root: str = DEFAULT_LEDGERS_ROOT
    zk_auth: ZkAuth = None
    zk_session_timeout: float = 10.0
    delay_override: float | None = None
    """``--lost-bookie-recovery-delay``; None: the znode, else BookKeeper's default 0."""
    every: Mapping[str, float] = field(default_factory=dict)
    grace_period: float = 30.0
    rate: float | None = 50e6
    window: int = 64
    ledgers_in_flight: int = 8
    bookie_protocol: WireProtocol = DEFAULT_BOOKIE_PROTOCOL
    """``--bookie-protocol``: the scheduled audits' entry reads and the repairs' copies."""
    read_timeout: float = 10.0
    connect_timeout: float = 5.0
    verify_percentage: float = 0.0
    read_rate: float | None = DEFAULT_READ_RATE
    """Bytes/s the scheduled audits read from one bookie (None: unlimited)."""
    password: bytes | None = None
    digest_type: DigestType | None = None
    retry_interval: float = 5.0
    poll_interval: float = 2.0
    max_failed_cycles: int = 5
    """``/healthz`` fails after this many leader cycles in a row raised (0: never)."""
    stop_timeout: float = 30.0
    metrics_host: str = "0.0.0.0"
    metrics_port: int | None = None
    instance_id: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    tls: TlsSettings | None = None
    """Bookie TLS (``--tls-*`` flags) of the audits' and repairs' bookie connections."""
    spool_dir: str | None = None
    """``--spool-dir``: rows the warehouse did not take wait here; None: the default
    (:func:`jobs.watch.spool.default_spool_dir`)."""
    spool_max_bytes: int = DEFAULT_SPOOL_MAX_BYTES
    """``--spool-max-bytes``: above it the service stops (exit 2) rather than grow."""
    pulsar_admin: AdminSettings | None = None
    """``--pulsar-admin-url`` and its credentials: after a repair the topics whose ledgers
    changed are unloaded (docs/pulsar.md); None: they are recorded and named in the log."""
    unload_rate: float = 2.0
    """``--unload-rate``: topic unloads per second at most."""


def audit_config(cfg: WatchConfig, check: str) -> AuditConfig:
    """The configuration of one of the watch's audits of ``check``."""
    config = AuditConfig(
        zk=cfg.zk,
        warehouse=cfg.warehouse,
        check=check,
        ledgers_root=cfg.ledgers_root,
        zk_auth=cfg.zk_auth,
        tls=cfg.tls,
    )
    config.fetch = dataclasses.replace(
        config.fetch,
        read_timeout=cfg.read_timeout,
        connect_timeout=cfg.connect_timeout,
        verify_percentage=cfg.verify_percentage,
        read_rate=cfg.read_rate,
        bookie_protocol=cfg.bookie_protocol,
    )
    return config


def repair_config(cfg: WatchConfig, audit_run_id: str) -> RepairConfig:
    """The configuration of the watch's repair of the findings of ``audit_run_id``, in this
    process: a stop or a lost leadership waits only for the ledgers in flight."""
    return RepairConfig(
        zk=cfg.zk,
        warehouse=cfg.warehouse,
        mode=RepairMode.REREPLICATE,
        audit_run_id=audit_run_id,
        ledgers_root=cfg.ledgers_root,
        zk_auth=cfg.zk_auth,
        zk_session_timeout=cfg.zk_session_timeout,
        settings=RepairSettings(
            grace_period=cfg.grace_period,
            rate=cfg.rate,
            window=cfg.window,
            bookie_protocol=cfg.bookie_protocol,
            password=cfg.password,
            digest_type=cfg.digest_type,
            marked_before=True,  # the watch marks its findings first (_mark)
        ),
        ledgers_in_flight=cfg.ledgers_in_flight,
        local_processes=1,
        read_timeout=cfg.read_timeout,
        tls=cfg.tls,
    )


class _Stopped(Exception):
    """The service was asked to stop, or lost its leadership, between two steps."""


class WatchService:
    """One ``bkaudit watch`` instance. :meth:`run` blocks until :meth:`stop` (SIGTERM)."""

    def __init__(self, config: WatchConfig, metrics: WatchMetrics | None = None) -> None:
        self.cfg = config
        self.metrics = metrics or WatchMetrics()
        self.health = Health(
            stale_after=max(60.0, 10 * config.poll_interval),
            max_failed_cycles=config.max_failed_cycles,
        )
        self.stopping = threading.Event()
        self.server: MetricsServer | None = None
        self.tracker = LossTracker()
        self.schedule = Schedule(dict(config.every))
        self.leading = False
        self.retry_at = 0.0
        self.warehouse_ok = True
        self.first_seen: dict[tuple[int, int, str], datetime] = {}
        """When each finding was first detected (grace period of open ledgers)."""
        self.no_replica: list[dict[str, Any]] = []
        """NO_REPLICA actions of earlier runs: reported again, not copied again."""
        self.zk: MetadataStore | None = None
        self.watcher: ClusterWatcher | None = None
        self.election: LeaderElection | None = None
        self.lost_sessions_seen = 0
        self.spool = SpoolWriter(
            config.warehouse,
            config.spool_dir or default_spool_dir(config.warehouse),
            config.spool_max_bytes,
        )
        self.flush_error: str | None = None
        self.spooled = False
        """Something waits in the spool (the warehouse is not writable, for /readyz)."""

    # ---- lifecycle -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the loop to stop after the step in progress (signal-safe)."""
        self.stopping.set()
        if self.watcher is not None:
            self.watcher.wake.set()

    def install_signals(self) -> None:
        def handler(signum: int, _frame: Any) -> None:
            log.info("watch: %s received, stopping", signal.Signals(signum).name)
            self.stop()
            # A batch of repairs may be copying: give it stop_timeout, then leave; its locks
            # are ephemeral and die with its session.
            t = threading.Timer(self.cfg.stop_timeout, self._hard_exit)
            t.daemon = True
            t.start()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def _hard_exit(self) -> None:
        log.error(
            "watch: still busy %gs after the stop request; exiting (locks in flight expire "
            "with their ZooKeeper session)",
            self.cfg.stop_timeout,
        )
        logging.shutdown()
        os._exit(1)

    def identity(self) -> dict[str, Any]:
        return {
            "id": self.cfg.instance_id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "warehouse": self.cfg.warehouse,
            "metrics_port": self.server.port if self.server else None,
            "since": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }

    def run(self) -> int:
        """Serve until stopped; 0 on a clean stop."""
        cfg = self.cfg
        if cfg.metrics_port is not None:
            self.server = MetricsServer(
                self.metrics, self.health, cfg.metrics_host, cfg.metrics_port, self._info
            ).start()
        self.zk = open_store(cfg.zk, auth=cfg.zk_auth, timeout=cfg.zk_session_timeout)
        self.watcher = ClusterWatcher(self.zk, cfg.ledgers_root)
        self.election = LeaderElection(self.zk, cfg.ledgers_root, self.identity())
        self._spool_state()
        if self.spooled:
            log.warning(
                "watch: spool %s holds %d rows from before; flushing them to %s first",
                self.spool.dir,
                self.spool.stats()[1],
                cfg.warehouse,
            )
        try:
            self.election.join()
            self._watch_election()
            while not self.stopping.is_set():
                self.health.heartbeat()
                self._flush()
                wait = self._cycle()
                if self.stopping.is_set():
                    break
                self.watcher.wake.wait(max(0.05, wait))
                self.watcher.wake.clear()
        finally:
            self._shutdown()
        return 0

    def _shutdown(self) -> None:
        self.leading = False
        self.metrics.leader.set(0)
        if self.election is not None and self.zk is not None:
            try:
                self.election.leave()
            except Exception as exc:  # noqa: BLE001 - the session may be gone; it ends anyway
                log.debug("watch: leaving the election: %s", exc)
        if self.zk is not None:
            if self.watcher is not None:  # our own close is not a session loss
                self.zk.remove_state_listener(self.watcher.on_state)
            self.zk.close()
        if self.server is not None:
            self.server.stop()
        log.info("watch: stopped")

    def _info(self) -> dict[str, Any]:
        return {"role": self.health.role, "instance": self.cfg.instance_id}

    def _watch_election(self) -> None:
        assert self.watcher is not None and self.election is not None
        watcher = self.watcher

        def changed(_children: list[str] | None) -> None:
            watcher.wake.set()

        assert self.zk is not None
        self.zk.watch_children(self.election.path, changed)

    # ---- one cycle -----------------------------------------------------------------------------

    def _cycle(self) -> float:
        """Decide and act once; returns how long to sleep unless woken."""
        assert self.watcher is not None and self.election is not None
        w, e = self.watcher, self.election
        if w.lost_sessions != self.lost_sessions_seen:
            self.metrics.session_losses.inc(w.lost_sessions - self.lost_sessions_seen)
            self.lost_sessions_seen = w.lost_sessions
        if not w.connected:
            self._step_down(f"{w.zk.kind} disconnected")
            return self.cfg.poll_interval
        # The cycle decides as of this instant, taken before ZooKeeper confirms the term: a
        # process paused after the confirmation (SIGSTOP, a long GC, a frozen VM) must not
        # wake up and count the pause towards a bookie's delay on a view of the old term.
        as_of = time.monotonic()
        try:
            if not e.in_current_session():
                # The session expired: our member died with it. Join again; whatever we knew
                # belongs to the old term.
                self._step_down("session expired; rejoining the election")
                e.join()
            leader = e.is_leader()
        except Exception as exc:  # noqa: BLE001 - unknown leadership: step down (fails closed)
            log.warning("watch: election: %s", one_line(exc))
            self._step_down("election unavailable")
            return self.cfg.poll_interval
        if not leader:
            self._step_down(None)
            return self.cfg.poll_interval * 5
        try:
            if not self.leading:
                # The take-over reads the whole cluster, so this cycle's check is long past:
                # the term's first decisions wait for the next cycle's.
                self._take_over()
                wait = 0.0
            else:
                wait = self._lead(as_of)
        except _Stopped as exc:
            log.info("watch: %s", exc)
            return 0.0
        except SpoolError:
            raise  # the service stops (run_watch prints it and exits 2)
        except Exception as exc:  # logged, counted, and /healthz turns red if it keeps failing
            self.health.cycle_failed(one_line(exc))
            self.metrics.cycle_failures.inc()
            log.exception(
                "watch: cycle failed (%d in a row): %s",
                self.health.failed_cycles,
                one_line(exc),
            )
            return self.cfg.retry_interval
        self.health.cycle_ok()
        return wait

    def _step_down(self, why: str | None) -> None:
        if self.leading:
            log.warning("watch: no longer the leader%s", f" ({why})" if why else "")
        self.leading = False
        self.metrics.leader.set(0)
        if why is None:
            self.health.role = "standby"
            self.health.ready_reason = None if self.warehouse_ok else "warehouse unreachable"
        else:
            self.health.role = "disconnected"
            self.health.ready_reason = why

    def _still_leader(self) -> None:
        """Raise :class:`_Stopped` unless we may act now (asks ZooKeeper)."""
        assert self.watcher is not None and self.election is not None
        self.health.heartbeat()  # long work is a series of steps: each one proves liveness
        if self.stopping.is_set():
            raise _Stopped("stop requested")
        if not self.watcher.connected or not self.election.is_leader():
            self.leading = False
            raise _Stopped("leadership lost; the step is abandoned")

    def _take_over(self) -> None:
        """A new term: read the cluster afresh, the schedule and history from the tables,
        and audit the lost bookies now (as the Auditor's bookie check does at start)."""
        assert self.watcher is not None
        log.info("watch: elected leader (%s)", self.cfg.instance_id)
        self.metrics.leader.set(1)
        self.health.role = "leader"
        self.health.ready_reason = None
        self.tracker = LossTracker()
        self.first_seen = {}
        self.retry_at = 0.0
        self._load_history()
        self.watcher.watch_registrations()
        snap = self.watcher.snapshot()
        audit = self._audit(Check.LOST)
        if audit is None:
            # Fail closed: without this audit the bookies lost before the take-over are
            # unknown, not absent. The cycle fails and the take-over is retried whole.
            raise RuntimeError("take-over audit failed; retrying the take-over")
        lost = {b.bookie_id for b in audit.bookies if b.state == BookieState.LOST}
        marked = {b for bookies in snap.marked.values() for b in bookies}
        self.tracker.seed(snap.available, lost, marked, time.monotonic())
        self.leading = True  # only now: a failed take-over is retried whole
        self.health.ready_reason = None if self.warehouse_ok else "warehouse unreachable"
        if self.tracker.due or self.tracker.pending:
            log.info(
                "watch: at take-over, lost bookies due now %s, waiting for the delay %s",
                sorted(self.tracker.due),
                sorted(self.tracker.pending),
            )

    def _load_history(self) -> None:
        """Last run of each check (the schedule), first detections of the latest run and
        NO_REPLICA results, from the tables; an unreachable warehouse leaves them empty."""
        wh = self.cfg.warehouse
        try:
            if delta.table_exists(wh, AUDIT_RUNS):
                runs = delta.read_rows(wh, AUDIT_RUNS, columns=["check", "status", "finished_at"])
                for r in runs:
                    if r["status"] in RunStatus.FINISHED and r["finished_at"] is not None:
                        self.schedule.ran(r["check"], r["finished_at"].timestamp())
                for c, ts in self.schedule.last.items():
                    self.metrics.last_audit.labels(c).set(ts)
            if delta.table_exists(wh, AUDIT_RUNS):
                self.first_seen.update(delta.first_detections(wh))
            if delta.table_exists(wh, ACTIONS):
                self.no_replica = list(
                    delta.read_rows(
                        wh,
                        ACTIONS,
                        columns=["ledger_id", "segment_first_entry_id", "old_bookie", "status"],
                        filters=[("status", "=", ActionStatus.NO_REPLICA)],
                    )
                )
            self._warehouse(True)
        except Exception as exc:  # noqa: BLE001 - /readyz goes red and the rows are spooled
            self._warehouse(False, exc)

    def _warehouse(self, ok: bool, exc: BaseException | None = None) -> None:
        if not ok:
            self.metrics.warehouse_errors.inc()
            if exc is not None:  # (a spooled write was logged by the spool, with its file)
                log.error("watch: warehouse %s: %s", self.cfg.warehouse, one_line(exc))
        # Rows waiting in the spool mean the tables are behind: not ready either.
        self.warehouse_ok = ok and not self.spooled
        if self.leading:
            self.health.ready_reason = None if self.warehouse_ok else "warehouse unreachable"

    def _spool_state(self) -> None:
        files, rows, _size = self.spool.stats()
        self.metrics.spooled_files.set(files)
        self.metrics.spooled_rows.set(rows)
        self.spooled = files > 0

    def _flush(self) -> None:
        """Write what the spool holds, oldest first (every cycle, leader or not: the rows
        are of runs already done)."""
        if not self.spooled:
            return
        files, rows, _ = self.spool.stats()
        ok = self.spool.flush()
        self._spool_state()
        if ok and not self.spooled:
            log.info(
                "watch: warehouse %s writable again: %d spooled rows (%d files) written",
                self.cfg.warehouse,
                rows,
                files,
            )
            self._warehouse(True)
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
            self.warehouse_ok = False
            if self.leading:
                self.health.ready_reason = "warehouse unreachable"
        self.flush_error = self.spool.last_error

    def _write(
        self,
        batches: list[tuple[str, list[dict[str, Any]]]],
        run_date: Any = None,
        bound: bool = True,
    ) -> None:
        """Append, or spool when the warehouse does not take the rows (nothing is dropped);
        raises :class:`~jobs.watch.spool.SpoolError` past the bound or when the spool
        cannot be written either."""
        try:
            results = self.spool.write_many(batches, run_date, bound)
        finally:
            self._spool_state()
        self._warehouse(all(results))

    def _delay(self, snap: ClusterSnapshot) -> float:
        if self.cfg.delay_override is not None:
            return self.cfg.delay_override
        # Absent znode: BookKeeper's default lostBookieRecoveryDelay (0); the Auditor would
        # create it from its own configuration.
        return float(snap.delay_znode or 0)

    def _lead(self, now: float) -> float:
        """One leader cycle deciding as of ``now`` (monotonic seconds, taken before the
        cycle's leadership check); returns the sleep until the next thing is due."""
        assert self.watcher is not None
        cfg, m = self.cfg, self.metrics
        snap = self.watcher.snapshot()
        delay = self._delay(snap)
        became = self.tracker.observe(snap.available, now, delay)
        if became:
            log.info("watch: lost bookies due for repair: %s (delay %gs)", became, delay)
            self.retry_at = 0.0  # a new loss widens the work at once
        m.bookies.labels(BookieState.WRITABLE).set(len(snap.writable))
        m.bookies.labels(BookieState.READONLY).set(len(snap.readonly))
        m.bookies.labels(BookieState.LOST).set(len(self.tracker.pending) + len(self.tracker.due))
        m.marks.set(len(snap.marked))
        m.paused.set(1 if snap.disabled else 0)
        m.delay.set(delay)
        acted = False
        if self.tracker.due and now >= self.retry_at:
            self._respond(Check.LOST, snap)
            acted = True
        for check in self.schedule.due(time.time()):
            self._still_leader()
            self._respond(check, snap, scheduled=True)
            acted = True
        if acted:  # the gauges say what the work left, not what it started from
            assert self.watcher is not None
            m.marks.set(sum(1 for _ in self.watcher.urm.list_underreplicated()))
            m.bookies.labels(BookieState.LOST).set(
                len(self.tracker.pending) + len(self.tracker.due)
            )
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

    # ---- audit, mark, repair -------------------------------------------------------------------

    def _audit(self, check: str) -> Any:
        """One audit run of ``check`` in this process, written to the tables (a warehouse
        failure is logged and counted: the findings still drive the repair). None if the
        cluster could not be read."""
        from jobs.local.audit import LocalAudit

        cfg = self.cfg
        config = audit_config(cfg, check)
        started = time.time()
        try:
            plan = ScanPlan.read(cfg.zk, cfg.ledgers_root, cfg.zk_auth)
            job = LocalAudit(config, plan)
            try:
                job.scan()
                job.check()
            finally:
                job.close_helper()  # a failed audit must not leave its helper reading
            job.recheck()
        except Exception as exc:  # noqa: BLE001 - counted FAILED in metrics; retried next cycle
            log.error("watch: %s audit failed: %s", check, one_line(exc))
            self.metrics.audits.labels(check, RunStatus.FAILED).inc()
            return None
        self.health.heartbeat()
        self._first_detected(job)
        run = self._load(job)
        self.schedule.ran(check, started)
        self.metrics.audits.labels(check, run.status).inc()
        # The run's own finished_at, so the gauge is the audit_runs row's figure (as the
        # take-over's reading of the table sets it).
        self.metrics.last_audit.labels(check).set(run.finished_at.timestamp())
        frags, ledgers = finding_counts(f.as_row() for f in job.findings)
        self.metrics.set_findings(check, frags, ledgers)
        log.info(
            "watch: %s audit %s: %d ledgers, %d under-replicated fragments",
            check,
            run.run_id,
            job.run.counts[CountKey.LEDGERS],
            len(job.findings),
        )
        return job

    def _load(self, job: Any) -> Any:
        """The run's rows as :meth:`jobs.local.audit.LocalAudit.load` writes them (per-run
        tables first, ``audit_runs`` last), through the spool. first_detected_at comes from
        this instance's memory (seeded from the tables at take-over), which needs no read of
        an unreachable warehouse."""
        run = job.run
        tables = job.rows(self.first_seen)
        day = run_day(run.started_at)
        # The bound is checked with the audit_runs row: a run is spooled whole, or not at all.
        self._write(tables, day, False)
        run.finished_at = datetime.now(timezone.utc)
        self._write([(AUDIT_RUNS, [run.as_row()])])
        return run

    def _first_detected(self, job: Any) -> None:
        started = job.run.started_at
        current = {f.key for f in job.findings}
        self.first_seen = {k: v for k, v in self.first_seen.items() if k in current}
        for k in current:
            self.first_seen.setdefault(k, started)

    def _respond(self, check: str, snap: ClusterSnapshot, scheduled: bool = False) -> None:
        """Audit ``check``; publish marks for what is due; repair it; for a scheduled check
        with findings, audit again. Lost bookies waiting for the delay are left alone."""
        self._still_leader()
        job = self._audit(check)
        now = time.monotonic()
        if job is None:
            self.retry_at = now + self.cfg.retry_interval
            return
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
        if not rows:
            self.retry_at = now + (self.cfg.retry_interval if self.tracker.due else 0)
            return
        self._mark(rows)
        if self._disabled():
            log.info(
                "watch: underreplication/disable exists: repair paused (%d fragments)", len(rows)
            )
            self.retry_at = now + self.cfg.retry_interval
            return
        actions = self._repair(rows, job.run.run_id)
        progressed = any(a["status"] == ActionStatus.DONE for a in actions)
        pending = any(a["status"] not in ActionStatus.FINAL for a in actions)
        # All done: re-audit at once (the next cycle's audit is the re-audit); otherwise retry
        # after the interval (grace period, locks held elsewhere, failures).
        done = progressed and not pending
        self.retry_at = 0.0 if done else time.monotonic() + self.cfg.retry_interval
        if scheduled and check != Check.LOST:
            self._still_leader()
            self._audit(check)

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
        row["first_detected_at"] = self.first_seen.get(f.key)
        return dict(row)

    def _disabled(self) -> bool:
        assert self.watcher is not None
        return not self.watcher.urm.is_replication_enabled()

    def _mark(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Publish BookKeeper's marks (merged into existing ones), as the Auditor does, so
        ``listunderreplicated`` and Java ReplicationWorkers see the work."""
        assert self.watcher is not None
        self._still_leader()
        missing: dict[int, set[str]] = {}
        for r in rows:
            missing.setdefault(int(r["ledger_id"]), set()).add(r["bookie_id"])
        urm = self.watcher.urm
        # Many marks at once (kazoo is thread-safe): one round trip each in sequence was most
        # of the reaction time to a lost bookie named by hundreds of ledgers.
        with concurrent.futures.ThreadPoolExecutor(min(16, len(missing)) or 1) as pool:
            for _ in pool.map(
                lambda m: urm.mark_underreplicated(m[0], sorted(m[1])), missing.items()
            ):
                pass

    def _repair(self, rows: list[dict[str, Any]], audit_run_id: str) -> list[dict[str, Any]]:
        """The rereplicate engine over ``rows``, ``ledgers_in_flight`` ledgers at a time (a stop
        or a lost leadership waits only for the ledgers in flight)."""
        from jobs.runs.repair_partition import repair_partition

        cfg = self.cfg
        reqs = requests_from_findings(rows, self.no_replica)
        config = repair_config(cfg, audit_run_id)
        run_id = new_run_id()
        log.info("watch: repair %s: %d ledgers (audit %s)", run_id, len(reqs), audit_run_id)
        out: list[dict[str, Any]] = []

        def proceed() -> bool:
            try:
                self._still_leader()
            except _Stopped:
                return False
            return True

        # One session and one bookie client for the whole repair; leadership is asked before
        # each ledger starts, so a stop or a lost leadership waits only for those in flight.
        try:
            self._still_leader()
            for actions in repair_partition(config, reqs, proceed):
                out.extend(actions)
            self._still_leader()  # the ledgers not started were abandoned: say so
        finally:
            self._record(out, config, run_id)
        self._unload(out, config, run_id)
        return out

    def _unload(self, rows: list[dict[str, Any]], config: RepairConfig, run_id: str) -> None:
        """After a repair, the Pulsar topics whose ledgers changed: unloaded through the admin
        API (``--pulsar-admin-url``), so brokers drop stale ledger handles, or recorded and
        named for the operator. Never undoes the repair."""
        from bklib.pulsar.unload import operator_command
        from jobs.runs.pulsar_unload import unload_changed_topics

        try:
            done = unload_changed_topics(
                rows,
                run_id=run_id,
                mode=RepairMode.REREPLICATE,
                zk_hosts=self.cfg.zk,
                ledgers_root=self.cfg.ledgers_root,
                auth=self.cfg.zk_auth,
                warehouse=self.cfg.warehouse,
                audit_run_id=config.audit_run_id,
                dry_run=False,
                settings=self.cfg.pulsar_admin,
                unload_rate=self.cfg.unload_rate,
            )
        except Exception as exc:  # noqa: BLE001 - logged with the repair's id; the repair stands
            log.error("watch: repair %s: Pulsar topic unloads not done: %s", run_id, one_line(exc))
            return
        if not done.rows:
            return
        self.metrics.count_actions(done.rows)
        self._write([(ACTIONS, done.rows)])
        for o in done.outcomes:
            if o.status == ActionStatus.DONE:
                log.info("watch: repair %s: unloaded Pulsar topic %s", run_id, o.topic)
            else:
                log.warning(
                    "watch: repair %s: Pulsar topic %s still holds stale ledger handles (%s); "
                    "run: %s",
                    run_id,
                    o.topic,
                    o.error,
                    operator_command(o.topic),
                )

    def _record(self, rows: list[dict[str, Any]], config: RepairConfig, run_id: str) -> None:
        if not rows:
            return
        stamp(rows, config, run_id, Executor.LOCAL)
        self.metrics.count_actions(rows)
        self.no_replica.extend(r for r in rows if r["status"] == ActionStatus.NO_REPLICA)
        self._write([(ACTIONS, rows)])
        done = sum(1 for r in rows if r["status"] == ActionStatus.DONE)
        log.info("watch: repair %s: %d actions, %d done", run_id, len(rows), done)
