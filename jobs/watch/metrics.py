"""Prometheus metrics of ``bkaudit watch`` (prometheus_client renders them; the endpoint that
serves them is :mod:`jobs.watch.http_server`'s)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from bklib.audit.checks import replication_names
from bklib.states import ActionKind, ActionStatus, BookieState
from jobs.watch.decide import SEVERITY_ORDER

__all__ = ["WatchMetrics"]

log = logging.getLogger("jobs.watch")

REPAIR_BUCKETS = (5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 21600, 86400)
"""Seconds from a bookie's loss to no ledger naming it: from seconds (delay 0) to a day."""


class WatchMetrics:
    """Every metric the watch exports, in a registry of its own."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.ur_ledgers = Gauge(
            "bkaudit_underreplicated_ledgers",
            "Under-replicated ledgers in the latest audit of each check, by worst severity",
            ["check", "severity"],
            registry=r,
        )
        self.ur_fragments = Gauge(
            "bkaudit_underreplicated_fragments",
            "Under-replicated fragments in the latest audit of each check, by severity",
            ["check", "severity"],
            registry=r,
        )
        self.marks = Gauge(
            "bkaudit_underreplication_marks",
            "Ledgers with a BookKeeper under-replication mark now",
            registry=r,
        )
        self.bookies = Gauge(
            "bkaudit_bookies",
            "Bookies by state (lost: gone, not yet repaired)",
            ["state"],
            registry=r,
        )
        self.copied_bytes = Counter(
            "bkaudit_copied_bytes", "Bytes copied by finished COPY actions", registry=r
        )
        self.copied_entries = Counter(
            "bkaudit_copied_entries", "Entries copied by finished COPY actions", registry=r
        )
        self.actions = Counter(
            "bkaudit_repair_actions",
            "Repair actions by kind and status",
            ["action", "status"],
            registry=r,
        )
        self.time_to_repair = Histogram(
            "bkaudit_time_to_repair_seconds",
            "From a bookie's loss being seen to no ledger naming it",
            buckets=REPAIR_BUCKETS,
            registry=r,
        )
        self.last_audit = Gauge(
            "bkaudit_last_audit_timestamp_seconds",
            "Unix time the latest audit of each check finished",
            ["check"],
            registry=r,
        )
        self.audits = Counter(
            "bkaudit_audit_runs",
            "Audit runs started by this instance",
            ["check", "status"],
            registry=r,
        )
        self.leader = Gauge(
            "bkaudit_watch_leader", "1 while this instance leads, 0 on standby", registry=r
        )
        self.paused = Gauge(
            "bkaudit_repair_paused", "1 while underreplication/disable exists", registry=r
        )
        self.delay = Gauge(
            "bkaudit_lost_bookie_recovery_delay_seconds",
            "The lostBookieRecoveryDelay in force",
            registry=r,
        )
        self.warehouse_errors = Counter(
            "bkaudit_warehouse_errors", "Failed reads or writes of the Delta tables", registry=r
        )
        self.session_losses = Counter(
            "bkaudit_zk_session_losses", "ZooKeeper sessions lost (expired)", registry=r
        )
        self.spooled_files = Gauge(
            "bkaudit_spooled_files",
            "Failed table appends waiting in the spool (--spool-dir) to be written",
            registry=r,
        )
        self.spooled_rows = Gauge(
            "bkaudit_spooled_rows", "Table rows waiting in the spool to be written", registry=r
        )
        self.cycle_failures = Counter(
            "bkaudit_watch_cycle_failures",
            "Leader cycles that raised (an audit, a repair or a table step failed)",
            registry=r,
        )
        for s in BookieState.ALL:
            self.bookies.labels(s).set(0)
        for c in replication_names():
            for sev in SEVERITY_ORDER:
                self.ur_ledgers.labels(c, sev)
                self.ur_fragments.labels(c, sev)

    def set_findings(
        self, check: str, fragments: Mapping[str, int], ledgers: Mapping[str, int]
    ) -> None:
        for sev in SEVERITY_ORDER:
            self.ur_fragments.labels(check, sev).set(fragments.get(sev, 0))
            self.ur_ledgers.labels(check, sev).set(ledgers.get(sev, 0))

    def count_actions(self, rows: Iterable[Mapping[str, Any]]) -> None:
        for r in rows:
            self.actions.labels(r["action"], r["status"]).inc()
            if r["action"] == ActionKind.COPY and r["status"] == ActionStatus.DONE:
                self.copied_bytes.inc(int(r["bytes_copied"] or 0))
                self.copied_entries.inc(int(r["entries_copied"] or 0))

    def render(self) -> bytes:
        return generate_latest(self.registry)
