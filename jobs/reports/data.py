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

from bklib.audit.checks.registry import replication_names
from bklib.states import ActionKind, PulsarFinding
from jobs.reports import arrow_queries, incident
from jobs.reports.pulsar import latest_pulsar_check, orphans_per_namespace
from jobs.reports.queries import (
    DEFAULT_RUNS,
    SEVERITIES,
    STUCK_STATUSES,
    UNKNOWN_SEVERITY,
    Row,
    affected_topics,
    choose_bucket_seconds,
    finding_order,
    findings_with_repair_status,
    fragments_per_bookie,
    latest_blast_radius,
    latest_run_per_check,
    latest_triage,
    merge_run_findings,
    recent_runs,
    run_recency,
    stuck_ledgers,
    unfinished_after,
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
    "check",
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
    "mode",
    "ledger_id",
    "segment_first_entry_id",
    "old_bookie",
    "new_bookie",
    "topic",
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
    """The newest of :attr:`runs_shown` (the header's run)."""
    generated_at: datetime
    per_bookie: list[dict[str, Any]] = field(default_factory=list)
    over_runs: list[dict[str, Any]] = field(default_factory=list)
    throughput: list[dict[str, Any]] = field(default_factory=list)
    bucket_seconds: int = 60
    findings: list[dict[str, Any]] = field(default_factory=list)
    findings_total: int = 0
    ledgers_total: int = 0
    """Distinct ledgers of every finding shown (also when the table is truncated)."""
    missing_total: int = 0
    stuck: list[dict[str, Any]] = field(default_factory=list)
    has_actions: bool = False
    title: str = DEFAULT_TITLE
    topics: list[dict[str, Any]] = field(default_factory=list)
    blast: list[dict[str, Any]] = field(default_factory=list)
    blast_ran: bool = False
    triage: list[dict[str, Any]] = field(default_factory=list)
    triage_ran: bool = False
    pulsar_check: dict[str, Any] | None = None
    """The latest ``audit --check pulsar`` run (``pulsar_checks``), if any."""
    pulsar_namespaces: list[dict[str, Any]] = field(default_factory=list)
    pulsar_dangling: list[dict[str, Any]] = field(default_factory=list)
    runs_shown: list[dict[str, Any]] = field(default_factory=list)
    """Each check's latest finished audit run (or the ``--run-id`` run alone)."""
    checks_not_run: list[str] = field(default_factory=list)
    runs_unfinished: list[dict[str, Any]] = field(default_factory=list)
    """Audit runs newer than the shown ones that did not finish (their findings unknown)."""
    """Audit checks with no finished run: shown as not run, not as clean."""
    bookies: list[dict[str, Any]] = field(default_factory=list)
    losses: list[dict[str, Any]] = field(default_factory=list)
    repair_runs: list[dict[str, Any]] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    manual: list[dict[str, Any]] = field(default_factory=list)


def _shown_runs(
    warehouse: str, history: list[Row], run_id: str | None
) -> list[dict[str, Any]] | None:
    """Each check's latest finished run, or the run ``run_id`` alone; None when none."""
    if run_id is not None:
        run = delta.latest_run(warehouse, run_id)
        return None if run is None else [run]
    shown = latest_run_per_check(history, replication_names())
    for r in shown:
        r["counts"] = dict(r["counts"] or {})
    return shown or None


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
    history = delta.read_rows(warehouse, AUDIT_RUNS)
    shown = _shown_runs(warehouse, history, run_id)
    if shown is None:
        return None
    run = max(shown, key=run_recency)
    data = ReportData(warehouse, run, datetime.now(timezone.utc), title=title, runs_shown=shown)
    if run_id is None:
        data.checks_not_run = [
            c for c in replication_names() if c not in {r["check"] for r in shown}
        ]
        data.runs_unfinished = unfinished_after(history, shown)
    # Actions and past fragments stay Arrow (jobs.reports.arrow_queries): a month of audits
    # and repairs at a million ledgers is millions of rows; only what the page shows is Python.
    repairs = None
    dry_runs: set[str] = set()
    if delta.table_exists(warehouse, ACTIONS):
        table = delta.read_arrow(warehouse, ACTIONS, columns=_ACTION_COLUMNS_READ)
        not_repairs = pa.array(sorted(ActionKind.NOT_LEDGER_REPAIRS), pa.string())
        repairs = table.filter(pc.invert(pc.is_in(table.column("action"), not_repairs)))
        data.has_actions = True
        dry_runs = incident.dry_runs_of(table)
        data.repair_runs = incident.read_repair_runs(table)
        data.failures = incident.read_failures(repairs, dry_runs)
        data.manual = incident.read_manual_steps(table)
    latest: list[Row] = []
    if delta.table_exists(warehouse, FRAGMENTS):
        found = [
            f
            for r in shown
            for f in delta.run_fragments(warehouse, r, columns=_FINDING_COLUMNS_READ)
        ]
        latest = merge_run_findings(shown, found)
        data.per_bookie = fragments_per_bookie(latest)
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
        data.ledgers_total = len({f["ledger_id"] for f in latest})
        data.missing_total = sum(int(f["missing_entries"] or 0) for f in latest)
        data.topics = affected_topics(latest)
        # Worst first, so a truncated table still shows what matters.
        data.findings = _with_repair_status(
            worst_findings(latest, max_findings), shown, repairs, dry_runs
        )
    else:
        zeros = dict.fromkeys(
            (*SEVERITIES, UNKNOWN_SEVERITY, "fragments", "underreplicated_ledgers"), 0
        )
        data.over_runs = [{**r, **zeros} for r in sorted(shown, key=run_recency)]
    data.bookies = incident.read_bookie_states(warehouse, history, {r["run_id"] for r in shown})
    lost_now = incident.lost_bookies(data.bookies, latest)
    data.losses = incident.read_losses(warehouse, repairs, lost_now, data.generated_at)
    if delta.table_exists(warehouse, BLAST_RADIUS):
        data.blast_ran = True
        data.blast = latest_blast_radius(delta.read_rows(warehouse, BLAST_RADIUS))
    if delta.table_exists(warehouse, TRIAGE):
        data.triage_ran = True
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
        for s in data.stuck:
            s["dry_run"] = s["run_id"] in dry_runs
    return data


def _with_repair_status(
    findings: Sequence[Mapping[str, Any]],
    runs: Sequence[Mapping[str, Any]],
    repairs: pa.Table | None,
    dry_runs: set[str],
) -> list[Row]:
    """``findings`` (of several runs) with what the repairs since each one's own audit left
    their ledger in (:func:`findings_with_repair_status`), worst first; ``repair_dry_run``
    says the deciding run was a dry run (one decides only a ledger no real run touched)."""
    out: list[Row] = []
    for r in runs:
        mine = [f for f in findings if f["run_id"] == r["run_id"]]
        if mine:
            since = r["started_at"]
            out += findings_with_repair_status(mine, _repairs_of(repairs, mine, since), since)
    for f in out:
        f["repair_dry_run"] = f["repair_run_id"] in dry_runs
    return sorted(out, key=finding_order)


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
