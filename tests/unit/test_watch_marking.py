"""The marks of a loss published beside its repair (jobs/watch/marking.py): a ledger is let
through only once the chunk holding its mark is out, in the order given; a failure stops the
ledgers not yet marked and is raised by ``join``. The marks manager is a stand-in here;
tests/integration/test_watch_marking.py publishes to a real ZooKeeper."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from jobs.watch.marking import MarksFailed, MarksInFlight


class Marks:
    """``mark_many`` that records each chunk, waits while ``held`` is clear, and raises from
    call number ``fail_at`` on."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.chunks: list[list[int]] = []
        self.held = threading.Event()
        self.held.set()
        self.fail_at = fail_at
        self.known: list[Any] = []

    def mark_many(
        self, marks: Mapping[int, Sequence[str]], *, known: Mapping[int, Sequence[str]]
    ) -> int:
        assert self.held.wait(10)
        if self.fail_at is not None and len(self.chunks) >= self.fail_at:
            raise ConnectionError("session lost")
        self.chunks.append(list(marks))
        self.known.append(known)
        return len(marks)


def _marks(ids: Sequence[int]) -> dict[int, list[str]]:
    return {lid: ["b:3181"] for lid in ids}


def test_the_marks_go_out_in_the_repairs_order_a_chunk_at_a_time() -> None:
    urm = Marks()
    order = [9, 1, 5, 3, 7, 2]
    done: list[int] = []
    m = MarksInFlight(urm, _marks([1, 2, 3, 5, 7, 9, 11]), order, {4: ("x",)}, done.append, 2)  # type: ignore[arg-type]
    m.join()
    # In the order given; a marked ledger the order leaves out still goes, last.
    assert urm.chunks == [[9, 1], [5, 3], [7, 2], [11]]
    assert urm.known == [{4: ("x",)}] * 4
    assert m.written == 7 and done == [7]


def test_a_ledger_waits_for_its_own_chunk_and_no_longer() -> None:
    urm = Marks()
    urm.held.clear()  # nothing published yet
    m = MarksInFlight(urm, _marks(range(10)), list(range(10)), per_chunk=5)  # type: ignore[arg-type]
    passed: list[int] = []

    def repair(lid: int) -> None:
        if m.wait_for(lid):
            passed.append(lid)

    threads = [threading.Thread(target=repair, args=(lid,)) for lid in (0, 7)]
    for t in threads:
        t.start()
    assert m.wait_for(123)  # not among the marks: not waited for
    for t in threads:
        t.join(0.3)
    assert passed == []  # neither chunk out: both wait
    urm.held.set()
    for t in threads:
        t.join(10)
    assert sorted(passed) == [0, 7]
    m.join()


def test_a_failure_stops_the_ledgers_not_yet_marked_and_is_raised() -> None:
    urm = Marks(fail_at=1)
    m = MarksInFlight(urm, _marks(range(6)), list(range(6)), per_chunk=3)  # type: ignore[arg-type]
    assert m.wait_for(2)  # its chunk went out
    assert not m.wait_for(4)  # its chunk never will
    assert not m.wait_all() and m.failed
    with pytest.raises(MarksFailed, match="session lost"):
        m.join()
