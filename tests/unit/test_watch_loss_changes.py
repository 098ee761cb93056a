"""What a watch repair asks before each ledger starts (jobs/watch/loss_changes.py): a bookie
it repairs registered again, or another became due. The registrations are read at most once
per interval and fed to the cycle's loss tracker; the answer sticks once yes; a failed read
is no change."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from bklib.meta.stores import StoreUnavailable
from jobs.watch import loss_changes
from jobs.watch.decide import LossTracker
from jobs.watch.loss_changes import LossChanges

A, B, LOST, OTHER = "10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181", "10.0.0.4:3181"


class Registrations:
    """Stands in for ``registered_ids``: counts its reads; raises when ``down``."""

    def __init__(self) -> None:
        self.writable = frozenset({A, B, OTHER})
        self.readonly: frozenset[str] = frozenset()
        self.reads = 0
        self.down = False

    def __call__(self, store: object, root: str) -> tuple[frozenset[str], frozenset[str]]:
        self.reads += 1
        if self.down:
            raise StoreUnavailable("connection lost", path=root)
        return self.writable, self.readonly


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [100.0]
    monkeypatch.setattr(loss_changes.time, "monotonic", lambda: now[0])
    return now


def _changes(
    monkeypatch: pytest.MonkeyPatch, delay: float = 0.0
) -> tuple[LossChanges, LossTracker, Registrations]:
    regs = Registrations()
    monkeypatch.setattr(loss_changes, "registered_ids", regs)
    tracker = LossTracker()
    tracker.seed({A, B, OTHER}, [LOST], [LOST], 50.0)  # LOST gone and marked: due
    watcher = SimpleNamespace(zk=None, root="/ledgers")
    changes = LossChanges(
        watcher, tracker, threading.Lock(), repairing=frozenset({LOST}), delay=delay, every=2.0
    )
    return changes, tracker, regs


def test_back_once_registered_read_once_per_interval(
    monkeypatch: pytest.MonkeyPatch, clock: list[float]
) -> None:
    changes, tracker, regs = _changes(monkeypatch)
    assert not changes() and not changes() and regs.reads == 1
    regs.readonly = frozenset({LOST})  # read-only serves reads: back
    assert not changes()  # within the interval: not read again
    clock[0] += 2.0
    assert changes() and changes.back == {LOST} and regs.reads == 2
    assert LOST not in tracker.due
    regs.readonly = frozenset()
    clock[0] += 2.0
    assert changes() and regs.reads == 2  # sticky: the repair has stopped


def test_another_bookie_due_stops_it_and_one_within_its_delay_does_not_yet(
    monkeypatch: pytest.MonkeyPatch, clock: list[float]
) -> None:
    changes, tracker, regs = _changes(monkeypatch, delay=30.0)
    regs.writable = frozenset({A, B})  # OTHER gone: a single loss waits the delay
    assert not changes() and OTHER in tracker.pending
    clock[0] += 31.0
    assert changes() and changes.became == [OTHER] and set(tracker.due) == {LOST, OTHER}
    assert not changes.back


def test_a_failed_read_is_no_change(monkeypatch: pytest.MonkeyPatch, clock: list[float]) -> None:
    changes, _, regs = _changes(monkeypatch)
    regs.down = True
    assert not changes() and regs.reads == 1
