"""``bkaudit report``: one self-contained HTML page about under-replication and repair.

    bkaudit report --warehouse PATH --out report.html [--run-id R] [--runs 30]
    spark-submit jobs/reports/html.py --warehouse PATH --out report.html

The page has three charts (under-replicated fragments per bookie by severity, findings per
severity over the recent audit runs, repair throughput over time), the ledgers whose repair is
stuck (WAITING_GRACE or NO_REPLICA) and the findings table of the latest completed audit run.
CSS and SVG are inline and there is no script, so the file can be mailed or attached to a
ticket and opens offline.

Three layers, kept apart so each is tested on its own:

* queries: DataFrame -> DataFrame transforms over the Delta tables (also used by
  ``notebooks/underreplication.ipynb``);
* :func:`collect_report_data`: runs them and collects small Python lists (:class:`ReportData`);
* rendering: pure functions from those lists to SVG and HTML strings.

Exit status: 0 when the page was written, 2 on error (no warehouse, no completed run).
"""

from __future__ import annotations

import argparse
import html
import logging
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `spark-submit jobs/reports/html.py`: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from jobs.cli.config import parse_with_config
from jobs.spark import load

log = logging.getLogger("jobs.reports.html")

SEVERITIES = ("NO_REPLICA", "BELOW_AQ", "BELOW_WQ")
SEVERITY_COLORS = {"NO_REPLICA": "#b91c1c", "BELOW_AQ": "#ea580c", "BELOW_WQ": "#ca8a04"}
STUCK_STATUSES = (load.ACTION_WAITING_GRACE, load.ACTION_NO_REPLICA)
DEFAULT_RUNS = 30
DEFAULT_MAX_FINDINGS = 5000
"""Findings table rows; a large incident has far more fragments than a page can show."""
DEFAULT_TITLE = "BookKeeper under-replication report"

REPORT_EPILOG = """examples:
  bkaudit report --warehouse /data/bkaudit --out report.html
  bkaudit report --warehouse s3a://ops/bkaudit --out /tmp/r.html --runs 90
  bkaudit report --warehouse /data/bkaudit --run-id 20260101T000000Z-1a2b3c4d --out old.html
  spark-submit jobs/reports/html.py --warehouse /data/bkaudit --out report.html
"""


# ---- queries (DataFrame -> DataFrame) -------------------------------------------------------


def fragments_per_bookie(fragments: DataFrame) -> DataFrame:
    """Per missing bookie and severity: fragments, distinct ledgers and missing entries.

    Columns: bookie_id, severity, fragments, ledgers, missing_entries. Fragments without a
    severity (the replica count is unknown) count as severity ``UNKNOWN``.
    """
    return (
        fragments.groupBy("bookie_id", F.coalesce("severity", F.lit("UNKNOWN")).alias("severity"))
        .agg(
            F.count(F.lit(1)).alias("fragments"),
            F.countDistinct("ledger_id").alias("ledgers"),
            F.coalesce(F.sum("missing_entries"), F.lit(0)).cast("long").alias("missing_entries"),
        )
        .orderBy("bookie_id", "severity")
    )


def severity_over_runs(
    runs: DataFrame, fragments: DataFrame, limit: int = DEFAULT_RUNS
) -> DataFrame:
    """Fragments per severity in each of the latest ``limit`` completed audit runs, oldest
    first. Runs without findings are kept (with zeros), so a repair shows as a drop to 0.

    Columns: run_id, started_at, check, status, NO_REPLICA, BELOW_AQ, BELOW_WQ, fragments,
    underreplicated_ledgers.
    """
    recent = (
        runs.filter(F.col("status").isin(*load.COMPLETED))
        .orderBy(F.col("started_at").desc())
        .limit(limit)
        .select("run_id", "started_at", "check", "status")
    )
    per_run = fragments.groupBy("run_id").agg(
        *[F.sum(F.when(F.col("severity") == s, 1).otherwise(0)).alias(s) for s in SEVERITIES],
        F.count(F.lit(1)).alias("fragments"),
        F.countDistinct("ledger_id").alias("underreplicated_ledgers"),
    )
    counts = [*SEVERITIES, "fragments", "underreplicated_ledgers"]
    return (
        recent.join(per_run, "run_id", "left")
        .select(
            "run_id",
            "started_at",
            "check",
            "status",
            *[F.coalesce(F.col(c), F.lit(0)).cast("long").alias(c) for c in counts],
        )
        .orderBy("started_at")
    )


def choose_bucket_seconds(span_seconds: float) -> int:
    """Throughput bucket width for a time span: minutes up to 2 h, hours up to 7 days, else
    days (keeps the chart to at most ~170 columns)."""
    if span_seconds <= 2 * 3600:
        return 60
    if span_seconds <= 7 * 86400:
        return 3600
    return 86400


