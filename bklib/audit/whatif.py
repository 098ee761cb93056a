"""What happens if some bookies fail next: pure arithmetic over ledger views.

Given the ledgers (:class:`~bklib.audit.model.LedgerView`), the bookies that would fail, and
what is already gone (lost bookies, replicas the latest audit found missing), this computes per
ledger the entries that would fall below AQ and those left with no replica, and whether an open
ledger's writer could replace the failed bookies. :func:`blast_radius` does it for every bookie
and every rack in one pass.

Per entry ``x`` of a segment the write set is ``bklib.quorum.write_set`` (BookKeeper's
``RoundRobinDistributionSchedule``). An entry is *affected* when a failing bookie holds it now
(it is in the write set and not already missing there); its replicas after the failure are the
write-set members that hold it and do not fail. Affected entries with fewer than AQ replicas
left fall below AQ; with none they are lost. Entries a failing bookie does not hold are not the
failure's doing and are not counted.

Never per entry: between two boundaries of the missing ranges the set of absent bookies is
constant, and only residues ``x % E`` matter there, so the cost grows with segments and gaps.
The end of an open ledger's last segment is unknown (only the bookies know the LAC): such a
segment is judged on every residue, and its entry counts are unknown (``entries_unknown``).

Conservative on purpose: a replica the audit could not reach (BOOKIE_UNREACHABLE) is passed in
as missing by the callers, since a safe-to-stop verdict must not rely on it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from bklib.audit.model import LedgerView, SegmentSpan
from bklib.meta.model import LedgerState
from bklib.quorum import stripe_count, write_set
from bklib.states import UNKNOWN_RACK, Scope

__all__ = [
    "COVERAGE_SAMPLE",
    "DEFAULT_MIN_RACKS",
    "LedgerImpact",
    "Missing",
    "ScanCoverage",
    "ScopeImpact",
    "WriterCheck",
    "blast_radius",
    "current_missing",
    "ledger_impact",
    "merge_scopes",
    "rack_of",
    "replacement_shortfall",
    "segment_impact",
    "writer_blocked",
]

Run = tuple[int, int]
Missing = Mapping[tuple[int, int, str], Sequence[Run] | None]
"""(ledger id, segment first entry id, bookie) -> the entry ranges that bookie lacks in that
segment, or None for all of them (a lost bookie)."""

MAX_RANGES = 100
"""Lost entry ranges listed per ledger; the counts are always complete."""

DEFAULT_MIN_RACKS = 2
"""BookKeeper's ``minNumRacksPerWriteQuorum`` default (``RackawareEnsemblePlacementPolicy``)."""


COVERAGE_SAMPLE = 10
"""Unreadable ledger ids named in a coverage note."""


@dataclass(frozen=True)
class ScanCoverage:
    """What the metadata scan behind a what-if or blast-radius answer missed.

    A ledger whose metadata could not be read, or one the scan did not account for
    (docs/reliability.md, scan accounting), may name any bookie: an answer computed without it
    proves nothing safe and its counts are only a lower bound.
    """

    unreadable: int
    sample: tuple[int, ...]
    """The first :data:`COVERAGE_SAMPLE` unreadable ledger ids."""
    unaccounted: int

    @classmethod
    def of(cls, unreadable_ids: Sequence[int], unaccounted: int) -> ScanCoverage:
        """Coverage from every unreadable ledger id and the unaccounted count."""
        ids = sorted(unreadable_ids)
        return cls(len(ids), tuple(ids[:COVERAGE_SAMPLE]), unaccounted)

    @property
    def complete(self) -> bool:
        """True when every ledger was read and accounted for."""
        return not self.unreadable and not self.unaccounted

    def notes(self) -> list[str]:
        """One line per gap, naming the ledgers it can."""
        out = []
        if self.unreadable:
            shown = ", ".join(str(i) for i in self.sample)
            more = " ..." if self.unreadable > len(self.sample) else ""
            out.append(f"{self.unreadable} ledgers could not be read ({shown}{more})")
        if self.unaccounted:
            out.append(f"the metadata scan missed {self.unaccounted} ledgers")
        return out


