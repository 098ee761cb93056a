"""The repair in this process: the same :class:`~bklib.repair.worker.LedgerRepairer` the Spark
tasks run, over one ZooKeeper session and one bookie client, with a few ledgers in flight;
``replication_actions`` written through delta-rs. Same requests and rows as
:mod:`jobs.spark.repair_job`."""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import multiprocessing
import os
import signal
import threading
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from bklib.audit.accounting import ScanAccount, scanned_per_directory
from bklib.audit.engine import ScanPlan, scan_dirs
from bklib.audit.model import LedgerView
from bklib.meta.stores import MetadataStore
from bklib.repair.requests import (
    LedgerRequest,
    mark_requests,
    request_for_bookies,
    requests_from_findings,
)
from bklib.states import ActionStatus, Executor, Reason
from jobs.runs.repair_partition import repair_partition, repair_partition_rows
from jobs.runs.repair_run import log_done, log_start, stamp, stop_if_signalled
from jobs.runtime import interrupts
from jobs.runtime.cores import usable_cores
from jobs.runtime.progress import Progress
from jobs.tables import delta
from jobs.tables.runs import new_run_id
from jobs.tables.schema import ACTIONS, FRAGMENTS, LEDGERS

if TYPE_CHECKING:
    from jobs.runs.repair_run import RepairConfig

__all__ = ["LocalRepair", "scan_views"]

log = logging.getLogger("jobs.commands.repair")

PROGRESS_EVERY = 5.0


def scan_views(
    config: RepairConfig, session: MetadataStore, plan: ScanPlan | None = None
) -> tuple[list[LedgerView], ScanAccount]:
    """Every ledger's metadata, read in this process over its ``session``, and the account of
    what the scan read against what the directories announced (a repair that missed ledgers
    says so)."""
    plan = plan or ScanPlan.read(session, config.ledgers_root)
    views = list(scan_dirs(session, plan.dirs))
    account = plan.account(
        session, scanned_per_directory(v.znode_path for v in views), config.ledgers_root
    )
    return views, account


