"""The check a loss's repair makes before each ledger starts: has a bookie it repairs
registered again? At most one read of the registrations per interval, sticky once back, and
a failed read is not "back" (jobs/watch/returned.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bklib.meta.stores import StoreUnavailable
from jobs.watch import returned
from jobs.watch.returned import ReturnedBookies

LOST = "10.0.0.3:3181"


class Registrations:
    """Stands in for ``registered_ids``: counts its reads; raises when ``down``."""

    def __init__(self) -> None:
        self.writable: frozenset[str] = frozenset({"10.0.0.1:3181"})
        self.readonly: frozenset[str] = frozenset()
        self.reads = 0
        self.down = False

    def __call__(self, store: object, root: str) -> tuple[frozenset[str], frozenset[str]]:
        self.reads += 1
        if self.down:
            raise StoreUnavailable("connection lost", path=root)
        return self.writable, self.readonly


def test_back_once_registered_read_once_per_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(returned.time, "monotonic", lambda: now[0])
    regs = Registrations()
    monkeypatch.setattr(returned, "registered_ids", regs)
    back = ReturnedBookies(SimpleNamespace(zk=None, root="/ledgers"), frozenset({LOST}), 2.0)
    assert not back() and not back() and regs.reads == 1
    regs.readonly = frozenset({LOST})  # read-only serves reads: back
    assert not back()  # within the interval: not read again
    now[0] += 2.0
    assert back() and regs.reads == 2
    regs.readonly = frozenset()
    now[0] += 2.0
    assert back() and regs.reads == 2  # sticky: the repair has stopped


def test_a_failed_read_is_not_back_and_no_lost_bookie_reads_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    regs = Registrations()
    monkeypatch.setattr(returned, "registered_ids", regs)
    watcher = SimpleNamespace(zk=None, root="/ledgers")
    regs.down = True
    assert not ReturnedBookies(watcher, frozenset({LOST}), 0.0)()
    assert not ReturnedBookies(watcher, frozenset(), 0.0)() and regs.reads == 1
