"""Pure planning for re-replication: which segments of a ledger need work, which of them are
closed enough to copy, when an open ledger may be fenced, and which bookie replaces which.

No I/O here: :mod:`bklib.repair.worker` feeds in fresh metadata and the LAC it read.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from bklib.errors import NotEnoughBookiesError
from bklib.meta.model import LedgerMetadata
from bklib.quorum import stripe_count
from bklib.replacement import replacement_candidates

__all__ = [
    "FragmentWork",
    "GraceDecision",
    "LedgerWork",
    "TargetChooser",
    "grace_decision",
    "plan_ledger",
    "stripe_entries",
]


@dataclass(frozen=True)
class FragmentWork:
    """One segment to repair: its entry range and the bookies to move out of it.

    ``moves`` maps the position in the ensemble to the bookie that must leave it. ``closed``
    is False while the segment may still grow (the open last segment, or a middle segment
    whose end is above the LAC, BookKeeper #3917): such a fragment is never copied.
    """

    segment_index: int
    first_entry_id: int
    last_entry_id: int  # below first_entry_id for an empty segment
    ensemble: tuple[str, ...]
    moves: Mapping[int, str]
    closed: bool

    @property
    def empty(self) -> bool:
        return self.last_entry_id < self.first_entry_id


@dataclass(frozen=True)
class LedgerWork:
    """Every fragment of one ledger that still names a bad bookie."""

    ledger_id: int
    fragments: tuple[FragmentWork, ...] = ()

    @property
    def closed_fragments(self) -> tuple[FragmentWork, ...]:
        return tuple(f for f in self.fragments if f.closed)

    @property
    def open_fragments(self) -> tuple[FragmentWork, ...]:
        return tuple(f for f in self.fragments if not f.closed)


def plan_ledger(
    md: LedgerMetadata,
    bad_bookies: Collection[str],
    *,
    segments: Mapping[int, Collection[str]] | None = None,
    lac: int | None = None,
) -> LedgerWork:
    """The fragments of ``md`` to repair.

    ``bad_bookies`` leave every segment that names them. ``segments`` adds per-segment bad
    bookies (keyed by the segment's first entry id), for findings about one segment only
    (entries missing, digest mismatch). ``lac`` is the LAC read from the bookies for a ledger
    that is not CLOSED (None: unknown, so every segment of such a ledger counts as open).
    """
    everywhere = set(bad_bookies)
    per_segment = {k: set(v) for k, v in (segments or {}).items()}
    out: list[FragmentWork] = []
    n = len(md.segments)
    for si, seg in enumerate(md.segments):
        bad = everywhere | per_segment.get(seg.first_entry_id, set())
        moves = {i: b for i, b in enumerate(seg.ensemble) if b in bad}
        if not moves:
            continue
        if md.is_closed:
            closed, last = True, md.segment_last_entry_id(si)
        elif si + 1 < n:
            last = md.segment_last_entry_id(si)
            closed = lac is not None and lac >= last
        else:
            closed, last = False, md.segment_last_entry_id(si, lac)
        out.append(FragmentWork(si, seg.first_entry_id, last, seg.ensemble, moves, closed))
    return LedgerWork(md.ledger_id, tuple(out))


def stripe_entries(md: LedgerMetadata, frag: FragmentWork, index: int) -> int:
    """How many entries position ``index`` of ``frag`` holds (what a copy must write)."""
    if frag.empty:
        return 0
    return stripe_count(
        index, frag.first_entry_id, frag.last_entry_id, md.ensemble_size, md.write_quorum
    )


class GraceDecision(Enum):
    FENCE = "fence"
    """Grace period passed and the writer made no progress: fence and close by recovery."""
    WAIT_GRACE = "wait_grace"
    """Detected too recently: a live writer may still replace the bookie itself."""
    WAIT_PROGRESS = "wait_progress"
    """The writer added a segment since detection: it is alive, leave it alone this run."""


def grace_decision(
    md: LedgerMetadata,
    detected_segments: Collection[int] | None,
    detected_age: float | None,
    grace_period: float,
) -> GraceDecision:
    """May recovery fence the open ledger ``md`` now?

    ``detected_segments``: first entry ids of the segments the audit flagged; the writer made
    progress if the current last segment is not one of them. ``detected_age``: seconds since
    the fragment was first detected. None for both means an operator asked for this ledger
    explicitly (manual recover), which, like BookKeeper's recoverBookieData, fences at once.
    """
    if detected_segments is None and detected_age is None:
        return GraceDecision.FENCE
    if detected_segments is not None and md.last_segment.first_entry_id not in detected_segments:
        return GraceDecision.WAIT_PROGRESS
    if detected_age is None or detected_age < grace_period:
        return GraceDecision.WAIT_GRACE
    return GraceDecision.FENCE


@dataclass
class TargetChooser:
    """Picks replacement bookies, spreading load: the candidate with the fewest entries
    assigned so far by this chooser wins, ties broken by a per-chooser random order (so
    tasks and runs do not all pile onto the same bookie).

    When ``racks`` (bookie -> rack) is known, a candidate on a rack the rest of the segment
    does not use wins first, as BookKeeper's rack-aware policy prefers; without racks the
    choice is rack-unaware, like BookKeeper's default policy.
    """

    rng: random.Random = field(default_factory=random.Random)
    assigned: dict[str, int] = field(default_factory=dict)
    racks: Mapping[str, str] = field(default_factory=dict)
    _tiebreak: dict[str, float] = field(default_factory=dict)

    def preference_key(
        self, bookie: str, used_racks: Collection[str] = ()
    ) -> tuple[int, int, float]:
        """How :meth:`choose` ranks ``bookie``, lowest first: ``(same rack as one of
        used_racks, entries assigned so far, random tie-break)``."""
        if bookie not in self._tiebreak:
            self._tiebreak[bookie] = self.rng.random()
        same_rack = int(bookie in self.racks and self.racks[bookie] in used_racks)
        return same_rack, self.assigned.get(bookie, 0), self._tiebreak[bookie]

    def choose(
        self,
        candidates: Iterable[str],
        ensemble: Sequence[str],
        moves: Mapping[int, str],
        *,
        exclude: Collection[str] = (),
        weights: Mapping[int, int] | None = None,
        ledger_id: int | None = None,
    ) -> dict[int, str]:
        """A distinct replacement for each position in ``moves``, among
        :func:`~bklib.replacement.replacement_candidates`: writable (``candidates``), not in
        ``ensemble``, not in ``exclude`` and not a bookie that moves. ``weights`` are the
        entries each position will receive (for load spreading). Raises NotEnoughBookiesError
        when short: a repair leaves no bad bookie in place."""
        pool = replacement_candidates(candidates, ensemble, {*exclude, *moves.values()})
        out: dict[int, str] = {}
        staying = [b for i, b in enumerate(ensemble) if i not in moves]
        used = {self.racks[b] for b in staying if b in self.racks}
        for index in sorted(moves):
            pool.sort(key=lambda b: self.preference_key(b, used))
            if not pool:
                raise NotEnoughBookiesError(
                    f"no writable bookie can replace {moves[index]} (ensemble "
                    f"{sorted(ensemble)}, excluded {sorted(set(exclude))})",
                    ledger_id=ledger_id,
                    bookie=moves[index],
                )
            chosen = pool.pop(0)
            out[index] = chosen
            if chosen in self.racks:
                used.add(self.racks[chosen])
            w = (weights or {}).get(index, 1)
            self.assigned[chosen] = self.assigned.get(chosen, 0) + max(w, 1)
        return out
