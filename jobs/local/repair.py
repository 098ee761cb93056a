"""The repair in this process: the same :class:`~bklib.repair.worker.LedgerRepairer` the Spark
tasks run, over one ZooKeeper session and one bookie client, with a few ledgers in flight;
``replication_actions`` written through delta-rs. Same requests and rows as
:mod:`jobs.spark.repair_job`."""

from __future__ import annotations

import concurrent.futures
import logging
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from bklib.audit.engine import ScanPlan, scan_dirs
from bklib.audit.model import LedgerView
from bklib.repair.requests import LedgerRequest, request_for_bookies, requests_from_findings
from bklib.states import ActionStatus, Executor
from jobs.repair_run import log_done, log_start, stamp
from jobs.tables import delta
from jobs.tables.runs import new_run_id
from jobs.tables.schema import ACTIONS, FRAGMENTS, LEDGERS

if TYPE_CHECKING:
    from jobs.rereplicate import RepairConfig

__all__ = ["LocalRepair", "scan_views"]

log = logging.getLogger("jobs.rereplicate")

PROGRESS_EVERY = 5.0


def scan_views(config: RepairConfig, plan: ScanPlan | None = None) -> list[LedgerView]:
    """Every ledger's metadata, read in this process."""
    plan = plan or ScanPlan.read(config.zk, config.ledgers_root, config.zk_auth)
    return list(
        scan_dirs(
            config.zk, plan.dirs, root=config.ledgers_root, kind=plan.kind, auth=config.zk_auth
        )
    )


class LocalRepair:
    """One repair run in-process."""

    def __init__(self, config: RepairConfig) -> None:
        self.config = config
        started = datetime.now(timezone.utc)
        self.run_id = config.run_id or new_run_id(started)
        self.started_at = started
        self.lengths: dict[int, int] = {}
        """Ledger lengths of the requested ledgers, for the executor choice."""
        self.unreadable: list[LedgerView] = []
        """Ledgers whose metadata could not be read or parsed: they may name the bookies."""

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
        reqs = requests_from_findings(findings, previous)
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

    def requests_for_bookies(self, views: list[LedgerView]) -> list[LedgerRequest]:
        """Manual recover: every ledger whose metadata names one of the bookies."""
        out = []
        self.unreadable = [v for v in views if not v.ok]
        for v in views:
            if not v.ok:
                continue
            req = request_for_bookies(v.ledger_id, v.bookies(), self.config.bookies)
            if req is not None:
                out.append(req)
                self.lengths[v.ledger_id] = int(v.length or 0)
        return out

    def execute(self, reqs: list[LedgerRequest]) -> list[dict[str, Any]]:
        """Repair ``reqs``; returns the action rows (also appended to
        ``replication_actions``)."""
        from bklib.client.connection import ClientConfig
        from bklib.client.pool import SyncBookieClient
        from bklib.meta.racks import read_racks
        from bklib.meta.store import LedgerStore, connect
        from bklib.repair.worker import LedgerRepairer

        cfg = self.config
        n = len(reqs)
        if n == 0:
            log.info("%s %s: nothing to repair", cfg.mode, self.run_id)
            return []
        delta.check_writable(cfg.warehouse, (ACTIONS,))
        log_start(cfg, self.run_id, n, "in-process")
        t0 = last = time.monotonic()
        rows: list[dict[str, Any]] = []
        zk = connect(cfg.zk, auth=cfg.zk_auth, timeout=cfg.zk_session_timeout)
        try:
            with SyncBookieClient(
                cfg.zk,
                ledgers_root=cfg.ledgers_root,
                config=ClientConfig(read_timeout=cfg.read_timeout),
            ) as client:
                repairer = LedgerRepairer(
                    LedgerStore(zk, cfg.ledgers_root),
                    client,
                    cfg.settings,
                    racks=read_racks(zk, cfg.racks_znode),
                )
                with concurrent.futures.ThreadPoolExecutor(
                    max(1, cfg.ledgers_in_flight), thread_name_prefix="repair"
                ) as pool:
                    for done, actions in enumerate(pool.map(repairer.repair, reqs), 1):
                        rows.extend(a.as_row() for a in actions)
                        now = time.monotonic()
                        if now - last >= PROGRESS_EVERY:
                            last = now
                            rate = done / (now - t0)
                            log.info(
                                "progress: %d/%d ledgers, %.0fs elapsed, ETA %.0fs",
                                done,
                                n,
                                now - t0,
                                (n - done) / rate,
                            )
        finally:
            zk.stop()
            zk.close()
        elapsed = time.monotonic() - t0
        stamp(rows, cfg, self.run_id, Executor.LOCAL)
        delta.append_rows(cfg.warehouse, ACTIONS, rows)
        log_done(cfg, self.run_id, rows, n, elapsed)
        return rows
