"""The audit verdict (:mod:`bklib.audit.classify`) against an entry-by-entry oracle, and the
segment-end rule it shares with the repair planner. No servers, no Spark."""

from __future__ import annotations

import random

from bklib.audit.classify import classify_ledger, keep_still_current, summarize
from bklib.audit.model import Finding, LedgerView, ReplicaReport
from bklib.availability import EntryRuns
from bklib.meta.model import LedgerMetadata
from bklib.quorum import classify_replicas, write_set
from bklib.repair.plan import plan_ledger
from bklib.states import CountKey, Reason, ReplicaStatus
from tests.audit_helpers import metadata

B = [f"10.0.0.{i}:3181" for i in range(8)]


def _brute_force(
    md: LedgerMetadata, held: dict[str, set[int]], lost: set[str]
) -> dict[tuple[int, str], tuple[int, int, str | None]]:
    """Per (segment first, bookie): (missing count, min replicas), entry by entry."""
    out = {}
    for si, seg in enumerate(md.segments):
        # Written out here rather than taken from LedgerMetadata: the oracle states the rule.
        nxt = md.segments[si + 1].first_entry_id - 1 if si + 1 < len(md.segments) else None
        last = md.last_entry_id if nxt is None else min(nxt, md.last_entry_id)
        counts: dict[int, int] = {}
        miss: dict[str, list[int]] = {}
        for x in range(seg.first_entry_id, last + 1):
            absent = [
                seg.ensemble[i]
                for i in write_set(x, md.ensemble_size, md.write_quorum)
                if seg.ensemble[i] in lost or x not in held.get(seg.ensemble[i], set())
            ]
            counts[x] = len(absent)
            for b in absent:
                miss.setdefault(b, []).append(x)
        for b, xs in miss.items():
            worst = max(counts[x] for x in xs)
            mr = md.write_quorum - worst
            out[(seg.first_entry_id, b)] = (
                len(xs),
                mr,
                classify_replicas(mr, md.write_quorum, md.ack_quorum),
            )
    return out


def test_classify_ledger_agrees_with_entry_by_entry_counting() -> None:
    rng = random.Random(5)
    pool = B[:7]
    for lid in range(300):
        e = rng.randint(1, 5)
        wq = rng.randint(1, e)
        aq = rng.randint(1, wq)
        last = rng.randint(-1, 40)
        firsts = sorted(rng.sample(range(1, 45), rng.randint(0, 2)))
        segs = [(f, rng.sample(pool, e)) for f in [0, *firsts]]
        md = metadata(lid, segs, e=e, wq=wq, aq=aq, last=last)
        bookies = {b for _, ens in segs for b in ens}
        lost = {b for b in bookies if rng.random() < 0.15}
        held = {b: {x for x in range(0, 50) if rng.random() > 0.15} for b in bookies - lost}
        replicas = {
            b: ReplicaReport(lid, b, entries=tuple(EntryRuns.from_entry_ids(sorted(xs)).runs()))
            for b, xs in held.items()
        }
        got = {}
        for f in classify_ledger(LedgerView.from_metadata(md), frozenset(lost), replicas):
            if f.missing_entries:
                got[(f.segment_first_entry_id, f.bookie_id)] = (
                    f.missing_entries,
                    f.min_replicas,
                    f.severity,
                )
        assert got == _brute_force(md, held, lost), (lid, segs, last, lost)


def test_closed_ledger_segment_ends_agree_between_audit_and_repair() -> None:
    # An ensemble change recorded above lastEntryId: nothing past entry 5 belongs to the ledger.
    md = metadata(7, [(0, B[:3]), (10, B[3:6]), (20, B[:3])], last=5)
    view = LedgerView.from_metadata(md)
    assert [s.last_entry_id for s in view.segments or ()] == [5, 5, 5]
    work = plan_ledger(md, {B[0], B[3]})
    assert [(f.first_entry_id, f.last_entry_id) for f in work.fragments] == [
        (0, 5),
        (10, 5),
        (20, 5),
    ]
    assert [f.empty for f in work.fragments] == [False, True, True]


def test_unreachable_is_never_missing_and_has_no_severity() -> None:
    md = metadata(8, [(0, B[:3])], e=3, wq=2, aq=2, last=9)
    reps = {
        B[0]: ReplicaReport(8, B[0], status=ReplicaStatus.UNREACHABLE, error="timeout"),
        B[1]: ReplicaReport(8, B[1], entries=((0, 9),)),
        B[2]: ReplicaReport(8, B[2], entries=((0, 3),), unknown_entries=((4, 9),)),
    }
    found = classify_ledger(LedgerView.from_metadata(md), frozenset(), reps)
    assert {(f.bookie_id, f.reason) for f in found} == {
        (B[0], Reason.BOOKIE_UNREACHABLE),
        (B[2], Reason.BOOKIE_UNREACHABLE),
    }
    assert all(f.missing_entries is None and f.severity is None for f in found)
    counts = summarize(found)
    assert counts[CountKey.MISSING_ENTRIES] == 0
    assert counts[CountKey.reason(Reason.BOOKIE_UNREACHABLE)] == 2


def test_missing_entries_count_saturates_at_int64() -> None:
    # Two closed ledgers whose metadata claims 2^63-1 entries each: the count column is int64.
    md = metadata(5, [(0, B[:3])], e=3, wq=3, aq=2, last=2**63 - 2)
    found = [
        f
        for lid in (5, 6)
        for f in classify_ledger(LedgerView.from_metadata(md.replace(ledger_id=lid)), {B[0]}, None)
    ]
    assert [f.missing_entries for f in found] == [2**63 - 1] * 2
    assert summarize(found)[CountKey.MISSING_ENTRIES] == 2**63 - 1


def test_keep_still_current_keeps_failed_rereads_and_drops_moved_bookies() -> None:
    md = metadata(9, [(0, B[:3])], last=9)
    f = Finding(9, 0, 0, 9, 0, B[0], Reason.BOOKIE_LOST)
    moved = LedgerView.from_metadata(md.with_bookies_replaced(0, {B[0]: B[5]}))
    assert keep_still_current([f], {9: LedgerView.from_metadata(md)}) == [f]
    assert keep_still_current([f], {9: moved}) == []
    assert keep_still_current([f], {9: None}) == []
    assert keep_still_current([f], {9: LedgerView.unreadable(9, "/x", "boom")}) == [f]


def test_finding_rows_round_trip() -> None:
    md = metadata(3, [(0, B[:3])], e=3, wq=2, aq=2, last=20)
    reps = {b: ReplicaReport(3, b, entries=((0, 20),)) for b in B[1:3]}
    reps[B[0]] = ReplicaReport(3, B[0], entries=((0, 4), (9, 20)))
    (f,) = classify_ledger(LedgerView.from_metadata(md), frozenset(), reps)
    # Index 0 of E=3, WQ=2 holds residues {0, 2}: of the gap 5..8 it misses 5, 6 and 8.
    assert f.reason == Reason.ENTRIES_MISSING and f.missing_ranges == ((5, 8),)
    assert f.missing_entries == 3
    assert Finding.from_row(f.as_row()) == f
    assert LedgerView.from_row(LedgerView.from_metadata(md).as_row()) == LedgerView.from_metadata(
        md
    )
