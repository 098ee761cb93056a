"""``bkaudit report``: one self-contained HTML page about under-replication and repair.

    bkaudit report --warehouse PATH --out report.html [--run-id R] [--runs 30]

The page has three charts (under-replicated fragments per bookie by severity, findings per
severity over the recent audit runs, repair throughput over time), the ledgers whose repair is
stuck (WAITING_GRACE or NO_REPLICA) and the findings table of the latest completed audit run.
CSS and SVG are inline and there is no script, so the file can be mailed or attached to a
ticket and opens offline.

Three layers, kept apart so each is tested on its own:

* queries: plain-Python functions over rows of the Delta tables (dicts keyed by column, as
  :func:`jobs.tables.delta.read_rows` or a collected Spark DataFrame gives them; also used by
  ``notebooks/underreplication.ipynb``);
* :func:`collect_report_data`: reads the tables through delta-rs (no JVM) and runs the
  queries into small Python lists (:class:`ReportData`);
* rendering: pure functions from those lists to SVG and HTML strings.

Exit status: 0 when the page was written, 2 on error (no warehouse, no completed run).
"""

from __future__ import annotations

import argparse
import heapq
import html
import logging
import math
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bklib.states import ActionKind, ActionStatus, CountKey, PulsarFinding, RunStatus, Severity
from jobs.cli.config import parse_with_config
from jobs.reports.pulsar import latest_pulsar_check, orphans_per_namespace
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

log = logging.getLogger("jobs.reports.html")

Row = dict[str, Any]

SEVERITIES = Severity.ALL
UNKNOWN_SEVERITY = "UNKNOWN"
"""Chart label for fragments without a severity (their replica count is unknown)."""
SEVERITY_COLORS = {
    Severity.NO_REPLICA: "#b91c1c",
    Severity.BELOW_AQ: "#ea580c",
    Severity.BELOW_WQ: "#ca8a04",
}
STUCK_STATUSES = (ActionStatus.WAITING_GRACE, ActionStatus.NO_REPLICA)
DEFAULT_RUNS = 30
DEFAULT_MAX_FINDINGS = 5000
"""Findings table rows; a large incident has far more fragments than a page can show."""
DEFAULT_TITLE = "BookKeeper under-replication report"

REPORT_EPILOG = """examples:
  bkaudit report --warehouse /data/bkaudit --out report.html
  bkaudit report --warehouse s3a://ops/bkaudit --out /tmp/r.html --runs 90
  bkaudit report --warehouse /data/bkaudit --run-id 20260101T000000Z-1a2b3c4d --out old.html
  python -m jobs.reports.html --warehouse /data/bkaudit --out report.html
"""

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


# ---- queries (rows -> rows) -------------------------------------------------------------------


def _epoch_seconds(ts: datetime) -> float:
    """Seconds since the epoch. A naive timestamp is local time, as pyspark's ``collect``
    gives it; delta-rs gives UTC-aware ones."""
    return ts.timestamp()


def _from_epoch(seconds: int, like: datetime) -> datetime:
    """``seconds`` as a timestamp of the same kind as ``like``: UTC-aware, or naive local
    time (what pyspark's ``collect`` of ``timestamp_seconds`` gives)."""
    if like.tzinfo is not None:
        return datetime.fromtimestamp(seconds, tz=timezone.utc)
    return datetime.fromtimestamp(seconds)


def _distinct_count(values: Iterable[Any]) -> int:
    """count(DISTINCT x): nulls are not counted."""
    return len({v for v in values if v is not None})


def fragments_per_bookie(fragments: Iterable[Mapping[str, Any]]) -> list[Row]:
    """Per missing bookie and severity: fragments, distinct ledgers and missing entries.

    Keys: bookie_id, severity, fragments, ledgers, missing_entries; sorted by bookie_id,
    severity. Fragments without a severity (the replica count is unknown) count as severity
    ``UNKNOWN``.
    """
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for f in fragments:
        key = (f["bookie_id"], f["severity"] or UNKNOWN_SEVERITY)
        groups.setdefault(key, []).append(f)
    return [
        {
            "bookie_id": bookie,
            "severity": sev,
            "fragments": len(rows),
            "ledgers": _distinct_count(r["ledger_id"] for r in rows),
            "missing_entries": sum(r["missing_entries"] or 0 for r in rows),
        }
        for (bookie, sev), rows in sorted(groups.items())
    ]


def recent_runs(runs: Iterable[Mapping[str, Any]], limit: int = DEFAULT_RUNS) -> list[Row]:
    """The latest ``limit`` finished audit runs (COMPLETED or COMPLETED_WITH_ERRORS), newest
    first: run_id, started_at, check, status."""
    finished = [r for r in runs if r["status"] in RunStatus.FINISHED]
    newest = heapq.nlargest(max(limit, 0), finished, key=lambda r: r["started_at"])
    return [{k: r[k] for k in ("run_id", "started_at", "check", "status")} for r in newest]


