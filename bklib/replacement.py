"""Which bookies may replace failed members of an ensemble: the one rule behind the client's
ensemble change (:mod:`bklib.client.placement`), the repair's target choice
(:class:`bklib.repair.plan.TargetChooser`) and whatif's writer check
(:func:`bklib.audit.whatif.writer_blocked`, :mod:`bklib.audit.triage`).

It mirrors the exclusions of BookKeeper's ``EnsemblePlacementPolicy.replaceBookie`` as
``EnsembleUtils.replaceBookiesInEnsemble`` calls it: a replacement is a *writable* bookie
(read-only bookies never receive new ensembles), not already in the ensemble (a bookie appears
once per ensemble) and not excluded (the failed bookies themselves and whatever the caller
knows to be bad). With racks it adds ``RackawareEnsemblePlacementPolicy``'s
``minNumRacksPerWriteQuorum``: the bookies left must span ``min(min_racks, WQ)`` racks, and a
bookie without a rack counts in one shared rack (BookKeeper's default rack).

How many replacements a caller needs, and how it ranks the eligible ones, are the callers'
own: the client takes a partial replacement as ``replaceBookiesInEnsemble`` does, a repair
needs every position filled, whatif asks whether every failed bookie could be swapped out.

Pure: no I/O, nothing outside :mod:`bklib.states`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

from bklib.states import UNKNOWN_RACK

__all__ = [
    "DEFAULT_MIN_RACKS",
    "rack_of",
    "replaceable_in_any_ensemble",
    "replacement_candidates",
    "replacement_shortfall",
]

DEFAULT_MIN_RACKS = 2
"""BookKeeper's ``minNumRacksPerWriteQuorum`` default (``RackawareEnsemblePlacementPolicy``)."""


def rack_of(bookie: str, racks: Mapping[str, str]) -> str:
    """The bookie's rack, or :data:`~bklib.states.UNKNOWN_RACK`."""
    return racks.get(bookie) or UNKNOWN_RACK


def replacement_candidates(
    writable: Iterable[str], ensemble: Iterable[str], exclude: Iterable[str] = ()
) -> list[str]:
    """The bookies eligible to replace a member of ``ensemble``, sorted: in ``writable``, not
    in ``ensemble`` and not in ``exclude`` (the failed bookies, and any the caller bans)."""
    return sorted(set(writable).difference(ensemble, exclude))


def replacement_shortfall(
    ensemble: Sequence[str],
    replace: Collection[str],
    writable: Collection[str],
    racks: Mapping[str, str] | None = None,
    write_quorum: int = 1,
    min_racks: int = DEFAULT_MIN_RACKS,
) -> str | None:
    """Why the members of ``ensemble`` in ``replace`` cannot all be swapped for eligible
    bookies (:func:`replacement_candidates`, ``replace`` excluded), or None when they can.

    With ``racks``, the bookies that stay plus the candidates must span
    ``min(min_racks, write_quorum)`` racks."""
    need = sum(1 for b in ensemble if b in replace)
    if not need:
        return None
    candidates = replacement_candidates(writable, ensemble, replace)
    if len(candidates) < need:
        return (
            f"needs {need} replacement bookie{'s' * (need > 1)}, "
            f"{len(candidates)} writable outside the ensemble"
        )
    if racks:
        survivors = [b for b in ensemble if b not in replace]
        usable = {rack_of(b, racks) for b in (*survivors, *candidates)}
        want = min(min_racks, write_quorum)
        if len(usable) < want:
            return f"needs {want} racks per write quorum, {len(usable)} left"
    return None


def replaceable_in_any_ensemble(
    writable: Collection[str],
    ensemble_size: int,
    write_quorum: int,
    racks: Mapping[str, str] | None = None,
    min_racks: int = DEFAULT_MIN_RACKS,
) -> bool:
    """A sufficient condition for :func:`replacement_shortfall` to be None for every ensemble
    of ``ensemble_size`` bookies, every failed set, and ``writable`` as the bookies left.

    At least ``2 * ensemble_size`` writable bookies leave ``ensemble_size`` candidates outside
    any ensemble; racks holding more than ``ensemble_size`` of them keep a candidate whatever
    the ensemble takes. False does not mean blocked, only that the ensemble must be checked.
    """
    if len(writable) < 2 * ensemble_size:
        return False
    if not racks:
        return True
    per_rack: dict[str, int] = {}
    for b in writable:
        r = rack_of(b, racks)
        per_rack[r] = per_rack.get(r, 0) + 1
    full = sum(1 for n in per_rack.values() if n > ensemble_size)
    return full >= min(min_racks, write_quorum)
