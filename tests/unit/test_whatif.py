"""What-if arithmetic (:mod:`bklib.audit.whatif`) against a brute-force entry-by-entry oracle
over randomized ensembles, gaps and failures (seeded: hypothesis is not installed), plus
Pulsar custom-metadata decoding."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

import pytest

from bklib.audit.blast_radius import blast_radius
from bklib.audit.model import LedgerView, SegmentSpan
from bklib.audit.whatif import WriterCheck, ledger_impact, segment_impact, writer_blocked
from bklib.meta.model import LedgerMetadata, LedgerState, Segment
from bklib.meta.pulsar import decode_pulsar_metadata, topic_of_managed_ledger
from bklib.states import UNKNOWN_RACK, Scope

Run = tuple[int, int]


def oracle(
    first: int,
    last: int,
    e: int,
    wq: int,
    aq: int,
    failed: set[int],
    absent: Mapping[int, Sequence[Run] | None],
) -> tuple[int, int, list[int]]:
    """Entry by entry: (below AQ, lost, lost ids), restating RoundRobinDistributionSchedule."""
    below = lost = 0
    ids = []
    for x in range(first, last + 1):
        members = [(x + w) % e for w in range(wq)]

        def holds(i: int, x: int = x) -> bool:
            ranges = absent.get(i, ())
            if ranges is None:
                return False
            return not any(a <= x <= b for a, b in ranges)

        before = [i for i in members if holds(i)]
        if not any(i in failed for i in before):
            continue
        after = [i for i in before if i not in failed]
        if len(after) < aq:
            below += 1
            if not after:
                lost += 1
                ids.append(x)
    return below, lost, ids


def _random_case(rng: random.Random) -> tuple[int, int, int, int, int, set[int], dict]:
    e = rng.randint(1, 7)
    wq = rng.randint(1, e)
    aq = rng.randint(1, wq)
    first = rng.choice([0, rng.randint(0, 50)])
    last = first + rng.randint(-1, 60)
    failed = {i for i in range(e) if rng.random() < 0.35}
    absent: dict[int, Sequence[Run] | None] = {}
    for i in range(e):
        roll = rng.random()
        if roll < 0.15:
            absent[i] = None
        elif roll < 0.5:
            ranges = []
            x = first + rng.randint(-3, 10)
            while x <= last + 3 and len(ranges) < 4:
                a = max(0, x)
                b = a + rng.randint(0, 8)
                ranges.append((a, b))
                x = b + 2 + rng.randint(0, 10)
            absent[i] = ranges
    return e, wq, aq, first, last, failed, absent


def test_segment_impact_matches_entry_by_entry_oracle() -> None:
    rng = random.Random(20240517)
    for _ in range(3000):
        e, wq, aq, first, last, failed, absent = _random_case(rng)
        res = segment_impact(first, last, e, wq, aq, failed, absent, max_ranges=10_000)
        below, lost, ids = oracle(first, last, e, wq, aq, failed, absent)
        case = (e, wq, aq, first, last, failed, absent)
        assert (res.below_aq_entries, res.lost_entries) == (below, lost), case
        assert res.below_aq == (below > 0) and res.lost == (lost > 0), case
        got = [x for a, b in res.lost_ranges for x in range(a, b + 1)]
        if not res.truncated:
            assert got == ids, case


def test_open_segment_is_judged_on_every_residue() -> None:
    # E=3 WQ=2 AQ=2, index 0 fails: residues 0 and 2 drop to one replica.
    res = segment_impact(0, None, 3, 2, 2, [0], {})
    assert res.below_aq and not res.lost and res.below_aq_entries == 0
    # index 1 already gone: residue 0's write set {0, 1} is then empty.
    assert segment_impact(0, None, 3, 2, 2, [0], {1: None}).lost


def _view(lid: int, segs: list[tuple[int, list[str]]], e: int, wq: int, aq: int, last: int | None,
          custom: dict[str, bytes] | None = None) -> LedgerView:  # fmt: skip
    md = LedgerMetadata(
        ledger_id=lid,
        ensemble_size=e,
        write_quorum=wq,
        ack_quorum=aq,
        segments=tuple(Segment(f, tuple(b)) for f, b in segs),
        custom_metadata=custom or {},
    )
    if last is not None:
        md = md.closed(last, 0)
    return LedgerView.from_metadata(md)


def test_ledger_impact_over_segments_matches_the_oracle() -> None:
    rng = random.Random(7)
    pool = [f"10.0.0.{i}:3181" for i in range(8)]
    for lid in range(400):
        e = rng.randint(1, 5)
        wq = rng.randint(1, e)
        aq = rng.randint(1, wq)
        nseg = rng.randint(1, 3)
        starts = sorted(rng.sample(range(1, 60), nseg - 1))
        segs = [(f, rng.sample(pool, e)) for f in [0, *starts]]
        last = rng.randint(-1, 80)
        view = _view(lid, segs, e, wq, aq, last)
        failed = set(rng.sample(pool, rng.randint(1, 3)))
        gone = set(rng.sample(pool, rng.randint(0, 2)))
        impact = ledger_impact(view, failed, gone=gone)
        total_below = total_lost = 0
        touched = False
        assert view.segments is not None
        for s in view.segments:
            idx = {i for i, b in enumerate(s.ensemble) if b in failed}
            touched |= bool(idx)
            if not idx or s.last_entry_id is None:
                continue
            absent = {i: None for i, b in enumerate(s.ensemble) if b in gone}
            b_, l_, _ = oracle(s.first_entry_id, s.last_entry_id, e, wq, aq, idx, absent)
            total_below += b_
            total_lost += l_
        if not touched:
            assert impact is None
            continue
        assert impact is not None
        assert (impact.below_aq_entries, impact.lost_entries) == (total_below, total_lost)


def test_writer_needs_a_bookie_outside_the_ensemble() -> None:
    a, b, c, d = (f"h{i}:3181" for i in range(4))
    view = LedgerView(
        ledger_id=1,
        state=LedgerState.OPEN.name,
        ensemble_size=3,
        write_quorum=2,
        ack_quorum=2,
        segments=(SegmentSpan(0, None, (a, b, c)),),
    )
    assert writer_blocked(view, {a}, WriterCheck(frozenset({b, c, d}))) is None
    assert "1 replacement bookie, 0 writable" in str(
        writer_blocked(view, {a}, WriterCheck(frozenset({b, c})))
    )
    racks = {a: "r1", b: "r1", c: "r1", d: "r2"}
    assert writer_blocked(view, {d}, WriterCheck(frozenset({a, b, c}), racks)) is None
    why = writer_blocked(view, {a}, WriterCheck(frozenset({b, c}), {a: "r1", b: "r1", c: "r1"}))
    assert why is not None  # no bookie left outside the ensemble at all


def test_blast_radius_ranks_bookies_and_racks() -> None:
    a, b, c, d = (f"h{i}:3181" for i in range(4))
    views = [
        _view(1, [(0, [a, b])], 2, 2, 2, 9, {"pulsar/managed-ledger": b"t/n/persistent/x"}),
        _view(2, [(0, [a, c])], 2, 1, 1, 9),  # WQ=1: a's entries have no other copy
        _view(3, [(0, [c, d])], 2, 2, 1, 9),
    ]
    rows = blast_radius(views, [a, b, c, d], racks={a: "r1", b: "r1", c: "r2"})
    by = {(r.scope, r.name): r for r in rows}
    ra = by[(Scope.BOOKIE, a)]
    assert (ra.ledgers, ra.ledgers_below_aq, ra.ledgers_lost, ra.entries_lost) == (2, 2, 1, 5)
    assert ra.topics == {"persistent://t/n/x"}
    r1 = by[(Scope.RACK, "r1")]
    assert (r1.bookies, r1.ledgers_lost, r1.entries_lost) == (2, 2, 15)
    assert by[(Scope.RACK, UNKNOWN_RACK)].bookies == 1  # d has no rack
    assert by[(Scope.BOOKIE, d)].ledgers_below_aq == 0  # AQ=1 keeps c's copy
    bookies = [r.name for r in rows if r.scope == Scope.BOOKIE]
    assert bookies[0] == a


@pytest.mark.parametrize(
    "custom, component, topic",
    [
        (
            {
                "application": b"pulsar",
                "component": b"managed-ledger",
                "pulsar/managed-ledger": b"public/default/persistent/my%20topic-partition-0",
            },
            "managed-ledger",
            "persistent://public/default/my topic-partition-0",
        ),
        (
            {"component": b"managed-ledger", "psr/managed-ledger": b"p/c/ns/persistent/t"},
            "managed-ledger",
            "persistent://p/c/ns/t",
        ),
        (
            {"component": b"compacted-ledger", "pulsar/compactedTopic": b"persistent://a/b/c"},
            "compacted-ledger",
            "persistent://a/b/c",
        ),
        ({"component": b"schema", "pulsar/schemaId": b"a/b/c"}, "schema", "persistent://a/b/c"),
        ({"application": b"bkaudit-demo"}, None, None),
        ({"pulsar/managed-ledger": b"not-a-name"}, None, None),
    ],
)
def test_pulsar_custom_metadata(custom: dict[str, bytes], component: str, topic: str) -> None:
    info = decode_pulsar_metadata(custom)
    assert (info.component, info.topic) == (component, topic)


def test_topic_of_managed_ledger() -> None:
    assert topic_of_managed_ledger("t/n/non-persistent/a+b") == "non-persistent://t/n/a b"
    assert topic_of_managed_ledger("a/b") is None


def test_existing_mode_counts_entries_with_no_replica_now() -> None:
    rng = random.Random(99)
    for _ in range(1500):
        e, wq, _aq, first, last, _failed, absent = _random_case(rng)
        res = segment_impact(first, last, e, wq, 1, (), absent, 10_000, existing=True)
        lost = []
        for x in range(first, last + 1):
            members = [(x + w) % e for w in range(wq)]
            if all(
                i in absent and (absent[i] is None or any(a <= x <= b for a, b in absent[i] or ()))
                for i in members
            ):
                lost.append(x)
        assert res.lost_entries == len(lost), (e, wq, first, last, absent)
        if not res.truncated:
            assert [x for a, b in res.lost_ranges for x in range(a, b + 1)] == lost


def test_blast_radius_equals_ledger_impact_per_scope() -> None:
    rng = random.Random(3)
    pool = [f"10.0.0.{i}:3181" for i in range(7)]
    racks = {b: f"/r{i % 3}" for i, b in enumerate(pool[:5])}
    views = []
    for lid in range(300):
        e = rng.randint(1, 4)
        wq = rng.randint(1, e)
        aq = rng.randint(1, wq)
        starts = sorted(rng.sample(range(1, 40), rng.randint(0, 2)))
        segs = [(f, rng.sample(pool, e)) for f in [0, *starts]]
        views.append(_view(lid, segs, e, wq, aq, rng.choice([None, rng.randint(-1, 60)])))
    gone = {pool[6]}
    writable = set(pool[:5])
    missing = {(5, 0, views[5].bookies()[0]): ((0, 3),)}
    rows = blast_radius(views, pool, racks=racks, gone=gone, writable=writable, missing=missing)
    for r in rows:
        failed = {b for b in pool if r.name == (b if r.scope == Scope.BOOKIE else
                  racks.get(b, UNKNOWN_RACK))}  # fmt: skip
        imps = [
            ledger_impact(
                v,
                failed,
                gone=gone,
                missing=missing,
                writer=WriterCheck(frozenset(writable - failed), racks),
                max_ranges=0,
            )
            for v in views
        ]
        imps2 = [i for i in imps if i is not None]
        assert r.ledgers == len(imps2), r
        assert r.ledgers_below_aq == sum(i.below_aq for i in imps2), r
        assert r.ledgers_lost == sum(i.lost for i in imps2), r
        assert r.entries_lost == sum(i.lost_entries for i in imps2), r
        assert r.entries_below_aq == sum(i.below_aq_entries for i in imps2), r
        assert r.writers_blocked == sum(i.writer_blocked is not None for i in imps2), r
