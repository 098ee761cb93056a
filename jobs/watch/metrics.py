"""Prometheus metrics of ``bkaudit watch`` (prometheus_client renders them; the endpoint that
serves them is :mod:`jobs.watch.http_server`'s). docs/watch.md lists them and
docs/monitoring.md the rules and panels that read them (deploy/monitoring)."""

from __future__ import annotations

import logging
import time
import weakref
from collections import Counter as Tally
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from bklib.audit.checks import replication_names
from bklib.audit.index_keeper import RebuildCause
from bklib.audit.model import Finding
from bklib.meta.stores.zookeeper.budget import RequestBudget, request_budget
from bklib.states import ActionKind, ActionStatus, BookieState, CountKey, Reason
from bklib.version import __version__
from jobs.watch.decide import SEVERITY_ORDER

__all__ = ["WatchMetrics"]

log = logging.getLogger("jobs.watch")

REPAIR_BUCKETS = (5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 21600, 86400)
"""Seconds from a bookie's loss to no ledger naming it: from seconds (delay 0) to a day."""


REACTION_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600)
"""Seconds from a loss to its marks or first copy: the goals are seconds, a rescan is minutes."""


REACTION_STAGES = ("marked", "first_copy")


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
        self.unknown_fragments = Gauge(
            "bkaudit_unknown_fragments",
            "Fragments whose replicas the latest audit of each check could not learn (a bookie "
            "did not answer: BOOKIE_UNREACHABLE); in no severity of "
            "bkaudit_underreplicated_fragments, since unknown is neither present nor missing",
            ["check"],
            registry=r,
        )
        self.unread_ledgers = Gauge(
            "bkaudit_unread_ledgers",
            "Ledgers the latest audit of each check could not read (unreadable znodes, ledgers "
            "the scan could not account for): their replication is unknown",
            ["check"],
            registry=r,
        )
        self.bookie_fragments = Gauge(
            "bkaudit_bookie_underreplicated_fragments",
            "Under-replicated fragments the latest audit of each check found on each bookie, "
            "by reason (BOOKIE_UNREACHABLE: the bookie did not answer)",
            ["check", "bookie", "reason"],
            registry=r,
        )
        self.lost_since = Gauge(
            "bkaudit_lost_bookie_since_timestamp_seconds",
            "Unix time each lost bookie (gone, still named by ledgers) was first seen gone",
            ["bookie"],
            registry=r,
        )
        self.audit_interval = Gauge(
            "bkaudit_audit_interval_seconds",
            "The watch's schedule (--every): seconds between periodic audits of each check",
            ["check"],
            registry=r,
        )
        # The bookie index (docs/watch.md, "The index").
        self.full_scans = Counter(
            "bkaudit_metadata_scans",
            "Audits that read every ledger's metadata (take-overs, index rebuilds, the "
            "schedule's); a loss answered from the bookie index is not one",
            registry=r,
        )
        self.index_ledgers = Gauge(
            "bkaudit_index_ledgers", "Ledgers the bookie index holds", registry=r
        )
        self.index_bookies = Gauge(
            "bkaudit_index_bookies", "Bookies the ledgers of the bookie index name", registry=r
        )
        self.index_age = Gauge(
            "bkaudit_index_age_seconds",
            "Seconds since the bookie index last heard of a change (or was built)",
            registry=r,
        )
        self.index_stale = Gauge(
            "bkaudit_index_stale",
            "1 while the bookie index may not answer (a gap, or not built): losses are "
            "answered by a full scan, which rebuilds it",
            registry=r,
        )
        self.index_rebuilds = Counter(
            "bkaudit_index_rebuilds",
            "Builds of the bookie index from a full scan, by cause",
            ["cause"],
            registry=r,
        )
        self.index_changes = Counter(
            "bkaudit_index_changes_read",
            "Ledgers read again after the change feed announced them",
            registry=r,
        )
        self.index_differences = Counter(
            "bkaudit_index_differences",
            "Ledgers on which a reconciliation scan found the index wrong (each one a bug)",
            registry=r,
        )
        self.reaction = Histogram(
            "bkaudit_loss_reaction_seconds",
            "From a lost bookie's registration going to its ledgers marked (stage=marked) "
            "and to the first fragment copied (stage=first_copy)",
            ["stage"],
            buckets=REACTION_BUCKETS,
            registry=r,
        )
        self.start_time = Gauge(
            "bkaudit_watch_start_time_seconds",
            "Unix time this instance started (an audit is overdue from here when none "
            "ever finished)",
            registry=r,
        )
        self.start_time.set(time.time())
        Gauge(
            "bkaudit_build_info", "The bkaudit version this instance runs", ["version"], registry=r
        ).labels(__version__).set(1)
        r.register(ZooKeeperBudgetCollector())
        self._bookie_series: dict[str, set[tuple[str, str]]] = {}
        for s in BookieState.ALL:
            self.bookies.labels(s).set(0)
        for c in replication_names():
            for sev in SEVERITY_ORDER:
                self.ur_ledgers.labels(c, sev)
                self.ur_fragments.labels(c, sev)
        for cause in RebuildCause.ALL:
            self.index_rebuilds.labels(cause)
        for stage in REACTION_STAGES:
            self.reaction.labels(stage)
        self.index_stale.set(1)

    def set_findings(
        self, check: str, fragments: Mapping[str, int], ledgers: Mapping[str, int]
    ) -> None:
        for sev in SEVERITY_ORDER:
            self.ur_fragments.labels(check, sev).set(fragments.get(sev, 0))
            self.ur_ledgers.labels(check, sev).set(ledgers.get(sev, 0))

    def set_unknown(
        self, check: str, findings: Iterable[Finding], counts: Mapping[str, int]
    ) -> None:
        """What the latest audit of ``check`` could not learn, and its findings per bookie.

        The counts are the run's own (both halves of a split scan), the figures behind its
        COMPLETED_WITH_ERRORS (:func:`bklib.audit.completeness.shortfall`)."""
        self.unknown_fragments.labels(check).set(
            counts.get(CountKey.reason(Reason.BOOKIE_UNREACHABLE), 0)
        )
        self.unread_ledgers.labels(check).set(
            counts.get(CountKey.METADATA_ERRORS, 0) + counts.get(CountKey.LEDGERS_UNACCOUNTED, 0)
        )
        per_bookie = Tally(
            (f.bookie_id, f.reason) for f in findings if f.reason != Reason.PLACEMENT_VIOLATION
        )
        # A bookie the latest audit no longer names drops out, rather than keep a stale count.
        for bookie, reason in self._bookie_series.get(check, set()) - set(per_bookie):
            self.bookie_fragments.remove(check, bookie, reason)
        for (bookie, reason), n in per_bookie.items():
            self.bookie_fragments.labels(check, bookie, reason).set(n)
        self._bookie_series[check] = set(per_bookie)

    def set_lost(self, since: Mapping[str, float], now: float) -> None:
        """The lost bookies (pending the delay or due) and when each was first seen gone:
        ``since`` and ``now`` are the cycle's monotonic seconds, exported as Unix time."""
        wall = time.time()
        self.lost_since.clear()
        for bookie, t0 in since.items():
            self.lost_since.labels(bookie).set(wall - (now - t0))

    def set_schedule(self, every: Mapping[str, float]) -> None:
        """The periodic audits (--every): a check is overdue after twice its interval."""
        for check, seconds in every.items():
            self.audit_interval.labels(check).set(seconds)

    def count_actions(self, rows: Iterable[Mapping[str, Any]]) -> None:
        for r in rows:
            self.actions.labels(r["action"], r["status"]).inc()
            if r["action"] == ActionKind.COPY and r["status"] == ActionStatus.DONE:
                self.copied_bytes.inc(int(r["bytes_copied"] or 0))
                self.copied_entries.inc(int(r["entries_copied"] or 0))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class ZooKeeperBudgetCollector(Collector):
    """This process's ZooKeeper request budget (``--zk-rate``,
    :mod:`bklib.meta.stores.zookeeper.budget`), read at each scrape.

    An audit swaps in a share of the budget for its duration (``shared_budget``) and adds
    the share's requests back to the whole when it ends; a scrape meanwhile counts the whole
    as it was plus the share, so the counters neither drop nor count twice. A budget replaced
    for good (``set_request_rate``) has its last figures kept as a base."""

    def __init__(self) -> None:
        # The budget in force when the watch starts is the whole (no audit has begun yet).
        self._whole: weakref.ref[RequestBudget] | None = weakref.ref(request_budget())
        self._base = (0, 0.0)
        self._last = (0, 0.0)
        self._reported = (0.0, 0.0)

    def _figures(self) -> tuple[RequestBudget, float, float]:
        now = request_budget()
        whole = self._whole() if self._whole is not None else None
        if whole is None or now is whole:
            if whole is None and self._whole is not None:  # replaced: keep what it counted
                self._base = (self._base[0] + self._last[0], self._base[1] + self._last[1])
            self._whole = weakref.ref(now)
            self._last = (now.requests, now.waited)
            extra: tuple[int, float] = (0, 0.0)
            limit = now
        else:  # inside a shared_budget block: the whole is alive, its share in force
            self._last = (whole.requests, whole.waited)
            extra = (now.requests, now.waited)
            limit = whole
        requests = self._base[0] + self._last[0] + extra[0]
        waited = self._base[1] + self._last[1] + extra[1]
        # Counters never go down (a refund, a budget replaced between two scrapes).
        self._reported = (max(self._reported[0], requests), max(self._reported[1], waited))
        return limit, *self._reported

    def collect(self) -> Iterator[Metric]:
        budget, requests, waited = self._figures()
        yield CounterMetricFamily(
            "bkaudit_zk_requests",
            "ZooKeeper requests granted by this process's budget (--zk-rate)",
            value=requests,
        )
        yield CounterMetricFamily(
            "bkaudit_zk_request_wait_seconds",
            "Seconds this process's ZooKeeper requests waited for the budget",
            value=waited,
        )
        yield GaugeMetricFamily(
            "bkaudit_zk_request_rate_limit",
            "This process's ZooKeeper budget, requests/s (--zk-rate; +Inf: unlimited)",
            value=budget.rate if budget.rate is not None else float("inf"),
        )
