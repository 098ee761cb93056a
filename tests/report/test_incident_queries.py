"""The report's incident queries and sections on hand-made rows (jobs.reports.queries,
bookies, repairs, text, page): each check's latest run, the findings merged across them, the
bookie states, losses, failures behind a dry run, manual steps, the unknown severity and
the not-run notes. The real incident is tests/report/test_incident_report.py."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from bklib.states import ActionKind, ActionStatus, BookieState, Check, Reason, RunStatus, Severity
from jobs.reports.bookies import bookie_losses, bookie_states
from jobs.reports.data import ReportData
from jobs.reports.page import render_html
from jobs.reports.queries import (
    UNKNOWN_SEVERITY,
    fragments_per_bookie,
    latest_run_per_check,
    merge_run_findings,
    severity_over_runs,
    time_to_repair,
    unfinished_after,
)
from jobs.reports.repairs import failed_repairs, manual_steps, repair_runs
from jobs.reports.text import fmt_duration

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)


def _run(rid: str, check: str, minutes: int, status: str = RunStatus.COMPLETED) -> dict[str, Any]:
    start = T0 + timedelta(minutes=minutes)
    return {"run_id": rid, "check": check, "status": status, "started_at": start,
            "finished_at": start + timedelta(seconds=30), "counts": {}}  # fmt: skip


def _frag(rid: str, lid: int, bookie: str, reason: str, sev: str | None) -> dict[str, Any]:
    return {"run_id": rid, "ledger_id": lid, "segment_first_entry_id": 0, "bookie_id": bookie,
            "reason": reason, "severity": sev, "missing_entries": 1,
            "first_detected_at": T0}  # fmt: skip


RUNS = [
    _run("lost-1", Check.LOST, 0),
    _run("sample-1", Check.SAMPLE, 10, RunStatus.COMPLETED_WITH_ERRORS),
    _run("lost-2", Check.LOST, 20),
    _run("lost-3", Check.LOST, 30, RunStatus.FAILED),  # never shown
]


def test_each_checks_latest_finished_run_in_registry_order() -> None:
    shown = latest_run_per_check(RUNS, (Check.LOST, Check.SAMPLE, Check.REPLICAS))
    assert [r["run_id"] for r in shown] == ["lost-2", "sample-1"]
    # The failed run after them is not shown, but said: what it would have found is unknown.
    late = _run("deep-1", Check.DEEP, 40, RunStatus.INTERRUPTED)
    old = _run("deep-0", Check.DEEP, 5, RunStatus.FAILED)  # before every shown run
    got = unfinished_after([*RUNS, late, old], shown)
    assert [r["run_id"] for r in got] == ["deep-1", "lost-3"]
    page = render_html(_data(runs_unfinished=got))
    assert '<tr data-check="lost" data-status="FAILED" class="bad">' in page
    assert "INTERRUPTED: did not finish, not shown" in page


def test_merged_findings_keep_the_unreachable_and_drop_an_old_loss() -> None:
    shown = [RUNS[1], RUNS[2]]
    frags = [
        _frag("sample-1", 1, "b:1", Reason.BOOKIE_UNREACHABLE, None),
        _frag("sample-1", 2, "b:9", Reason.BOOKIE_LOST, Severity.BELOW_AQ),  # repaired since
        _frag("sample-1", 3, "b:8", Reason.BOOKIE_LOST, Severity.BELOW_AQ),
        _frag("lost-2", 3, "b:8", Reason.BOOKIE_LOST, Severity.NO_REPLICA),
        _frag("lost-1", 4, "b:7", Reason.BOOKIE_LOST, Severity.BELOW_AQ),  # not shown
    ]
    merged = merge_run_findings(shown, frags)
    assert [(f["ledger_id"], f["run_id"]) for f in merged] == [(1, "sample-1"), (3, "lost-2")]
    per = fragments_per_bookie(merged)
    assert {(r["bookie_id"], r["severity"]) for r in per} == {
        ("b:1", UNKNOWN_SEVERITY),
        ("b:8", Severity.NO_REPLICA),
    }
    over = severity_over_runs(RUNS, frags)
    assert [(r["run_id"], r[UNKNOWN_SEVERITY]) for r in over] == [
        ("lost-1", 0),
        ("sample-1", 1),
        ("lost-2", 0),
    ]


def test_bookie_states_unreachable_survives_a_lost_audit_and_lost_since() -> None:
    rows = [
        {"run_id": "lost-1", "bookie_id": "b:1", "state": BookieState.WRITABLE},
        {"run_id": "lost-1", "bookie_id": "b:2", "state": BookieState.WRITABLE},
        {"run_id": "lost-1", "bookie_id": "b:3", "state": BookieState.WRITABLE},
        {"run_id": "sample-1", "bookie_id": "b:1", "state": BookieState.WRITABLE},
        {"run_id": "sample-1", "bookie_id": "b:2", "state": BookieState.WRITABLE},
        {"run_id": "sample-1", "bookie_id": "b:3", "state": BookieState.LOST},
        {"run_id": "lost-2", "bookie_id": "b:1", "state": BookieState.WRITABLE},
        {"run_id": "lost-2", "bookie_id": "b:2", "state": BookieState.READONLY},
        {"run_id": "lost-2", "bookie_id": "b:3", "state": BookieState.LOST},
    ]
    states = bookie_states(
        rows, RUNS, [("sample-1", "b:1")], {Check.SAMPLE}, {"sample-1", "lost-2"}
    )
    by = {s["bookie_id"]: s for s in states}
    assert by["b:1"]["state"] == BookieState.UNREACHABLE
    assert by["b:1"]["unanswered_at"] == RUNS[1]["started_at"]
    assert by["b:1"]["answered_at"] is None
    assert by["b:1"]["registered_at"] == RUNS[2]["started_at"]
    assert by["b:2"]["state"] == BookieState.READONLY
    assert by["b:2"]["answered_at"] == RUNS[1]["started_at"]
    assert by["b:3"]["state"] == BookieState.LOST
    assert by["b:3"]["lost_since"] == RUNS[1]["started_at"]
    assert by["b:3"]["registered_at"] == RUNS[0]["started_at"]


def test_losses_age_and_time_to_repair() -> None:
    frags = [_frag("lost-1", lid, "b:3", Reason.BOOKIE_LOST, Severity.BELOW_AQ) for lid in (1, 2)]
    frags.append(_frag("lost-1", 5, "b:4", Reason.BOOKIE_LOST, Severity.BELOW_AQ))
    swap = {"status": ActionStatus.DONE, "action": ActionKind.METADATA_UPDATE,
            "segment_first_entry_id": 0}  # fmt: skip
    actions = [
        {**swap, "ledger_id": 1, "old_bookie": "b:3", "finished_at": T0 + timedelta(hours=1)},
        # One update swapping two bookies names both.
        {**swap, "ledger_id": 2, "old_bookie": "b:9,b:3", "finished_at": T0 + timedelta(hours=2)},
    ]
    now = T0 + timedelta(hours=3)
    losses = {
        r["bookie_id"]: r for r in bookie_losses(time_to_repair(frags, actions), {"b:4"}, now)
    }
    assert losses["b:3"]["status"] == "repaired"
    assert losses["b:3"]["seconds_to_repair"] == 7200.0
    assert losses["b:3"]["seconds_since_loss"] == 3 * 3600.0
    assert losses["b:4"]["status"] == BookieState.LOST
    assert losses["b:4"]["seconds_to_repair"] is None
    assert [fmt_duration(s) for s in (0, 59, 61, 7200, 90061)] == [
        "0 s", "59 s", "1 min 1 s", "2 h", "1 d 1 h"
    ]  # fmt: skip


def _action(run: str, lid: int, status: str, minutes: int, **kw: Any) -> dict[str, Any]:
    row = {"run_id": run, "mode": "rereplicate", "ledger_id": lid, "segment_first_entry_id": 0,
           "action": ActionKind.COPY, "status": status, "old_bookie": "b:3",
           "new_bookie": "b:5", "error": None, "topic": None,
           "started_at": T0 + timedelta(minutes=minutes),
           "finished_at": T0 + timedelta(minutes=minutes, seconds=1)}  # fmt: skip
    return {**row, **kw}


def test_a_later_dry_run_does_not_hide_a_real_failure() -> None:
    failing = [
        _action("real", 1, ActionStatus.FAILED, 1, error="ADD_ENTRY failed: EIO"),
        _action("dry", 2, ActionStatus.FAILED, 2, error="not enough bookies"),
        _action("older", 3, ActionStatus.FAILED, 0, error="gone"),
    ]
    latest = {1: "dry", 2: "dry", 3: "newer"}
    latest_real = {1: "real", 2: "real", 3: "newer"}
    got = failed_repairs(failing, latest, latest_real, {"dry"})
    assert [(r["ledger_id"], r["dry_run"], r["error"]) for r in got] == [
        (1, False, "ADD_ENTRY failed: EIO"),
        (2, True, "not enough bookies"),
    ]
    per_status = [
        {"run_id": "dry", "mode": "rereplicate", "status": ActionStatus.PLANNED, "actions": 3,
         "started_at": T0, "finished_at": T0},
        {"run_id": "dry", "mode": "rereplicate", "status": ActionStatus.FAILED, "actions": 1,
         "started_at": T0, "finished_at": T0},
    ]  # fmt: skip
    (run,) = repair_runs(per_status)
    assert run["dry_run"] and run["statuses"] == {"PLANNED": 3, "FAILED": 1}


def test_manual_steps_until_a_later_unload_is_done() -> None:
    unload = {"action": ActionKind.UNLOAD_TOPIC, "old_bookie": None}
    rows = [
        _action(
            "r1", 1, ActionStatus.MANUAL, 0, topic="t1", error="run: pulsar-admin ...", **unload
        ),
        _action("r1", 2, ActionStatus.MANUAL, 0, topic="t2", **unload),
        _action("r2", 2, ActionStatus.DONE, 5, topic="t2", **unload),
    ]
    assert [(m["topic"], m["error"]) for m in manual_steps(rows)] == [
        ("t1", "run: pulsar-admin ...")
    ]


def _data(**kw: Any) -> ReportData:
    run = RUNS[2]
    return ReportData("/wh", run, T0 + timedelta(hours=1), runs_shown=[run],
                      checks_not_run=[Check.SAMPLE], **kw)  # fmt: skip


def test_page_only_unknown_findings_are_the_worst_and_not_run_is_neutral() -> None:
    finding = {**_frag("lost-2", 1, "b:1", Reason.BOOKIE_UNREACHABLE, None), "check": Check.SAMPLE,
               "segment_last_entry_id": 7, "repair_status": ActionStatus.MANUAL}  # fmt: skip
    page = render_html(
        _data(
            findings=[finding],
            findings_total=1,
            per_bookie=fragments_per_bookie([finding]),
            manual=[
                {
                    "action": ActionKind.UNLOAD_TOPIC,
                    "topic": "persistent://t/n/x",
                    "ledger_id": 1,
                    "error": "unload it",
                    "run_id": "r",
                    "started_at": T0,
                }
            ],
        )
    )
    assert '<b class="bad">UNKNOWN (1)</b><span>worst severity</span>' in page
    assert 'data-severity="UNKNOWN"' in page and 'data-series="UNKNOWN"' in page
    assert '<tr data-check="sample" data-status="not-run" class="not-run">' in page
    assert '<span class="badge manual">manual step</span>' in page
    assert 'id="manual-steps"' in page and "unload it" in page
    # A MANUAL step is not a failure: nothing counts as failed.
    assert '<b class="">0</b><span>failed repairs</span>' in page