def repair_throughput(actions: DataFrame, bucket_seconds: int) -> DataFrame:
    """Entries and bytes copied by finished COPY actions per time bucket (by finished_at).

    Columns: bucket_start (timestamp), copies, entries_copied, bytes_copied, bytes_per_second.
    """
    secs = F.unix_timestamp("finished_at")
    start = (F.floor(secs / bucket_seconds) * bucket_seconds).cast("long")
    return (
        actions.filter(
            (F.col("action") == load.ACTION_COPY)
            & (F.col("status") == load.ACTION_DONE)
            & F.col("finished_at").isNotNull()
        )
        .groupBy(F.timestamp_seconds(start).alias("bucket_start"))
        .agg(
            F.count(F.lit(1)).alias("copies"),
            F.sum("entries_copied").cast("long").alias("entries_copied"),
            F.sum("bytes_copied").cast("long").alias("bytes_copied"),
        )
        .withColumn("bytes_per_second", F.col("bytes_copied") / F.lit(float(bucket_seconds)))
        .orderBy("bucket_start")
    )


def _latest(df: DataFrame, keys: Sequence[str]) -> DataFrame:
    w = Window.partitionBy(*keys).orderBy(
        F.coalesce("finished_at", "started_at").desc(), F.col("started_at").desc()
    )
    return df.withColumn("_rank", F.row_number().over(w)).filter("_rank = 1").drop("_rank")


def latest_ledger_status(actions: DataFrame) -> DataFrame:
    """Each ledger's most recent repair action: ledger_id, run_id, action, status, error,
    no_replica_entries, since (when that action started), finished_at."""
    return _latest(actions, ["ledger_id"]).select(
        "ledger_id",
        "run_id",
        "action",
        "status",
        "error",
        "no_replica_entries",
        F.col("started_at").alias("since"),
        "finished_at",
    )


def stuck_ledgers(actions: DataFrame) -> DataFrame:
    """Ledgers whose latest repair action is WAITING_GRACE (open, grace period not over) or
    NO_REPLICA (entries that exist nowhere): what an operator has to look at by hand."""
    return (
        latest_ledger_status(actions)
        .filter(F.col("status").isin(*STUCK_STATUSES))
        .orderBy("status", "ledger_id")
    )


def findings_with_repair_status(fragments: DataFrame, actions: DataFrame | None) -> DataFrame:
    """One run's fragments with the latest repair action for the same fragment (ledger,
    segment, missing bookie), else for the ledger. Adds repair_status and repair_error."""
    if actions is None:
        return fragments.withColumn("repair_status", F.lit(None).cast("string")).withColumn(
            "repair_error", F.lit(None).cast("string")
        )
    per_fragment = _latest(
        actions.filter(F.col("old_bookie").isNotNull()),
        ["ledger_id", "segment_first_entry_id", "old_bookie"],
    ).select(
        "ledger_id",
        "segment_first_entry_id",
        F.col("old_bookie").alias("bookie_id"),
        F.col("status").alias("_fs"),
        F.col("error").alias("_fe"),
    )
    per_ledger = latest_ledger_status(actions).select(
        "ledger_id", F.col("status").alias("_ls"), F.col("error").alias("_le")
    )
    return (
        fragments.join(per_fragment, ["ledger_id", "segment_first_entry_id", "bookie_id"], "left")
        .join(per_ledger, "ledger_id", "left")
        .withColumn("repair_status", F.coalesce("_fs", "_ls"))
        .withColumn("repair_error", F.coalesce("_fe", "_le"))
        .drop("_fs", "_fe", "_ls", "_le")
    )


def time_to_repair(fragments: DataFrame, actions: DataFrame) -> DataFrame:
    """For every fragment ever found (ledger, segment, bookie): when it was first detected,
    when its repair finished (the DONE METADATA_UPDATE that swapped the bookie out, else the
    last DONE COPY), and the hours in between (null while unrepaired).

    Columns: ledger_id, segment_first_entry_id, bookie_id, first_detected_at, repaired_at,
    hours_to_repair.
    """
    keys = ["ledger_id", "segment_first_entry_id", "bookie_id"]
    found = fragments.groupBy(*keys).agg(F.min("first_detected_at").alias("first_detected_at"))
    done = (
        actions.filter(
            (F.col("status") == load.ACTION_DONE)
            & F.col("action").isin(load.ACTION_METADATA_UPDATE, load.ACTION_COPY)
            & F.col("old_bookie").isNotNull()
        )
        .groupBy("ledger_id", "segment_first_entry_id", F.col("old_bookie").alias("bookie_id"))
        .agg(
            F.coalesce(
                F.min(F.when(F.col("action") == load.ACTION_METADATA_UPDATE, F.col("finished_at"))),
                F.max("finished_at"),
            ).alias("repaired_at")
        )
    )
    # Casting a timestamp to double keeps the microseconds unix_timestamp would drop.
    hours = (F.col("repaired_at").cast("double") - F.col("first_detected_at").cast("double")) / 3600
    return (
        found.join(done, keys, "left")
        .withColumn("hours_to_repair", F.when(F.col("repaired_at").isNotNull(), hours))
        .orderBy(*keys)
    )


