"""``bkaudit maintain``'s retention rules on their own (:mod:`jobs.tables.retention`): rows in,
decisions out, no warehouse and no server. The same rules on real Delta tables are
``tests/spark/test_maintain.py``."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone
from typing import Any

import pyarrow as pa

from bklib.states import ActionKind, ActionStatus, Check, RepairMode, RunStatus
from jobs.tables.retention import (
    AuditRun,
    Deletion,
    RetentionPlan,
    deletions,
    latest_per_check,
    open_finding_runs,
    plan_retention,
    repair_runs,
)
from jobs.tables.schema import (
    ACTIONS,
    AUDIT_RUNS,
    BLAST_RADIUS,
    BOOKIES,
    FRAGMENTS,
    LEDGERS,
    PULSAR_CHECKS,
    PULSAR_REFERENCES,
    TRIAGE,
)

NOW = datetime(2026, 3, 1, 12, tzinfo=timezone.utc)
CUTOFF = NOW - timedelta(days=30)


def _action(
    run_id: str,
    audit_run: str,
    ledger: int,
    status: str,
    at: datetime,
    mode: str = RepairMode.REREPLICATE,
) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "mode": mode,
        "audit_run_id": audit_run,
        "ledger_id": ledger,
        "segment_first_entry_id": 0,
        "segment_last_entry_id": 9,
        "old_bookie": "10.0.0.7:3181",
        "new_bookie": "10.0.0.8:3181",
        "action": ActionKind.COPY,
        "entries_copied": 10,
        "bytes_copied": 1000,
        "no_replica_entries": None,
        "status": status,
        "error": None,
        "started_at": at,
        "finished_at": at + timedelta(seconds=5),
        "executor": "local",
    }


def _run(run_id: str, check: str, days_ago: float, status: str = RunStatus.COMPLETED) -> AuditRun:
    return AuditRun(run_id, check, status, NOW - timedelta(days=days_ago))


def test_open_findings_rule() -> None:
    """The rule on its own: cleared by a later COMPLETED audit of the same check, resolved by
    a later repair, otherwise open (and only its last report is kept)."""
    t = NOW - timedelta(days=60)

    def run(i: int, check: str, status: str = RunStatus.COMPLETED) -> AuditRun:
        return AuditRun(f"r{i}", check, status, t + timedelta(days=i))

    runs = [
        run(0, Check.DEEP),
        run(1, Check.DEEP, RunStatus.COMPLETED_WITH_ERRORS),
        run(2, Check.DEEP, RunStatus.COMPLETED_WITH_ERRORS),
        run(3, Check.LOST),
        run(4, Check.LOST),
        run(5, Check.LOST, RunStatus.FAILED),
    ]

    def frag(run_id: str, ledger: int) -> dict[str, Any]:
        return {
            "run_id": run_id,
            "ledger_id": ledger,
            "segment_first_entry_id": 0,
            "bookie_id": "b",
        }

    fragments = [
        frag("r0", 7),  # deep: seen in r0 and r1, not in r2 (with errors): last report r1
        frag("r1", 7),
        frag("r1", 8),  # repaired after r1: resolved
        frag("r3", 9),  # lost: r4 COMPLETED without it: cleared
    ]
    actions = [_action("p1", "r1", 8, ActionStatus.DONE, t + timedelta(days=1, hours=1))]
    assert open_finding_runs(runs, fragments, actions) == {"r1": "last report of 1 open finding"}
    # Once a complete deep audit no longer lists ledger 7, nothing is open.
    runs.append(run(6, Check.DEEP))
    assert open_finding_runs(runs, fragments, actions) == {}


def test_latest_run_and_latest_finished_run_of_each_check_are_kept() -> None:
    runs = [
        _run("d1", Check.DEEP, 50),
        _run("d2", Check.DEEP, 45, RunStatus.COMPLETED_WITH_ERRORS),
        _run("d3", Check.DEEP, 40, RunStatus.FAILED),
        _run("l1", Check.LOST, 60),
    ]
    assert latest_per_check(runs) == {
        "d3": f"latest {Check.DEEP} run",
        "d2": f"latest finished {Check.DEEP} run",
        "l1": f"latest {Check.LOST} run",
    }


def test_repair_runs_group_actions_by_run() -> None:
    t = NOW - timedelta(days=3)
    actions = [
        _action("p1", "a1", 5, ActionStatus.DONE, t + timedelta(minutes=2)),
        _action("p1", "a1", 6, ActionStatus.DONE, t),
        {**_action("p2", "", 7, ActionStatus.DONE, t), "started_at": None},
    ]
    by_id = {p.run_id: p for p in repair_runs(actions)}
    assert by_id["p1"].started_at == t
    assert by_id["p1"].audit_run_ids == frozenset({"a1"})
    assert by_id["p1"].ledgers == frozenset({5, 6})
    # No start time and no audit run: the oldest possible, from nothing.
    assert by_id["p2"].started_at == datetime.min.replace(tzinfo=timezone.utc)
    assert by_id["p2"].audit_run_ids == frozenset()


def test_plan_keeps_recent_latest_open_runs_and_their_repair_history() -> None:
    runs = [
        _run("old", Check.REPLICAS, 50),
        _run("open", Check.REPLICAS, 45, RunStatus.COMPLETED_WITH_ERRORS),
        _run("latest", Check.REPLICAS, 40, RunStatus.COMPLETED_WITH_ERRORS),
        _run("recent", Check.LOST, 2),
    ]
    day = timedelta(days=1)
    actions = [
        _action("p-recent", "recent", 1, ActionStatus.DONE, NOW - day),
        _action("p-open", "open", 2, ActionStatus.FAILED, NOW - 44 * day),
        # Worked from a deleted run, but touched a kept run's ledger after that run: history.
        _action("p-history", "old", 3, ActionStatus.FAILED, NOW - 39 * day),
        # Same, but before the kept run started: not part of its history.
        _action("p-before", "old", 3, ActionStatus.FAILED, NOW - 49 * day),
        _action("p-recover", "", 4, ActionStatus.DONE, NOW - 48 * day, RepairMode.RECOVER),
    ]
    plan = plan_retention(
        runs,
        cutoff=CUTOFF,
        open_runs={"open": "last report of 1 open finding"},
        actions=actions,
        kept_run_ledgers={"latest": {3}},
        other_runs={
            BLAST_RADIUS: {"b-old": NOW - 90 * day, "b-older": NOW - 91 * day},
            TRIAGE: {"t-new": NOW - day, "t-old": NOW - 60 * day},
            PULSAR_CHECKS: {},
        },
    )
    assert plan.cutoff_day == CUTOFF.date()
    assert plan.kept_audit == {
        "recent": "recent",
        "latest": f"latest {Check.REPLICAS} run",
        "open": "last report of 1 open finding",
    }
    assert plan.deleted_audit == {"old"}
    assert plan.kept_repair == {
        "p-recent": "recent",
        "p-open": "repairs a kept audit run",
        "p-history": "repair history of a kept audit run",
        "p-recover": f"latest {RepairMode.RECOVER} run",
    }
    assert plan.deleted_repair == {"p-before"}
    assert plan.kept_other == {
        BLAST_RADIUS: {"b-old": "latest run"},
        TRIAGE: {"t-new": "recent"},
        PULSAR_CHECKS: {},
    }
    assert plan.deleted_other == {
        BLAST_RADIUS: {"b-older"},
        TRIAGE: {"t-old"},
        PULSAR_CHECKS: set(),
    }


def test_repair_history_of_an_old_kept_run_is_kept() -> None:
    day = timedelta(days=1)
    runs = [_run("kept", Check.REPLICAS, 40), _run("gone", Check.REPLICAS, 50)]
    runs.append(_run("newest", Check.REPLICAS, 1))
    actions = [
        _action("p-newest", "newest", 9, ActionStatus.DONE, NOW - day),
        _action("p-after", "gone", 3, ActionStatus.FAILED, NOW - 39 * day),
        _action("p-other-ledger", "gone", 4, ActionStatus.FAILED, NOW - 38 * day),
    ]
    plan = plan_retention(
        runs,
        cutoff=CUTOFF,
        open_runs={"kept": "last report of 1 open finding"},
        actions=actions,
        kept_run_ledgers={"kept": {3}},
    )
    assert plan.kept_repair == {
        "p-newest": "recent",
        "p-after": "repair history of a kept audit run",
    }
    assert plan.deleted_repair == {"p-other-ledger"}
    assert plan.kept_other == {} and plan.deleted_other == {}


def test_deletion_predicates_quote_chunk_and_spare_kept_runs() -> None:
    d = Deletion(FRAGMENTS, {"b", "a'x"}, date(2026, 1, 31), {"k1"})
    assert d.predicates() == [
        "run_date < '2026-01-31' AND run_id NOT IN ('k1')",
        "run_id IN ('a''x', 'b')",
    ]
    many = Deletion(AUDIT_RUNS, {f"r{i:04d}" for i in range(1001)})
    assert [p.count("'") // 2 for p in many.predicates()] == [500, 500, 1]
    assert Deletion(TRIAGE).empty() and Deletion(TRIAGE).predicates() == []


def test_deletion_expression_selects_the_same_rows() -> None:
    rows = pa.table(
        {
            "run_id": ["gone", "kept", "orphan", "today"],
            "run_date": pa.array(
                [date(2026, 1, 2), date(2026, 1, 2), date(2026, 1, 3), date(2026, 2, 1)],
                pa.date32(),
            ),
        }
    )
    d = Deletion(FRAGMENTS, {"today"}, date(2026, 1, 31), {"kept"})
    assert rows.filter(d.expression()).column("run_id").to_pylist() == [
        "gone",
        "orphan",
        "today",
    ]
    named = Deletion(FRAGMENTS, {"gone"})
    assert rows.filter(named.expression()).column("run_id").to_pylist() == ["gone"]


def test_deletions_name_only_what_the_partition_rule_misses() -> None:
    cut = NOW - timedelta(days=30)
    plan = RetentionPlan(
        cutoff=cut,
        kept_audit={"a-old-kept": "latest", "a-new": "recent"},
        deleted_audit={"a-old", "a-cutoff-day"},
        kept_repair={"p-old-kept": "latest"},
        deleted_repair={"p-old"},
        deleted_other={BLAST_RADIUS: {"b1"}},
    )
    day = cut.date()
    runs_day = {
        "a-old-kept": day - timedelta(days=5),
        "a-new": day + timedelta(days=3),
        "a-old": day - timedelta(days=9),
        "a-cutoff-day": day,
        "p-old-kept": day - timedelta(days=2),
        "p-old": day - timedelta(days=4),
    }
    out = {d.table: d for d in deletions(plan, runs_day)}
    assert next(iter(deletions(plan, runs_day))).table == AUDIT_RUNS  # readers lose it first
    assert out[AUDIT_RUNS] == Deletion(AUDIT_RUNS, {"a-old", "a-cutoff-day"})
    for table in (FRAGMENTS, LEDGERS, BOOKIES):
        assert out[table] == Deletion(table, {"a-cutoff-day"}, day, {"a-old-kept"})
    assert out[ACTIONS] == Deletion(ACTIONS, set(), day, {"p-old-kept"})
    assert out[BLAST_RADIUS] == Deletion(BLAST_RADIUS, {"b1"})
    for table in (TRIAGE, PULSAR_CHECKS, PULSAR_REFERENCES):
        assert out[table].empty()
