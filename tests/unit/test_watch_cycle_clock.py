"""A leader cycle decides as of the instant before ZooKeeper confirmed its term.

A process paused between the confirmation and the decision (SIGSTOP, a long GC, a frozen VM)
wakes with a view of the old term; counting the pause towards a lost bookie's delay would
make it due on that view. Here the pause is a fake clock jumping inside the leadership check,
and the store is a stand-in: the cycle's decision is pure once its inputs are read. The
integration side (a real session expiring while the process is stopped) is
``tests/integration/test_watch_warehouse.py``.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from bklib.states import Check
from jobs.watch import loop
from jobs.watch.loop import WatchConfig, WatchService
from jobs.watch.watcher import ClusterSnapshot

VICTIM = "10.0.0.3:3181"
OTHERS = frozenset({"10.0.0.1:3181", "10.0.0.2:3181"})
DELAY = 3.0


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Watcher:
    """The registrations as the paused process last saw them: the victim still gone."""

    def __init__(self) -> None:
        self.connected = True
        self.lost_sessions = 0
        self.wake = threading.Event()

    def snapshot(self) -> ClusterSnapshot:
        return ClusterSnapshot(
            writable=OTHERS, readonly=frozenset(), delay_znode=None, disabled=False
        )


class _Election:
    """Leader; ``pause`` seconds pass on the clock while its answer is in flight."""

    def __init__(self, clock: _Clock, pause: float) -> None:
        self.clock, self.pause = clock, pause

    def in_current_session(self) -> bool:
        return True

    def is_leader(self) -> bool:
        self.clock.now += self.pause
        return True


def _service(tmp_path: Path, clock: _Clock, pause: float) -> tuple[WatchService, list[str]]:
    svc = WatchService(
        WatchConfig(
            zk="127.0.0.1:1",
            warehouse=str(tmp_path / "wh"),
            spool_dir=str(tmp_path / "spool"),
            delay_override=DELAY,
        )
    )
    svc.watcher = _Watcher()  # type: ignore[assignment]
    svc.election = _Election(clock, pause)  # type: ignore[assignment]
    svc.leading = True
    svc.tracker.seed(OTHERS | {VICTIM}, [], [], clock.now)
    svc.tracker.observe(OTHERS, clock.now, DELAY)  # the victim left: pending from now
    responded: list[str] = []

    def respond(check: str, _snap: ClusterSnapshot, scheduled: bool = False) -> None:
        responded.append(check)

    svc._respond = respond  # type: ignore[method-assign]
    return svc, responded


def test_a_pause_after_the_leadership_check_does_not_make_a_bookie_due(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = _Clock()
    monkeypatch.setattr(loop.time, "monotonic", clock)
    svc, responded = _service(tmp_path, clock, pause=DELAY + 10)
    svc._cycle()
    assert responded == []
    assert VICTIM in svc.tracker.pending and not svc.tracker.due


def test_time_that_passed_before_the_check_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same pause before the cycle's check: the term was confirmed after it, so the
    # bookie is due and the loss is acted on (the test above can fail).
    clock = _Clock()
    monkeypatch.setattr(loop.time, "monotonic", clock)
    svc, responded = _service(tmp_path, clock, pause=0.0)
    clock.now += DELAY + 10
    svc._cycle()
    assert responded == [Check.LOST]
    assert VICTIM in svc.tracker.due
