"""The report's data: the Delta tables read through delta-rs (no JVM), run through the
queries of :mod:`jobs.reports.queries` into small Python lists (:class:`ReportData`), which
:mod:`jobs.reports.page` renders. Only the columns and partitions the page shows are read
(docs/operations.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from bklib.states import ActionKind, PulsarFinding
from jobs.reports.pulsar import latest_pulsar_check, orphans_per_namespace
from jobs.reports.queries import (
    DEFAULT_RUNS,
    SEVERITIES,
    Row,
    affected_topics,
    choose_bucket_seconds,
    findings_with_repair_status,
    finished_span_seconds,
    fragments_per_bookie,
    latest_blast_radius,
    latest_triage,
    recent_runs,
    repair_throughput,
    severity_over_runs,
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


def _stream_rows(
    warehouse: str, name: str, columns: Sequence[str], filters: Sequence[tuple[str, str, Any]]
) -> Iterator[Row]:
    """Rows batch by batch, so a long history is never all Python dicts at once."""
    table = delta.read_arrow(warehouse, name, columns=columns, filters=filters)
    for batch in table.to_batches():
        yield from batch.to_pylist()


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
    actions = None
    if delta.table_exists(warehouse, ACTIONS):
        actions = [
            a
            for a in delta.read_rows(warehouse, ACTIONS, columns=_ACTION_COLUMNS_READ)
            if a["action"] not in ActionKind.NOT_LEDGER_REPAIRS
        ]
        data.has_actions = True
    if delta.table_exists(warehouse, FRAGMENTS):
        latest = delta.read_rows(
            warehouse,
            FRAGMENTS,
            columns=_FINDING_COLUMNS_READ,
            filters=[("run_id", "=", run["run_id"])],
        )
        data.per_bookie = fragments_per_bookie(latest)
        history = delta.read_rows(
            warehouse, AUDIT_RUNS, columns=["run_id", "started_at", "check", "status"]
        )
        # Only the charted runs' partitions are read.
        charted = [r["run_id"] for r in recent_runs(history, runs)]
        frags: Iterable[Row] = ()
        if charted:
            frags = _stream_rows(
                warehouse,
                FRAGMENTS,
                ["run_id", "ledger_id", "severity"],
                [("run_id", "in", charted)],
            )
        data.over_runs = severity_over_runs(history, frags, runs)
        data.findings_total = len(latest)
        data.topics = affected_topics(latest)
        # Worst first, so a truncated table still shows what matters.
        data.findings = findings_with_repair_status(
            worst_findings(latest, max_findings), actions, run["started_at"]
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
    if actions is not None:
        data.bucket_seconds = choose_bucket_seconds(float(finished_span_seconds(actions)))
        data.throughput = repair_throughput(actions, data.bucket_seconds)
        data.stuck = stuck_ledgers(actions)
    return data