# ---- collected data ---------------------------------------------------------------------------


@dataclass
class ReportData:
    """Everything the page shows, as small Python values (no Spark)."""

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


def _rows(df: DataFrame) -> list[dict[str, Any]]:
    return [r.asDict(recursive=True) for r in df.collect()]


def collect_report_data(
    spark: SparkSession,
    warehouse: str,
    *,
    run_id: str | None = None,
    runs: int = DEFAULT_RUNS,
    title: str = DEFAULT_TITLE,
    max_findings: int = DEFAULT_MAX_FINDINGS,
) -> ReportData | None:
    """Run the report's queries; None when the warehouse has no such completed run."""
    run = load.latest_run(spark, warehouse, run_id)
    if run is None:
        return None
    data = ReportData(warehouse, run, datetime.now(timezone.utc), title=title)
    has_frags = load.table_exists(spark, warehouse, load.FRAGMENTS)
    frags = load.read_table(spark, warehouse, load.FRAGMENTS) if has_frags else None
    actions = None
    if load.table_exists(spark, warehouse, load.ACTIONS):
        actions = load.read_table(spark, warehouse, load.ACTIONS)
        data.has_actions = True
    if frags is not None:
        latest = frags.filter(F.col("run_id") == run["run_id"])
        data.per_bookie = _rows(fragments_per_bookie(latest))
        data.over_runs = _rows(
            severity_over_runs(load.read_table(spark, warehouse, load.AUDIT_RUNS), frags, runs)
        )
        # Worst first, so a truncated table still shows what matters.
        rank = F.coalesce(
            *[F.when(F.col("severity") == s, F.lit(i)) for i, s in enumerate(SEVERITIES)],
            F.lit(len(SEVERITIES)),
        )
        data.findings_total = latest.count()
        data.findings = _rows(
            findings_with_repair_status(latest, actions)
            .orderBy(rank, "ledger_id", "segment_first_entry_id", "bookie_id")
            .limit(max_findings)
        )
    else:
        data.over_runs = [
            {**run, **dict.fromkeys((*SEVERITIES, "fragments", "underreplicated_ledgers"), 0)}
        ]
    if actions is not None:
        span = actions.agg(
            (F.unix_timestamp(F.max("finished_at")) - F.unix_timestamp(F.min("finished_at"))).alias(
                "s"
            )
        ).first()
        data.bucket_seconds = choose_bucket_seconds(float((span and span["s"]) or 0))
        data.throughput = _rows(repair_throughput(actions, data.bucket_seconds))
        data.stuck = _rows(stuck_ledgers(actions))
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


def render_html(data: ReportData) -> str:
    """The whole page for ``data``."""
    run = data.run
    counts = run.get("counts") or {}
    sev_series = [s for s in SEVERITIES]
    colors = dict(SEVERITY_COLORS, UNKNOWN="#6b7280")
    bookies: dict[str, dict[str, float]] = {}
    for r in data.per_bookie:
        bookies.setdefault(r["bookie_id"], {})[r["severity"]] = float(r["fragments"])
    if any(r["severity"] == "UNKNOWN" for r in data.per_bookie):
        sev_series.append("UNKNOWN")
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
        "underreplicated_ledgers", len({f["ledger_id"] for f in data.findings})
    )
    missing = counts.get(
        "missing_entries", sum(int(f.get("missing_entries") or 0) for f in data.findings)
    )
    present = {r["severity"] for r in data.per_bookie} | {f.get("severity") for f in data.findings}
    worst = next((s for s in SEVERITIES if s in present), "")
    cards = [
        ("ledgers scanned", counts.get("ledgers", "")),
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
<h2>Findings of run {_e(run["run_id"])}</h2>
{shown_note}{render_findings_table(data.findings)}
</body></html>
"""


# ---- command line -----------------------------------------------------------------------------


def add_report_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the report flags to ``parser`` (shared by ``bkaudit report`` and spark-submit)."""
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
    parser.add_argument("--master", default=None, help="Spark master (default: conf or local[2])")
    return parser


def run_report(args: argparse.Namespace, spark: SparkSession | None = None) -> int:
    """Write the report from parsed arguments; 0 when written, 2 on error."""
    try:
        if spark is None:
            from jobs.spark.session import build_spark

            spark = build_spark(
                "bkaudit-report",
                master=getattr(args, "master", None),
                overrides={"spark.ui.showConsoleProgress": "false"},
            )
        data = collect_report_data(
            spark,
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
    except Exception as exc:
        log.exception("report failed")
        print(f"report: {exc}", file=sys.stderr)
        return 2
    print(
        f"report of run {data.run['run_id']}: {len(data.findings)} fragments, "
        f"{len(data.stuck)} stuck ledgers -> {out}"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``spark-submit jobs/reports/html.py ...`` entry point."""
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
