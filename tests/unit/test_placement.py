"""Placement: new ensembles spread by a rotating start, replacements exclude the ensemble."""

from __future__ import annotations

import random

import pytest

from bklib.client.placement import PlacementPolicy
from bklib.errors import IncorrectParameterError, NotEnoughBookiesError

BOOKIES = [f"b{i}:3181" for i in range(6)]


def test_new_ensemble_distinct_and_rotating() -> None:
    p = PlacementPolicy(random.Random(7))
    first = p.new_ensemble(BOOKIES, 3)
    second = p.new_ensemble(BOOKIES, 3)
    assert len(set(first)) == 3 and len(set(second)) == 3
    # Consecutive calls start one bookie further round the sorted ring.
    ring = sorted(BOOKIES)
    s1 = ring.index(first[0])
    assert list(first) == [ring[(s1 + k) % 6] for k in range(3)]
    assert second[0] == ring[(s1 + 1) % 6]


def test_new_ensemble_spreads_over_all_bookies() -> None:
    p = PlacementPolicy(random.Random(1))
    used = {b for _ in range(6) for b in p.new_ensemble(BOOKIES, 2)}
    assert used == set(BOOKIES)


def test_new_ensemble_excludes_and_fails_when_short() -> None:
    p = PlacementPolicy(random.Random(3))
    ens = p.new_ensemble(BOOKIES, 4, exclude=BOOKIES[:2])
    assert set(ens) == set(BOOKIES[2:])
    with pytest.raises(NotEnoughBookiesError):
        p.new_ensemble(BOOKIES, 5, exclude=BOOKIES[:2])
    with pytest.raises(NotEnoughBookiesError):
        p.new_ensemble([], 1)
    with pytest.raises(IncorrectParameterError):
        p.new_ensemble(BOOKIES, 0)


def test_replace_bookie_excludes_current_ensemble_and_failed() -> None:
    p = PlacementPolicy(random.Random(5))
    ens = ("b0:3181", "b1:3181", "b2:3181")
    for _ in range(20):
        new = p.replace_bookie(BOOKIES, ens, 1, exclude=["b3:3181"])
        assert new in {"b4:3181", "b5:3181"}
    with pytest.raises(NotEnoughBookiesError) as err:
        p.replace_bookie(BOOKIES[:4], ens, 1, exclude=["b3:3181"])
    assert err.value.bookie == "b1:3181"


def test_replace_bookies_full_and_partial() -> None:
    p = PlacementPolicy(random.Random(9))
    ens = ("b0:3181", "b1:3181", "b2:3181")
    new, replaced = p.replace_bookies(BOOKIES, ens, {0: "b0:3181", 2: "b2:3181"})
    assert set(replaced) == {0, 2}
    assert new[1] == "b1:3181"
    assert len(set(new)) == 3
    assert not set(new) & {"b0:3181", "b2:3181"}
    # Only one spare: one index replaced, the other keeps its (failed) bookie.
    new, replaced = p.replace_bookies(BOOKIES[:4], ens, {0: "b0:3181", 2: "b2:3181"})
    assert replaced == {0: "b3:3181"}
    assert new == ("b3:3181", "b1:3181", "b2:3181")
    # No spare at all.
    with pytest.raises(NotEnoughBookiesError):
        p.replace_bookies(BOOKIES[:3], ens, {0: "b0:3181"})


def test_replace_bookies_skips_indices_already_replaced() -> None:
    p = PlacementPolicy(random.Random(2))
    ens = ("b0:3181", "b1:3181", "b2:3181")
    new, replaced = p.replace_bookies(BOOKIES, ens, {0: "b5:3181"})
    assert (new, replaced) == (ens, {})
