"""Choosing bookies for ensembles: new ensembles, and replacements for failed bookies.

A small stand-in for BookKeeper's default (rack-unaware) placement policy:

* candidates are the *writable* registrations (``<root>/available/<id>``); read-only bookies
  serve reads but never receive new ensembles;
* a new ensemble takes ``E`` distinct candidates walking the sorted candidate ring from a
  start that rotates (random first start, then +1 per call), so successive ledgers spread
  over the cluster instead of all landing on the first ``E`` bookies;
* a replacement for a failed index is one of
  :func:`bklib.replacement.replacement_candidates` (the rule the repair and whatif share): a
  writable bookie outside the whole current ensemble (a bookie may appear only once in an
  ensemble) and outside every bookie the caller says failed; several failed indices may be
  replaced at once, and a partial replacement is returned when at least one index could be
  replaced (as ``EnsembleUtils.replaceBookiesInEnsemble`` does); replacing none raises
  :class:`~bklib.errors.NotEnoughBookiesError`.

Everything here is pure except :func:`writable_bookies`, which reads ZooKeeper.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Iterable, Mapping, Sequence

from kazoo.client import KazooClient

from bklib.errors import IncorrectParameterError, NotEnoughBookiesError
from bklib.meta.registration import list_bookies
from bklib.meta.stores import MetadataStore
from bklib.replacement import replacement_candidates
from bklib.states import DEFAULT_LEDGERS_ROOT

log = logging.getLogger(__name__)

__all__ = ["PlacementPolicy", "writable_bookies"]


def writable_bookies(
    zk: MetadataStore | KazooClient, root: str = DEFAULT_LEDGERS_ROOT
) -> list[str]:
    """Sorted ids of the bookies currently registered as writable (blocking ZooKeeper read)."""
    return sorted(list_bookies(zk, root).writable)


class PlacementPolicy:
    """Picks ensembles and replacements from a candidate list.

    ``rng`` makes choices reproducible (tests, randomized schedules); by default the start of
    the walk is random once and then rotates. Thread-safe: the rotating start is the only
    state and it is guarded by a lock.
    """

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()
        self._next_start: int | None = None
        self._lock = threading.Lock()

    def _start(self, n: int) -> int:
        with self._lock:
            if self._next_start is None:
                self._next_start = self._rng.randrange(1 << 30)
            start = self._next_start
            self._next_start += 1
        return start % n

    def _walk(self, pool: Sequence[str]) -> list[str]:
        """``pool`` rotated to this call's start (empty stays empty)."""
        if not pool:
            return []
        s = self._start(len(pool))
        return [*pool[s:], *pool[:s]]

    def new_ensemble(
        self, candidates: Iterable[str], size: int, exclude: Iterable[str] = ()
    ) -> tuple[str, ...]:
        """``size`` distinct candidates not in ``exclude``.

        Raises NotEnoughBookiesError when fewer than ``size`` are eligible.
        """
        if size < 1:
            raise IncorrectParameterError(f"ensemble size must be >= 1, got {size}")
        banned = set(exclude)
        pool = sorted(set(candidates) - banned)
        if len(pool) < size:
            raise NotEnoughBookiesError(
                f"need {size} writable bookies, only {len(pool)} eligible: {pool}"
            )
        chosen = tuple(self._walk(pool)[:size])
        log.debug("placement: new ensemble %s from %d candidates", chosen, len(pool))
        return chosen

    def replace_bookie(
        self,
        candidates: Iterable[str],
        ensemble: Sequence[str],
        index: int,
        exclude: Iterable[str] = (),
    ) -> str:
        """A bookie to put at ``ensemble[index]``: one of
        :func:`~bklib.replacement.replacement_candidates` (not in the ensemble, not in
        ``exclude``).

        Raises NotEnoughBookiesError when none is eligible.
        """
        if not 0 <= index < len(ensemble):
            raise IncorrectParameterError(f"index {index} outside ensemble of size {len(ensemble)}")
        excluded = set(exclude)
        pool = replacement_candidates(candidates, ensemble, excluded)
        if not pool:
            raise NotEnoughBookiesError(
                f"no writable bookie can replace {ensemble[index]} at index {index} "
                f"(ensemble {list(ensemble)}, excluded {sorted(excluded)})",
                bookie=ensemble[index],
            )
        return self._walk(pool)[0]

    def replace_bookies(
        self,
        candidates: Iterable[str],
        ensemble: Sequence[str],
        failed: Mapping[int, str],
        exclude: Iterable[str] = (),
    ) -> tuple[tuple[str, ...], dict[int, str]]:
        """Replace every index in ``failed`` whose bookie is still there.

        Returns ``(new_ensemble, {index: new_bookie})``. Indices that cannot be replaced keep
        their bookie (partial replacement); if nothing could be replaced, raises
        NotEnoughBookiesError. Failed bookies and ``exclude`` are never chosen, and neither is
        any bookie of the ensemble (including those chosen for other indices in this call).
        """
        cands = list(candidates)
        banned = set(exclude) | set(failed.values())
        new = list(ensemble)
        replaced: dict[int, str] = {}
        last_error: NotEnoughBookiesError | None = None
        for index in sorted(failed):
            if not 0 <= index < len(new):
                raise IncorrectParameterError(f"index {index} outside ensemble of size {len(new)}")
            if new[index] != failed[index]:
                continue  # already replaced by someone else: nothing to do for this index
            try:
                bookie = self.replace_bookie(cands, new, index, banned)
            except NotEnoughBookiesError as exc:
                last_error = exc
                continue
            new[index] = bookie
            replaced[index] = bookie
        if not replaced and last_error is not None:
            raise last_error
        return tuple(new), replaced
