"""The report's Arrow queries (jobs.reports.arrow_queries) give what their plain-Python twins
in jobs.reports.queries and bklib.repair.outcome give, on the same rows: ties, nulls, buckets
and runs included."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from typing import Any

import pyarrow as pa
import pytest

from bklib.repair.outcome import repair_status
from bklib.states import ActionKind, ActionStatus, Severity
from jobs.reports import arrow_queries, queries
from jobs.tables.delta import arrow_rows
from jobs.tables.schema import ACTIONS_TABLE_SCHEMA

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
STATUSES = [ActionStatus.DONE, ActionStatus.FAILED, ActionStatus.WAITING_GRACE,
            ActionStatus.NO_REPLICA, ActionStatus.SKIPPED]  # fmt: skip


def _actions(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        # Few distinct times, so that ties on both keys are common.
        started = T0 + timedelta(seconds=rng.choice([0, 1, 59, 60, 3599, 3600, 86400]))
        finished = None if rng.random() < 0.2 else started + timedelta(
            microseconds=rng.choice([0, 1, 999_999, 1_000_000, 60_000_000]))  # fmt: skip
        rows.append({
            "run_id": f"r{rng.randrange(4)}", "mode": "rereplicate", "audit_run_id": "a",
            "ledger_id": rng.randrange(12), "segment_first_entry_id": 0,
            "old_bookie": "b:1", "new_bookie": "b:2",
            "action": rng.choice([ActionKind.COPY, ActionKind.COPY, ActionKind.METADATA_UPDATE]),
            "entries_copied": None if rng.random() < 0.1 else rng.randrange(100),
            "bytes_copied": None if rng.random() < 0.1 else rng.randrange(10_000),
            "status": rng.choice(STATUSES), "error": f"e{i}", "started_at": started,
            "finished_at": finished, "no_replica_entries": [i],
        })  # fmt: skip
    return rows


def _table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=ACTIONS_TABLE_SCHEMA)


@pytest.mark.parametrize("seed", range(8))
def test_actions_queries_match_their_python_twins(seed: int) -> None:
    rows = _actions(300, seed)
    table = _table(rows)
    as_read = arrow_rows(table)  # what the Python twins get from a read
    span = queries.finished_span_seconds(as_read)
    assert arrow_queries.finished_span_seconds(table) == span
    for bucket in (60, 3600, 86400, queries.choose_bucket_seconds(span)):
        assert arrow_queries.repair_throughput(table, bucket) == queries.repair_throughput(
            as_read, bucket
        )
    latest = arrow_rows(arrow_queries.latest_action_per_ledger(table))
    assert sorted(latest, key=lambda r: r["ledger_id"]) == [
        dict(a) for _, a in sorted(queries._latest(as_read, lambda a: a["ledger_id"]).items())
    ]
    assert queries.stuck_ledgers(latest) == queries.stuck_ledgers(as_read)


def test_empty_and_unfinished_actions() -> None:
    empty = _table([])
    assert arrow_queries.finished_span_seconds(empty) == 0
    assert arrow_queries.repair_throughput(empty, 60) == []
    assert arrow_queries.latest_action_per_ledger(empty).num_rows == 0
    unfinished = [dict(r, finished_at=None) for r in _actions(5, 1)]
    assert arrow_queries.finished_span_seconds(_table(unfinished)) == 0
    assert arrow_queries.repair_throughput(_table(unfinished), 60) == []


def test_severity_over_runs_matches_its_python_twin() -> None:
    rng = random.Random(3)
    runs = [
        {"run_id": f"r{i}", "started_at": T0 + timedelta(hours=i), "check": "lost",
         "status": rng.choice(["COMPLETED", "COMPLETED_WITH_ERRORS", "FAILED"])}
        for i in range(40)
    ]  # fmt: skip
    frags = [
        {"run_id": f"r{rng.randrange(42)}", "ledger_id": rng.choice([None, *range(30)]),
         "severity": rng.choice([*Severity.ALL, None, "OTHER"])}
        for _ in range(2000)
    ]  # fmt: skip
    columns = [("run_id", pa.string()), ("ledger_id", pa.int64()), ("severity", pa.string())]
    table = pa.Table.from_pylist(frags, schema=pa.schema(columns))
    for limit in (0, 1, 5, 30, 50):
        assert arrow_queries.severity_over_runs(runs, table, limit) == queries.severity_over_runs(
            runs, frags, limit
        )


def _repair_rows(seed: int) -> list[dict[str, Any]]:
    """Few ledgers, runs and start times: SKIPPED runs after REPAIRED ones, dry runs,
    unloads (no bearing on repair status), rows before the audit and ties are common."""
    rng = random.Random(seed)
    statuses = [ActionStatus.DONE, ActionStatus.SKIPPED, ActionStatus.SKIPPED,
                ActionStatus.PLANNED, ActionStatus.FAILED, ActionStatus.WAITING_GRACE]  # fmt: skip
    actions = [ActionKind.COPY, ActionKind.METADATA_UPDATE, ActionKind.SKIP,
               ActionKind.UNLOAD_TOPIC]  # fmt: skip
    return [
        {"run_id": f"r{rng.randrange(4)}", "mode": "rereplicate", "audit_run_id": "a",
         "ledger_id": rng.randrange(6), "segment_first_entry_id": 0, "old_bookie": "b:1",
         "new_bookie": "b:2", "action": rng.choice(actions), "status": rng.choice(statuses),
         "error": rng.choice([None, "", f"e{i}"]),
         "started_at": T0 + timedelta(seconds=rng.choice([-5, 0, 1, 2, 3, 4])),
         "finished_at": None}
        for i in range(rng.randrange(60))
    ]  # fmt: skip


@pytest.mark.parametrize("seed", range(40))
def test_repair_status_of_matches_its_python_twin(seed: int) -> None:
    table = _table(_repair_rows(seed))
    for since in (None, T0):
        expected = repair_status(arrow_rows(table), since)
        decided = arrow_rows(arrow_queries.repair_status_of(table, since))
        assert {r["ledger_id"]: (r.pop("outcome"), r) for r in decided} == expected


def test_repair_status_of_keeps_a_repair_that_later_runs_only_skip() -> None:
    def act(run: str, status: str, second: int) -> dict[str, Any]:
        started = T0 + timedelta(seconds=second)
        return {"run_id": run, "mode": "rereplicate", "ledger_id": 7, "action": ActionKind.COPY,
                "status": status, "error": None, "started_at": started}  # fmt: skip

    repaired_then_skipped = [act("r1", ActionStatus.DONE, 1), act("r2", ActionStatus.SKIPPED, 2),
                             act("r3", ActionStatus.SKIPPED, 3)]  # fmt: skip
    failed_then_skipped = [act("r1", ActionStatus.FAILED, 1), act("r2", ActionStatus.SKIPPED, 2)]
    for rows, outcome, run in (
        (repaired_then_skipped, "REPAIRED", "r1"),
        (failed_then_skipped, ActionStatus.SKIPPED, "r2"),
    ):
        decided = arrow_rows(arrow_queries.repair_status_of(pa.Table.from_pylist(rows), None))
        assert [(d["outcome"], d["run_id"]) for d in decided] == [(outcome, run)]
    assert arrow_queries.repair_status_of(_table([]), T0).num_rows == 0
