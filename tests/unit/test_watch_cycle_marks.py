"""Marks no loss explains (docs/watch.md, "Marks left behind"): a bookie that came back
after its repair started, a repair cut off, another tool's marks. The leader checks them once
no lost bookie is due or waiting for its delay, as BookKeeper's ReplicationWorker checks every
mark, then again only after a back-off. The repair is a stand-in; the real one is
tests/integration/test_watch.py (a bookie back mid-repair)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobs.watch import cycle
from jobs.watch.cycle import MARKS_RECHECK, Cycle
from jobs.watch.watcher import ClusterSnapshot
from tests.watch_stand_ins import OTHERS, VICTIM, Clock, leader_cycle

A, _ = sorted(OTHERS)


class Marked:
    """The stand-in watcher's snapshot, with marks and the registrations the test sets."""

    def __init__(self) -> None:
        self.writable = OTHERS
        self.marked: dict[int, tuple[str, ...]] = {5: (A,), 9: (VICTIM,)}
        self.disabled = False

    def __call__(self) -> ClusterSnapshot:
        return ClusterSnapshot(
            writable=self.writable,
            readonly=frozenset(),
            delay_znode=None,
            disabled=self.disabled,
            marked=dict(self.marked),
        )


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The cycle's monotonic clock, moved by the test."""
    now = Clock()
    monkeypatch.setattr(cycle.time, "monotonic", now)
    return now


def _cycle(tmp_path: Path, delay: float) -> tuple[Cycle, Marked, list[list[int]]]:
    c = leader_cycle(tmp_path, delay_override=delay)
    snap = Marked()
    c.watcher.snapshot = snap  # type: ignore[method-assign]
    checked: list[list[int]] = []

    def verify(ids: Any, changed: Any = None) -> list[dict[str, Any]]:
        checked.append(list(ids))
        return []

    c.repair.verify_marks = verify  # type: ignore[method-assign]
    c.index.rebuild_due = lambda now: False  # type: ignore[method-assign]
    return c, snap, checked


def test_marks_no_loss_explains_are_checked_at_once_then_after_a_back_off(
    tmp_path: Path, clock: Clock
) -> None:
    c, _, checked = _cycle(tmp_path, 0.0)
    c.run()
    assert checked == [[5, 9]]
    clock.now += MARKS_RECHECK / 2
    c.run()
    assert checked == [[5, 9]]  # not in a loop while a mark stands (a silent bookie)
    clock.now += MARKS_RECHECK / 2 + 1
    c.run()
    assert checked == [[5, 9], [5, 9]]


def test_marks_wait_while_a_lost_bookie_is_within_its_delay_or_repair_is_disabled(
    tmp_path: Path, clock: Clock
) -> None:
    c, snap, checked = _cycle(tmp_path, 30.0)
    c.tracker.seed(OTHERS | {VICTIM}, [], [], clock.now)
    c.run()  # the victim is gone, within its delay: its marks are not checked early
    assert c.tracker.pending and checked == []
    snap.writable = OTHERS | {VICTIM}
    snap.disabled = True
    clock.now += 1
    c.run()  # back, but underreplication/disable exists
    assert not c.tracker.pending and checked == []
    snap.disabled = False
    c.run()
    assert checked == [[5, 9]]
