"""Which audit answers a loss (docs/watch.md, "The index"): with a current index, one of only
the ledgers naming the due bookie; with a stale one (never built, or its feed's barrier not
confirmed: notifications held back), a full scan, from which the index is rebuilt. The cycle
never answers from a stale index. The store, its feed and the audits are stand-ins; the real
ones are tests/integration/test_bookie_index.py and test_watch_index_reaction.py.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bklib.audit.model import LedgerView
from bklib.meta.model import LedgerMetadata, Segment
from bklib.states import Check, CountKey, RunStatus
from jobs.watch import cycle
from jobs.watch.cycle import Cycle
from jobs.watch.index import REBUILD_EVERY
from tests.watch_stand_ins import OTHERS, VICTIM, Clock, FeedStore, audit_job, leader_cycle

A, B = sorted(OTHERS)
LEDGERS = {
    1: (VICTIM, A),
    2: (A, B),
    3: (B, VICTIM),
    4: (A, B),
}


def view(ledger_id: int) -> LedgerView:
    md = LedgerMetadata(ledger_id, 2, 2, 1, (Segment(0, LEDGERS[ledger_id]),))
    return LedgerView.from_metadata(md, f"/ledgers/00/0000/L{ledger_id:04d}", 0)


class Audits:
    """Records each audit asked for: None for a full scan, else the ledger ids."""

    def __init__(self) -> None:
        self.asked: list[list[int] | None] = []

    def __call__(self, check: str, ledger_ids: Any = None, kind: Any = None, **_: Any) -> Any:
        assert check == Check.LOST
        self.asked.append(None if ledger_ids is None else list(ledger_ids))
        counts = {CountKey.METADATA_ERRORS: 0, CountKey.LEDGERS: len(LEDGERS)}
        run = SimpleNamespace(run_id=f"run-{len(self.asked)}", counts=counts)
        run.status = RunStatus.COMPLETED
        ledgers = [view(i) for i in (LEDGERS if ledger_ids is None else ledger_ids)]
        return audit_job(run, ledgers)


def _cycle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Cycle, Audits, FeedStore, Clock]:
    """A leading cycle over stand-in audits and a stand-in feed, on a clock the test moves."""
    clock = Clock()
    monkeypatch.setattr(cycle.time, "monotonic", clock)
    c = leader_cycle(tmp_path, delay_override=0.0)
    store = FeedStore()
    c.index.keeper.store = store  # type: ignore[assignment]
    audits = Audits()
    c.audits.run = audits  # type: ignore[method-assign]
    return c, audits, store, clock


def _lose(c: Cycle, clock: Clock) -> None:
    """The victim is lost and due now."""
    c.tracker.seed(OTHERS | {VICTIM}, [], [], clock.now)
    c.tracker.observe(OTHERS, clock.now, 0.0)
    c.retry_at = 0.0


def _rebuilds(c: Cycle, cause: str) -> float:
    value = c.metrics.registry.get_sample_value("bkaudit_index_rebuilds_total", {"cause": cause})
    return float(value or 0)


def test_a_loss_reads_the_ledgers_the_index_names_and_a_stale_index_is_never_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c, audits, store, clock = _cycle(tmp_path, monkeypatch)

    # Never built: the loss is answered by a full scan, which builds the index.
    _lose(c, clock)
    c.run()
    assert audits.asked == [None]
    assert len(c.index.keeper.index) == len(LEDGERS)
    assert _rebuilds(c, "take-over") == 1

    # Current: only the ledgers naming the victim are read.
    _lose(c, clock)
    c.run()
    assert audits.asked[-1] == [1, 3]

    # Notifications held back: the barrier is not confirmed; a full scan answers, on a new
    # feed, and the index is rebuilt from it.
    store.feeds[-1].flowing = False
    _lose(c, clock)
    c.run()
    assert audits.asked[-1] is None
    assert _rebuilds(c, "barrier-timeout") == 1
    assert len(store.feeds) == 2 and not store.feeds[0].open
    gauge = c.metrics.registry.get_sample_value("bkaudit_index_stale")
    assert gauge == 0  # rebuilt

    # And current again on the new feed.
    _lose(c, clock)
    c.run()
    assert audits.asked[-1] == [1, 3]
    assert audits.asked.count(None) == 2


def test_a_gap_on_a_quiet_cluster_rebuilds_the_index_at_once_and_not_in_a_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c, audits, store, clock = _cycle(tmp_path, monkeypatch)
    _lose(c, clock)
    c.run()  # built from the loss's full scan; the victim named by no finding: resolved
    assert audits.asked == [None] and not c.tracker.due

    store.gaps[-1]("the change feed's session ended")
    c.run()  # no loss: the stale index is rebuilt now, on a new feed
    assert audits.asked == [None, None]
    assert _rebuilds(c, "gap") == 1 and len(store.feeds) == 2

    store.gaps[-1]("again")
    c.run()
    assert audits.asked == [None, None]  # not twice within REBUILD_EVERY
    clock.now += REBUILD_EVERY + 1
    c.run()
    assert audits.asked == [None, None, None] and _rebuilds(c, "gap") == 2


def test_a_scheduled_lost_audit_reconciles_the_index_and_rebuilds_it_on_a_difference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c, audits, _, clock = _cycle(tmp_path, monkeypatch)
    _lose(c, clock)
    c.run()  # the index built from the loss's full scan
    snap = c.watcher.snapshot()

    def differences() -> float:
        value = c.metrics.registry.get_sample_value("bkaudit_index_differences_total")
        return float(value or 0)

    c.respond(Check.LOST, snap, scheduled=True)
    assert audits.asked[-1] is None  # the schedule's audit is a full scan
    assert differences() == 0 and _rebuilds(c, "reconciliation") == 0

    keeper = c.index.keeper
    keeper.index.apply(2, None)  # the index loses a ledger, as a bug would make it
    keeper.index.apply(5, LedgerMetadata(5, 2, 2, 1, (Segment(0, (A, VICTIM)),)))  # and one too
    c.respond(Check.LOST, snap, scheduled=True)
    assert differences() == 2 and _rebuilds(c, "reconciliation") == 1
    assert keeper.index.bookies_of(2) == frozenset({A, B})  # rebuilt from the scan
    assert 5 not in keeper.index and len(keeper.index) == len(LEDGERS)

    c.respond(Check.LOST, snap, scheduled=True)
    assert differences() == 2 and _rebuilds(c, "reconciliation") == 1  # it matches again