def severity_over_runs(
    runs: Iterable[Mapping[str, Any]],
    fragments: Iterable[Mapping[str, Any]],
    limit: int = DEFAULT_RUNS,
) -> list[Row]:
    """Fragments per severity in each of the latest ``limit`` completed audit runs, oldest
    first. Runs without findings are kept (with zeros), so a repair shows as a drop to 0.
    ``fragments`` is read once and may be a generator over many runs.

    Keys: run_id, started_at, check, status, NO_REPLICA, BELOW_AQ, BELOW_WQ, fragments,
    underreplicated_ledgers.
    """
    recent = recent_runs(runs, limit)
    per_sev = {r["run_id"]: dict.fromkeys(SEVERITIES, 0) for r in recent}
    total = dict.fromkeys(per_sev, 0)
    ledgers: dict[str, set[int]] = {run_id: set() for run_id in per_sev}
    for f in fragments:
        counts = per_sev.get(f["run_id"])
        if counts is None:  # an older run, or one that did not finish
            continue
        if f["severity"] in counts:
            counts[f["severity"]] += 1
        total[f["run_id"]] += 1
        if f["ledger_id"] is not None:
            ledgers[f["run_id"]].add(f["ledger_id"])
    return [
        {
            **r,
            **per_sev[r["run_id"]],
            "fragments": total[r["run_id"]],
            "underreplicated_ledgers": len(ledgers[r["run_id"]]),
        }
        for r in reversed(recent)
    ]


def choose_bucket_seconds(span_seconds: float) -> int:
    """Throughput bucket width for a time span: minutes up to 2 h, hours up to 7 days, else
    days (keeps the chart to at most ~170 columns)."""
    if span_seconds <= 2 * 3600:
        return 60
    if span_seconds <= 7 * 86400:
        return 3600
    return 86400


def finished_span_seconds(actions: Iterable[Mapping[str, Any]]) -> int:
    """Whole seconds between the first and the last ``finished_at`` of ``actions`` (0 when
    fewer than two actions finished): what :func:`choose_bucket_seconds` takes."""
    secs = [math.floor(_epoch_seconds(a["finished_at"])) for a in actions if a["finished_at"]]
    return max(secs) - min(secs) if secs else 0


def repair_throughput(actions: Iterable[Mapping[str, Any]], bucket_seconds: int) -> list[Row]:
    """Entries and bytes copied by finished COPY actions per time bucket (by finished_at).

    Keys: bucket_start (timestamp, UTC-aware when the input is), copies, entries_copied,
    bytes_copied, bytes_per_second; oldest bucket first.
    """
    buckets: dict[int, Row] = {}
    for a in actions:
        done = a["finished_at"]
        if a["action"] != ActionKind.COPY or a["status"] != ActionStatus.DONE or done is None:
            continue
        # Whole seconds first, as Spark's unix_timestamp does, then down to the bucket.
        start = math.floor(_epoch_seconds(done)) // bucket_seconds * bucket_seconds
        b = buckets.get(start)
        if b is None:
            b = buckets[start] = {
                "bucket_start": _from_epoch(start, done),
                "copies": 0,
                "entries_copied": 0,
                "bytes_copied": 0,
            }
        b["copies"] += 1
        b["entries_copied"] += a["entries_copied"] or 0
        b["bytes_copied"] += a["bytes_copied"] or 0
    out = [buckets[k] for k in sorted(buckets)]
    for b in out:
        b["bytes_per_second"] = b["bytes_copied"] / float(bucket_seconds)
    return out


def _recency(a: Mapping[str, Any]) -> tuple[Any, Any]:
    return (a["finished_at"] or a["started_at"], a["started_at"])


def _latest(
    actions: Iterable[Mapping[str, Any]], key: Callable[[Mapping[str, Any]], Any]
) -> dict[Any, Mapping[str, Any]]:
    """Per ``key``, the most recent action: latest coalesce(finished_at, started_at), then
    latest started_at (the first one seen wins a full tie)."""
    best: dict[Any, Mapping[str, Any]] = {}
    for a in actions:
        k = key(a)
        cur = best.get(k)
        if cur is None or _recency(a) > _recency(cur):
            best[k] = a
    return best


def latest_ledger_status(actions: Iterable[Mapping[str, Any]]) -> list[Row]:
    """Each ledger's most recent repair action, by ledger_id: ledger_id, run_id, action,
    status, error, no_replica_entries, since (when that action started), finished_at."""
    latest = _latest(actions, lambda a: a["ledger_id"])
    return [
        {
            "ledger_id": a["ledger_id"],
            "run_id": a["run_id"],
            "action": a["action"],
            "status": a["status"],
            "error": a["error"],
            "no_replica_entries": a["no_replica_entries"],
            "since": a["started_at"],
            "finished_at": a["finished_at"],
        }
        for _, a in sorted(latest.items())
    ]


