"""``bkaudit report`` on an incident built by real runs, read from the page Chromium renders.

Real ZooKeeper, five Python bookies with fault injection, and only the real commands
(``bkaudit audit``, ``rereplicate`` on the local executor, ``report``) write the warehouse:

1. bookie L1 stops; a lost audit finds it; rereplicate repairs it; a lost audit is clean
   (a loss with a time to repair);
2. bookie L2 stops and bookie S stops answering reads; a sample audit finds L2 lost and S
   unreachable (unknown severity); S answers again; a later lost audit finds L2 lost only;
3. rereplicate while every live bookie refuses the adds of one ledger: that copy FAILS, the
   other ledger of L2 is repaired;
4. ``rereplicate --dry-run`` of the sample audit: PLANNED rows.

The page must show each check's latest run (the unreachable finding too), the time since each
loss and the time to repair, the bookies' states with their last answers, the unknown
findings in the charts and the worst-severity card, the failure's reason as text, the checks
and jobs that never ran as "not run" (neutral), and the dry run marked. The screenshot is kept
in build/test-artifacts/report/ (or $BKAUDIT_TEST_ARTIFACTS).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import pytest
from PIL import Image

from bklib.states import ActionKind, ActionStatus, BookieState, Check, Reason, Severity
from bklib.testing.zkserver import ZooKeeperServer
from jobs.reports.page import SEVERITY_COLORS, UNKNOWN_COLOR
from jobs.tables import delta
from jobs.tables.schema import ACTIONS, AUDIT_RUNS, FRAGMENTS
from tests.audit_helpers import AuditCluster, audit_cluster
from tests.cli_helpers import REPO, bkaudit, failure
from tests.report.chromium import chromium

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

ARTIFACTS = Path(
    os.environ.get("BKAUDIT_TEST_ARTIFACTS", REPO / "build" / "test-artifacts" / "report")
)
FAST = ("--read-timeout", "1s", "--connect-timeout", "2s")


@dataclass
class Incident:
    """The warehouse and who played which part."""

    path: str
    first_lost: str  # lost, repaired
    lost: str  # lost now
    silent: str  # did not answer the sample audit
    repaired: int  # the lost bookie's ledger that was repaired
    failed: int  # the lost bookie's ledger whose copy failed
    quiet: int  # the silent bookie's ledger
    on_lost: int = 0  # the ledgers on ``lost`` when it went: the first repair may add one
    runs: dict[str, str] = field(default_factory=dict)  # step -> audit run id
    dry_run: str = ""
    failed_run: str = ""


def _ok(proc: subprocess.CompletedProcess[str], *codes: int) -> None:
    assert proc.returncode in codes, failure(proc)
    assert "Traceback" not in proc.stderr, failure(proc)


def _audit(c: AuditCluster, wh: str, check: str, *codes: int) -> str:
    proc = bkaudit("audit", "--zk", c.zk, "--warehouse", wh, "--check", check,
                   "--executor", "local", "--bookie-protocol", "v3", *FAST)  # fmt: skip
    _ok(proc, *codes)
    run = max(delta.read_rows(wh, AUDIT_RUNS), key=lambda r: r["started_at"])
    assert run["check"] == check
    return str(run["run_id"])


def _repair(c: AuditCluster, wh: str, *extra: str) -> str:
    before = {a["run_id"] for a in delta.read_rows(wh, ACTIONS, columns=["run_id"])}
    proc = bkaudit("rereplicate", "--zk", c.zk, "--warehouse", wh, "--executor", "local",
                   "--grace-period", "0s", "--local-processes", "1", "--read-timeout", "2s",
                   *extra)  # fmt: skip
    _ok(proc, 0, 1)
    (run,) = {a["run_id"] for a in delta.read_rows(wh, ACTIONS, columns=["run_id"])} - before
    return str(run)


@pytest.fixture(scope="module")
def incident(
    zk_server: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Incident]:
    base = tmp_path_factory.mktemp("incident")
    wh = str(base / "warehouse")
    with (
        zk_server.private_chroot("incident") as chroot,
        audit_cluster(base / "sandbox", chroot, bookies=5) as c,
    ):
        b0, b1, b2, b3, b4 = c.bookie_ids
        c.ledger([b0, b3], 8, wq=2, aq=2)  # the first loss's
        repaired = c.ledger([b1, b4], 8, wq=2, aq=2)
        failed = c.ledger([b0, b4], 8, wq=2, aq=2)
        quiet = c.ledger([b1, b2], 8, wq=2, aq=2)
        inc = Incident(wh, b3, b4, b2, repaired.ledger_id, failed.ledger_id, quiet.ledger_id)

        # 1. A loss, repaired.
        c.sandbox.stop_bookie(b3)
        inc.runs["first-loss"] = _audit(c, wh, Check.LOST, 0)
        _repair(c, wh)
        inc.runs["clean"] = _audit(c, wh, Check.LOST, 0)

        # 2. A second loss, and a bookie that does not answer the sample audit's reads. The
        # first repair may have put the first loss's ledger on b4 too.
        inc.on_lost = sum(
            b4 in c.store.read_ledger(lid).value.bookies() for lid in c.store.list_ledger_ids()
        )
        c.sandbox.stop_bookie(b4)
        admin = c.admin(b2)
        admin.add_fault("drop", op="READ_ENTRY")  # registered, connected, never answers
        try:
            inc.runs["sample"] = _audit(c, wh, Check.SAMPLE, 3)  # incomplete: b2 unknown
        finally:
            admin.clear_faults()
        inc.runs["lost"] = _audit(c, wh, Check.LOST, 0)

        # 3. Every live bookie refuses the adds of one ledger: its copy fails.
        live = [b0, b1, b2]
        for b in live:
            c.admin(b).add_fault("fail", op="ADD_ENTRY", ledger=failed.ledger_id)
        try:
            inc.failed_run = _repair(c, wh)
        finally:
            for b in live:
                c.admin(b).clear_faults()

        # 4. A dry run of the sample audit's findings.
        inc.dry_run = _repair(c, wh, "--dry-run", "--run-id", inc.runs["sample"])
        yield inc


class _Page(HTMLParser):
    """Rows, cells and attributes of the tables, chart segments and cards of the DOM."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, list[tuple[dict[str, str], list[str]]]] = {}
        self.cells: dict[str, list[dict[str, str]]] = {}
        self.segments: dict[str, list[dict[str, str]]] = {}
        self.cards: dict[str, str] = {}
        self.not_run: dict[str, str] = {}
        self.text: list[str] = []
        self._table: str | None = None
        self._row: tuple[dict[str, str], list[str]] | None = None
        self._cell: list[str] | None = None
        self._chart: str | None = None
        self._card: str | None = None
        self._note: str | None = None
        self.generated_epoch = 0.0
        self.shot = Path()
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if "id" in a:
            self.ids.add(a["id"])
        if tag == "table" and "id" in a:
            self._table = a["id"]
            self.rows[self._table] = []
        elif tag == "tr" and self._table is not None:
            self._row = (a, [])
        elif tag == "td" and self._row is not None:
            self._cell = []
            self.cells.setdefault(self._table or "", []).append(a)
        elif tag == "svg" and "data-chart" in a:
            self._chart = a["data-chart"]
            self.segments[self._chart] = []
        elif tag == "rect" and self._chart is not None:
            self.segments[self._chart].append(a)
        elif tag == "div" and "data-card" in a:
            self._card = a["data-card"]
            self.cards[self._card] = ""
        elif "not-run" in a.get("class", "").split() and "id" in a:
            self._note = a["id"]
            self.not_run[self._note] = ""
        elif tag == "span" and a.get("id") == "generated-at":
            self.generated_epoch = float(a["data-epoch"])

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._table = None
        elif tag == "tr" and self._row is not None and self._table is not None:
            if self._row[1]:  # not the header
                self.rows[self._table].append(self._row)
            self._row = None
        elif tag == "td" and self._cell is not None and self._row is not None:
            self._row[1].append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "svg":
            self._chart = None
        elif tag == "div":
            self._card = None
        elif tag == "p":
            self._note = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)
        if self._card is not None:
            self.cards[self._card] += data
        if self._note is not None:
            self.not_run[self._note] += data

    def table(self, tid: str) -> list[tuple[dict[str, str], list[str]]]:
        return self.rows.get(tid, [])


