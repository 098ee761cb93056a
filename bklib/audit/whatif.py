"""What happens if some bookies fail next: pure arithmetic over ledger views.

Given the ledgers (:class:`~bklib.audit.model.LedgerView`), the bookies that would fail, and
what is already gone (lost bookies, replicas the latest audit found missing), this computes per
ledger the entries that would fall below AQ and those left with no replica, and whether an open
ledger's writer could replace the failed bookies. :mod:`bklib.audit.blast_radius` does it for
every bookie and every rack in one pass, on the helpers here.

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

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from bklib.audit.model import LedgerView
from bklib.meta.model import LedgerState
from bklib.quorum import stripe_count, write_set
from bklib.replacement import DEFAULT_MIN_RACKS, replacement_shortfall

__all__ = [
    "COVERAGE_SAMPLE",
    "LedgerImpact",
    "Missing",
    "ScanCoverage",
    "WriterCheck",
    "current_missing",
    "ledger_impact",
    "residue_verdict",
    "segment_impact",
    "writer_blocked",
]

Run = tuple[int, int]
Missing = Mapping[tuple[int, int, str], Sequence[Run] | None]
"""(ledger id, segment first entry id, bookie) -> the entry ranges that bookie lacks in that
segment, or None for all of them (a lost bookie)."""

MAX_RANGES = 100
"""Lost entry ranges listed per ledger; the counts are always complete."""

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
def residue_verdict(
    e: int, wq: int, aq: int, gone_mask: int, failed_mask: int
) -> tuple[tuple[int, int], ...]:
    """(residue, replicas left) for each residue an index of ``failed_mask`` holds and that
    would keep fewer than AQ replicas; ``gone_mask`` indices do not hold it already.

    Bit ``i`` of a mask is ensemble index ``i``. Cached: blast radius asks it per ensemble
    shape."""
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


_NO_IMPACT = SegmentResult(0, 0, (), False, False, False)


def _mask(indices: Iterable[int]) -> int:
    """The bitmask of ensemble ``indices`` (bit ``i`` is index ``i``)."""
    mask = 0
    for i in indices:
        mask |= 1 << i
    return mask


def _split_absent(
    absent: Mapping[int, Sequence[Run] | None], last: int | None
) -> tuple[int, dict[int, list[Run]]]:
    """Which indices lack the whole segment (a mask) and which lack sorted ranges of it."""
    whole = 0
    partial: dict[int, list[Run]] = {}
    for i, ranges in absent.items():
        if ranges is None or last is None:
            whole |= 1 << i  # unknown end: a partial gap counts as whole (conservative)
        elif ranges:
            partial[i] = sorted(ranges)
    return whole, partial


def _verdict(
    e: int, wq: int, aq: int, gone: int, failed_mask: int, existing: bool
) -> tuple[tuple[int, int], ...]:
    """Residues below AQ with ``gone`` absent: ``failed_mask`` failing, or as is (existing)."""
    if existing:
        return residue_verdict(e, wq, aq, 0, gone)
    return residue_verdict(e, wq, aq, gone, failed_mask & ~gone)


def _open_impact(
    e: int, wq: int, aq: int, whole: int, failed_mask: int, existing: bool
) -> SegmentResult:
    """Whether an open segment (unknown end) has any residue below AQ or with no replica."""
    verdict = _verdict(e, wq, aq, whole, failed_mask, existing)
    any_lost = any(h == 0 for _, h in verdict)
    return SegmentResult(0, 0, (), False, bool(verdict), any_lost)


def _bounds(first: int, last: int, partial: Mapping[int, Sequence[Run]]) -> list[int]:
    """The sorted points in ``[first, last + 1]`` where the set of absent indices changes."""
    points = {first, last + 1}
    for rs in partial.values():
        for a, b in rs:
            if b >= first and a <= last:
                points.add(max(a, first))
                points.add(min(b, last) + 1)
    return sorted(points)


def _gone_at(p: int, whole: int, partial: Mapping[int, Sequence[Run]]) -> int:
    """The mask of indices that lack entry ``p``."""
    gone = whole
    for i, rs in partial.items():
        if any(a <= p <= b for a, b in rs):
            gone |= 1 << i
    return gone


def _tally(
    verdict: Iterable[tuple[int, int]], p: int, q: int, e: int
) -> tuple[int, int, list[int]]:
    """How many entries of ``[p, q]`` fall below AQ, how many are lost, and the lost residues."""
    span = q - p + 1
    below = lost = 0
    lost_residues = []
    for r, held in verdict:
        n = span // e if span % e == 0 else _count(r, p, q, e)
        if n == 0:
            continue
        below += n
        if held == 0:
            lost += n
            lost_residues.append(r)
    return below, lost, lost_residues


def _record_lost(
    runs: list[Run], lost_residues: Sequence[int], p: int, q: int, e: int, max_ranges: int
) -> bool:
    """List ``[p, q]``'s lost ids in ``runs``; True if cut short (max_ranges, or 64 stripes)."""
    if len(lost_residues) == e:
        _add_run(runs, p, q)
        return len(runs) > max_ranges
    hi = min(q, p + e * 64)
    for x in sorted(x for r in lost_residues for x in _ids(r, p, hi, e)):
        _add_run(runs, x, x)
        if len(runs) > max_ranges:
            return True
    return q > p + e * 64