def stuck_ledgers(actions: Iterable[Mapping[str, Any]]) -> list[Row]:
    """Ledgers whose latest repair action is WAITING_GRACE (open, grace period not over) or
    NO_REPLICA (entries that exist nowhere): what an operator has to look at by hand.
    Same keys as :func:`latest_ledger_status`, sorted by status, ledger_id."""
    rows = [r for r in latest_ledger_status(actions) if r["status"] in STUCK_STATUSES]
    return sorted(rows, key=lambda r: (r["status"], r["ledger_id"]))


def findings_with_repair_status(
    fragments: Iterable[Mapping[str, Any]],
    actions: Iterable[Mapping[str, Any]] | None,
    since: Any = None,
) -> list[Row]:
    """One run's fragments with what the repair runs started after ``since`` (the audit's
    start) left their ledger in: ``repair_status`` and ``repair_error`` by the rule
    ``listunderreplicated`` uses (:func:`jobs.commands.listing.repair_status`), so both
    reports say the same of every finding."""
    from jobs.commands.listing import REPAIRED, repair_status

    if actions is None:
        return [{**f, "repair_status": None, "repair_error": None} for f in fragments]
    repairs = repair_status([dict(a) for a in actions], since)
    out = []
    for f in fragments:
        status, last = repairs.get(f["ledger_id"], (None, {}))
        error = last.get("error") if status not in (None, REPAIRED) else None
        out.append({**f, "repair_status": status, "repair_error": error})
    return out


def time_to_repair(
    fragments: Iterable[Mapping[str, Any]], actions: Iterable[Mapping[str, Any]]
) -> list[Row]:
    """For every fragment ever found (ledger, segment, bookie): when it was first detected,
    when its repair finished (the DONE METADATA_UPDATE that swapped the bookie out, else the
    last DONE COPY), and the hours in between (None while unrepaired).

    Keys: ledger_id, segment_first_entry_id, bookie_id, first_detected_at, repaired_at,
    hours_to_repair; sorted by the first three.
    """
    found: dict[tuple[Any, Any, Any], Any] = {}
    for f in fragments:
        k = (f["ledger_id"], f["segment_first_entry_id"], f["bookie_id"])
        first, cur = f["first_detected_at"], found.get(k)
        found[k] = first if cur is None or (first is not None and first < cur) else cur
    swapped: dict[tuple[Any, Any, Any], datetime] = {}  # first DONE METADATA_UPDATE
    last_done: dict[tuple[Any, Any, Any], datetime] = {}  # last DONE COPY or METADATA_UPDATE
    repairs = (ActionKind.METADATA_UPDATE, ActionKind.COPY)
    for a in actions:
        done = a["finished_at"]
        if (
            a["status"] != ActionStatus.DONE
            or a["action"] not in repairs
            or a["old_bookie"] is None
            or done is None
        ):
            continue
        k = (a["ledger_id"], a["segment_first_entry_id"], a["old_bookie"])
        if a["action"] == ActionKind.METADATA_UPDATE and (k not in swapped or done < swapped[k]):
            swapped[k] = done
        if k not in last_done or done > last_done[k]:
            last_done[k] = done
    out = []
    for k in sorted(found):
        repaired = swapped.get(k, last_done.get(k))
        first = found[k]
        hours = None
        if repaired is not None and first is not None:
            hours = (_epoch_seconds(repaired) - _epoch_seconds(first)) / 3600
        out.append(
            {
                "ledger_id": k[0],
                "segment_first_entry_id": k[1],
                "bookie_id": k[2],
                "first_detected_at": first,
                "repaired_at": repaired,
                "hours_to_repair": hours,
            }
        )
    return out


def severity_rank(finding: Mapping[str, Any]) -> int:
    """Sort key putting the worst severity first (no severity last)."""
    return Severity.ORDER.get(finding["severity"], len(Severity.ORDER))


def worst_findings(findings: Iterable[Mapping[str, Any]], limit: int) -> list[Mapping[str, Any]]:
    """The ``limit`` worst findings: by severity, then ledger, segment and bookie."""
    return heapq.nsmallest(
        max(limit, 0),
        findings,
        key=lambda f: (
            severity_rank(f),
            f["ledger_id"],
            f["segment_first_entry_id"],
            f["bookie_id"],
        ),
    )


# ---- collected data ---------------------------------------------------------------------------


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


