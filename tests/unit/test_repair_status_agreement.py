"""``listunderreplicated`` and the HTML report say the same of every finding's repair status
(one rule: :func:`jobs.commands.listing.repair_status`), after a partial repair too."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from bklib.repair.outcome import repair_status
from bklib.states import ActionKind, ActionStatus
from jobs.reports.queries import findings_with_repair_status

AUDIT = datetime(2026, 11, 27, 8, 0, tzinfo=timezone.utc)


def _frag(lid: int, bookie: str) -> dict[str, Any]:
    return {"ledger_id": lid, "segment_first_entry_id": 0, "bookie_id": bookie}


def _act(lid: int, bookie: str, action: str, status: str, minute: int, run: str = "r1") -> dict:
    return {
        "run_id": run,
        "mode": "rereplicate",
        "ledger_id": lid,
        "segment_first_entry_id": 0,
        "old_bookie": bookie,
        "action": action,
        "status": status,
        "error": None if status == ActionStatus.DONE else f"{action} {status}",
        "started_at": AUDIT + timedelta(minutes=minute),
        "finished_at": AUDIT + timedelta(minutes=minute, seconds=30),
    }


def test_both_reports_agree_after_a_partial_repair() -> None:
    frags = [_frag(1, "b1"), _frag(1, "b2"), _frag(2, "b1"), _frag(3, "b1"), _frag(4, "b9")]
    actions = [
        # Ledger 1: one fragment copied, the other failed in the same run: not repaired.
        _act(1, "b1", ActionKind.COPY, ActionStatus.DONE, 1),
        _act(1, "b2", ActionKind.COPY, ActionStatus.FAILED, 2),
        # Ledger 2: repaired, then a later run only skips it: still repaired.
        _act(2, "b1", ActionKind.COPY, ActionStatus.DONE, 1),
        _act(2, "b1", ActionKind.METADATA_UPDATE, ActionStatus.DONE, 2),
        _act(2, "b1", ActionKind.SKIP, ActionStatus.SKIPPED, 5, run="r2"),
        # Ledger 3: a repair before the audit does not count.
        _act(3, "b1", ActionKind.COPY, ActionStatus.DONE, -10, run="r0"),
        # Ledger 1's topic unloaded later: no bearing on its repair status.
        {**_act(1, "b1", ActionKind.UNLOAD_TOPIC, ActionStatus.DONE, 9, run="r3"), "topic": "t"},
    ]
    listed = repair_status(actions, AUDIT)
    shown = findings_with_repair_status(frags, actions, AUDIT)
    for f in shown:
        assert f["repair_status"] == listed.get(f["ledger_id"], (None,))[0], f
    assert [f["repair_status"] for f in shown] == [
        ActionStatus.FAILED,
        ActionStatus.FAILED,
        "REPAIRED",
        None,
        None,
    ]


def test_a_dry_run_decides_only_a_ledger_no_real_run_touched() -> None:
    import pyarrow as pa

    from bklib.repair.outcome import DRY_RUN
    from jobs.reports.arrow_queries import repair_status_of
    from jobs.tables.delta import arrow_rows

    actions = [
        # Ledger 1: a real run failed, a dry run since: still FAILED (a plan changed nothing).
        _act(1, "b1", ActionKind.COPY, ActionStatus.FAILED, 1, run="r1"),
        _act(1, "b1", ActionKind.COPY, ActionStatus.PLANNED, 2, run="r2"),
        # Ledger 2: only a dry run: it decides, as a dry run.
        _act(2, "b1", ActionKind.COPY, ActionStatus.PLANNED, 2, run="r2"),
        # Ledger 3: a dry run, then a real repair: the repair decides.
        _act(3, "b1", ActionKind.COPY, ActionStatus.PLANNED, 2, run="r2"),
        _act(3, "b1", ActionKind.COPY, ActionStatus.DONE, 3, run="r3"),
    ]
    listed = {lid: (o, a["run_id"]) for lid, (o, a) in repair_status(actions, AUDIT).items()}
    assert listed == {1: (ActionStatus.FAILED, "r1"), 2: (DRY_RUN, "r2"), 3: ("REPAIRED", "r3")}
    decided = arrow_rows(repair_status_of(pa.Table.from_pylist(actions), AUDIT))
    assert {d["ledger_id"]: (d["outcome"], d["run_id"]) for d in decided} == listed