def current_missing(
    missing: Mapping[tuple[int, int, str], Sequence[Run] | None], views: Iterable[LedgerView]
) -> dict[tuple[int, int, str], Sequence[Run] | None]:
    """The entries of ``missing`` whose segment still names their bookie in ``views``: a
    finding on a replica the metadata has since moved is stale. Per ledger, so disjoint sets
    of views (Spark partitions) filter independently."""
    wanted = {k[0] for k in missing}
    out: dict[tuple[int, int, str], Sequence[Run] | None] = {}
    for v in views:
        if v.ledger_id not in wanted or not v.ok:
            continue
        for s in v.segments or ():
            for b in s.ensemble:
                key = (v.ledger_id, s.first_entry_id, b)
                if key in missing:
                    out[key] = missing[key]
    return out


def rack_of(bookie: str, racks: Mapping[str, str]) -> str:
    """The bookie's rack, or :data:`~bklib.states.UNKNOWN_RACK`."""
    return racks.get(bookie) or UNKNOWN_RACK


@dataclass(frozen=True)
class SegmentResult:
    """One segment's share of an impact."""

    below_aq_entries: int
    lost_entries: int
    lost_ranges: tuple[Run, ...]
    truncated: bool
    below_aq: bool
    lost: bool


@lru_cache(maxsize=65536)
def _residue_verdict(
    e: int, wq: int, aq: int, gone_mask: int, failed_mask: int
) -> tuple[tuple[int, int], ...]:
    """(residue, replicas left) for each residue an index of ``failed_mask`` holds and that
    would keep fewer than AQ replicas; ``gone_mask`` indices do not hold it already."""
    out = []
    for r in range(e):
        ws = write_set(r, e, wq)  # the write set of every entry with residue r
        if not any(failed_mask >> i & 1 and not gone_mask >> i & 1 for i in ws):
            continue
        held = sum(1 for i in ws if not (gone_mask | failed_mask) >> i & 1)
        if held < aq:
            out.append((r, held))
    return tuple(out)


def _count(r: int, p: int, q: int, e: int) -> int:
    # Entries of residue r in [p, q]: index r's stripe with a write quorum of one.
    return stripe_count(r, p, q, e, 1)


def _ids(r: int, p: int, q: int, e: int) -> Iterable[int]:
    x = p + (r - p) % e
    while x <= q:
        yield x
        x += e


def _add_run(runs: list[Run], a: int, b: int) -> None:
    if runs and runs[-1][1] + 1 >= a:
        runs[-1] = (runs[-1][0], max(runs[-1][1], b))
    else:
        runs.append((a, b))


def segment_impact(
    first: int,
    last: int | None,
    e: int,
    wq: int,
    aq: int,
    failed: Collection[int],
    absent: Mapping[int, Sequence[Run] | None],
    max_ranges: int = MAX_RANGES,
    *,
    existing: bool = False,
) -> SegmentResult:
    """The impact on one segment of failing ensemble indices ``failed``.

    ``absent[i]`` are the ranges index ``i`` already lacks (None: all of them). ``last`` None
    is an open segment of unknown end: judged on every residue, counts left at 0.
    ``existing``: ignore ``failed`` and judge what is already absent (the entries with no
    replica now are ``lost``; use AQ=1 to ask only that).
    """
    failed_mask = 0
    for i in failed:
        failed_mask |= 1 << i
    if existing:
        failed_mask = sum(1 << i for i in absent)
    if not failed_mask:
        return SegmentResult(0, 0, (), False, False, False)
    whole = 0
    partial: dict[int, list[Run]] = {}
    for i, ranges in absent.items():
        if ranges is None or last is None:
            whole |= 1 << i  # unknown end: a partial gap counts as whole (conservative)
        elif ranges:
            partial[i] = sorted(ranges)
    if last is None:
        verdict = (
            _residue_verdict(e, wq, aq, 0, whole)
            if existing
            else _residue_verdict(e, wq, aq, whole, failed_mask & ~whole)
        )
        any_lost = any(h == 0 for _, h in verdict)
        return SegmentResult(0, 0, (), False, bool(verdict), any_lost)
    if last < first:
        return SegmentResult(0, 0, (), False, False, False)
    points = {first, last + 1}
    for rs in partial.values():
        for a, b in rs:
            if b >= first and a <= last:
                points.add(max(a, first))
                points.add(min(b, last) + 1)
    bounds = sorted(points)
    below = lost = 0
    runs: list[Run] = []
    truncated: bool = False
    for k in range(len(bounds) - 1):
        p, q = bounds[k], bounds[k + 1] - 1
        gone = whole
        for i, rs in partial.items():
            if any(a <= p <= b for a, b in rs):
                gone |= 1 << i
        verdict = (
            _residue_verdict(e, wq, aq, 0, gone)
            if existing
            else _residue_verdict(e, wq, aq, gone, failed_mask & ~gone)
        )
        if not verdict:
            continue
        span = q - p + 1
        lost_residues = []
        for r, held in verdict:
            n = span // e if span % e == 0 else _count(r, p, q, e)
            if n == 0:
                continue
            below += n
            if held == 0:
                lost += n
                lost_residues.append(r)
        if not lost_residues or truncated or max_ranges <= 0:
            truncated = truncated or (bool(lost_residues) and max_ranges <= 0)
            continue
        if len(lost_residues) == e:
            _add_run(runs, p, q)
        else:
            ids = sorted(x for r in lost_residues for x in _ids(r, p, min(q, p + e * 64), e))
            for x in ids:
                _add_run(runs, x, x)
                if len(runs) > max_ranges:
                    break
            if q > p + e * 64:
                truncated = True
        if len(runs) > max_ranges:
            truncated = True
    if len(runs) > max_ranges:
        runs = runs[:max_ranges]
    return SegmentResult(below, lost, tuple(runs), truncated, below > 0, lost > 0)


