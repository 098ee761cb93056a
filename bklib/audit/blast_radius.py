"""Blast radius: what each bookie, and each rack, would do failing alone, in one pass.

:func:`blast_radius` answers :func:`bklib.audit.whatif.ledger_impact`'s question for every
scope at once, with the same numbers (tests/unit/test_blast_radius.py holds it to an
entry-by-entry oracle per scope). Most ledgers have no partially missing replica: those are
summed from per-ensemble plans, bit masks of the residues each scope naming the ensemble would
leave below AQ or with no replica (:func:`~bklib.audit.whatif.residue_verdict`); the others
take :func:`~bklib.audit.whatif.ledger_impact` per scope. The writer check is
:func:`~bklib.audit.whatif.writer_blocked`, skipped when
:func:`bklib.replacement.replaceable_in_any_ensemble` already proves it passes.

Partial results over disjoint sets of ledgers add up with :func:`merge_scopes` (Spark
partitions, forked workers).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from bklib.audit.model import LedgerView, SegmentSpan
from bklib.audit.whatif import (
    LedgerImpact,
    Missing,
    WriterCheck,
    ledger_impact,
    residue_verdict,
    writer_blocked,
)
from bklib.meta.model import LedgerState
from bklib.replacement import DEFAULT_MIN_RACKS, rack_of, replaceable_in_any_ensemble
from bklib.states import Scope

__all__ = ["ScopeImpact", "blast_radius", "merge_scopes"]


@dataclass
class ScopeImpact:
    """The blast radius of one bookie or one rack (a row of the ``blast_radius`` table)."""

    COUNTS: ClassVar[tuple[str, ...]] = (
        "ledgers",
        "ledgers_below_aq",
        "ledgers_lost",
        "entries_below_aq",
        "entries_lost",
        "ledgers_entries_unknown",
        "writers_blocked",
    )
    """The counters, which partial results add up (and the table's int64 columns)."""

    scope: str
    name: str
    bookies: int = 0
    ledgers: int = 0
    """Ledgers naming a bookie of the scope."""
    ledgers_below_aq: int = 0
    ledgers_lost: int = 0
    entries_below_aq: int = 0
    entries_lost: int = 0
    ledgers_entries_unknown: int = 0
    writers_blocked: int = 0
    topics: set[str] = field(default_factory=set)
    topics_lost: set[str] = field(default_factory=set)

    def add(self, impact: LedgerImpact) -> None:
        self.ledgers += 1
        if impact.below_aq:
            self.ledgers_below_aq += 1
            if impact.topic:
                self.topics.add(impact.topic)
        if impact.lost:
            self.ledgers_lost += 1
            if impact.topic:
                self.topics_lost.add(impact.topic)
        self.entries_below_aq += impact.below_aq_entries
        self.entries_lost += impact.lost_entries
        self.ledgers_entries_unknown += impact.entries_unknown
        if impact.writer_blocked is not None:
            self.writers_blocked += 1
            if impact.topic:
                self.topics.add(impact.topic)

    def merge(self, other: ScopeImpact) -> None:
        """Add another partial result for the same scope (Spark partitions, say)."""
        for name in self.COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.topics |= other.topics
        self.topics_lost |= other.topics_lost

    @property
    def risk(self) -> tuple[int, int, int, int]:
        """Sort key, riskiest first when sorted descending."""
        return (self.entries_lost, self.ledgers_lost, self.ledgers_below_aq, self.writers_blocked)


@dataclass
class _LedgerMarks:
    """Per ledger, each scope counts once: the scopes named, below AQ, lost, unknown."""

    named: set[int] = field(default_factory=set)
    below: set[int] = field(default_factory=set)
    lost: set[int] = field(default_factory=set)
    unknown: set[int] = field(default_factory=set)

    def uncounted(self, plan: list[_Plan], *, is_open: bool) -> None:
        """A segment with no known entries: an open one is judged on every residue."""
        for sid, below, lost, _, _ in plan:
            self.named.add(sid)
            if below and is_open:
                self.below.add(sid)
                self.unknown.add(sid)
                if lost:
                    self.lost.add(sid)


class _Radius:
    """:func:`blast_radius`'s accumulator: one slot per scope, with per-ensemble plans.

    A ledger with no partially missing replica is summed from its segments' plans: per
    ensemble (and E/WQ/AQ), which residues each scope naming it would leave below AQ or with
    no replica, as bit masks computed once. A closed segment's entries per residue are
    ``n // E`` plus one for the ``n % E`` residues from ``first % E`` on, so a scope's count
    is two popcounts. Other ledgers take :func:`ledger_impact` per scope (exact ranges).
    """

    def __init__(
        self,
        bookies: Iterable[str],
        racks: Mapping[str, str],
        gone: frozenset[str],
        writable: frozenset[str] | None,
        min_racks: int,
    ) -> None:
        self.racks, self.gone, self.writable, self.min_racks = racks, gone, writable, min_racks
        self.ids: dict[tuple[str, str], int] = {}
        self.keys: list[tuple[str, str]] = []
        self.members: list[set[str]] = []
        self.ledgers: list[int] = []
        self.below: list[int] = []
        self.lost: list[int] = []
        self.below_entries: list[int] = []
        self.lost_entries: list[int] = []
        self.unknown: list[int] = []
        self.blocked: list[int] = []
        self.topics: list[set[str]] = []
        self.topics_lost: list[set[str]] = []
        self.plans: dict[tuple[int, int, int, tuple[str, ...]], list[_Plan]] = {}
        self.templates: dict[_Shape, list[tuple[int, int, int, int]]] = {}
        self.info: dict[str, tuple[int, int, int]] = {}
        self.windows: dict[tuple[int, int, int], int] = {}
        self.writer_memo: dict[tuple[tuple[str, ...], int, int], str | None] = {}
        self.roomy: dict[tuple[int, int, int], bool] = {}
        for b in bookies:
            self.bookie(b)

    def _sid(self, key: tuple[str, str]) -> int:
        sid = self.ids.get(key)
        if sid is None:
            sid = self.ids[key] = len(self.keys)
            self.keys.append(key)
            self.members.append(set())
            for col in (self.ledgers, self.below, self.lost, self.below_entries):
                col.append(0)
            for col in (self.lost_entries, self.unknown, self.blocked):
                col.append(0)
            self.topics.append(set())
            self.topics_lost.append(set())
        return sid

    def bookie(self, b: str) -> int:
        """The bookie's scope id; a bookie seen first here joins its rack."""
        sid = self.ids.get((Scope.BOOKIE, b))
        if sid is None:
            sid = self._sid((Scope.BOOKIE, b))
            self.members[sid].add(b)
            self.members[self._sid((Scope.RACK, rack_of(b, self.racks)))].add(b)
            self.writer_memo.clear()  # a rack's membership changed
            self.roomy.clear()
        return sid

    def _bookie_info(self, b: str) -> tuple[int, int, int]:
        """(bookie scope id, rack scope id, 1 if already gone)."""
        got = self.info.get(b)
        if got is None:
            sid = self.bookie(b)
            got = self.info[b] = (
                sid,
                self.ids[(Scope.RACK, rack_of(b, self.racks))],
                int(b in self.gone),
            )
        return got

    def plan(self, e: int, wq: int, aq: int, ens: tuple[str, ...]) -> list[_Plan]:
        """Per scope naming ``ens``: its residues below AQ and with no replica."""
        key = (e, wq, aq, ens)
        got = self.plans.get(key)
        if got is not None:
            return got
        gone_mask = 0
        groups: dict[int, int] = {}  # scope id -> ensemble indices, in first-seen order
        for i, b in enumerate(ens):
            sid, rid, is_gone = self._bookie_info(b)
            bit = 1 << i
            gone_mask |= is_gone << i
            groups[sid] = groups.get(sid, 0) | bit
            groups[rid] = groups.get(rid, 0) | bit
        # The verdicts depend on the ensemble only through these masks: shared by every
        # ensemble of the same rack pattern (E=4 ensembles are mostly distinct).
        tkey = (e, wq, aq, gone_mask, tuple(groups.values()))
        tmpl = self.templates.get(tkey)
        if tmpl is None:
            tmpl = []
            for fm in groups.values():
                below = lost = 0
                for r, held in residue_verdict(e, wq, aq, gone_mask, fm & ~gone_mask):
                    below |= 1 << r
                    if held == 0:
                        lost |= 1 << r
                tmpl.append((below, lost, below.bit_count(), lost.bit_count()))
            self.templates[tkey] = tmpl
        out = [(sid, *t) for sid, t in zip(groups, tmpl, strict=True)]
        if len(self.plans) < _MAX_PLANS:
            self.plans[key] = out
        return out

    def window(self, e: int, first: int, rem: int) -> int:
        """Residues of the last ``rem`` entries of a segment starting at ``first``."""
        key = (e, first % e, rem)
        w = self.windows.get(key)
        if w is None:
            w = 0
            for k in range(rem):
                w |= 1 << ((first + k) % e)
            self.windows[key] = w
        return w

    def add_ledger(self, view: LedgerView) -> None:
        """A ledger with no partially missing replica, every scope at once."""
        e, wq, aq = view.ensemble_size, view.write_quorum, view.ack_quorum
        assert e is not None and wq is not None and aq is not None and view.segments
        segs = view.segments
        if len(segs) == 1 and segs[0].last_entry_id is not None and view.is_closed:
            self._add_closed(e, wq, aq, segs[0], view.topic)
            return
        marks = _LedgerMarks()
        for seg in segs:
            plan = self.plans.get((e, wq, aq, seg.ensemble)) or self.plan(e, wq, aq, seg.ensemble)
            first, last = seg.first_entry_id, seg.last_entry_id
            n = 0 if last is None else last - first + 1
            if n <= 0:
                marks.uncounted(plan, is_open=last is None)
            else:
                self._count_segment(plan, e, first, n, marks)
        self._finish_ledger(view, marks)

    def _count_segment(
        self, plan: list[_Plan], e: int, first: int, n: int, marks: _LedgerMarks
    ) -> None:
        """Add a segment of ``n > 0`` known entries from ``first`` to the scopes in ``plan``."""
        q, rem = divmod(n, e)
        w = self.window(e, first, rem) if rem else 0
        below_entries, lost_entries = self.below_entries, self.lost_entries
        for sid, below, lost, nb, nl in plan:
            marks.named.add(sid)
            if not below:
                continue
            cb = q * nb + (below & w).bit_count()
            if not cb:
                continue
            below_entries[sid] += cb
            marks.below.add(sid)
            if lost:
                cl = q * nl + (lost & w).bit_count()
                if cl:
                    lost_entries[sid] += cl
                    marks.lost.add(sid)

    def _finish_ledger(self, view: LedgerView, marks: _LedgerMarks) -> None:
        """Count the ledger once in each scope ``marks`` names, and check its writer."""
        topic = view.topic
        ledgers = self.ledgers
        for sid in marks.named:
            ledgers[sid] += 1
        for sid in marks.below:
            self.below[sid] += 1
            if topic:
                self.topics[sid].add(topic)
        for sid in marks.lost:
            self.lost[sid] += 1
            if topic:
                self.topics_lost[sid].add(topic)
        for sid in marks.unknown:
            self.unknown[sid] += 1
        if self.writable is not None and view.state == LedgerState.OPEN.name:
            for sid in marks.named:
                if self._blocked(view, sid) is not None:
                    self.blocked[sid] += 1
                    if topic:
                        self.topics[sid].add(topic)

    def _add_closed(self, e: int, wq: int, aq: int, seg: SegmentSpan, topic: str | None) -> None:
        """:meth:`add_ledger` for the common case, a closed ledger of one segment."""
        plan = self.plans.get((e, wq, aq, seg.ensemble)) or self.plan(e, wq, aq, seg.ensemble)
        assert seg.last_entry_id is not None
        n = seg.last_entry_id - seg.first_entry_id + 1
        ledgers = self.ledgers
        if n <= 0:
            for p in plan:
                ledgers[p[0]] += 1
            return
        q, rem = divmod(n, e)
        w = self.window(e, seg.first_entry_id, rem) if rem else 0
        for sid, below, lost, nb, nl in plan:
            ledgers[sid] += 1
            if not below:
                continue
            cb = q * nb + (below & w).bit_count()
            if not cb:
                continue
            self.below_entries[sid] += cb
            self.below[sid] += 1
            if topic:
                self.topics[sid].add(topic)
            if lost:
                cl = q * nl + (lost & w).bit_count()
                if cl:
                    self.lost_entries[sid] += cl
                    self.lost[sid] += 1
                    if topic:
                        self.topics_lost[sid].add(topic)

    def _roomy(self, sid: int, e: int, wq: int) -> bool:
        """True when any ensemble of size ``e`` can surely replace the scope's bookies (then
        the per-ensemble writer check is not needed)."""
        key = (sid, e, wq)
        got = self.roomy.get(key)
        if got is None:
            assert self.writable is not None
            left = self.writable - self.members[sid]
            got = replaceable_in_any_ensemble(left, e, wq, self.racks, self.min_racks)
            self.roomy[key] = got
        return got

    def _blocked(self, view: LedgerView, sid: int) -> str | None:
        assert view.segments and self.writable is not None
        e, wq = len(view.segments[-1].ensemble), view.write_quorum or 1
        if self._roomy(sid, e, wq):
            return None
        key = (view.segments[-1].ensemble, wq, sid)
        if key in self.writer_memo:
            return self.writer_memo[key]
        failed = self.members[sid]
        check = WriterCheck(self.writable - failed, self.racks, self.min_racks)
        why = self.writer_memo[key] = writer_blocked(view, failed, check)
        return why

    def add_exact(self, view: LedgerView, missing: Missing) -> None:
        """A ledger with partially missing replicas: :func:`ledger_impact` per scope."""
        named = [self.bookie(b) for b in view.bookies()]
        sids = list(dict.fromkeys(named))
        sids += list(dict.fromkeys(self.ids[(Scope.RACK, rack_of(b, self.racks))]
                                   for b in view.bookies()))  # fmt: skip
        is_open = self.writable is not None and view.state == LedgerState.OPEN.name
        for sid in sids:
            failed = self.members[sid]
            check = None
            if is_open:
                assert self.writable is not None
                check = WriterCheck(self.writable - failed, self.racks, self.min_racks)
            imp = ledger_impact(
                view, failed, gone=self.gone, missing=missing, writer=check, max_ranges=0
            )
            if imp is not None:
                self.add_impact(sid, imp)

    def add_impact(self, sid: int, imp: LedgerImpact) -> None:
        self.ledgers[sid] += 1
        self.below[sid] += imp.below_aq
        self.lost[sid] += imp.lost
        self.below_entries[sid] += imp.below_aq_entries
        self.lost_entries[sid] += imp.lost_entries
        self.unknown[sid] += imp.entries_unknown
        self.blocked[sid] += imp.writer_blocked is not None
        if imp.topic:
            if imp.below_aq or imp.writer_blocked is not None:
                self.topics[sid].add(imp.topic)
            if imp.lost:
                self.topics_lost[sid].add(imp.topic)

    def results(self) -> list[ScopeImpact]:
        out = []
        for sid, (scope, name) in enumerate(self.keys):
            out.append(
                ScopeImpact(
                    scope,
                    name,
                    bookies=len(self.members[sid]),
                    ledgers=self.ledgers[sid],
                    ledgers_below_aq=self.below[sid],
                    ledgers_lost=self.lost[sid],
                    entries_below_aq=self.below_entries[sid],
                    entries_lost=self.lost_entries[sid],
                    ledgers_entries_unknown=self.unknown[sid],
                    writers_blocked=self.blocked[sid],
                    topics=self.topics[sid],
                    topics_lost=self.topics_lost[sid],
                )
            )
        return out


_Plan = tuple[int, int, int, int, int]
"""(scope id, residues below AQ, residues with no replica, and their popcounts)."""
_Shape = tuple[int, int, int, int, tuple[int, ...]]
"""(E, WQ, AQ, indices already gone, indices of each scope naming the ensemble)."""
_MAX_PLANS = 200_000
"""Ensembles whose plans are kept (the templates behind them are few)."""


def merge_scopes(parts: Iterable[Iterable[ScopeImpact]]) -> list[ScopeImpact]:
    """Partial :func:`blast_radius` results over disjoint sets of ledgers (same bookies and
    arguments otherwise) added up, ordered as :func:`blast_radius` orders them."""
    acc: dict[tuple[str, str], ScopeImpact] = {}
    for part in parts:
        for s in part:
            prev = acc.get((s.scope, s.name))
            if prev is None:
                acc[(s.scope, s.name)] = s
            else:
                prev.merge(s)
    return _ranked(acc.values())


def _ranked(scopes: Iterable[ScopeImpact]) -> list[ScopeImpact]:
    return sorted(scopes, key=lambda s: (s.scope, *(-x for x in s.risk), s.name))


def blast_radius(
    views: Iterable[LedgerView],
    bookies: Iterable[str],
    *,
    racks: Mapping[str, str] | None = None,
    gone: Collection[str] = frozenset(),
    missing: Missing | None = None,
    writable: Collection[str] | None = None,
    min_racks: int = DEFAULT_MIN_RACKS,
) -> list[ScopeImpact]:
    """The impact of each bookie, and of each rack, failing alone: one pass over ``views``.

    ``bookies`` are the cluster's bookies (registered and lost); a bookie named by a ledger
    and absent from them is added. Racks come from ``racks`` (bookies without one form the
    ``unknown`` rack). ``writable`` enables the open-ledger writer check. Riskiest first.
    Partial results over disjoint sets of views, with the same arguments otherwise, combine
    with :func:`merge_scopes`.
    """
    missing = missing or {}
    acc = _Radius(
        dict.fromkeys(bookies),
        dict(racks or {}),
        frozenset(gone),
        frozenset(writable) if writable is not None else None,
        min_racks,
    )
    with_missing = {k[0] for k in missing}
    for view in views:
        if not view.ok or not view.segments:
            continue
        if view.ledger_id in with_missing:
            acc.add_exact(view, missing)
        else:
            acc.add_ledger(view)
    return _ranked(acc.results())
