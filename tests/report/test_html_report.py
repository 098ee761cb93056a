"""``bkaudit report`` (jobs.reports.queries, data, charts, page; jobs.commands.report): the
queries on a real warehouse (written by Spark, read through delta-rs), the page rendered by
headless Chromium (DOM and pixels), and the pure rendering helpers."""

from __future__ import annotations

import argparse
import os
import shutil
from collections.abc import Sequence
from datetime import datetime, timezone
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from bklib.states import ActionStatus, Check, Reason, RunStatus, Severity
from jobs.commands.report import add_report_arguments, run_report
from jobs.reports.charts import axis_ticks, human_bytes, nice_bytes_max, nice_max, svg_hbar_chart
from jobs.reports.data import ReportData, collect_report_data
from jobs.reports.page import SEVERITY_COLORS, render_findings_table, render_html
from jobs.reports.queries import (
    choose_bucket_seconds,
    fragments_per_bookie,
    repair_throughput,
    severity_over_runs,
    stuck_ledgers,
    time_to_repair,
)
from jobs.tables import delta
from jobs.tables.schema import ACTIONS, AUDIT_RUNS, FRAGMENTS
from tests.report.chromium import chromium
from tests.report.conftest import ReportWarehouse

pytestmark = pytest.mark.integration


def _fragments(wh: ReportWarehouse) -> list[dict[str, Any]]:
    return delta.read_rows(wh.path, FRAGMENTS)


def _actions(wh: ReportWarehouse) -> list[dict[str, Any]]:
    return delta.read_rows(wh.path, ACTIONS)


def _project(rows: Sequence[dict[str, Any]], *columns: str) -> list[dict[str, Any]]:
    return [{c: r[c] for c in columns} for r in rows]


def assert_rows_equal(got: Sequence[dict[str, Any]], expected: Sequence[dict[str, Any]]) -> None:
    """Same rows in the same order, same columns in the same order, and every value of the
    expected type (an int is not a float, a UTC-aware timestamp is not a naive one)."""
    assert got == expected
    for g, e in zip(got, expected, strict=True):
        assert list(g) == list(e)
        assert {k: type(v) for k, v in g.items()} == {k: type(v) for k, v in e.items()}
        for k, v in e.items():
            if isinstance(v, datetime):
                assert g[k].tzinfo == v.tzinfo, k


# ---- queries on the real warehouse ------------------------------------------------------------


def test_fragments_per_bookie(report_warehouse: ReportWarehouse) -> None:
    wh = report_warehouse
    latest = [f for f in _fragments(wh) if f["run_id"] == wh.latest_run]
    by_sev: dict[str, list[tuple[int, int | None]]] = {}
    for lid, (missing, sev) in wh.expected.items():
        by_sev.setdefault(sev, []).append((lid, missing))
    assert set(by_sev) == set(Severity.ALL)  # the fixture covers all three
    expected = [
        {
            "bookie_id": wh.victim,
            "severity": sev,
            "fragments": len(rows),
            "ledgers": len(rows),
            "missing_entries": sum(m or 0 for _, m in rows),
        }
        for sev, rows in sorted(by_sev.items())
    ]
    assert_rows_equal(fragments_per_bookie(latest), expected)


def test_severity_over_runs_keeps_clean_runs(report_warehouse: ReportWarehouse) -> None:
    wh = report_warehouse
    runs = delta.read_rows(wh.path, AUDIT_RUNS)
    columns = ("run_id", *Severity.ALL, "fragments", "underreplicated_ledgers")
    got = _project(severity_over_runs(runs, _fragments(wh)), *columns)
    sev = [s for _, s in wh.expected.values()]
    n = len(wh.expected)
    found = (
        sev.count(Severity.NO_REPLICA),
        sev.count(Severity.BELOW_AQ),
        sev.count(Severity.BELOW_WQ),
        n,
        n,
    )
    expected = [
        dict(zip(columns, (wh.runs[0], 0, 0, 0, 0, 0), strict=True)),
        dict(zip(columns, (wh.runs[1], *found), strict=True)),
    ]
    assert_rows_equal(got, expected)
    latest_only = severity_over_runs(runs, _fragments(wh), limit=1)
    assert [r["run_id"] for r in latest_only] == [wh.latest_run]