def _closed_impact(
    first: int,
    last: int,
    e: int,
    wq: int,
    aq: int,
    gaps: tuple[int, dict[int, list[Run]]],
    failed_mask: int,
    existing: bool,
    max_ranges: int,
) -> SegmentResult:
    """A closed segment's counts and lost ranges, piece by piece where the absent set holds."""
    whole, partial = gaps
    # No partial gaps (the common case): one piece, the whole segment, absent set ``whole``.
    bounds = _bounds(first, last, partial) if partial else [first, last + 1]
    below = lost = 0
    runs: list[Run] = []
    truncated = False
    for k in range(len(bounds) - 1):
        p, q = bounds[k], bounds[k + 1] - 1
        gone = _gone_at(p, whole, partial) if partial else whole
        verdict = _verdict(e, wq, aq, gone, failed_mask, existing)
        if not verdict:
            continue
        n_below, n_lost, lost_residues = _tally(verdict, p, q, e)
        below += n_below
        lost += n_lost
        if not lost_residues or truncated:
            continue
        truncated = max_ranges <= 0 or _record_lost(runs, lost_residues, p, q, e, max_ranges)
    return SegmentResult(below, lost, tuple(runs[:max_ranges]), truncated, below > 0, lost > 0)


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
    failed_mask = _mask(failed)
    if existing:
        failed_mask = _mask(absent)
    if not failed_mask:
        return _NO_IMPACT
    gaps = _split_absent(absent, last)
    if last is None:
        return _open_impact(e, wq, aq, gaps[0], failed_mask, existing)
    if last < first:
        return _NO_IMPACT
    return _closed_impact(first, last, e, wq, aq, gaps, failed_mask, existing, max_ranges)


@dataclass(frozen=True)
class WriterCheck:
    """What an open ledger's writer has to replace failed bookies with."""

    writable: frozenset[str]
    """Writable bookies after the failure."""
    racks: Mapping[str, str] = field(default_factory=dict)
    """Pulsar's rack map; empty: placement is rack-unaware."""
    min_racks: int = DEFAULT_MIN_RACKS


def writer_blocked(view: LedgerView, failed: Collection[str], check: WriterCheck) -> str | None:
    """Why the writer of an OPEN ledger could not replace the failed bookies of its last
    ensemble (BookKeeper's ``LedgerHandle.ensembleChangeLoop`` needs a new bookie outside the
    ensemble for each), or None when it can or the ledger is not open. The rule is
    :func:`bklib.replacement.replacement_shortfall` (the failed bookies are never candidates)."""
    if view.state != LedgerState.OPEN.name or not view.segments:
        return None
    return replacement_shortfall(
        view.segments[-1].ensemble,
        failed,
        check.writable,
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
