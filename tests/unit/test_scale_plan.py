"""The scale harness's plan of ledgers (bklib/testing/scale/plan.py): how few bookies it can
be laid over; and a farm identity's storage computed from it (bklib/testing/scale/storage.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bklib.bookie.journal import Journal
from bklib.errors import NoSuchEntryError
from bklib.testing.scale.plan import SHAPES, ScalePlan
from bklib.testing.scale.storage import PlannedStorage, shared_plans


def _bookies(n: int) -> tuple[str, ...]:
    return tuple(f"10.0.0.{i}:3181" for i in range(1, n + 1))


def test_a_plan_refuses_too_few_bookies_to_replace_one_of_its_widest_ensemble() -> None:
    widest = max(e for (e, _, _), _ in SHAPES)
    with pytest.raises(ValueError, match=f"at least {widest + 1} bookies, not {widest}"):
        ScalePlan(100, _bookies(widest))


def test_a_plan_over_the_fewest_bookies_builds_every_ledger() -> None:
    widest = max(e for (e, _, _), _ in SHAPES)
    plan = ScalePlan(500, _bookies(widest + 1))
    ledgers = list(plan)
    assert len(ledgers) == 500
    # Every shape was drawn, the widest included, and later segments replaced a bookie.
    assert max(lp.metadata.ensemble_size for lp in ledgers) == widest
    changed = [lp for lp in ledgers if len(lp.metadata.segments) > 1]
    assert changed
    for lp in changed:
        first, second = lp.metadata.segments[0].ensemble, lp.metadata.segments[1].ensemble
        assert len(set(first) ^ set(second)) == 2  # one bookie out, one other bookie in


def test_a_farm_identitys_cached_state_forgets_what_is_damaged(tmp_path: Path) -> None:
    bookies = _bookies(8)
    plan = ScalePlan(200, bookies)
    # Never opened: planned entries are computed, and damage to them is only remembered.
    journal = Journal(tmp_path / "journal", name="farm")
    storage = PlannedStorage(plan, bookies[0], journal, tmp_path / "b0")
    lp = next(lp for lp in plan if len(lp.entries_on(bookies[0])) >= 2)
    held = lp.entries_on(bookies[0])
    state = storage.ledgers.get(lp.ledger_id)
    assert state is not None and list(state.entries) == held
    assert storage.read_from(state, held[0]) == lp.entry_body(held[0])
    assert storage.ledgers.get(lp.ledger_id) is state  # looked up again: the cached state
    storage.delete_entries(lp.ledger_id, [held[0]])
    after = storage.ledgers.get(lp.ledger_id)
    assert after is not None and list(after.entries) == held[1:]
    with pytest.raises(NoSuchEntryError):
        storage.read_from(after, held[0])


def test_a_ledgers_placement_is_what_its_write_sets_give_each_bookie() -> None:
    bookies = _bookies(8)
    plan = ScalePlan(300, bookies)
    for lp in plan:
        for b in bookies:
            assert lp.entries_on(b) == [e for e in range(lp.entries) if lp.holds(b, e)]
        # Every entry is on write-quorum bookies, so the placement adds up.
        placed = sum(len(v) for v in lp.placement.values())
        assert placed == lp.entries * lp.metadata.write_quorum


def test_a_farms_identities_share_each_planned_ledger(tmp_path: Path) -> None:
    bookies = _bookies(8)
    plan = ScalePlan(200, bookies)
    journal = Journal(tmp_path / "journal", name="farm")
    plans = shared_plans(plan)
    a = PlannedStorage(plan, bookies[0], journal, tmp_path / "b0", plans=plans)
    b = PlannedStorage(plan, bookies[1], journal, tmp_path / "b1", plans=plans)
    alone = PlannedStorage(plan, bookies[2], journal, tmp_path / "b2")
    lid = plan.ledger_id(17)
    shared = a.ledger_plan(lid)
    assert shared is not None and b.ledger_plan(lid) is shared  # built once for both
    own = alone.ledger_plan(lid)
    assert own is not shared and own == shared
    assert a.ledger_plan(plan.ledger_id(plan.ledgers)) is None  # past the plan