@pytest.fixture(scope="module")
def page(incident: Incident, tmp_path_factory: pytest.TempPathFactory) -> _Page:
    out = tmp_path_factory.mktemp("incident-report") / "report.html"
    proc = bkaudit("report", "--warehouse", incident.path, "--out", str(out))
    _ok(proc, 0)
    shot = out.with_suffix(".png")
    chromium(f"--screenshot={shot}", "--window-size=1400,4200", out.as_uri())
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, ARTIFACTS / "incident.png")
    shutil.copy(out, ARTIFACTS / "incident.html")
    dom = _Page()
    dom.feed(chromium("--dump-dom", out.as_uri()).stdout)
    dom.shot = shot
    return dom


def _first_detected(wh: str, bookie: str) -> float:
    frags = delta.read_rows(wh, FRAGMENTS)
    firsts = [
        f["first_detected_at"]
        for f in frags
        if f["bookie_id"] == bookie and f["reason"] == Reason.BOOKIE_LOST
    ]
    return float(min(firsts).timestamp())


def _seconds(attrs: dict[str, str]) -> float:
    return float(attrs["data-seconds"])


def test_each_checks_latest_run_is_shown_with_the_unreachable_finding(
    incident: Incident, page: _Page
) -> None:
    runs = {a["data-check"]: (a["data-status"], cells) for a, cells in page.table("audit-runs")}
    assert runs[Check.LOST][1][1] == incident.runs["lost"]
    assert runs[Check.SAMPLE][1][1] == incident.runs["sample"]
    findings = {(a["data-ledger-id"], a["data-bookie-id"]): a for a, _ in page.table("findings")}
    # The sample audit's unreachable finding survives the later lost audit.
    silent = findings[(str(incident.quiet), incident.silent)]
    assert silent["data-severity"] == "UNKNOWN"
    lost = findings[(str(incident.failed), incident.lost)]
    assert lost["data-severity"] == Severity.BELOW_AQ
    # The first loss was repaired: the clean lost audit after it hides its old finding.
    assert incident.first_lost not in {b for _, b in findings}


