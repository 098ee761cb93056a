"""BookKeeper's LedgerChecker verdict, pure: from one ledger's metadata and what its bookies
answered, the under-replicated fragments and how bad each is.

Never one row per entry per replica. A segment's entries on the bookie at ensemble index ``i``
form a stripe, the residues ``{i - WQ + 1 .. i} mod E`` (:mod:`bklib.quorum`). What a bookie
holds arrives as runs of entry ids (:class:`bklib.availability.EntryRuns`). Per (segment,
bookie) the missing entries are the gaps of the runs trimmed to the stripe, counted with residue
arithmetic. The fewest replicas of any entry comes from a sweep over the gap boundaries of the
segment's bookies: between two boundaries the set of bookies missing the entries is constant,
and only the (at most E) residues present there need counting. Cost grows with segments and
gaps, not with entries.

Fail closed: only a negative answer (NoSuchLedger / NoSuchEntry) makes entries missing. An
unreachable bookie, or an id whose read failed, is BOOKIE_UNREACHABLE, counted neither as
missing nor as held, and never given a severity.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bklib.audit.model import Finding, LedgerView, ReplicaReport
from bklib.availability import EntryRuns
from bklib.quorum import classify_replicas, stripe_count
from bklib.states import CountKey, Reason, ReplicaStatus

__all__ = [
    "MAX_RANGES_PER_FINDING",
    "classify_ledger",
    "keep_still_current",
    "ledger_lac",
    "summarize",
]

MAX_RANGES_PER_FINDING = 100
"""Missing ranges listed per finding; the count is always complete."""
MAX_COUNT = 2**63 - 1
"""The largest value of an int64 count column."""

Run = tuple[int, int]


def _count(ranges: Iterable[Run], idx: int, e: int, wq: int) -> int:
    return sum(stripe_count(idx, a, b, e, wq) for a, b in ranges)


def _worst_missing(absent: dict[int, list[Run]], e: int, wq: int) -> dict[int, int]:
    """For each index, the largest number of bookies missing one of the entries it misses
    (its own included).

    ``absent[i]`` are sorted, disjoint ranges where index ``i`` lacks its stripe entries.
    Entry ``x`` counts towards index ``i`` only if ``i`` is in x's write set, i.e.
    ``(i - x) % E < WQ``, so the ranges need not be exact to the stripe.
    """
    points = sorted({p for rs in absent.values() for a, b in rs for p in (a, b + 1)})
    worst = dict.fromkeys(absent, 0)
    ptr = dict.fromkeys(absent, 0)
    for k in range(len(points) - 1):
        p, q = points[k], points[k + 1] - 1
        group = []
        for i, rs in absent.items():
            j = ptr[i]
            while j < len(rs) and rs[j][1] < p:
                j += 1
            ptr[i] = j
            if j < len(rs) and rs[j][0] <= p:
                group.append(i)
        if not group:
            continue
        residues = range(e) if q - p + 1 >= e else {x % e for x in range(p, q + 1)}
        for r in residues:
            hit = [i for i in group if (i - r) % e < wq]
            c = len(hit)
            for i in hit:
                if c > worst[i]:
                    worst[i] = c
    return worst


def _worst_on_ring(lost: set[int], e: int, wq: int) -> dict[int, int]:
    """Per lost index, the most lost bookies in any write set holding it (all residues):
    how a segment whose entries are unknown or absent is classified."""
    out = {}
    for i in lost:
        best = 0
        for r in range(e):
            if (i - r) % e < wq:
                best = max(best, sum(1 for w in range(wq) if (r + w) % e in lost))
        out[i] = best
    return out


def _fully_held(rep: ReplicaReport, first: int, last: int) -> bool:
    """One held run spans ``[first, last]`` and no entry is bad or unknown."""
    if rep.bad_entries or rep.unknown_entries:
        return False
    return EntryRuns(rep.entries).covers(first, last)


_Found = tuple[int, str, dict[str, Any]]
"""One finding of a segment before it is graded: ``(ensemble index, reason, fields)``."""


@dataclass
class _SegmentScan:
    """What one segment's bookies showed: the findings, the ranges each index lacks (missing
    or bad; what the grading sweep counts), and the indexes of lost bookies."""

    found: list[_Found] = field(default_factory=list)
    absent: dict[int, list[Run]] = field(default_factory=dict)
    lost_idx: set[int] = field(default_factory=set)


def classify_ledger(
    ledger: LedgerView,
    lost_bookies: Collection[str],
    replicas: Mapping[str, ReplicaReport] | None,
    lac: int | None = None,
    max_ranges: int = MAX_RANGES_PER_FINDING,
) -> list[Finding]:
    """The findings of one readable ledger; empty when healthy.

    ``replicas`` maps bookie id to what it answered, or is None for a metadata-only check,
    where only lost bookies are findings. ``lac`` bounds the last segment of a ledger that is
    not closed (None: unknown, so nothing there is counted missing).
    """
    if not ledger.ok or ledger.segments is None:
        return []
    e, wq, aq = ledger.ensemble_size, ledger.write_quorum, ledger.ack_quorum
    assert e is not None and wq is not None and aq is not None
    segments = ledger.segments
    out: list[Finding] = []
    if replicas is None and not any(b in lost_bookies for s in segments for b in s.ensemble):
        return out  # the common case of the metadata-only check, kept cheap
    for si, seg in enumerate(segments):
        first, last = seg.first_entry_id, seg.last_entry_id
        if last is None and replicas is not None:
            last = lac  # open / in-recovery ledger: checked up to its LAC
        scan = _scan_segment(seg.ensemble, first, last, lost_bookies, replicas, e, wq)
        if not scan.found:
            continue
        out.extend(_graded(ledger, si, first, last, scan, max_ranges, e, wq, aq))
    return out


def _scan_segment(
    ensemble: Iterable[str],
    first: int,
    last: int | None,
    lost_bookies: Collection[str],
    replicas: Mapping[str, ReplicaReport] | None,
    e: int,
    wq: int,
) -> _SegmentScan:
    """The findings of each bookie of a segment ``[first, last]`` (``last`` None: end
    unknown): lost bookies always; the others only with ``replicas``, a known end and
    entries on their stripe."""
    scan = _SegmentScan()
    nonempty = last is not None and last >= first
    for i, bookie in enumerate(ensemble):
        rep = replicas.get(bookie) if replicas is not None else None
        if _holds_segment(rep, bookie, lost_bookies, first, last):
            continue  # the common case: one run spanning the segment
        expected = stripe_count(i, first, last, e, wq) if last is not None else None
        base: dict[str, Any] = {"expected_entries": expected, "bookie_id": bookie}
        if bookie in lost_bookies:
            _add_lost(scan, i, base, expected, first, last)
            continue
        if replicas is None or last is None or not nonempty or not expected:
            continue
        _add_answer(scan, i, rep, base, expected, first, last, e, wq)
    return scan


def _holds_segment(
    rep: ReplicaReport | None,
    bookie: str,
    lost_bookies: Collection[str],
    first: int,
    last: int | None,
) -> bool:
    """Whether ``bookie`` (not lost) answered OK with one held run spanning the non-empty
    segment and nothing bad or unknown: nothing to report."""
    return (
        last is not None
        and last >= first
        and rep is not None
        and rep.status == ReplicaStatus.OK
        and bookie not in lost_bookies
        and _fully_held(rep, first, last)
    )


def _add_lost(
    scan: _SegmentScan,
    i: int,
    base: dict[str, Any],
    expected: int | None,
    first: int,
    last: int | None,
) -> None:
    """A lost bookie at index ``i``: BOOKIE_LOST, its whole stripe absent when the segment
    has entries."""
    scan.lost_idx.add(i)
    if last is not None and last >= first:
        scan.absent[i] = [(first, last)]
    scan.found.append(
        (
            i,
            Reason.BOOKIE_LOST,
            {**base, "missing_entries": expected, "error": "not registered"},
        )
    )


def _add_answer(
    scan: _SegmentScan,
    i: int,
    rep: ReplicaReport | None,
    base: dict[str, Any],
    expected: int,
    first: int,
    last: int,
    e: int,
    wq: int,
) -> None:
    """A bookie asked about a non-empty segment, at index ``i``: UNREACHABLE when it did not
    answer (unknown, never missing), its whole stripe missing on NoSuchLedger, else what its
    runs lack."""
    if rep is None or rep.status == ReplicaStatus.UNREACHABLE:
        err = rep.error if rep is not None else "no answer recorded"
        scan.found.append(
            (
                i,
                Reason.BOOKIE_UNREACHABLE,
                {**base, "unknown_entries": expected, "error": err},
            )
        )
        return
    if rep.status == ReplicaStatus.NO_LEDGER:
        gaps = EntryRuns().missing_from_stripe(i, first, last, e, wq)
        scan.absent[i] = gaps
        scan.found.append(
            (
                i,
                Reason.ENTRIES_MISSING,
                {
                    **base,
                    "missing_entries": expected,
                    "ranges": gaps,
                    "error": rep.error,
                },
            )
        )
        return
    _add_runs(scan, i, rep, base, first, last, e, wq)


def _add_runs(
    scan: _SegmentScan,
    i: int,
    rep: ReplicaReport,
    base: dict[str, Any],
    first: int,
    last: int,
    e: int,
    wq: int,
) -> None:
    """An answering bookie at index ``i``: the stripe entries its runs lack are
    ENTRIES_MISSING, bad ones DIGEST_MISMATCH, unknown ones BOOKIE_UNREACHABLE (neither held
    nor missing)."""
    unknown = EntryRuns(rep.unknown_entries).present_on_stripe(i, first, last, e, wq)
    # Unknown ids are neither held nor missing: they fill the gaps they sit in.
    held = EntryRuns([*rep.entries, *rep.unknown_entries])
    gaps = held.missing_from_stripe(i, first, last, e, wq)
    bad = EntryRuns(rep.bad_entries).present_on_stripe(i, first, last, e, wq)
    if gaps or bad:
        scan.absent[i] = list(EntryRuns([*gaps, *bad]).runs()) if bad else gaps
    if gaps:
        scan.found.append(
            (
                i,
                Reason.ENTRIES_MISSING,
                {**base, "missing_entries": _count(gaps, i, e, wq), "ranges": gaps},
            )
        )
    if bad:
        scan.found.append(
            (
                i,
                Reason.DIGEST_MISMATCH,
                {**base, "missing_entries": _count(bad, i, e, wq), "ranges": bad},
            )
        )
    if unknown:
        scan.found.append(
            (
                i,
                Reason.BOOKIE_UNREACHABLE,
                {**base, "unknown_entries": _count(unknown, i, e, wq), "error": rep.error},
            )
        )


def _graded(
    ledger: LedgerView,
    si: int,
    first: int,
    last: int | None,
    scan: _SegmentScan,
    max_ranges: int,
    e: int,
    wq: int,
    aq: int,
) -> list[Finding]:
    """Segment ``si``'s findings with their fewest replicas and severity (none for
    BOOKIE_UNREACHABLE: unknown is not missing)."""
    nonempty = last is not None and last >= first
    worst = _worst_missing(scan.absent, e, wq) if scan.absent else {}
    ring = _worst_on_ring(scan.lost_idx, e, wq) if scan.lost_idx else {}
    out: list[Finding] = []
    for i, reason, f in scan.found:
        min_rep: int | None
        if reason == Reason.BOOKIE_UNREACHABLE:
            min_rep = None
        elif reason == Reason.BOOKIE_LOST and not nonempty:
            # Nothing stored, or the end is unknown: classify as if every residue held
            # entries, since the metadata names a dead bookie either way.
            min_rep = wq - ring[i]
        else:
            min_rep = wq - worst.get(i, 0)
        ranges = f.pop("ranges", None)
        out.append(
            Finding(
                ledger_id=ledger.ledger_id,
                segment_index=si,
                segment_first_entry_id=first,
                segment_last_entry_id=last,
                bookie_index=i,
                reason=reason,
                missing_ranges=tuple(ranges[:max_ranges]) if ranges is not None else None,
                missing_ranges_truncated=(len(ranges) > max_ranges if ranges is not None else None),
                min_replicas=min_rep,
                severity=classify_replicas(min_rep, wq, aq) if min_rep is not None else None,
                ledger_state=ledger.state,
                ensemble_size=e,
                write_quorum=wq,
                ack_quorum=aq,
                topic=ledger.topic,
                component=ledger.component,
                **f,
            )
        )
    return out


def ledger_lac(replicas: Iterable[ReplicaReport]) -> int | None:
    """The highest LAC any bookie reported, as a LAC read takes the max."""
    lacs = [r.lac for r in replicas if r.lac is not None]
    return max(lacs) if lacs else None


def keep_still_current(
    findings: Iterable[Finding], current: Mapping[int, LedgerView | None]
) -> list[Finding]:
    """Drop findings whose ledger changed or vanished after it was scanned.

    ``current`` maps each flagged ledger to its metadata read again: None when it was deleted,
    a view with ``error`` set when the re-read failed. A finding stays if its segment still
    names the bookie, or if the re-read failed (an error is no evidence the problem went away).
    """
    out = []
    for f in findings:
        now = current.get(f.ledger_id)
        if now is None:
            continue
        if not now.ok:
            out.append(f)
            continue
        if any(
            s.first_entry_id == f.segment_first_entry_id and f.bookie_id in s.ensemble
            for s in now.segments or ()
        ):
            out.append(f)
    return out


def summarize(findings: Collection[Finding]) -> dict[str, int]:
    """Counts for the run record: fragments per reason and severity, ledgers, missing entries
    (unknown entries are not missing)."""
    counts = {
        CountKey.FRAGMENTS: len(findings),
        CountKey.UNDERREPLICATED_LEDGERS: len({f.ledger_id for f in findings}),
        # Saturated: the count is an int64 and metadata may claim up to 2^63-1 entries per
        # ledger; an overflow would lose the whole run.
        CountKey.MISSING_ENTRIES: min(
            sum(f.missing_entries or 0 for f in findings if f.reason != Reason.BOOKIE_UNREACHABLE),
            MAX_COUNT,
        ),
    }
    for f in findings:
        k = CountKey.reason(f.reason)
        counts[k] = counts.get(k, 0) + 1
        if f.severity is not None:
            k = CountKey.severity(f.severity)
            counts[k] = counts.get(k, 0) + 1
    return counts
