"""The report's data: the Delta tables read through delta-rs (no JVM), run through the
queries of :mod:`jobs.reports.queries` into small Python lists (:class:`ReportData`), which
:mod:`jobs.reports.page` renders. Only the columns and partitions the page shows are read
(docs/operations.md); the long history (every repair action, the charted runs' fragments) is
counted in Arrow by :mod:`jobs.reports.arrow_queries`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from bklib.states import ActionKind, PulsarFinding
from jobs.reports import arrow_queries
from jobs.reports.pulsar import latest_pulsar_check, orphans_per_namespace
from jobs.reports.queries import (
    DEFAULT_RUNS,
    SEVERITIES,
    STUCK_STATUSES,
    Row,
    affected_topics,
    choose_bucket_seconds,
    findings_with_repair_status,
    fragments_per_bookie,
    latest_blast_radius,
    latest_triage,
    recent_runs,
    stuck_ledgers,
    worst_findings,
)
from jobs.tables import delta
from jobs.tables.schema import (
    ACTIONS,
    AUDIT_RUNS,
    BLAST_RADIUS,
    FRAGMENTS,
    PULSAR_CHECKS,
    PULSAR_REFERENCES,
    TRIAGE,
)

DEFAULT_MAX_FINDINGS = 5000
"""Findings table rows; a large incident has far more fragments than a page can show."""
DEFAULT_TITLE = "BookKeeper under-replication report"

_FINDING_COLUMNS_READ = (
    "run_id",
    "ledger_id",
    "segment_first_entry_id",
    "segment_last_entry_id",
    "bookie_id",
    "reason",
    "missing_entries",
    "min_replicas",
    "severity",
    "ledger_state",
    "first_detected_at",
    "topic",
)
"""Fragment columns the page uses; missing_ranges and the rest stay on disk."""
_ACTION_COLUMNS_READ = (
    "run_id",
    "ledger_id",
    "segment_first_entry_id",
    "old_bookie",
    "action",
    "status",
    "error",
    "no_replica_entries",
    "entries_copied",
    "bytes_copied",
    "started_at",
    "finished_at",
)


@dataclass
class ReportData:
    """Everything the page shows, as small Python values."""

    warehouse: str
    run: dict[str, Any]
    generated_at: datetime
    per_bookie: list[dict[str, Any]] = field(default_factory=list)
    over_runs: list[dict[str, Any]] = field(default_factory=list)
    throughput: list[dict[str, Any]] = field(default_factory=list)
    bucket_seconds: int = 60
    findings: list[dict[str, Any]] = field(default_factory=list)
    findings_total: int = 0
    stuck: list[dict[str, Any]] = field(default_factory=list)
    has_actions: bool = False
    title: str = DEFAULT_TITLE
    topics: list[dict[str, Any]] = field(default_factory=list)
    blast: list[dict[str, Any]] = field(default_factory=list)
    triage: list[dict[str, Any]] = field(default_factory=list)
    pulsar_check: dict[str, Any] | None = None
    """The latest ``audit --check pulsar`` run (``pulsar_checks``), if any."""
    pulsar_namespaces: list[dict[str, Any]] = field(default_factory=list)
    pulsar_dangling: list[dict[str, Any]] = field(default_factory=list)


def collect_report_data(
    warehouse: str,
    *,
    run_id: str | None = None,
    runs: int = DEFAULT_RUNS,
    title: str = DEFAULT_TITLE,
    max_findings: int = DEFAULT_MAX_FINDINGS,
) -> ReportData | None:
    """Read the tables through delta-rs and run the report's queries; None when the
    warehouse has no such completed run."""
    run = delta.latest_run(warehouse, run_id)
    if run is None:
        return None
    data = ReportData(warehouse, run, datetime.now(timezone.utc), title=title)
    # Actions and past fragments stay Arrow (jobs.reports.arrow_queries): a month of audits
    # and repairs at a million ledgers is millions of rows; only what the page shows is Python.
    repairs = None
    if delta.table_exists(warehouse, ACTIONS):
        table = delta.read_arrow(warehouse, ACTIONS, columns=_ACTION_COLUMNS_READ)
        not_repairs = pa.array(sorted(ActionKind.NOT_LEDGER_REPAIRS), pa.string())
        repairs = table.filter(pc.invert(pc.is_in(table.column("action"), not_repairs)))
        data.has_actions = True
    if delta.table_exists(warehouse, FRAGMENTS):
        latest = delta.run_fragments(warehouse, run, columns=_FINDING_COLUMNS_READ)
        data.per_bookie = fragments_per_bookie(latest)
        history = delta.read_rows(
            warehouse, AUDIT_RUNS, columns=["run_id", "started_at", "check", "status"]
        )
        # Only the charted runs' partitions are read.
        charted = [r["run_id"] for r in recent_runs(history, runs)]
        columns = ["run_id", "ledger_id", "severity"]
        if charted:
            wanted = [("run_id", "in", charted)]
            frags = delta.read_arrow(warehouse, FRAGMENTS, columns=columns, filters=wanted)
        else:
            frags = pa.table({c: pa.array([], pa.string()) for c in columns})
        data.over_runs = arrow_queries.severity_over_runs(history, frags, runs)
        data.findings_total = len(latest)
        data.topics = affected_topics(latest)
        # Worst first, so a truncated table still shows what matters.
        shown = worst_findings(latest, max_findings)
        data.findings = findings_with_repair_status(
            shown, _repairs_of(repairs, shown, run["started_at"]), run["started_at"]
        )
    else:
        data.over_runs = [
            {**run, **dict.fromkeys((*SEVERITIES, "fragments", "underreplicated_ledgers"), 0)}
        ]
    if delta.table_exists(warehouse, BLAST_RADIUS):
        data.blast = latest_blast_radius(delta.read_rows(warehouse, BLAST_RADIUS))
    if delta.table_exists(warehouse, TRIAGE):
        data.triage = latest_triage(delta.read_rows(warehouse, TRIAGE))
    if delta.table_exists(warehouse, PULSAR_CHECKS):
        refs = (
            delta.read_rows(warehouse, PULSAR_REFERENCES)
            if delta.table_exists(warehouse, PULSAR_REFERENCES)
            else []
        )
        check, findings = latest_pulsar_check(delta.read_rows(warehouse, PULSAR_CHECKS), refs)
        data.pulsar_check = check
        data.pulsar_namespaces = orphans_per_namespace(findings)
        data.pulsar_dangling = [f for f in findings if f["kind"] == PulsarFinding.DANGLING]
    if repairs is not None:
        span = arrow_queries.finished_span_seconds(repairs)
        data.bucket_seconds = choose_bucket_seconds(float(span))
        data.throughput = arrow_queries.repair_throughput(repairs, data.bucket_seconds)
        latest_each = arrow_queries.latest_action_per_ledger(repairs)
        stuck = pa.array(STUCK_STATUSES, pa.string())
        data.stuck = stuck_ledgers(
            delta.arrow_rows(latest_each.filter(pc.is_in(latest_each.column("status"), stuck)))
        )
    return data


def _repairs_of(
    repairs: pa.Table | None, findings: Sequence[Mapping[str, Any]], since: datetime
) -> list[Row] | None:
    """The repair actions :func:`findings_with_repair_status` weighs for ``findings``: those
    of their ledgers that started at ``since`` or later (repair_status ignores the rest)."""
    if repairs is None:
        return None
    ids = pa.array(sorted({f["ledger_id"] for f in findings}), pa.int64())
    mine = repairs.filter(pc.is_in(repairs.column("ledger_id"), ids))
    return delta.arrow_rows(mine.filter(pc.greater_equal(mine.column("started_at"), since)))
