"""A leader cycle decides as of the instant before ZooKeeper confirmed its term.

A process paused between the confirmation and the decision (SIGSTOP, a long GC, a frozen VM)
wakes with a view of the old term; counting the pause towards a lost bookie's delay would
make it due on that view. Here the pause is a fake clock jumping inside the leadership check,
and the store is a stand-in: the cycle's decision is pure once its inputs are read. The
integration side (a real session expiring while the process is stopped) is
``tests/integration/test_watch_warehouse.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bklib.states import Check
from jobs.watch import cycle
from jobs.watch.cycle import Cycle
from jobs.watch.watcher import ClusterSnapshot
from tests.watch_stand_ins import OTHERS, VICTIM, Clock, leader_cycle

DELAY = 3.0


class _Election:
    """Leader; ``pause`` seconds pass on the clock while its answer is in flight."""

    def __init__(self, clock: Clock, pause: float) -> None:
        self.clock, self.pause = clock, pause

    def in_current_session(self) -> bool:
        return True

    def is_leader(self) -> bool:
        self.clock.now += self.pause
        return True


def _cycle(tmp_path: Path, clock: Clock, pause: float) -> tuple[Cycle, list[str]]:
    c = leader_cycle(tmp_path, _Election(clock, pause), delay_override=DELAY)
    c.tracker.seed(OTHERS | {VICTIM}, [], [], clock.now)
    c.tracker.observe(OTHERS, clock.now, DELAY)  # the victim left: pending from now
    responded: list[str] = []

    def respond(check: str, _snap: ClusterSnapshot, scheduled: bool = False) -> None:
        responded.append(check)

    c.respond = respond  # type: ignore[method-assign]
    return c, responded


def test_a_pause_after_the_leadership_check_does_not_make_a_bookie_due(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    monkeypatch.setattr(cycle.time, "monotonic", clock)
    c, responded = _cycle(tmp_path, clock, pause=DELAY + 10)
    c.run()
    assert responded == []
    assert VICTIM in c.tracker.pending and not c.tracker.due


def test_time_that_passed_before_the_check_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same pause before the cycle's check: the term was confirmed after it, so the
    # bookie is due and the loss is acted on (the test above can fail).
    clock = Clock()
    monkeypatch.setattr(cycle.time, "monotonic", clock)
    c, responded = _cycle(tmp_path, clock, pause=0.0)
    clock.now += DELAY + 10
    c.run()
    assert responded == [Check.LOST]
    assert VICTIM in c.tracker.due