def affected_topics(fragments: Iterable[Mapping[str, Any]]) -> list[Row]:
    """Per Pulsar topic of the fragments: ledgers, fragments and worst severity, worst first
    (fragments of ledgers without a topic are left out)."""
    acc: dict[str, dict[str, Any]] = {}
    for f in fragments:
        topic = f.get("topic")
        if not topic:
            continue
        t = acc.setdefault(topic, {"topic": topic, "ledgers": set(), "fragments": 0, "rank": 9})
        t["ledgers"].add(f["ledger_id"])
        t["fragments"] += 1
        t["rank"] = min(t["rank"], Severity.ORDER.get(f.get("severity") or "", 9))
    out = [
        {
            "topic": t["topic"],
            "ledgers": len(t["ledgers"]),
            "fragments": t["fragments"],
            "worst": next((k for k, v in Severity.ORDER.items() if v == t["rank"]), None),
        }
        for t in acc.values()
    ]
    return sorted(out, key=lambda t: (Severity.ORDER.get(t["worst"] or "", 9), -t["ledgers"]))


def latest_blast_radius(rows: Iterable[Mapping[str, Any]], limit: int = 10) -> list[Row]:
    """The riskiest bookies and racks of the latest ``blast_radius`` run (``limit`` of each):
    most entries lost, then ledgers lost, ledgers below AQ, writers blocked."""
    rows = list(rows)
    if not rows:
        return []
    latest = max(rows, key=lambda r: r["computed_at"])["run_id"]
    mine = [dict(r) for r in rows if r["run_id"] == latest]

    def risk(r: Mapping[str, Any]) -> tuple[int, ...]:
        keys = ("entries_lost", "ledgers_lost", "ledgers_below_aq", "writers_blocked")
        return tuple(-int(r.get(k) or 0) for k in keys)

    out: list[Row] = []
    for scope in ("bookie", "rack"):
        out += sorted((r for r in mine if r["scope"] == scope), key=risk)[:limit]
    return out


def latest_triage(rows: Iterable[Mapping[str, Any]]) -> list[Row]:
    """The rows of the latest ``triage`` run, by class then ledger."""
    rows = list(rows)
    if not rows:
        return []
    latest = max(rows, key=lambda r: r["triaged_at"])["run_id"]
    return sorted(
        (dict(r) for r in rows if r["run_id"] == latest),
        key=lambda r: (r["class"], r["ledger_id"]),
    )


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