def test_time_to_repair_and_stuck_ledgers(report_warehouse: ReportWarehouse) -> None:
    wh = report_warehouse
    first = {f["ledger_id"]: f for f in wh.latest_fragments}
    got = time_to_repair(_fragments(wh), _actions(wh))
    expected = []
    for lid in sorted(wh.expected):
        f = first[lid]
        done = wh.repaired_at.get(lid)
        hours = (done.timestamp() - f["first_detected_at"].timestamp()) / 3600 if done else None
        expected.append(
            {
                "ledger_id": lid,
                "segment_first_entry_id": f["segment_first_entry_id"],
                "bookie_id": wh.victim,
                "first_detected_at": f["first_detected_at"],
                "repaired_at": done,
                "hours_to_repair": hours,
            }
        )
    assert_rows_equal(got, expected)

    stuck = _project(stuck_ledgers(_actions(wh)), "ledger_id", "status", "no_replica_entries")
    assert_rows_equal(
        stuck,
        [
            {
                "ledger_id": wh.no_replica,
                "status": ActionStatus.NO_REPLICA,
                "no_replica_entries": [1, 3, 5],
            },
            {
                "ledger_id": wh.open_ledger,
                "status": ActionStatus.WAITING_GRACE,
                "no_replica_entries": None,
            },
        ],
    )


def test_repair_throughput_per_minute(report_warehouse: ReportWarehouse) -> None:
    wh = report_warehouse
    got = repair_throughput(_actions(wh), 60)
    assert [(r["copies"], r["entries_copied"], r["bytes_copied"]) for r in got] == [
        (1, *wh.copied[wh.below_aq]),
        (1, *wh.copied[wh.below_wq]),
    ]
    assert got[0]["bucket_start"] < got[1]["bucket_start"]
    assert got[0]["bytes_per_second"] == pytest.approx(wh.copied[wh.below_aq][1] / 60)
    per_day = repair_throughput(_actions(wh), 86400)
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


def test_report_command_renders_charts_and_findings_in_chromium(
    report_warehouse: ReportWarehouse, tmp_path: Path
) -> None:
    wh = report_warehouse
    out = tmp_path / "report.html"
    args = add_report_arguments(argparse.ArgumentParser()).parse_args(
        ["--warehouse", wh.path, "--out", str(out)]
    )
    assert run_report(args) == 0  # no SparkSession: the tables are read through delta-rs
    page = out.read_text()
    assert "<script" not in page and "http://" not in page and "https://" not in page

    dom = _Dom()
    dom.feed(chromium("--dump-dom", out.as_uri()).stdout)
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
    assert stuck == {
        wh.no_replica: ActionStatus.NO_REPLICA,
        wh.open_ledger: ActionStatus.WAITING_GRACE,
    }

    # Painted, not just present: the severity colours and the throughput blue are on screen.
    shot = tmp_path / "report.png"
    chromium(f"--screenshot={shot}", "--window-size=1400,4000", out.as_uri())
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


def test_findings_table_is_truncated_worst_first(report_warehouse: ReportWarehouse) -> None:
    wh = report_warehouse
    data = collect_report_data(wh.path, max_findings=2)
    assert data is not None and data.findings_total == len(wh.expected)
    order = Severity.ORDER
    worst = sorted(wh.expected.items(), key=lambda kv: (order[kv[1][1]], kv[0]))[:2]
    assert [f["ledger_id"] for f in data.findings] == [lid for lid, _ in worst]
    page = render_html(data)
    assert f"Showing the 2 worst of {len(wh.expected)} fragments" in page
    assert page.count("<tr data-ledger-id=") == 2 + len(data.stuck)


def test_report_of_an_empty_warehouse_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = add_report_arguments(argparse.ArgumentParser()).parse_args(
        ["--warehouse", str(tmp_path / "none"), "--out", str(tmp_path / "r.html")]
    )
    assert run_report(args) == 2
    assert capsys.readouterr().err.count("\n") == 1
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
                "reason": Reason.BOOKIE_LOST,
                "missing_entries": None,
                "min_replicas": 1,
                "severity": Severity.BELOW_AQ,
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
            {"run_id": "r1", "check": Check.LOST, "status": RunStatus.COMPLETED, "counts": {}},
            datetime(2026, 1, 1),
            over_runs=[
                {"run_id": "r1", "started_at": datetime(2026, 1, 1)}
                | dict.fromkeys(Severity.ALL, 0)
            ],
        )
    )
    assert 'id="findings-empty"' in page
    # No repair ran: the repair sections say "not run" (neutral), not a green "nothing".
    for section in ("stuck", "repair-throughput", "repair-runs", "repair-failures"):
        assert f'<p class="not-run" id="{section}-not-run">not run: ' in page, section
        assert f'id="{section}-empty"' not in page, section
    assert page.count("<svg") == 1  # the run chart; no bookie bars, no repair chart
