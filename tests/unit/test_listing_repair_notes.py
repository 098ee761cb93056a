"""The note ``listunderreplicated`` prints under each ledger a repair or a dry run decided
since the audit: a dry run is marked as one and never reads as a repair's status
(docs/repair.md, "Dry run")."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pyarrow as pa

from bklib.states import ActionKind, ActionStatus
from jobs.commands.listing import ACTION_COLUMNS, RepairsSince, plan_blockers
from jobs.reports.arrow_queries import repair_status_of

AUDIT = datetime(2026, 12, 1, 8, 0, tzinfo=timezone.utc)
SCHEMA = pa.schema(
    [("ledger_id", pa.int64()), ("run_id", pa.string()), ("mode", pa.string()),
     ("action", pa.string()), ("status", pa.string()), ("error", pa.string()),
     ("started_at", pa.timestamp("us", tz="UTC"))]
)  # fmt: skip


def _act(lid: int, run: str, status: str, second: int, error: str | None = None) -> dict[str, Any]:
    started = AUDIT + timedelta(seconds=second)
    return {"ledger_id": lid, "run_id": run, "mode": "rereplicate", "action": ActionKind.COPY,
            "status": status, "error": error, "started_at": started}  # fmt: skip


def _notes(rows: list[dict[str, Any]]) -> RepairsSince:
    actions = pa.Table.from_pylist(rows, schema=SCHEMA)
    assert tuple(actions.column_names) == ACTION_COLUMNS
    return RepairsSince.of(plan_blockers(repair_status_of(actions, AUDIT), actions))


def test_a_dry_run_is_marked_and_names_the_step_it_could_not_plan() -> None:
    no_target = "NotEnoughBookiesError: no writable bookie can replace b:3"
    repairs = _notes(
        [
            _act(1, "dry", ActionStatus.PLANNED, 1),
            _act(2, "dry", ActionStatus.PLANNED, 1, no_target),  # the first copy has no target
            _act(2, "dry", ActionStatus.PLANNED, 2),  # the row that decides has none to say
            _act(3, "real", ActionStatus.FAILED, 1, "copy failed"),
            _act(3, "dry", ActionStatus.PLANNED, 2, no_target),  # after a real run: no say
        ]
    )
    assert repairs.notes[1].startswith("dry run since: would repair (rereplicate dry, ")
    assert repairs.notes[2].startswith(f"dry run since: would not repair: {no_target} (")
    assert repairs.notes[3].startswith("repair since: FAILED: copy failed (rereplicate real, ")
    assert not any("FAILED" in repairs.notes[lid] for lid in (1, 2))
    assert not any(repairs.resolved(lid) for lid in (1, 2, 3))


def test_no_dry_run_leaves_the_notes_as_they_were() -> None:
    repairs = _notes(
        [_act(4, "real", ActionStatus.DONE, 1), _act(5, "real", ActionStatus.SKIPPED, 1)]
    )
    assert repairs.notes[4].startswith("repair since: REPAIRED (rereplicate real, ")
    assert repairs.notes[5].startswith("repair since: SKIPPED (rereplicate real, ")
    assert repairs.resolved(4) and repairs.resolved(5)