def test_time_since_each_loss_and_time_to_repair(incident: Incident, page: _Page) -> None:
    losses = {a["data-bookie-id"]: (a, cells) for a, cells in page.table("losses")}
    assert set(losses) == {incident.first_lost, incident.lost}
    rows = page.table("losses")
    attrs = page.cells["losses"]
    per_row = len(attrs) // len(rows)
    by_bookie = {a["data-bookie-id"]: attrs[i * per_row : (i + 1) * per_row]
                 for i, (a, _) in enumerate(rows)}  # fmt: skip
    timed = {b: [c for c in tds if "data-seconds" in c] for b, tds in by_bookie.items()}

    # Time since each loss: from its first detection to the page's generation.
    for bookie in losses:
        since, _ = timed[bookie]
        expected = page.generated_epoch - _first_detected(incident.path, bookie)
        assert _seconds(since) == pytest.approx(expected, abs=0.01), bookie
        assert losses[bookie][1][3].endswith(" ago")

    # Time to repair: the first loss, to the metadata update that swapped it out.
    actions = delta.read_rows(incident.path, ACTIONS)
    swaps = [
        a["finished_at"].timestamp()
        for a in actions
        if a["action"] == ActionKind.METADATA_UPDATE
        and a["status"] == ActionStatus.DONE
        and incident.first_lost in (a["old_bookie"] or "").split(",")
    ]
    assert swaps, "the first loss was repaired"
    _, to_repair = timed[incident.first_lost]
    expected = max(swaps) - _first_detected(incident.path, incident.first_lost)
    assert _seconds(to_repair) == pytest.approx(expected, abs=0.01)
    assert losses[incident.first_lost][0]["data-status"] == "repaired"
    # The second loss: every ledger repaired but one, which failed, so not repaired yet.
    assert losses[incident.lost][0]["data-status"] == BookieState.LOST
    assert losses[incident.lost][1][4] == "not repaired yet"
    n = incident.on_lost
    assert n in (2, 3), n
    assert losses[incident.lost][1][5] == f"{n - 1} of {n} fragments repaired"


