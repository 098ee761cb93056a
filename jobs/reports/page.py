"""The report's page: one self-contained HTML string from :class:`~jobs.reports.data.ReportData`,
pure. CSS and SVG (:mod:`jobs.reports.charts`) are inline and there is no script, so the
file can be mailed or attached to a ticket and opens offline (docs/operations.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from bklib.states import ActionStatus, CountKey, Severity
from jobs.reports.charts import esc, human_bytes, nice_bytes_max, svg_column_chart, svg_hbar_chart
from jobs.reports.data import ReportData
from jobs.reports.queries import SEVERITIES, UNKNOWN_SEVERITY
from jobs.reports.sections import CSS as SECTIONS_CSS
from jobs.reports.sections import DRY_RUN_BADGE, MANUAL_BADGE, render_incident_sections
from jobs.reports.text import fmt_ts, not_run

SEVERITY_COLORS = {
    Severity.NO_REPLICA: "#b91c1c",
    Severity.BELOW_AQ: "#ea580c",
    Severity.BELOW_WQ: "#ca8a04",
}
UNKNOWN_COLOR = "#6b7280"
"""Findings without a severity (a bookie that did not answer): neither present nor missing."""
ALL_COLORS = {**SEVERITY_COLORS, UNKNOWN_SEVERITY: UNKNOWN_COLOR}

_CSS = (
    """
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
    + SECTIONS_CSS
)


def _legend(series: Sequence[str], colors: dict[str, str]) -> str:
    items = "".join(f'<span><i style="background:{colors[s]}"></i>{esc(s)}</span>' for s in series)
    return f'<div class="legend">{items}</div>'


def _short_time(ts: Any, bucket_seconds: int = 60) -> str:
    if not isinstance(ts, datetime):
        return str(ts)
    return ts.strftime("%m-%d" if bucket_seconds >= 86400 else "%m-%d %H:%M")


def _sev_badge(sev: Any) -> str:
    sev = sev or UNKNOWN_SEVERITY
    color = SEVERITY_COLORS.get(str(sev), UNKNOWN_COLOR)
    return f'<span class="sev" style="background:{color}">{esc(sev)}</span>'


def _repair_cell(f: dict[str, Any]) -> str:
    """The repair status, a dry run's marked as one and a manual step as one."""
    status = f.get("repair_status")
    if status is None:
        return "<td></td>"
    dry = bool(f.get("repair_dry_run"))
    badge = ""
    if dry:
        badge = " " + DRY_RUN_BADGE
    elif status == ActionStatus.MANUAL:
        badge = " " + MANUAL_BADGE
    return f'<td data-dry-run="{str(dry).lower()}">{esc(status)}{badge}</td>'


_FINDING_COLUMNS = (
    ("ledger_id", "ledger", True),
    ("check", "found by", False),
    ("segment", "segment", False),
    ("bookie_id", "missing replica", False),
    ("reason", "reason", False),
    ("missing_entries", "missing entries", True),
    ("min_replicas", "min replicas", True),
    ("severity", "severity", False),
    ("ledger_state", "ledger state", False),
    ("first_detected_at", "first detected (UTC)", False),
    ("repair_status", "repair since the audit", False),
    ("repair_error", "repair error", False),
)


def render_findings_table(findings: Sequence[dict[str, Any]]) -> str:
    """The latest run's findings as ``table#findings``; one ``tr`` per fragment carrying
    ``data-ledger-id``, ``data-bookie-id`` and ``data-severity``."""
    if not findings:
        return '<p class="empty ok" id="findings-empty">No under-replicated fragments.</p>'
    head = "".join(f"<th>{esc(h)}</th>" for _, h, _ in _FINDING_COLUMNS)
    body = []
    for f in findings:
        last = f.get("segment_last_entry_id")
        cells = {
            **f,
            "segment": f"[{f.get('segment_first_entry_id')}, {'open' if last is None else last}]",
            "first_detected_at": fmt_ts(f.get("first_detected_at")),
        }
        tds = []
        for key, _, numeric in _FINDING_COLUMNS:
            if key == "severity":
                tds.append(f"<td>{_sev_badge(f.get('severity'))}</td>")
            elif key == "repair_status":
                tds.append(_repair_cell(f))
            elif key == "repair_error":
                tds.append(f'<td class="reason">{esc(f.get("repair_error"))}</td>')
            else:
                cls = ' class="num"' if numeric else ""
                tds.append(f"<td{cls}>{esc(cells.get(key))}</td>")
        body.append(
            f'<tr data-ledger-id="{esc(f["ledger_id"])}" data-bookie-id="{esc(f["bookie_id"])}" '
            f'data-severity="{esc(f.get("severity") or UNKNOWN_SEVERITY)}">{"".join(tds)}</tr>'
        )
    return (
        f'<table id="findings"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'
    )