# ---- rendering (pure) -----------------------------------------------------------------------

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;
color:#1f2937;background:#f8fafc}
h1{font-size:22px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 8px}
.meta{color:#6b7280;margin-bottom:16px}
.cards{display:flex;gap:12px;flex-wrap:wrap}
.card{background:#fff;border:1px solid #e5e7eb;border-radius:8px;padding:10px 14px;min-width:130px}
.card b{display:block;font-size:20px}.card span{color:#6b7280;font-size:12px}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(460px,1fr));gap:16px}
figure{background:#fff;border:1px solid #e5e7eb;border-radius:8px;margin:0;padding:12px}
figcaption{font-weight:600;margin-bottom:6px}
.legend span{display:inline-block;margin-right:12px;font-size:12px}
.legend i{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:-1px}
.empty{color:#6b7280;font-style:italic;padding:20px 0}
table{border-collapse:collapse;width:100%;background:#fff;font-size:13px}
th,td{border-bottom:1px solid #e5e7eb;padding:5px 8px;text-align:left;white-space:nowrap}
th{background:#f1f5f9;position:sticky;top:0}td.num{text-align:right}
.sev{font-weight:600;color:#fff;padding:1px 6px;border-radius:4px;font-size:12px}
.ok{color:#15803d}.bad{color:#b91c1c}
svg text{font:11px system-ui,sans-serif;fill:#374151}
"""


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _fmt_ts(value: Any) -> str:
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return "" if value is None else str(value)


def human_bytes(n: float) -> str:
    """``1536`` -> ``1.5 KiB``."""
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    i = 0
    while abs(n) >= 1024 and i < len(units) - 1:
        n /= 1024
        i += 1
    return f"{n:.0f} {units[i]}" if i == 0 else f"{n:.1f} {units[i]}"


def nice_max(value: float) -> float:
    """The smallest 1/2/5 x 10^k at or above ``value`` (axis top); 1 for 0."""
    if value <= 0:
        return 1.0
    exp = 10 ** math.floor(math.log10(value))
    for m in (1, 2, 5, 10):
        if m * exp >= value:
            return float(m * exp)
    return float(10 * exp)


def nice_bytes_max(value: float) -> float:
    """:func:`nice_max` in the binary unit of ``value``, so byte axes read 0, 10, 20 KiB."""
    scale = 1.0
    while value / scale >= 1024:
        scale *= 1024
    return nice_max(value / scale) * scale


def axis_ticks(top: float) -> list[float]:
    """Tick values from 0 to ``top`` (a :func:`nice_max` value): steps of 1, 2 or 5 x 10^k, so
    a count axis reads 0, 1, 2 ... rather than 1.25, 2.5 ..."""
    lead = round(top / 10 ** math.floor(math.log10(top)))
    if lead not in (1, 2, 5):  # a binary-scaled top (nice_bytes_max): use its unit's digits
        unit = 1024 ** math.floor(math.log(top, 1024))
        lead = round(top / unit / 10 ** math.floor(math.log10(top / unit)))
    n = 4 if lead == 2 else 5
    return [top * k / n for k in range(n + 1)]


def _legend(series: Sequence[str], colors: dict[str, str]) -> str:
    items = "".join(f'<span><i style="background:{colors[s]}"></i>{_e(s)}</span>' for s in series)
    return f'<div class="legend">{items}</div>'


def svg_hbar_chart(
    chart_id: str,
    rows: Sequence[tuple[str, dict[str, float]]],
    series: Sequence[str],
    colors: dict[str, str],
    unit: str = "",
    empty: str = "nothing to show",
) -> str:
    """Horizontal stacked bars, one per label. Each bar segment is a ``rect`` carrying
    ``data-label``, ``data-series`` and ``data-value``; a ``title`` gives the tooltip."""
    if not rows:
        return f'<div class="empty" data-chart="{_e(chart_id)}">{_e(empty)}</div>'
    left, width, bar, gap = 170, 620, 26, 10
    top = nice_max(max(sum(v.values()) for _, v in rows))
    height = len(rows) * (bar + gap) + 30
    out = [
        f'<svg class="chart" data-chart="{_e(chart_id)}" viewBox="0 0 {left + width + 20} '
        f'{height}" width="100%" role="img">'
    ]
    for i, (label, values) in enumerate(rows):
        y = i * (bar + gap) + 4
        out.append(f'<text x="{left - 6}" y="{y + 13}" text-anchor="end">{_e(label)}</text>')
        x = float(left)
        for s in series:
            v = float(values.get(s, 0))
            if v <= 0:
                continue
            w = width * v / top
            out.append(
                f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{bar}" fill="{colors[s]}" '
                f'data-label="{_e(label)}" data-series="{_e(s)}" data-value="{v:g}">'
                f"<title>{_e(label)}: {v:g} {_e(s)} {_e(unit)}</title></rect>"
            )
            x += w
        out.append(f'<text x="{x + 4:.1f}" y="{y + 13}">{sum(values.values()):g}</text>')
    axis_y = len(rows) * (bar + gap) + 4
    out.append(
        f'<line x1="{left}" y1="{axis_y}" x2="{left + width}" y2="{axis_y}" stroke="#9ca3af"/>'
    )
    for t in axis_ticks(top):
        x = left + width * t / top
        out.append(f'<text x="{x:.1f}" y="{axis_y + 16}" text-anchor="middle">{t:g}</text>')
    out.append("</svg>")
    return "".join(out)


def svg_column_chart(
    chart_id: str,
    columns: Sequence[tuple[str, str, dict[str, float]]],
    series: Sequence[str],
    colors: dict[str, str],
    value_format: Any = None,
    top_of: Any = None,
) -> str:
    """Vertical stacked columns over time: ``(key, x label, {series: value})`` per column.
    Every column gets a ``g`` with ``data-key``; segments are ``rect`` with ``data-series``
    and ``data-value`` (zero-height columns still carry their data)."""
    if not columns:
        return f'<div class="empty" data-chart="{_e(chart_id)}">nothing to show</div>'
    fmt = value_format or (lambda v: f"{v:g}")
    left, width, height, bottom = 64, 700, 220, 50
    top = (top_of or nice_max)(max(sum(v.values()) for _, _, v in columns))
    step = width / len(columns)
    bar = max(2.0, min(40.0, step * 0.7))
    out = [
        f'<svg class="chart" data-chart="{_e(chart_id)}" viewBox="0 0 {left + width + 10} '
        f'{height + bottom}" width="100%" role="img">'
    ]
    for t in axis_ticks(top):
        y = height - height * t / top + 6
        out.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{left + width}" y2="{y:.1f}" stroke="#e5e7eb"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{_e(fmt(t))}</text>'
        )
    label_every = max(1, math.ceil(len(columns) / 10))
    for i, (key, label, values) in enumerate(columns):
        x = left + i * step + (step - bar) / 2
        y = height + 6.0
        total = sum(values.values())
        out.append(f'<g data-key="{_e(key)}" data-total="{total:g}">')
        for s in series:
            v = float(values.get(s, 0))
            h = height * v / top
            y -= h
            out.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{h:.1f}" '
                f'fill="{colors[s]}" data-series="{_e(s)}" data-value="{v:g}">'
                f"<title>{_e(label)}: {_e(fmt(v))} {_e(s)}</title></rect>"
            )
        out.append("</g>")
        if i % label_every == 0:
            out.append(
                f'<text x="{x + bar / 2:.1f}" y="{height + 22}" text-anchor="middle">'
                f"{_e(label)}</text>"
            )
    out.append(
        f'<line x1="{left}" y1="{height + 6}" x2="{left + width}" y2="{height + 6}" '
        'stroke="#9ca3af"/></svg>'
    )
    return "".join(out)


def _short_time(ts: Any, bucket_seconds: int = 60) -> str:
    if not isinstance(ts, datetime):
        return str(ts)
    return ts.strftime("%m-%d" if bucket_seconds >= 86400 else "%m-%d %H:%M")


def _sev_badge(sev: Any) -> str:
    if not sev:
        return ""
    color = SEVERITY_COLORS.get(str(sev), "#6b7280")
    return f'<span class="sev" style="background:{color}">{_e(sev)}</span>'


_FINDING_COLUMNS = (
    ("ledger_id", "ledger", True),
    ("segment", "segment", False),
    ("bookie_id", "missing replica", False),
    ("reason", "reason", False),
    ("missing_entries", "missing entries", True),
    ("min_replicas", "min replicas", True),
    ("severity", "severity", False),
    ("ledger_state", "ledger state", False),
    ("first_detected_at", "first detected (UTC)", False),
    ("repair_status", "repair status", False),
)


def render_findings_table(findings: Sequence[dict[str, Any]]) -> str:
    """The latest run's findings as ``table#findings``; one ``tr`` per fragment carrying
    ``data-ledger-id``, ``data-bookie-id`` and ``data-severity``."""
    if not findings:
        return '<p class="empty ok" id="findings-empty">No under-replicated fragments.</p>'
    head = "".join(f"<th>{_e(h)}</th>" for _, h, _ in _FINDING_COLUMNS)
    body = []
    for f in findings:
        last = f.get("segment_last_entry_id")
        cells = {
            **f,
            "segment": f"[{f.get('segment_first_entry_id')}, {'open' if last is None else last}]",
            "first_detected_at": _fmt_ts(f.get("first_detected_at")),
        }
        tds = []
        for key, _, numeric in _FINDING_COLUMNS:
            if key == "severity":
                tds.append(f"<td>{_sev_badge(f.get('severity'))}</td>")
            elif key == "repair_status" and f.get("repair_error"):
                tds.append(f'<td title="{_e(f["repair_error"])}">{_e(f.get("repair_status"))}</td>')
            else:
                cls = ' class="num"' if numeric else ""
                tds.append(f"<td{cls}>{_e(cells.get(key))}</td>")
        body.append(
            f'<tr data-ledger-id="{_e(f["ledger_id"])}" data-bookie-id="{_e(f["bookie_id"])}" '
            f'data-severity="{_e(f.get("severity"))}">{"".join(tds)}</tr>'
        )
    return (
        f'<table id="findings"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'
    )


def render_stuck_table(stuck: Sequence[dict[str, Any]], has_actions: bool) -> str:
    """Ledgers stuck in WAITING_GRACE or NO_REPLICA as ``table#stuck``."""
    if not has_actions:
        return '<p class="empty" id="stuck-empty">No repair run recorded yet.</p>'
    if not stuck:
        return '<p class="empty ok" id="stuck-empty">No ledger is stuck.</p>'
    rows = []
    for s in stuck:
        entries = s.get("no_replica_entries") or []
        shown = ", ".join(map(str, entries[:10])) + (" ..." if len(entries) > 10 else "")
        rows.append(
            f'<tr data-ledger-id="{_e(s["ledger_id"])}" data-status="{_e(s["status"])}">'
            f'<td class="num">{_e(s["ledger_id"])}</td><td>{_e(s["status"])}</td>'
            f"<td>{_e(s.get('action'))}</td><td>{_e(_fmt_ts(s.get('since')))}</td>"
            f"<td>{_e(shown)}</td><td>{_e(s.get('error'))}</td><td>{_e(s.get('run_id'))}</td></tr>"
        )
    head = "".join(
        f"<th>{h}</th>"
        for h in ("ledger", "status", "action", "since (UTC)", "entries with no replica", "error")
    )
    return (
        f'<table id="stuck"><thead><tr>{head}<th>repair run</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _table(tid: str, head: Sequence[str], rows: Sequence[Sequence[Any]], empty: str) -> str:
    if not rows:
        return f'<p class="empty ok" id="{tid}-empty">{_e(empty)}</p>'
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{_e(v)}</td>" for v in r) + "</tr>" for r in rows)
    return f'<table id="{tid}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def render_risk_sections(data: ReportData) -> str:
    """Blast radius (riskiest bookies and racks), affected topics, triage."""
    head = ("name", "bookies", "ledgers", "below AQ", "ledgers lost", "entries lost",
            "writers blocked", "topics")  # fmt: skip

    def blast(scope: str) -> list[list[Any]]:
        return [
            [
                r["name"],
                r["bookies"],
                r["ledgers"],
                r["ledgers_below_aq"],
                r["ledgers_lost"],
                r["entries_lost"],
                r["writers_blocked"],
                len(r.get("topics") or []),
            ]
            for r in data.blast
            if r["scope"] == scope
        ]

    no_blast = "No blastradius run recorded yet (bkaudit blastradius)."
    topics = [[t["topic"], t["ledgers"], t["fragments"], t["worst"]] for t in data.topics]
    triage = [
        [
            r["ledger_id"],
            r["class"],
            r.get("topic"),
            r.get("age_seconds"),
            r.get("lost_entries"),
            r.get("detail"),
            r.get("repair_status"),
        ]
        for r in data.triage
    ]
    return (
        "<h2>Riskiest bookies (blast radius if each failed alone)</h2>"
        + _table("blast-bookies", head, blast("bookie"), no_blast)
        + "<h2>Riskiest racks</h2>"
        + _table("blast-racks", head, blast("rack"), no_blast)
        + "<h2>Affected topics (latest run)</h2>"
        + _table(
            "topics",
            ("topic", "ledgers", "fragments", "worst severity"),
            topics,
            "No under-replicated ledger carries Pulsar topic metadata.",
        )
        + "<h2>Unrecoverable ledgers (triage)</h2>"
        + _table(
            "triage",
            ("ledger", "class", "topic", "age (s)", "entries lost", "detail", "repair status"),
            triage,
            "No triage run recorded, or nothing to triage (bkaudit triage).",
        )
        + render_pulsar_section(data)
    )


def render_pulsar_section(data: ReportData) -> str:
    """Pulsar's metadata against BookKeeper's: orphan bytes per namespace, dangling refs."""
    check = data.pulsar_check
    if check is None:
        return (
            "<h2>Pulsar metadata</h2>"
            '<p class="empty" id="pulsar-empty">No Pulsar cross-check recorded '
            "(bkaudit audit --check pulsar).</p>"
        )
    when = check["started_at"]
    orphans = [[r["namespace"], r["orphans"], r["bytes"]] for r in data.pulsar_namespaces]
    dangling = [
        [r["ledger_id"], r.get("topic"), r.get("component"), r.get("key")]
        for r in data.pulsar_dangling
    ]
    return (
        f"<h2>Pulsar metadata (check {_e(check['run_id'])}, {_e(_fmt_ts(when))})</h2>"
        + "<h3>Orphan ledgers per namespace</h3>"
        + _table(
            "pulsar-orphans",
            ("namespace", "orphan ledgers", "bytes"),
            orphans,
            "No orphan ledgers.",
        )
        + "<h3>Dangling references (topics whose reads fail)</h3>"
        + _table(
            "pulsar-dangling",
            ("ledger", "topic", "component", "key"),
            dangling,
            "No dangling references.",
        )
    )


def render_html(data: ReportData) -> str:
    """The whole page for ``data``."""
    run = data.run
    counts = run.get("counts") or {}
    sev_series = [s for s in SEVERITIES]
    colors = {**SEVERITY_COLORS, UNKNOWN_SEVERITY: "#6b7280"}
    bookies: dict[str, dict[str, float]] = {}
    for r in data.per_bookie:
        bookies.setdefault(r["bookie_id"], {})[r["severity"]] = float(r["fragments"])
    if any(r["severity"] == UNKNOWN_SEVERITY for r in data.per_bookie):
        sev_series.append(UNKNOWN_SEVERITY)
    per_bookie = sorted(bookies.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))
    chart_bookies = svg_hbar_chart(
        "fragments-per-bookie",
        per_bookie,
        sev_series,
        colors,
        empty="No under-replicated fragments in this run.",
    )
    chart_runs = svg_column_chart(
        "severity-over-runs",
        [
            (r["run_id"], _short_time(r["started_at"]), {s: float(r[s]) for s in SEVERITIES})
            for r in data.over_runs
        ],
        SEVERITIES,
        SEVERITY_COLORS,
    )
    if data.has_actions:
        chart_repair = svg_column_chart(
            "repair-throughput",
            [
                (
                    _fmt_ts(r["bucket_start"]),
                    _short_time(r["bucket_start"], data.bucket_seconds),
                    {"bytes copied": float(r["bytes_copied"] or 0)},
                )
                for r in data.throughput
            ],
            ["bytes copied"],
            {"bytes copied": "#2563eb"},
            value_format=human_bytes,
            top_of=nice_bytes_max,
        )
    else:
        chart_repair = (
            '<div class="empty" data-chart="repair-throughput">No repair run recorded yet.</div>'
        )
    total_copied = sum(int(r["bytes_copied"] or 0) for r in data.throughput)
    total_entries = sum(int(r["entries_copied"] or 0) for r in data.throughput)
    # The run's own counts cover every fragment, also when the table below is truncated.
    total = max(data.findings_total, len(data.findings))
    ledgers_bad = counts.get(
        CountKey.UNDERREPLICATED_LEDGERS, len({f["ledger_id"] for f in data.findings})
    )
    missing = counts.get(
        CountKey.MISSING_ENTRIES, sum(int(f.get("missing_entries") or 0) for f in data.findings)
    )
    present = {r["severity"] for r in data.per_bookie} | {f.get("severity") for f in data.findings}
    worst = next((s for s in SEVERITIES if s in present), "")
    cards = [
        ("ledgers scanned", counts.get(CountKey.LEDGERS, "")),
        ("under-replicated ledgers", ledgers_bad),
        ("fragments", total),
        ("missing entries", missing),
        ("worst severity", worst or "none"),
        ("stuck ledgers", len(data.stuck)),
        ("copied (all repair runs)", f"{human_bytes(total_copied)} / {total_entries} entries"),
    ]
    cards_html = "".join(
        f'<div class="card"><b class="{"bad" if (k == "worst severity" and worst) else ""}">'
        f"{_e(v)}</b><span>{_e(k)}</span></div>"
        for k, v in cards
    )
    shown_note = (
        f'<p class="meta" id="findings-truncated">Showing the {len(data.findings)} worst of '
        f"{total} fragments; <code>bkaudit listunderreplicated</code> lists them all.</p>"
        if total > len(data.findings)
        else ""
    )
    bucket = {60: "minute", 3600: "hour", 86400: "day"}.get(
        data.bucket_seconds, f"{data.bucket_seconds}s"
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_e(data.title)}</title><style>{_CSS}</style></head>
<body>
<h1>{_e(data.title)}</h1>
<div class="meta">audit run <code id="run-id">{_e(run["run_id"])}</code>
 · check {_e(run.get("check"))} · {_e(run.get("status"))}
 · finished {_e(_fmt_ts(run.get("finished_at")))} UTC · zk {_e(run.get("zk"))}
 · warehouse {_e(data.warehouse)} · generated {_e(_fmt_ts(data.generated_at))} UTC</div>
<div class="cards">{cards_html}</div>
<div class="grid">
<figure id="fig-bookies"><figcaption>Under-replicated fragments per missing bookie
 (latest run)</figcaption>{_legend(sev_series, colors)}{chart_bookies}</figure>
<figure id="fig-runs"><figcaption>Fragments by severity over the last {len(data.over_runs)}
 audit runs</figcaption>{_legend(SEVERITIES, SEVERITY_COLORS)}{chart_runs}</figure>
<figure id="fig-repair"><figcaption>Repair throughput: bytes copied per {bucket}
</figcaption>{chart_repair}</figure>
</div>
<h2>Ledgers stuck in WAITING_GRACE or NO_REPLICA</h2>
{render_stuck_table(data.stuck, data.has_actions)}
{render_risk_sections(data)}
<h2>Findings of run {_e(run["run_id"])}</h2>
{shown_note}{render_findings_table(data.findings)}
</body></html>
"""


# ---- command line -----------------------------------------------------------------------------


def add_report_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the report flags to ``parser`` (shared by ``bkaudit report`` and :func:`main`)."""
    parser.add_argument("--warehouse", required=True, help="directory or URI of the Delta tables")
    parser.add_argument("--out", default="report.html", help="HTML file to write")
    parser.add_argument(
        "--run-id", default=None, help="findings of this audit run (default: latest completed)"
    )
    parser.add_argument(
        "--runs", type=int, default=DEFAULT_RUNS, help="audit runs in the severity chart"
    )
    parser.add_argument(
        "--max-findings",
        type=int,
        default=DEFAULT_MAX_FINDINGS,
        help="rows of the findings table, worst severity first",
    )
    parser.add_argument("--title", default=DEFAULT_TITLE, help="page title")
    return parser


def _one_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message (delta-rs errors span many)."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return first or type(exc).__name__


def run_report(args: argparse.Namespace, spark: Any = None) -> int:
    """Write the report from parsed arguments; 0 when written, 2 on error (one line on
    stderr). ``spark`` is accepted for older callers and ignored: the tables are read
    through delta-rs."""
    del spark
    try:
        data = collect_report_data(
            args.warehouse,
            run_id=args.run_id,
            runs=args.runs,
            title=args.title,
            max_findings=args.max_findings,
        )
        if data is None:
            what = f"audit run {args.run_id}" if args.run_id else "completed audit run"
            print(f"report: no {what} in {args.warehouse}", file=sys.stderr)
            return 2
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(render_html(data), encoding="utf-8")
    except Exception as exc:  # TableProtocolError, unreadable tables, unwritable --out
        log.debug("report failed", exc_info=True)
        print(f"report: {_one_line(exc)}", file=sys.stderr)
        return 2
    print(
        f"report of run {data.run['run_id']}: {len(data.findings)} fragments, "
        f"{len(data.stuck)} stuck ledgers -> {out}"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m jobs.reports.html ...`` entry point."""
    parser = add_report_arguments(
        argparse.ArgumentParser(
            prog="html_report",
            description="Write a self-contained HTML report from the Delta tables.",
            epilog=REPORT_EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )
    args = parse_with_config(parser, "report", argv)  # conf/bkaudit.yaml and BKAUDIT_* env
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return run_report(args)


if __name__ == "__main__":
    sys.exit(main())
