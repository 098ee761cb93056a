"""jobs.reports.html: the queries on a real warehouse (chispa), the page rendered by headless
Chromium (DOM and pixels), and the pure rendering helpers."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
from datetime import datetime, timezone
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from chispa import assert_df_equality
from PIL import Image
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from jobs.reports.html import (
    SEVERITY_COLORS,
    ReportData,
    add_report_arguments,
    axis_ticks,
    choose_bucket_seconds,
    collect_report_data,
    fragments_per_bookie,
    human_bytes,
    nice_bytes_max,
    nice_max,
    render_findings_table,
    render_html,
    repair_throughput,
    run_report,
    severity_over_runs,
    stuck_ledgers,
    svg_hbar_chart,
    time_to_repair,
)
from jobs.spark import load
from tests.report.conftest import ReportWarehouse

pytestmark = pytest.mark.integration

CHROMIUM = os.environ.get("BKAUDIT_CHROMIUM", "/usr/bin/chromium")


def _fragments(spark: SparkSession, wh: ReportWarehouse) -> Any:
    return load.read_table(spark, wh.path, load.FRAGMENTS)


def _actions(spark: SparkSession, wh: ReportWarehouse) -> Any:
    return load.read_table(spark, wh.path, load.ACTIONS)


# ---- queries on the real warehouse ------------------------------------------------------------


def test_fragments_per_bookie(spark: SparkSession, report_warehouse: ReportWarehouse) -> None:
    wh = report_warehouse
    latest = _fragments(spark, wh).filter(F.col("run_id") == wh.latest_run)
    by_sev: dict[str, list[tuple[int, int | None]]] = {}
    for lid, (missing, sev) in wh.expected.items():
        by_sev.setdefault(sev, []).append((lid, missing))
    assert set(by_sev) == {"NO_REPLICA", "BELOW_AQ", "BELOW_WQ"}  # the fixture covers all three
    expected = spark.createDataFrame(
        [
            (wh.victim, sev, len(rows), len(rows), sum(m or 0 for _, m in rows))
            for sev, rows in sorted(by_sev.items())
        ],
        "bookie_id string, severity string, fragments long, ledgers long, missing_entries long",
    )
    assert_df_equality(fragments_per_bookie(latest), expected, ignore_nullable=True)


def test_severity_over_runs_keeps_clean_runs(
    spark: SparkSession, report_warehouse: ReportWarehouse
) -> None:
    wh = report_warehouse
    runs = load.read_table(spark, wh.path, load.AUDIT_RUNS)
    got = severity_over_runs(runs, _fragments(spark, wh)).select(
        "run_id", "NO_REPLICA", "BELOW_AQ", "BELOW_WQ", "fragments", "underreplicated_ledgers"
    )
    sev = [s for _, s in wh.expected.values()]
    n = len(wh.expected)
    found = (sev.count("NO_REPLICA"), sev.count("BELOW_AQ"), sev.count("BELOW_WQ"), n, n)
    expected = spark.createDataFrame(
        [(wh.runs[0], 0, 0, 0, 0, 0), (wh.runs[1], *found)],
        "run_id string, NO_REPLICA long, BELOW_AQ long, BELOW_WQ long, fragments long, "
        "underreplicated_ledgers long",
    )
    assert_df_equality(got, expected, ignore_nullable=True)
    latest_only = severity_over_runs(runs, _fragments(spark, wh), limit=1).collect()
    assert [r["run_id"] for r in latest_only] == [wh.latest_run]


def test_time_to_repair_and_stuck_ledgers(
    spark: SparkSession, report_warehouse: ReportWarehouse
) -> None:
    wh = report_warehouse
    first = {f["ledger_id"]: f for f in wh.latest_fragments}
    got = time_to_repair(_fragments(spark, wh), _actions(spark, wh))
    rows = []
    for lid in sorted(wh.expected):
        f = first[lid]
        done = wh.repaired_at.get(lid)
        hours = (done.timestamp() - f["first_detected_at"].timestamp()) / 3600 if done else None
        rows.append(
            (lid, f["segment_first_entry_id"], wh.victim, f["first_detected_at"], done, hours)
        )
    expected = spark.createDataFrame(
        rows,
        T.StructType(
            [
                T.StructField("ledger_id", T.LongType()),
                T.StructField("segment_first_entry_id", T.LongType()),
                T.StructField("bookie_id", T.StringType()),
                T.StructField("first_detected_at", T.TimestampType()),
                T.StructField("repaired_at", T.TimestampType()),
                T.StructField("hours_to_repair", T.DoubleType()),
            ]
        ),
    )
    assert_df_equality(got, expected, ignore_nullable=True, allow_nan_equality=True)

    stuck = stuck_ledgers(_actions(spark, wh)).select("ledger_id", "status", "no_replica_entries")
    assert_df_equality(
        stuck,
        spark.createDataFrame(
            [(wh.no_replica, "NO_REPLICA", [1, 3, 5]), (wh.open_ledger, "WAITING_GRACE", None)],
            "ledger_id long, status string, no_replica_entries array<long>",
        ),
        ignore_nullable=True,
    )


def test_repair_throughput_per_minute(
    spark: SparkSession, report_warehouse: ReportWarehouse
) -> None:
    wh = report_warehouse
    got = repair_throughput(_actions(spark, wh), 60).collect()
    assert [(r["copies"], r["entries_copied"], r["bytes_copied"]) for r in got] == [
        (1, *wh.copied[wh.below_aq]),
        (1, *wh.copied[wh.below_wq]),
    ]
    assert got[0]["bucket_start"] < got[1]["bucket_start"]
    assert got[0]["bytes_per_second"] == pytest.approx(wh.copied[wh.below_aq][1] / 60)
    per_day = repair_throughput(_actions(spark, wh), 86400).collect()
    assert len(per_day) in (1, 2)  # two only when the copies straddle midnight UTC
    assert sum(r["bytes_copied"] for r in per_day) == sum(b for _, b in wh.copied.values())


# ---- the page in a real browser ---------------------------------------------------------------


class _Dom(HTMLParser):
    """Collects what the tests look for in Chromium's serialised DOM."""

    def __init__(self) -> None:
        super().__init__()
        self.charts: dict[str, list[dict[str, str]]] = {}
        self.columns: dict[str, list[dict[str, str]]] = {}
        self.tables: dict[str, list[dict[str, str]]] = {}
        self._chart: str | None = None
        self._table: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "svg" and "data-chart" in a:
            self._chart = a["data-chart"]
            self.charts[self._chart] = []
            self.columns[self._chart] = []
        elif tag == "rect" and self._chart is not None:
            self.charts[self._chart].append(a)
        elif tag == "g" and self._chart is not None and "data-key" in a:
            self.columns[self._chart].append(a)
        elif tag == "table" and "id" in a:
            self._table = a["id"]
            self.tables[self._table] = []
        elif tag == "tr" and self._table is not None and "data-ledger-id" in a:
            self.tables[self._table].append(a)

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self._chart = None
        elif tag == "table":
            self._table = None