def render_stuck_table(stuck: Sequence[dict[str, Any]], has_actions: bool) -> str:
    """Ledgers stuck in WAITING_GRACE or NO_REPLICA as ``table#stuck``."""
    if not has_actions:
        return not_run("stuck", "no repair run recorded")
    if not stuck:
        return '<p class="empty ok" id="stuck-empty">No ledger is stuck.</p>'
    rows = []
    for s in stuck:
        entries = s.get("no_replica_entries") or []
        shown = ", ".join(map(str, entries[:10])) + (" ..." if len(entries) > 10 else "")
        badge = f" {DRY_RUN_BADGE}" if s.get("dry_run") else ""
        rows.append(
            f'<tr data-ledger-id="{esc(s["ledger_id"])}" data-status="{esc(s["status"])}">'
            f'<td class="num">{esc(s["ledger_id"])}</td><td>{esc(s["status"])}{badge}</td>'
            f"<td>{esc(s.get('action'))}</td><td>{esc(fmt_ts(s.get('since')))}</td>"
            f"<td>{esc(shown)}</td><td>{esc(s.get('error'))}</td><td>{esc(s.get('run_id'))}</td></tr>"
        )
    head = "".join(
        f"<th>{h}</th>"
        for h in ("ledger", "status", "action", "since (UTC)", "entries with no replica", "error")
    )
    return (
        f'<table id="stuck"><thead><tr>{head}<th>repair run</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _table(
    tid: str, head: Sequence[str], rows: Sequence[Sequence[Any]], empty: str, ran: bool = True
) -> str:
    """A plain table; ``empty`` (green) when its job ran and found nothing, the neutral
    not-run note when it did not run."""
    if not ran:
        return not_run(tid, empty)
    if not rows:
        return f'<p class="empty ok" id="{tid}-empty">{esc(empty)}</p>'
    th = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{esc(v)}</td>" for v in r) + "</tr>" for r in rows)
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

    no_blast = (
        "no blastradius run recorded (bkaudit blastradius)"
        if not data.blast_ran
        else "No bookie or rack at risk."
    )
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
        + _table("blast-bookies", head, blast("bookie"), no_blast, data.blast_ran)
        + "<h2>Riskiest racks</h2>"
        + _table("blast-racks", head, blast("rack"), no_blast, data.blast_ran)
        + "<h2>Affected topics (runs shown)</h2>"
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
            "Nothing to triage." if data.triage_ran else "no triage run recorded (bkaudit triage)",
            data.triage_ran,
        )
        + render_pulsar_section(data)
    )