class LocalRepair:
    """One repair run in-process, over the command's store ``session`` (a spawned worker
    process opens its own: :func:`~jobs.runs.repair_partition.worker_partition`)."""

    def __init__(self, config: RepairConfig, session: MetadataStore) -> None:
        self.config = config
        self.session = session
        started = datetime.now(timezone.utc)
        self.run_id = config.run_id or new_run_id(started)
        self.started_at = started
        self.lengths: dict[int, int] = {}
        """Ledger lengths of the requested ledgers, for the executor choice."""
        self.unreadable: list[LedgerView] = []
        """Ledgers whose metadata could not be read or parsed: they may name the bookies."""
        self.unnamed: list[str] = []
        """Requested bookies that no readable ensemble names (often a typo in the id)."""
        self.placement_skipped = 0
        """PLACEMENT_VIOLATION findings a plain rereplicate leaves alone (docs/placement.md)."""

    def requests_from_audit(self) -> list[LedgerRequest] | None:
        """Requests for the latest completed audit run (or ``audit_run_id``); None if there
        is no audit run."""
        cfg = self.config
        run = delta.latest_run(cfg.warehouse, cfg.audit_run_id)
        if run is None:
            return None
        cfg.audit_run_id = run["run_id"]
        findings = delta.read_rows(
            cfg.warehouse,
            FRAGMENTS,
            columns=[
                "ledger_id",
                "segment_first_entry_id",
                "bookie_id",
                "reason",
                "first_detected_at",
            ],
            filters=[("run_id", "=", run["run_id"])],
        )
        previous = delta.read_rows(
            cfg.warehouse,
            ACTIONS,
            columns=["ledger_id", "segment_first_entry_id", "old_bookie", "status"],
            filters=[("status", "=", ActionStatus.NO_REPLICA)],
        )
        findings = list(findings)
        self.placement_skipped = sum(
            1 for f in findings if f["reason"] == Reason.PLACEMENT_VIOLATION
        )
        reqs = requests_from_findings(findings, previous, fix_placement=cfg.fix_placement)
        wanted = {r.ledger_id for r in reqs}
        if wanted:
            for r in delta.read_rows(
                cfg.warehouse,
                LEDGERS,
                columns=["ledger_id", "length"],
                filters=[("run_id", "=", run["run_id"])],
            ):
                if r["ledger_id"] in wanted:
                    self.lengths[r["ledger_id"]] = int(r["length"] or 0)
        return reqs

    def requests_for_marks(self, reqs: list[LedgerRequest]) -> list[LedgerRequest]:
        """Requests to verify the ledgers BookKeeper's under-replication marks name but no
        request covers (``LedgerRequest.verify_mark``): a mark whose bookie came back is
        cleared once the ledger checks healthy, instead of staying forever."""
        from bklib.meta.underreplication import UnderReplicationManager

        urm = UnderReplicationManager(self.session, self.config.ledgers_root)
        marked = [m.ledger_id for m in urm.list_underreplicated()]
        out = mark_requests(marked, (r.ledger_id for r in reqs))
        if out:
            log.info("%d marked ledgers not in the audit's findings: checking them", len(out))
        return out

    def requests_for_bookies(self, views: list[LedgerView]) -> list[LedgerRequest]:
        """Manual recover: every ledger whose metadata names one of the bookies."""
        out = []
        self.unreadable = [v for v in views if not v.ok]
        named: set[str] = set()
        for v in views:
            if not v.ok:
                continue
            named.update(v.bookies())
            req = request_for_bookies(v.ledger_id, v.bookies(), self.config.bookies)
            if req is not None:
                out.append(req)
                self.lengths[v.ledger_id] = int(v.length or 0)
        self.unnamed = [b for b in self.config.bookies if b not in named]
        return out

    def processes(self, ledgers: int) -> int:
        """Worker processes for ``ledgers`` ledgers: ``--local-processes``, or one per core
        while each gets at least ``--ledgers-in-flight`` ledgers."""
        wanted = self.config.local_processes
        if wanted:
            return max(1, min(wanted, ledgers))
        per = max(1, self.config.ledgers_in_flight)
        return max(1, min(usable_cores(), ledgers // per))

    def execute(self, reqs: list[LedgerRequest]) -> list[dict[str, Any]]:
        """Repair ``reqs``; returns the action rows (also appended to
        ``replication_actions``). After SIGINT or SIGTERM no ledger starts, those in flight
        finish within ``--stop-timeout``, the rows of every finished ledger are written, and
        :class:`~jobs.runtime.interrupts.Interrupted` is raised."""
        cfg = self.config
        n = len(reqs)
        if n == 0:
            log.info("%s %s: nothing to repair", cfg.mode, self.run_id)
            return []
        delta.check_writable(cfg.warehouse, (ACTIONS,))
        where = "in-process" if self.processes(n) <= 1 else f"in {self.processes(n)} processes"
        log_start(cfg, self.run_id, n, where)
        t0 = time.monotonic()
        rows: list[dict[str, Any]] = []
        record = _Record(cfg, self.run_id)
        procs = self.processes(n)

        # Past --stop-timeout the finished ledgers' rows are written from the timer, the
        # session closed (its locks deleted at once), and the process leaves.
        def abandon() -> None:
            done = list(rows)
            record.write(done)
            self.session.close()
            ledgers = len({r["ledger_id"] for r in done})
            interrupts.note(f"{cfg.mode} {self.run_id}: the actions of {ledgers} ledgers recorded")

        # A bar with an ETA on a terminal, a line every few seconds otherwise.
        with (
            interrupts.draining(cfg.stop_timeout, on_stop=_stop_workers, on_deadline=abandon),
            Progress(cfg.mode, n, logger=log, every=PROGRESS_EVERY) as progress,
        ):
            if procs <= 1:
                for actions in repair_partition(cfg, self.session, reqs):
                    rows.extend(actions)
                    progress.advance(1)
            else:
                # The client's event loop is one core's worth of work: split the ledgers over
                # processes (by ledger id, as Spark partitions them), each with its own client.
                groups = [[r for r in reqs if r.ledger_id % procs == k] for k in range(procs)]
                ctx = multiprocessing.get_context("spawn")
                with concurrent.futures.ProcessPoolExecutor(
                    procs, mp_context=ctx, initializer=interrupts.in_repair_worker
                ) as pool:
                    futures = {pool.submit(repair_partition_rows, cfg, g): len(g) for g in groups}
                    for fut in concurrent.futures.as_completed(futures):
                        rows.extend(fut.result())
                        progress.advance(futures[fut])
            record.write(rows)  # in the scope: a signal now does not cut the write short
        log_done(cfg, self.run_id, rows, n, time.monotonic() - t0)
        stop_if_signalled(cfg, self.run_id, rows, n)
        return rows


class _Record:
    """A repair run's rows, appended to ``replication_actions`` once: by the run, or past
    ``--stop-timeout`` by the timer that ends the process, whichever comes first."""

    def __init__(self, config: RepairConfig, run_id: str) -> None:
        self.config = config
        self.run_id = run_id
        self._lock = threading.Lock()
        self._written = False

    def write(self, rows: list[dict[str, Any]]) -> None:
        with self._lock:
            if self._written:
                return
            self._written = True
            stamp(rows, self.config, self.run_id, Executor.LOCAL)
            delta.append_rows(self.config.warehouse, ACTIONS, rows)


def _stop_workers() -> None:
    """Tell the repair's worker processes, if any, to start no ledger (SIGTERM:
    :func:`~jobs.runtime.interrupts.in_repair_worker`); a Ctrl-C reaches them too, but they
    ignore SIGINT, and a signal to this process alone must stop them as well."""
    for child in multiprocessing.active_children():
        if child.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGTERM)