def _chromium(*args: str) -> subprocess.CompletedProcess[str]:
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} missing: run scripts/install_chromium.sh"
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


def test_report_command_renders_charts_and_findings_in_chromium(
    spark: SparkSession, report_warehouse: ReportWarehouse, tmp_path: Path
) -> None:
    wh = report_warehouse
    out = tmp_path / "report.html"
    args = add_report_arguments(argparse.ArgumentParser()).parse_args(
        ["--warehouse", wh.path, "--out", str(out)]
    )
    assert run_report(args, spark) == 0
    page = out.read_text()
    assert "<script" not in page and "http://" not in page and "https://" not in page

    dom = _Dom()
    dom.feed(_chromium("--dump-dom", out.as_uri()).stdout)
    assert set(dom.charts) == {"fragments-per-bookie", "severity-over-runs", "repair-throughput"}

    bars = dom.charts["fragments-per-bookie"]
    assert {b["data-label"] for b in bars} == {wh.victim}
    per_sev: dict[str, float] = {}
    for _, sev in wh.expected.values():
        per_sev[sev] = per_sev.get(sev, 0) + 1
    assert {b["data-series"]: float(b["data-value"]) for b in bars} == per_sev

    cols = dom.columns["severity-over-runs"]
    assert [c["data-key"] for c in cols] == wh.runs
    assert [float(c["data-total"]) for c in cols] == [0, len(wh.expected)]

    repair = dom.columns["repair-throughput"]
    assert [float(c["data-total"]) for c in repair] == [
        wh.copied[wh.below_aq][1],
        wh.copied[wh.below_wq][1],
    ]

    findings = dom.tables["findings"]
    assert sorted(int(r["data-ledger-id"]) for r in findings) == sorted(wh.expected)
    assert {r["data-bookie-id"] for r in findings} == {wh.victim}
    assert {int(r["data-ledger-id"]): r["data-severity"] for r in findings} == {
        lid: sev for lid, (_, sev) in wh.expected.items()
    }
    assert str(wh.healthy) not in {r["data-ledger-id"] for r in findings}
    stuck = {int(r["data-ledger-id"]): r["data-status"] for r in dom.tables["stuck"]}
    assert stuck == {wh.no_replica: "NO_REPLICA", wh.open_ledger: "WAITING_GRACE"}

    # Painted, not just present: the severity colours and the throughput blue are on screen.
    shot = tmp_path / "report.png"
    _chromium(f"--screenshot={shot}", "--window-size=1400,1600", out.as_uri())
    img = Image.open(shot).convert("RGB")
    colors = img.getcolors(maxcolors=1 << 20) or []
    painted = {rgb: n for n, rgb in colors}
    for name, hex_color in [*SEVERITY_COLORS.items(), ("throughput", "#2563eb")]:
        rgb = tuple(int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
        assert painted.get(rgb, 0) > 100, f"{name} ({hex_color}) not painted"
    keep = os.environ.get("BKAUDIT_KEEP_REPORT")
    if keep:  # for looking at the page by eye
        shutil.copy(shot, Path(keep).with_suffix(".png"))
        shutil.copy(out, Path(keep).with_suffix(".html"))


def test_findings_table_is_truncated_worst_first(
    spark: SparkSession, report_warehouse: ReportWarehouse
) -> None:
    wh = report_warehouse
    data = collect_report_data(spark, wh.path, max_findings=2)
    assert data is not None and data.findings_total == len(wh.expected)
    order = {"NO_REPLICA": 0, "BELOW_AQ": 1, "BELOW_WQ": 2}
    worst = sorted(wh.expected.items(), key=lambda kv: (order[kv[1][1]], kv[0]))[:2]
    assert [f["ledger_id"] for f in data.findings] == [lid for lid, _ in worst]
    page = render_html(data)
    assert f"Showing the 2 worst of {len(wh.expected)} fragments" in page
    assert page.count("<tr data-ledger-id=") == 2 + len(data.stuck)


def test_report_of_an_empty_warehouse_is_an_error(spark: SparkSession, tmp_path: Path) -> None:
    args = add_report_arguments(argparse.ArgumentParser()).parse_args(
        ["--warehouse", str(tmp_path / "none"), "--out", str(tmp_path / "r.html")]
    )
    assert run_report(args, spark) == 2
    assert not (tmp_path / "r.html").exists()


# ---- pure helpers -------------------------------------------------------------------------------


def test_axis_bucket_and_byte_helpers() -> None:
    assert axis_ticks(5.0) == [0, 1, 2, 3, 4, 5]
    assert nice_bytes_max(30_000) == 50 * 1024 and nice_bytes_max(900) == 1000
    assert axis_ticks(50 * 1024) == [k * 10 * 1024 for k in range(6)]
    assert [human_bytes(t) for t in axis_ticks(nice_bytes_max(3 * 1024**2))] == [
        "0 B",
        "1.0 MiB",
        "2.0 MiB",
        "3.0 MiB",
        "4.0 MiB",
        "5.0 MiB",
    ]
    assert axis_ticks(20.0) == [0, 5, 10, 15, 20]
    assert axis_ticks(0.1) == pytest.approx([0, 0.02, 0.04, 0.06, 0.08, 0.1])
    assert [nice_max(v) for v in (0, 0.3, 1, 3, 7, 10, 11, 4500)] == [
        1.0,
        0.5,
        1.0,
        5.0,
        10.0,
        10.0,
        20.0,
        5000.0,
    ]
    assert [choose_bucket_seconds(s) for s in (0, 7200, 7201, 7 * 86400, 8 * 86400)] == [
        60,
        60,
        3600,
        3600,
        86400,
    ]
    assert [human_bytes(n) for n in (0, 1023, 1536, 5 * 1024**3)] == [
        "0 B",
        "1023 B",
        "1.5 KiB",
        "5.0 GiB",
    ]


def test_rendering_escapes_and_handles_empty_data() -> None:
    evil = '<img src=x onerror="alert(1)">:3181'
    table = render_findings_table(
        [
            {
                "ledger_id": 7,
                "segment_first_entry_id": 0,
                "segment_last_entry_id": None,
                "bookie_id": evil,
                "reason": "BOOKIE_LOST",
                "missing_entries": None,
                "min_replicas": 1,
                "severity": "BELOW_AQ",
                "ledger_state": "OPEN",
                "first_detected_at": datetime(2026, 1, 1, tzinfo=timezone.utc),
            }
        ]
    )
    assert "<img" not in table and "&lt;img" in table and "[0, open]" in table
    assert 'data-chart="x"' in svg_hbar_chart("x", [], ["a"], {"a": "#000"})
    assert "<rect" not in svg_hbar_chart("x", [], ["a"], {"a": "#000"})
    page = render_html(
        ReportData(
            "/wh",
            {"run_id": "r1", "check": "lost", "status": "COMPLETED", "counts": {}},
            datetime(2026, 1, 1),
            over_runs=[
                {"run_id": "r1", "started_at": datetime(2026, 1, 1), "NO_REPLICA": 0}
                | {"BELOW_AQ": 0, "BELOW_WQ": 0}
            ],
        )
    )
    assert 'id="findings-empty"' in page and "No repair run recorded yet." in page
    assert page.count("<svg") == 1  # the run chart; no bookie bars, no repair chart