@dataclass(frozen=True)
class WriterCheck:
    """What an open ledger's writer has to replace failed bookies with."""

    writable: frozenset[str]
    """Writable bookies after the failure."""
    racks: Mapping[str, str] = field(default_factory=dict)
    """Pulsar's rack map; empty: placement is rack-unaware."""
    min_racks: int = DEFAULT_MIN_RACKS


def replacement_shortfall(
    ensemble: Sequence[str],
    replace: Collection[str],
    writable: Collection[str],
    racks: Mapping[str, str] | None = None,
    write_quorum: int = 1,
    min_racks: int = DEFAULT_MIN_RACKS,
) -> str | None:
    """Why ``replace`` cannot all be swapped out of ``ensemble`` for writable bookies outside
    it, or None when they can."""
    need = sum(1 for b in ensemble if b in replace)
    if not need:
        return None
    candidates = set(writable) - set(ensemble)
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


def writer_blocked(view: LedgerView, failed: Collection[str], check: WriterCheck) -> str | None:
    """Why the writer of an OPEN ledger could not replace the failed bookies of its last
    ensemble (BookKeeper's ``LedgerHandle.ensembleChangeLoop`` needs a new bookie outside the
    ensemble for each), or None when it can or the ledger is not open."""
    if view.state != LedgerState.OPEN.name or not view.segments:
        return None
    return replacement_shortfall(
        view.segments[-1].ensemble,
        failed,
        check.writable - set(failed),
        check.racks,
        view.write_quorum or 1,
        check.min_racks,
    )


@dataclass
class LedgerImpact:
    """One ledger's impact of a failure (only ledgers that name a failing bookie)."""

    ledger_id: int
    state: str | None
    topic: str | None
    component: str | None
    below_aq: bool = False
    lost: bool = False
    below_aq_entries: int = 0
    lost_entries: int = 0
    lost_ranges: list[Run] = field(default_factory=list)
    lost_ranges_truncated: bool = False
    entries_unknown: bool = False
    """An open segment was affected: its entry counts are unknown (not in the totals)."""
    writer_blocked: str | None = None

    @property
    def harmed(self) -> bool:
        return self.below_aq or self.writer_blocked is not None


def _absent_for(
    view: LedgerView, first: int, ensemble: Sequence[str], gone: Collection[str], missing: Missing
) -> dict[int, Sequence[Run] | None]:
    out: dict[int, Sequence[Run] | None] = {}
    for i, b in enumerate(ensemble):
        if b in gone:
            out[i] = None
            continue
        key = (view.ledger_id, first, b)
        if key in missing:
            out[i] = missing[key]
    return out


