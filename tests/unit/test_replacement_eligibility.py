"""The one replacement-eligibility rule (:mod:`bklib.replacement`) and its three callers: the
client's ensemble change (:class:`~bklib.client.placement.PlacementPolicy`), the repair's
target choice (:class:`~bklib.repair.plan.TargetChooser`) and whatif's writer check
(:func:`~bklib.audit.whatif.writer_blocked`)."""

from __future__ import annotations

import itertools
import random
from collections.abc import Collection, Sequence

import pytest

from bklib.audit.model import LedgerView, SegmentSpan
from bklib.audit.whatif import WriterCheck, writer_blocked
from bklib.client.placement import PlacementPolicy
from bklib.errors import NotEnoughBookiesError
from bklib.meta.model import LedgerState
from bklib.repair.plan import TargetChooser
from bklib.replacement import (
    rack_of,
    replaceable_in_any_ensemble,
    replacement_candidates,
    replacement_shortfall,
)
from bklib.states import UNKNOWN_RACK

A, B, C, D, E, X = (f"10.0.0.{i}:3181" for i in range(6))
ENSEMBLE = (A, B, C)


def _open_view(ensemble: Sequence[str], wq: int = 2) -> LedgerView:
    return LedgerView(
        ledger_id=1,
        state=LedgerState.OPEN.name,
        ensemble_size=len(ensemble),
        write_quorum=wq,
        ack_quorum=min(wq, 2),
        segments=(SegmentSpan(0, None, tuple(ensemble)),),
    )


def test_candidates_are_writable_outside_the_ensemble_and_not_excluded() -> None:
    assert replacement_candidates([E, D, A, B, X], ENSEMBLE, [X]) == [D, E]
    assert replacement_candidates([], ENSEMBLE) == []
    assert replacement_candidates(iter([D, D, C]), iter(ENSEMBLE), iter(())) == [D]


def test_shortfall_needs_one_candidate_per_failed_member() -> None:
    assert replacement_shortfall(ENSEMBLE, {X}, [D]) is None  # X is not in the ensemble
    assert replacement_shortfall(ENSEMBLE, {A}, [B, C, D]) is None
    assert replacement_shortfall(ENSEMBLE, {A, B}, [C, D]) == (
        "needs 2 replacement bookies, 1 writable outside the ensemble"
    )


def test_racks_left_must_span_min_racks_per_write_quorum() -> None:
    racks = {A: "/r1", B: "/r1", C: "/r1", D: "/r1"}
    assert replacement_shortfall(ENSEMBLE, {A}, [D], racks, write_quorum=2) == (
        "needs 2 racks per write quorum, 1 left"
    )
    assert replacement_shortfall(ENSEMBLE, {A}, [D], racks, write_quorum=1) is None
    assert replacement_shortfall(ENSEMBLE, {A}, [D], racks, 2, min_racks=1) is None
    # A bookie with no rack is in the one shared unknown rack: it adds a rack once.
    assert rack_of(E, racks) == UNKNOWN_RACK
    assert replacement_shortfall(ENSEMBLE, {A}, [D, E], racks, write_quorum=2) is None
    assert replacement_shortfall(ENSEMBLE, {A}, [D, E], racks, 3, min_racks=3) == (
        "needs 3 racks per write quorum, 2 left"
    )


def test_a_failed_bookie_outside_the_ensemble_is_never_a_replacement() -> None:
    """X fails with A but is still registered writable (a rack going down, a drain): the only
    bookie that may take A's place is D. whatif's shortfall used to count X as a candidate
    when a caller passed it among the writable bookies; the client and the repair never
    picked it. All three now apply the one rule."""
    writable = [B, C, D, X]
    assert replacement_candidates(writable, ENSEMBLE, {A, X}) == [D]
    new, replaced = PlacementPolicy(random.Random(1)).replace_bookies(
        writable, ENSEMBLE, {0: A}, exclude={X}
    )
    assert replaced == {0: D} and new == (D, B, C)
    assert TargetChooser(random.Random(1)).choose(writable, ENSEMBLE, {0: A}, exclude={X}) == {0: D}
    assert writer_blocked(_open_view(ENSEMBLE), {A, X}, WriterCheck(frozenset(writable))) is None
    # Without D, no caller finds a replacement, and X does not count as one.
    short = [B, C, X]
    assert replacement_shortfall(ENSEMBLE, {A, X}, short) == (
        "needs 1 replacement bookie, 0 writable outside the ensemble"
    )
    with pytest.raises(NotEnoughBookiesError):
        PlacementPolicy().replace_bookies(short, ENSEMBLE, {0: A}, exclude={X})
    with pytest.raises(NotEnoughBookiesError):
        TargetChooser().choose(short, ENSEMBLE, {0: A}, exclude={X})
    assert writer_blocked(_open_view(ENSEMBLE), {A, X}, WriterCheck(frozenset(short))) is not None


