"""``listunderreplicated``'s report text, made over Arrow columns (jobs.commands.listing):
each part of a fragment's line is printed only when it has a value, ledgers and their
fragments come in order, older tables without the newer columns still list, and each
ledger's repair note follows from the actions since the audit."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pyarrow as pa

from bklib.states import ActionKind, ActionStatus, Severity
from jobs.commands.listing import FRAGMENT_COLUMNS, RepairsSince, format_report
from jobs.reports.arrow_queries import repair_status_of
from jobs.tables.schema import ACTIONS_TABLE_SCHEMA, FRAGMENTS_TABLE_SCHEMA

AUDIT = datetime(2026, 11, 28, 8, 0, tzinfo=timezone.utc)
STARTED = AUDIT - timedelta(minutes=2)
RUN = {"run_id": "audit-1", "check": "lost", "status": "COMPLETED", "finished_at": AUDIT,
       "zk": "zk:2181", "started_at": STARTED}  # fmt: skip


def _frag(lid: int, first: int, bookie: str, **values: Any) -> dict[str, Any]:
    row = {"run_id": "audit-1", "ledger_id": lid, "segment_index": 0, "bookie_index": 0,
           "segment_first_entry_id": first, "segment_last_entry_id": first + 9,
           "bookie_id": bookie, "reason": "BOOKIE_LOST", "missing_entries": None,
           "unknown_entries": None, "severity": None, "min_replicas": None,
           "ledger_state": None, "first_detected_at": None, "error": None}  # fmt: skip
    return {**row, **values}


def _fragments(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=FRAGMENTS_TABLE_SCHEMA).select(FRAGMENT_COLUMNS)


def test_each_part_of_a_line_is_printed_only_with_a_value() -> None:
    detected = AUDIT - timedelta(days=1, microseconds=1)  # printed to the second, floored
    frags = _fragments([
        _frag(5, 0, "b2:3181", segment_last_entry_id=None, missing_entries=0,
              unknown_entries=0, severity="", ledger_state="", error=""),
        _frag(5, 0, "b1:3181", missing_entries=10, unknown_entries=3,
              severity=Severity.NO_REPLICA, min_replicas=1, ledger_state="OPEN",
              first_detected_at=detected,
              error="read timed out"),
        _frag(3, 10, "b1:3181", severity=Severity.BELOW_WQ),
        _frag(3, 0, "b1:3181", missing_entries=4),
    ])  # fmt: skip
    lines = format_report(RUN, frags, []).splitlines()
    assert lines == [
        "audit run audit-1: check lost, COMPLETED, finished 2026-11-28 08:00:00 UTC, zk zk:2181",
        "3",
        "\tMissingReplica : b1:3181  segment [0, 9]  BOOKIE_LOST  4 entries",
        "\tMissingReplica : b1:3181  segment [10, 19]  BOOKIE_LOST  BELOW_WQ (min replicas ?)",
        "5",
        "\tMissingReplica : b1:3181  segment [0, 9]  BOOKIE_LOST  10 entries  3 unknown  "
        "NO_REPLICA (min replicas 1)  OPEN  since 2026-11-27 07:59:59  (read timed out)",
        "\tMissingReplica : b2:3181  segment [0, LAC?]  BOOKIE_LOST  0 entries",
        "2 under-replicated ledgers, 4 fragments, 0 unreadable znodes; worst severity NO_REPLICA",
    ]


def test_a_table_written_before_the_newer_columns_still_lists() -> None:
    old = _fragments(
        [_frag(1, 0, "b1:3181", severity=Severity.BELOW_AQ, min_replicas=2)]
    ).drop_columns(["unknown_entries", "first_detected_at", "topic", "component", "ledger_state"])
    assert format_report(RUN, old, []).splitlines()[1:3] == [
        "1",
        "\tMissingReplica : b1:3181  segment [0, 9]  BOOKIE_LOST  BELOW_AQ (min replicas 2)",
    ]


def test_repair_notes_say_what_the_runs_since_the_audit_did() -> None:
    def act(lid: int, status: str, minute: int, error: str | None) -> dict[str, Any]:
        return {"run_id": f"fix-{lid}", "mode": "rereplicate", "ledger_id": lid,
                "action": ActionKind.COPY, "status": status, "error": error,
                "started_at": AUDIT + timedelta(minutes=minute, microseconds=500)}  # fmt: skip

    actions = pa.Table.from_pylist(
        [act(1, ActionStatus.DONE, 1, "ignored once repaired"),
         act(2, ActionStatus.FAILED, 2, "no writable bookie"),
         act(3, ActionStatus.FAILED, 3, "")],
        schema=ACTIONS_TABLE_SCHEMA,
    )  # fmt: skip
    repairs = RepairsSince.of(repair_status_of(actions, STARTED))
    frags = _fragments([_frag(lid, 0, "b1:3181") for lid in (1, 2, 3, 4)])
    details = [line for line in format_report(RUN, frags, [], repairs).splitlines() if "\t" in line]
    assert [d.split("BOOKIE_LOST")[1] for d in details] == [
        "  repair since: REPAIRED (rereplicate fix-1, 2026-11-28 08:01:00)",
        "  repair since: FAILED: no writable bookie (rereplicate fix-2, 2026-11-28 08:02:00)",
        "  repair since: FAILED (rereplicate fix-3, 2026-11-28 08:03:00)",
        "",
    ]
    summary = format_report(RUN, frags, [], repairs).splitlines()[-1]
    assert summary.startswith("1 of these ledgers were repaired after this audit and 3 still")
    assert repairs.resolved(1) and not repairs.resolved(2) and not repairs.resolved(4)


def test_no_fragments_and_unreadable_znodes() -> None:
    empty = _fragments([])
    assert format_report(RUN, empty, []).splitlines()[-1] == "no under-replicated ledgers"
    error = {"ledger_id": 9, "znode_path": "/ledgers/00/0000/L0009", "error": "bad protobuf"}
    assert format_report(RUN, empty, [error]).splitlines()[-2:] == [
        "unreadable metadata: ledger 9 at /ledgers/00/0000/L0009: bad protobuf",
        "0 under-replicated ledgers, 0 fragments, 1 unreadable znodes; worst severity none",
    ]


def test_an_incomplete_run_says_so_first_and_is_never_clean() -> None:
    run = {**RUN, "status": "COMPLETED_WITH_ERRORS",
           "counts": {"metadata_errors": 2, "reason_BOOKIE_UNREACHABLE": 44}}  # fmt: skip
    for frags in (_fragments([]), _fragments([_frag(3, 0, "b1:3181", missing_entries=4)])):
        lines = format_report(run, frags, []).splitlines()
        assert lines[0].startswith("INCOMPLETE: audit run audit-1 is COMPLETED_WITH_ERRORS")
        assert "(2 unreadable znodes, 44 fragments on unreachable bookies)" in lines[0]
        assert "no under-replicated ledgers" not in lines
    # the complete run over no fragments is the only clean bill
    assert format_report(RUN, _fragments([]), []).splitlines()[-1] == "no under-replicated ledgers"
