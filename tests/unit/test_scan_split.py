"""The pure parts of the local audit's split: directories cut into contiguous halves of about
equal ledger counts (jobs.local.scan_shard.split_dirs), the run's ZooKeeper budget shared
while two processes scan (bklib.meta.stores.zookeeper.budget.shared_budget), and the per-bookie read
bounds shared while two processes read (jobs.local.scan_shard.split_bounds)."""

from __future__ import annotations

from typing import Any

import pytest

from bklib.audit.capabilities import ProbeCandidates, probe_targets
from bklib.audit.checker import CheckSettings
from bklib.audit.model import LedgerView, SegmentSpan
from bklib.meta.store import LeafDir
from bklib.meta.stores.zookeeper import budget as zk_budget
from jobs.local.scan_shard import split_bounds, split_dirs


def _dirs(*counts: int) -> list[LeafDir]:
    return [LeafDir(f"/ledgers/00/{i:04d}", f"00{i:04d}", n) for i, n in enumerate(counts)]


def test_halves_are_contiguous_and_about_equal() -> None:
    dirs = _dirs(*([10_000] * 99), 3)
    halves = split_dirs(dirs, 2)
    assert [d for half in halves for d in half] == dirs  # the scan's order, cut once
    sizes = [sum(d.count for d in half) for half in halves]
    assert len(halves) == 2 and abs(sizes[0] - sizes[1]) <= 10_000, sizes


def test_uneven_and_small_plans() -> None:
    assert split_dirs(_dirs(5), 2) == [_dirs(5)]  # one directory: nothing to split
    assert split_dirs([], 2) == []
    halves = split_dirs(_dirs(1, 1, 1, 97), 2)
    assert [len(h) for h in halves] == [3, 1]
    assert len(split_dirs(_dirs(*([7] * 10)), 3)) == 3


def test_the_budget_is_shared_then_restored_with_its_count() -> None:
    whole = zk_budget.set_request_rate(1000.0)
    try:
        with zk_budget.shared_budget(2) as share:
            assert share == 500.0
            assert zk_budget.request_budget().rate == 500.0
            assert zk_budget.request_budget().take_up_to(3) == 3
        assert zk_budget.request_budget() is whole and whole.rate == 1000.0
        assert whole.requests == 3
        zk_budget.set_request_rate(None)
        with zk_budget.shared_budget(2) as share:
            assert share is None and zk_budget.request_budget().rate is None
    finally:
        zk_budget.set_request_rate(zk_budget.DEFAULT_REQUEST_RATE)


def test_each_of_two_processes_reads_a_bookie_within_half_the_runs_bounds() -> None:
    settings = CheckSettings(reads_in_flight=255, read_rate=100e6, sample_seed=3)
    half = split_bounds(settings, 2)
    assert half.reads_in_flight == 127 and half.read_rate == 50e6
    assert 2 * half.reads_in_flight <= settings.reads_in_flight
    assert half.sample_seed == 3  # the rest is the run's
    assert split_bounds(CheckSettings(reads_in_flight=2), 2).reads_in_flight == 1
    assert split_bounds(CheckSettings(read_rate=None), 2).read_rate is None
    # One read in flight cannot be shared: such a run checks in one process.
    with pytest.raises(ValueError, match="1 reads in flight cannot be shared by 2"):
        split_bounds(CheckSettings(reads_in_flight=1), 2)


def _view(lid: int, bookies: tuple[str, ...], *, closed: bool = True, ok: bool = True) -> Any:
    return LedgerView(
        ledger_id=lid,
        state="CLOSED" if closed else "OPEN",
        ensemble_size=len(bookies),
        write_quorum=len(bookies),
        ack_quorum=len(bookies),
        last_entry_id=9 if closed else None,
        segments=(SegmentSpan(0, 9 if closed else None, bookies),),
        error=None if ok else "corrupt",
    )


def test_the_halves_probe_candidates_merge_into_one_passs() -> None:
    views = [
        _view(1, ("a", "b"), closed=False),
        _view(2, ("b", "c")),
        _view(3, ("a", "c"), ok=False),  # unreadable: never a candidate
        _view(4, ("a", "d")),
        _view(5, ("d", "e"), closed=False),
        _view(6, ("b", "e")),
    ]
    one = probe_targets(views, "abcdef")
    assert one == {"a": 4, "b": 2, "c": 2, "d": 4, "e": 6}  # closed first, then the lowest
    for cut in range(len(views) + 1):
        first = ProbeCandidates.of(views[:cut])
        second = ProbeCandidates.of(views[cut:])
        assert first.plus(second).targets("abcdef") == one, cut
        assert second.plus(first).targets("abcdef") == one, cut