def _subsets(items: Sequence[str]) -> list[frozenset[str]]:
    return [frozenset(c) for n in range(len(items) + 1) for c in itertools.combinations(items, n)]


def _client(writable: Collection[str], failed: dict[int, str], exclude: Collection[str]) -> int:
    """Indices the client replaced, each by an eligible bookie (0 when it raised)."""
    excluded = {*failed.values(), *exclude}
    try:
        new, replaced = PlacementPolicy(random.Random(0)).replace_bookies(
            writable, ENSEMBLE, failed, exclude
        )
    except NotEnoughBookiesError:
        return 0
    assert set(replaced.values()) <= set(replacement_candidates(writable, ENSEMBLE, excluded))
    assert len(set(new)) == len(new)
    return len(replaced)


def _repair(writable: Collection[str], failed: dict[int, str], exclude: Collection[str]) -> bool:
    """True when the repair found a distinct eligible target for every failed index."""
    excluded = {*failed.values(), *exclude}
    try:
        out = TargetChooser(random.Random(0)).choose(writable, ENSEMBLE, failed, exclude=exclude)
    except NotEnoughBookiesError:
        return False
    assert set(out) == set(failed) and len(set(out.values())) == len(out)
    assert set(out.values()) <= set(replacement_candidates(writable, ENSEMBLE, excluded))
    return True


def test_the_three_callers_agree_on_who_may_replace() -> None:
    """Every writable set of six bookies, every failed subset of the ensemble, with and
    without a failing bookie outside it: the client replaces what the rule allows (partially
    when short), the repair succeeds and whatif's writer is unblocked exactly when there is an
    eligible bookie per failed member."""
    universe = [A, B, C, D, E, X]
    cases = 0
    for writable in _subsets(universe):
        for failed_set in _subsets(ENSEMBLE):
            if not failed_set:
                continue
            failed = {i: b for i, b in enumerate(ENSEMBLE) if b in failed_set}
            for exclude in (frozenset(), frozenset({X})):
                eligible = replacement_candidates(writable, ENSEMBLE, failed_set | exclude)
                need = len(failed)
                assert _client(writable, failed, exclude) == min(need, len(eligible))
                assert _repair(writable, failed, exclude) == (len(eligible) >= need)
                check = WriterCheck(frozenset(writable))
                blocked = writer_blocked(_open_view(ENSEMBLE), failed_set | exclude, check)
                assert (blocked is None) == (len(eligible) >= need)
                cases += 1
    assert cases == 64 * 7 * 2


def test_replaceable_in_any_ensemble_implies_no_shortfall() -> None:
    rng = random.Random(4)
    pool = [f"10.0.1.{i}:3181" for i in range(14)]
    proved = 0
    for _ in range(3000):
        racks = {b: f"/r{rng.randrange(3)}" for b in pool if rng.random() < 0.8}
        e = rng.randint(1, 4)
        wq = rng.randint(1, e)
        min_racks = rng.randint(1, 3)
        left = set(rng.sample(pool, rng.randint(0, len(pool))))
        if not replaceable_in_any_ensemble(left, e, wq, racks, min_racks):
            continue
        proved += 1
        for _ in range(5):
            ens = rng.sample(pool, e)
            failed = set(rng.sample(ens, rng.randint(1, e)))
            assert replacement_shortfall(ens, failed, left - failed, racks, wq, min_racks) is None
    assert proved > 100