def test_bookie_states_with_their_last_answer(incident: Incident, page: _Page) -> None:
    states = {a["data-bookie-id"]: (a["data-state"], cells) for a, cells in page.table("bookies")}
    assert states[incident.lost][0] == BookieState.LOST
    assert states[incident.silent][0] == BookieState.UNREACHABLE
    others = set(states) - {incident.lost, incident.silent}
    assert others and all(states[b][0] == BookieState.WRITABLE for b in others)
    answer = states[incident.silent][1][2]
    assert answer.startswith(f"did not answer the {Check.SAMPLE} audit of ")
    lost_answer = states[incident.lost][1][2]
    assert lost_answer.startswith("not registered since ")
    assert "last seen registered: 2" in lost_answer  # registered before it stopped
    for b in others:
        assert states[b][1][2].startswith("answered the reads of "), states[b]


def test_unknown_findings_in_the_charts_and_the_worst_severity_card(
    incident: Incident, page: _Page
) -> None:
    bars = {(s["data-label"], s["data-series"]) for s in page.segments["fragments-per-bookie"]}
    assert (incident.silent, "UNKNOWN") in bars
    assert (incident.lost, Severity.BELOW_AQ) in bars
    runs = page.segments["severity-over-runs"]
    assert any(s["data-series"] == "UNKNOWN" and float(s["data-value"]) > 0 for s in runs)
    worst = page.cards["worst-severity"]
    assert re.fullmatch(rf"{Severity.BELOW_AQ} \+ \d+ UNKNOWN.*", worst), worst


def test_failure_reasons_are_page_text(incident: Incident, page: _Page) -> None:
    failures = page.table("repair-failures")
    assert failures, "the failed copy is listed"
    ((attrs, row),) = [(a, c) for a, c in failures if a["data-ledger-id"] == str(incident.failed)]
    assert attrs["data-status"] == ActionStatus.FAILED and attrs["data-dry-run"] == "false"
    reason = row[5]
    assert reason and reason != "no reason recorded"
    assert reason in " ".join(page.text)
    assert page.cards["repair-failures"].startswith("1")


def test_not_run_is_shown_as_not_run(page: _Page) -> None:
    runs = {a["data-check"]: (a, cells) for a, cells in page.table("audit-runs")}
    for check in (Check.REPLICAS, Check.DEEP):
        attrs, cells = runs[check]
        assert attrs["data-status"] == "not-run" and "not-run" in attrs.get("class", "")
        assert cells[1].startswith("not run")
    for section in ("blast-bookies", "blast-racks", "triage", "pulsar"):
        assert page.not_run[f"{section}-not-run"].startswith("not run: "), section
        assert f"{section}-empty" not in page.ids and section not in page.rows


def test_the_dry_run_is_marked(incident: Incident, page: _Page) -> None:
    runs = {a["data-run-id"]: (a, cells) for a, cells in page.table("repair-runs")}
    assert runs[incident.dry_run][0]["data-dry-run"] == "true"
    assert "dry run" in runs[incident.dry_run][1][0]
    assert runs[incident.failed_run][0]["data-dry-run"] == "false"
    # The silent bookie's finding was last planned by the dry run: marked as such.
    findings = {(a["data-ledger-id"], a["data-bookie-id"]): c for a, c in page.table("findings")}
    status = findings[(str(incident.quiet), incident.silent)]
    assert any(c.startswith(f"{ActionStatus.PLANNED} dry run") for c in status), status


def test_the_screenshot_paints_the_incident(page: _Page) -> None:
    img = Image.open(page.shot).convert("RGB")
    painted = {rgb: n for n, rgb in img.getcolors(maxcolors=1 << 22) or []}
    wanted = {"BELOW_AQ": SEVERITY_COLORS[Severity.BELOW_AQ], "UNKNOWN": UNKNOWN_COLOR}
    for name, hex_color in wanted.items():
        rgb = tuple(int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
        assert painted.get(rgb, 0) > 100, f"{name} ({hex_color}) not painted"
    assert (ARTIFACTS / "incident.png").exists()