def render_pulsar_section(data: ReportData) -> str:
    """Pulsar's metadata against BookKeeper's: orphan bytes per namespace, dangling refs."""
    check = data.pulsar_check
    if check is None:
        return "<h2>Pulsar metadata</h2>" + not_run(
            "pulsar", "no Pulsar cross-check recorded (bkaudit audit --check pulsar)"
        )
    when = check["started_at"]
    orphans = [[r["namespace"], r["orphans"], r["bytes"]] for r in data.pulsar_namespaces]
    dangling = [
        [r["ledger_id"], r.get("topic"), r.get("component"), r.get("key")]
        for r in data.pulsar_dangling
    ]
    return (
        f"<h2>Pulsar metadata (check {esc(check['run_id'])}, {esc(fmt_ts(when))})</h2>"
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


def _worst_card(data: ReportData) -> tuple[str, bool]:
    """The worst severity found, and the findings of unknown severity beside it: a bookie
    that did not answer may hold the entries or not (fail closed: it is not "none")."""
    present = {r["severity"] for r in data.per_bookie} | {f.get("severity") for f in data.findings}
    worst = Severity.worst(present)
    unknown = sum(int(r["fragments"]) for r in data.per_bookie if r["severity"] == UNKNOWN_SEVERITY)
    if not unknown:
        return worst, worst != Severity.NONE
    if worst == Severity.NONE:
        return f"{UNKNOWN_SEVERITY} ({unknown})", True
    return f"{worst} + {unknown} {UNKNOWN_SEVERITY}", True


def _cards(data: ReportData) -> str:
    counts = data.run.get("counts") or {}
    total_copied = sum(int(r["bytes_copied"] or 0) for r in data.throughput)
    total_entries = sum(int(r["entries_copied"] or 0) for r in data.throughput)
    worst, bad = _worst_card(data)
    cards = [
        ("ledgers-scanned", "ledgers scanned (latest run)", counts.get(CountKey.LEDGERS, ""),
         False),
        ("underreplicated-ledgers", "under-replicated ledgers", data.ledgers_total, False),
        # Every fragment, also when the table below is truncated.
        ("fragments", "fragments", max(data.findings_total, len(data.findings)), False),
        ("missing-entries", "missing entries", data.missing_total, False),
        ("worst-severity", "worst severity", worst, bad),
        ("stuck-ledgers", "stuck ledgers", len(data.stuck), False),
        ("repair-failures", "failed repairs", len(data.failures), bool(data.failures)),
        ("copied", "copied (all repair runs)",
         f"{human_bytes(total_copied)} / {total_entries} entries", False),
    ]  # fmt: skip
    return "".join(
        f'<div class="card" data-card="{key}"><b class="{"bad" if is_bad else ""}">'
        f"{esc(v)}</b><span>{esc(label)}</span></div>"
        for key, label, v, is_bad in cards
    )


def render_html(data: ReportData) -> str:
    """The whole page for ``data``."""
    run = data.run
    bookies: dict[str, dict[str, float]] = {}
    for r in data.per_bookie:
        bookies.setdefault(r["bookie_id"], {})[r["severity"]] = float(r["fragments"])
    sev_series = [*SEVERITIES]
    if any(r["severity"] == UNKNOWN_SEVERITY for r in data.per_bookie):
        sev_series.append(UNKNOWN_SEVERITY)
    per_bookie = sorted(bookies.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))
    chart_bookies = svg_hbar_chart(
        "fragments-per-bookie",
        per_bookie,
        sev_series,
        ALL_COLORS,
        empty="No under-replicated fragments in the runs shown.",
    )
    run_series = [*SEVERITIES]
    if any(r.get(UNKNOWN_SEVERITY) for r in data.over_runs):
        run_series.append(UNKNOWN_SEVERITY)
    chart_runs = svg_column_chart(
        "severity-over-runs",
        [
            (
                r["run_id"],
                _short_time(r["started_at"]),
                {s: float(r.get(s) or 0) for s in run_series},
            )
            for r in data.over_runs
        ],
        run_series,
        ALL_COLORS,
    )
    if data.has_actions:
        chart_repair = svg_column_chart(
            "repair-throughput",
            [
                (
                    fmt_ts(r["bucket_start"]),
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
        chart_repair = not_run("repair-throughput", "no repair run recorded")
    shown_note = (
        f'<p class="meta" id="findings-truncated">Showing the {len(data.findings)} worst of '
        f"{data.findings_total} fragments; <code>bkaudit listunderreplicated</code> lists "
        "them all.</p>"
        if data.findings_total > len(data.findings)
        else ""
    )
    bucket = {60: "minute", 3600: "hour", 86400: "day"}.get(
        data.bucket_seconds, f"{data.bucket_seconds}s"
    )
    checks = ", ".join(f"{r['check']} {r['run_id']}" for r in data.runs_shown)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(data.title)}</title><style>{_CSS}</style></head>
<body>
<h1>{esc(data.title)}</h1>
<div class="meta">latest audit run <code id="run-id">{esc(run["run_id"])}</code>
 · check {esc(run.get("check"))} · {esc(run.get("status"))}
 · finished {esc(fmt_ts(run.get("finished_at")))} UTC · zk {esc(run.get("zk"))}
 · warehouse {esc(data.warehouse)} · generated <span id="generated-at"
 data-epoch="{data.generated_at.timestamp():.3f}">{esc(fmt_ts(data.generated_at))}</span> UTC</div>
<div class="cards">{_cards(data)}</div>
{render_incident_sections(data)}
<div class="grid">
<figure id="fig-bookies"><figcaption>Under-replicated fragments per missing bookie
 ({esc(checks)})</figcaption>{_legend(sev_series, ALL_COLORS)}{chart_bookies}</figure>
<figure id="fig-runs"><figcaption>Fragments by severity over the last {len(data.over_runs)}
 audit runs</figcaption>{_legend(run_series, ALL_COLORS)}{chart_runs}</figure>
<figure id="fig-repair"><figcaption>Repair throughput: bytes copied per {bucket}
</figcaption>{chart_repair}</figure>
</div>
<h2>Ledgers stuck in WAITING_GRACE or NO_REPLICA</h2>
{render_stuck_table(data.stuck, data.has_actions)}
{render_risk_sections(data)}
<h2>Findings of the runs shown</h2>
{shown_note}{render_findings_table(data.findings)}
</body></html>
"""
