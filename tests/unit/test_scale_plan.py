"""The scale harness's plan of ledgers (bklib/testing/scale/plan.py): how few bookies it can
be laid over."""

from __future__ import annotations

import pytest

from bklib.testing.scale.plan import SHAPES, ScalePlan


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