def ledger_impact(
    view: LedgerView,
    failed: Collection[str],
    *,
    gone: Collection[str] = frozenset(),
    missing: Missing | None = None,
    writer: WriterCheck | None = None,
    max_ranges: int = MAX_RANGES,
) -> LedgerImpact | None:
    """The impact on ``view`` of ``failed`` failing; None when no segment names one of them.

    ``gone`` are bookies already lost (they hold nothing); ``missing`` the replicas the latest
    audit found missing; ``writer`` enables the open-ledger writer check.
    """
    if not view.ok or not view.segments:
        return None
    e, wq, aq = view.ensemble_size, view.write_quorum, view.ack_quorum
    assert e is not None and wq is not None and aq is not None
    out: LedgerImpact | None = None
    missing = missing or {}
    for seg in view.segments:
        idx = [i for i, b in enumerate(seg.ensemble) if b in failed]
        if not idx:
            continue
        if out is None:
            out = LedgerImpact(view.ledger_id, view.state, view.topic, view.component)
        absent = _absent_for(view, seg.first_entry_id, seg.ensemble, gone, missing)
        res = segment_impact(
            seg.first_entry_id, seg.last_entry_id, e, wq, aq, idx, absent, max_ranges
        )
        out.below_aq |= res.below_aq
        out.lost |= res.lost
        out.below_aq_entries += res.below_aq_entries
        out.lost_entries += res.lost_entries
        if seg.last_entry_id is None and res.below_aq:
            out.entries_unknown = True
        room = max_ranges - len(out.lost_ranges)
        out.lost_ranges.extend(res.lost_ranges[:room])
        out.lost_ranges_truncated |= res.truncated or len(res.lost_ranges) > room
    if out is not None and writer is not None:
        out.writer_blocked = writer_blocked(view, failed, writer)
    return out


@dataclass
class ScopeImpact:
    """The blast radius of one bookie or one rack (a row of the ``blast_radius`` table)."""

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
        for name in (
            "ledgers",
            "ledgers_below_aq",
            "ledgers_lost",
            "entries_below_aq",
            "entries_lost",
            "ledgers_entries_unknown",
            "writers_blocked",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.topics |= other.topics
        self.topics_lost |= other.topics_lost

    @property
    def risk(self) -> tuple[int, int, int, int]:
        """Sort key, riskiest first when sorted descending."""
        return (self.entries_lost, self.ledgers_lost, self.ledgers_below_aq, self.writers_blocked)


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
                for r, held in _residue_verdict(e, wq, aq, gone_mask, fm & ~gone_mask):
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
        # Per ledger, each scope counts once: the scopes named, below AQ, lost, unknown.
        named: set[int] = set()
        below_at: set[int] = set()
        lost_at: set[int] = set()
        unknown_at: set[int] = set()
        below_entries, lost_entries = self.below_entries, self.lost_entries
        for seg in segs:
            plan = self.plans.get((e, wq, aq, seg.ensemble)) or self.plan(e, wq, aq, seg.ensemble)
            first, last = seg.first_entry_id, seg.last_entry_id
            n = 0 if last is None else last - first + 1
            if n <= 0:
                for sid, below, lost, _, _ in plan:
                    named.add(sid)
                    if below and last is None:  # open: judged on every residue
                        below_at.add(sid)
                        unknown_at.add(sid)
                        if lost:
                            lost_at.add(sid)
                continue
            q, rem = divmod(n, e)
            w = self.window(e, first, rem) if rem else 0
            for sid, below, lost, nb, nl in plan:
                named.add(sid)
                if not below:
                    continue
                cb = q * nb + (below & w).bit_count()
                if not cb:
                    continue
                below_entries[sid] += cb
                below_at.add(sid)
                if lost:
                    cl = q * nl + (lost & w).bit_count()
                    if cl:
                        lost_entries[sid] += cl
                        lost_at.add(sid)
        topic = view.topic
        ledgers = self.ledgers
        for sid in named:
            ledgers[sid] += 1
        for sid in below_at:
            self.below[sid] += 1
            if topic:
                self.topics[sid].add(topic)
        for sid in lost_at:
            self.lost[sid] += 1
            if topic:
                self.topics_lost[sid].add(topic)
        for sid in unknown_at:
            self.unknown[sid] += 1
        if self.writable is not None and view.state == LedgerState.OPEN.name:
            for sid in named:
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
        """True when any ensemble of size ``e`` can surely replace the scope's bookies: at
        least ``e`` writable bookies outside the scope and any such ensemble, and enough
        racks holding more than ``e`` of them that no ensemble takes a rack away."""
        key = (sid, e, wq)
        got = self.roomy.get(key)
        if got is None:
            assert self.writable is not None
            left = self.writable - self.members[sid]
            got = len(left) >= 2 * e
            if got and self.racks:
                per_rack: dict[str, int] = defaultdict(int)
                for b in left:
                    per_rack[rack_of(b, self.racks)] += 1
                full = sum(1 for n in per_rack.values() if n > e)
                got = full >= min(self.min_racks, wq)
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
