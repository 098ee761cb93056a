"""A loss's first ledgers (jobs/watch/first_ledgers.py): which ledgers are taken, which the
audit's marks and repair then leave out, and what a failure leaves (everything to the audit)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from bklib.audit.model import LedgerView
from bklib.meta.model import LedgerMetadata, Segment
from bklib.repair.requests import LedgerRequest
from bklib.states import ActionKind, ActionStatus
from jobs.watch.first_ledgers import (
    FIRST_LEDGERS,
    FirstLedgers,
    first_requests,
    resolved_ledgers,
)
from jobs.watch.spool import SpoolFullError

LOST, OTHER = "10.0.0.9:3181", "10.0.0.8:3181"


def view(lid: int, *ensembles: tuple[str, ...], closed: bool = True) -> LedgerView:
    segs = tuple(Segment(i * 10, e) for i, e in enumerate(ensembles))
    md = LedgerMetadata(lid, 2, 2, 1, segs)
    if closed:
        md = md.closed(len(segs) * 10 - 1, 100)
    return LedgerView.from_metadata(md, f"/ledgers/L{lid}", 0)


def row(lid: int, action: str, status: str, at: int, run: str = "r1") -> dict[str, Any]:
    t0 = datetime(2026, 12, 3, tzinfo=timezone.utc)
    return {
        "ledger_id": lid,
        "action": action,
        "status": status,
        "started_at": t0 + timedelta(seconds=at),
        "run_id": run,
    }


def test_only_closed_readable_ledgers_naming_a_due_bookie_are_taken_in_order() -> None:
    views = [
        None,  # deleted since the index named it
        LedgerView.unreadable(2, "/ledgers/L2", "CorruptMetadataError: bad"),
        view(3, ("a:1", LOST), closed=False),  # open: its grace period is the audit's to keep
        view(4, ("a:1", "b:1")),  # names no due bookie
        view(5, ("a:1", "b:1"), (LOST, OTHER)),  # both due, named in its second segment
        view(6, (LOST, "b:1")),
    ]
    reqs = first_requests(views, frozenset({LOST, OTHER}))
    assert [(q.ledger_id, q.bad_bookies) for q in reqs] == [
        (5, frozenset({LOST, OTHER})),
        (6, frozenset({LOST})),
    ]
    assert all(q.first_detected_at is not None and not q.verify_mark for q in reqs)
    many = [view(i, (LOST, "b:1")) for i in range(100, 140)]
    assert [q.ledger_id for q in first_requests(many, frozenset({LOST}))] == list(
        range(100, 100 + FIRST_LEDGERS)
    )


def test_resolved_means_repaired_or_nothing_to_do_and_never_unfinished() -> None:
    rows = [
        row(1, ActionKind.COPY, ActionStatus.DONE, 0),
        row(1, ActionKind.METADATA_UPDATE, ActionStatus.DONE, 1),
        row(2, ActionKind.SKIP, ActionStatus.SKIPPED, 0),  # already repaired
        row(3, ActionKind.SKIP, ActionStatus.LOCKED, 0),  # a Java worker holds it
        row(4, ActionKind.COPY, ActionStatus.DONE, 0),
        row(4, ActionKind.COPY, ActionStatus.FAILED, 1),  # its second segment's copy failed
        row(5, ActionKind.SKIP, ActionStatus.WAITING_GRACE, 0),
    ]
    assert resolved_ledgers(rows) == {1, 2}


class Changes:
    """The lost bookies as :class:`~jobs.watch.loss_changes.LossChanges` sees them."""

    def __init__(self, changed: bool = False) -> None:
        self._changed = changed
        self.asked = 0

    def __call__(self) -> bool:
        self.asked += 1
        return self._changed

    @property
    def changed(self) -> bool:
        return self._changed


def _first(
    views: list[LedgerView | None], repair: Any, changes: Changes | None = None
) -> FirstLedgers:
    return FirstLedgers(views, frozenset({LOST}), changes or Changes(), repair=repair)


def test_what_the_repair_left_is_handed_to_the_audits_repair() -> None:
    asked: list[list[LedgerRequest]] = []

    def repair(reqs: list[LedgerRequest], changed: Any) -> list[dict[str, Any]]:
        asked.append(reqs)
        assert changed() is False  # the repair asks before each ledger
        return [
            row(7, ActionKind.COPY, ActionStatus.DONE, 0),
            row(7, ActionKind.METADATA_UPDATE, ActionStatus.DONE, 1),
            row(8, ActionKind.SKIP, ActionStatus.LOCKED, 0),
            row(9, ActionKind.COPY, ActionStatus.FAILED, 0),
        ]

    views: list[LedgerView | None] = [view(i, (LOST, "b:1")) for i in (7, 8, 9)]
    changes = Changes()
    first = _first(views, repair, changes)
    assert first.ledger_ids == {7, 8, 9}  # the audit's marks leave all three out
    assert first.start() is first
    out = first.join()
    assert [q.ledger_id for q in asked[0]] == [7, 8, 9] and changes.asked == 1
    assert out.resolved == {7}  # 8 and 9 are the audit's repair's
    assert out.error is None and len(out.rows) == 4 and not out.changed
    assert out.unmarked == frozenset()  # marked by the repair itself
    assert first.bookies_of(out.rows[:1]) == {LOST}
    assert first.bookies_of(out.rows[2:3]) == set()  # locked: nothing copied


def test_lost_bookies_that_changed_meanwhile_are_reported() -> None:
    first = _first([view(7, (LOST, "b:1"))], lambda reqs, changed: [], Changes(changed=True))
    assert first.start() is first
    out = first.join()
    assert out.changed and out.resolved == set()


def test_a_failed_repair_leaves_every_ledger_to_the_audit() -> None:
    def repair(reqs: list[LedgerRequest], changed: Any) -> list[dict[str, Any]]:
        raise ConnectionError("bookie client could not start")

    first = _first([view(7, (LOST, "b:1"))], repair)
    assert first.start() is first
    out = first.join()
    assert out.resolved == set() and out.rows == []
    assert out.error == "ConnectionError: bookie client could not start"
    assert out.unmarked == {7}  # perhaps never marked: the audit's marks take it


def test_a_full_spool_stops_the_watch_from_the_cycle_thread() -> None:
    def repair(reqs: list[LedgerRequest], changed: Any) -> list[dict[str, Any]]:
        raise SpoolFullError("spool /tmp/s is over --spool-max-bytes 1000")

    first = _first([view(7, (LOST, "b:1"))], repair)
    assert first.start() is first
    with pytest.raises(SpoolFullError):
        first.join()


def test_nothing_starts_when_no_ledger_read_qualifies() -> None:
    def repair(reqs: list[LedgerRequest], changed: Any) -> list[dict[str, Any]]:
        raise AssertionError("not to be called")

    views: list[LedgerView | None] = [view(3, (LOST, "a:1"), closed=False), None]
    first = _first(views, repair)
    assert first.start() is None and first.ledger_ids == frozenset()
