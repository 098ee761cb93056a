"""``BookieIndex`` against a brute-force reference rebuilt from the same metadata after every
batch of random changes (creates, ensemble changes, in-place replacements, closes, deletes,
bookies coming and going), and its diff against injected differences."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable

import pytest

import bklib.audit.bookie_index as bookie_index
from bklib.audit.bookie_index import BookieIndex, LedgerDifference
from bklib.errors import CorruptMetadataError, IncorrectParameterError
from bklib.meta.model import LedgerMetadata, Segment
from bklib.meta.scan import ScanResult

BIG = 1 << 40  # past what a posting array of 32-bit ids holds


def bookie(n: int) -> str:
    return f"10.0.{n // 256}.{n % 256}:3181"


def ledger(lid: int, *ensembles: Iterable[str]) -> LedgerMetadata:
    segs = tuple(Segment(10 * i, tuple(e)) for i, e in enumerate(ensembles))
    e = len(segs[0].ensemble)
    return LedgerMetadata(lid, e, e, 1, segs)


def scan(mds: Iterable[LedgerMetadata]) -> list[ScanResult]:
    return [ScanResult(md.ledger_id, f"/ledgers/L{md.ledger_id}", metadata=md) for md in mds]


def reference_of(mds: dict[int, LedgerMetadata]) -> dict[int, frozenset[str]]:
    """Each ledger's bookies, from its segments directly."""
    return {lid: frozenset(b for s in md.segments for b in s.ensemble) for lid, md in mds.items()}


def check(index: BookieIndex, mds: dict[int, LedgerMetadata], ever: Iterable[int]) -> None:
    """Every answer of ``index`` is the reference's; every posting is at most twice its size."""
    ref = reference_of(mds)
    by_bookie: dict[str, list[int]] = {}
    for lid in sorted(ref):
        for b in ref[lid]:
            by_bookie.setdefault(b, []).append(lid)
    assert len(index) == len(ref)
    assert index.bookies() == frozenset(by_bookie)
    assert index.bookie_count == len(by_bookie)
    for lid in ever:
        assert index.bookies_of(lid) == ref.get(lid)
        assert (lid in index) == (lid in ref)
    for n, name in enumerate(index._names):
        if index._numbers.get(name) == n:
            assert index._live[n] == len(by_bookie[name])
            assert len(index._postings[n]) <= 2 * index._live[n]  # compaction's bound
    assert index.diff_scan(mds.values()) == []  # a scan of what it holds differs nowhere
    for b, lids in by_bookie.items():
        assert index.ledgers_of(b) == lids
    assert index.diff(BookieIndex.from_scan(scan(mds.values()))) == []


class Churn:
    """Random metadata changes over a window of bookies that slides: new bookie ids appear,
    old ones stop being chosen, as pods of a long-running cluster are replaced."""

    def __init__(self, seed: int, window: int = 8) -> None:
        self.rng = random.Random(seed)
        self.window = window
        self.base = 0
        self.mds: dict[int, LedgerMetadata] = {}
        self.ever: set[int] = set()
        self.next_id = 0
        self.named: Counter[str] = Counter()  # ledgers naming each bookie
        self.peak = 0  # the most bookies named at once

    def put(self, lid: int, md: LedgerMetadata | None) -> None:
        """Change the reference (the index is changed by the caller)."""
        old = self.mds.pop(lid, None)
        if old is not None:
            self.named.subtract(old.bookies())
        if md is not None:
            self.mds[lid] = md
            self.named.update(md.bookies())
        self.named = +self.named  # drop bookies no ledger names
        self.peak = max(self.peak, len(self.named))

    def pool(self) -> list[str]:
        return [bookie(n) for n in range(self.base, self.base + self.window)]

    def op(self, index: BookieIndex) -> None:
        rng, mds = self.rng, self.mds
        r = rng.random()
        if r < 0.03:
            self.base += 1
        if r < 0.3 or not mds:
            self.create(index)
            return
        # Mostly the oldest ledger is deleted, as retention trims a topic's oldest ledgers.
        lid = min(mds) if r >= 0.8 and rng.random() < 0.5 else rng.choice(sorted(mds))
        md = mds[lid]
        if r < 0.5:
            md = self.ensemble_change(md)
        elif r < 0.6:
            md = self.replace_in_place(md)
        elif r < 0.7:
            md = md.closed(rng.randint(-1, 100), 0)
        elif r < 0.8:
            md = ledger(lid, *(s.ensemble for s in md.segments))  # same bookies, rewritten
        else:
            self.put(lid, None)
            assert index.apply(lid, None)
            return
        changed = reference_of({lid: md}) != reference_of({lid: mds[lid]})
        self.put(lid, md)
        assert index.apply(lid, md) == changed

    def create(self, index: BookieIndex) -> None:
        rng = self.rng
        if self.ever and rng.random() < 0.1:
            lid = rng.choice(sorted(self.ever))  # an id deleted and written again, or a rewrite
        else:
            lid = self.next_id + (BIG if rng.random() < 0.2 else 0)
            self.next_id += rng.randint(1, 3)
        md = ledger(lid, rng.sample(self.pool(), rng.randint(1, 4)))
        self.put(lid, md)
        self.ever.add(lid)
        index.apply(lid, md)

    def ensemble_change(self, md: LedgerMetadata) -> LedgerMetadata:
        ensemble = list(md.last_segment.ensemble)
        spare = [b for b in self.pool() if b not in ensemble]
        if spare:
            ensemble[self.rng.randrange(len(ensemble))] = self.rng.choice(spare)
        first = md.last_segment.first_entry_id + self.rng.randint(0, 5)
        return md.with_new_segment(first, tuple(ensemble))

    def replace_in_place(self, md: LedgerMetadata) -> LedgerMetadata:
        seg = self.rng.choice(md.segments)
        spare = [b for b in self.pool() if b not in seg.ensemble]
        if not spare:
            return md
        old = self.rng.choice(seg.ensemble)
        return md.with_bookies_replaced(seg.first_entry_id, {old: self.rng.choice(spare)})


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_index_is_the_reference_after_every_batch(seed: int) -> None:
    index, churn = BookieIndex(), Churn(seed)
    for _ in range(40):
        for _ in range(100):
            churn.op(index)
        check(index, churn.mds, churn.ever)
    assert churn.base > 50  # bookies came and went
    # Numbers are recycled: there are no more than the most bookies named at once (and the
    # names new to one change, numbered before that change frees any), fewer than ever seen.
    assert len(index._names) <= churn.peak + 4
    assert churn.peak < churn.base


def test_numbers_past_two_bytes_fall_back_to_tuples(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bookie_index, "_NARROW", 4)
    index, churn = BookieIndex(), Churn(4)
    kinds: Counter[type] = Counter()
    for _ in range(10):
        for _ in range(100):
            churn.op(index)
        check(index, churn.mds, churn.ever)
        kinds.update(type(e) for e in index._ledgers.values())
    assert kinds[tuple] and kinds[bytes]


def test_a_fresh_index_diffs_against_one_with_another_numbering() -> None:
    a, b = BookieIndex(), BookieIndex()
    mds = [ledger(1, [bookie(1), bookie(2)]), ledger(2, [bookie(3), bookie(1)])]
    for md in mds:
        a.apply(md.ledger_id, md)
    for md in reversed(mds):
        b.apply(md.ledger_id, md)
    assert a._numbers != b._numbers
    assert a.diff(b) == b.diff(a) == []


def test_reapplying_changes_nothing() -> None:
    index, churn = BookieIndex(), Churn(5)
    for _ in range(500):
        churn.op(index)
    before = (dict(index._ledgers), [p.tolist() for p in index._postings], list(index._live))
    for lid, md in churn.mds.items():
        assert not index.apply(lid, md)
        assert not index.apply(lid, md.closed(7, 0))  # the state is not the index's business
    after = (dict(index._ledgers), [p.tolist() for p in index._postings], list(index._live))
    assert after == before
    check(index, churn.mds, churn.ever)


def test_deleting_an_unknown_ledger_changes_nothing() -> None:
    index = BookieIndex()
    assert not index.apply(5, None)
    md = ledger(7, [bookie(1), bookie(2)])
    assert index.apply(7, md)
    assert not index.apply(8, None)
    assert index.apply(7, None)
    assert not index.apply(7, None)
    assert len(index) == 0 and index.bookie_count == 0
    assert index.ledgers_of(bookie(1)) == [] and index.bookies_of(7) is None


def test_a_ledger_leaving_a_bookie_and_coming_back_is_listed_once() -> None:
    index = BookieIndex()
    a, b, c = bookie(1), bookie(2), bookie(3)
    for i in range(5):
        index.apply(i, ledger(i, [a, b]))
    index.apply(0, ledger(0, [c, b]))
    index.apply(0, ledger(0, [a, b], [c, b]))
    assert index.ledgers_of(a) == [0, 1, 2, 3, 4]
    assert index.ledgers_of_any([c, a, "unknown:3181"]) == [0, 1, 2, 3, 4]
    assert index.bookies_of(0) == frozenset({a, b, c})


def test_diff_reports_exactly_the_injected_differences() -> None:
    rng = random.Random(7)
    pool = [bookie(n) for n in range(10)]
    mds = {lid: ledger(lid, rng.sample(pool, 3)) for lid in range(200)}
    ours = BookieIndex.from_scan(scan(mds.values()))
    theirs = dict(mds)
    del theirs[3]  # only ours
    theirs[500] = ledger(500, pool[:2])  # only theirs
    theirs[9] = mds[9].with_new_segment(50, (pool[0], pool[1], pool[2]))  # other bookies
    if reference_of({9: theirs[9]}) == reference_of({9: mds[9]}):
        theirs[9] = ledger(9, pool[7:])
    theirs[10] = mds[10].closed(40, 0)  # same bookies: no difference
    seg = mds[11].segments[0]
    theirs[11] = mds[11].with_new_segment(5, tuple(reversed(seg.ensemble)))  # same set
    expected = [
        LedgerDifference(3, frozenset(mds[3].bookies()), None),
        LedgerDifference(9, frozenset(mds[9].bookies()), frozenset(theirs[9].bookies())),
        LedgerDifference(500, None, frozenset(pool[:2])),
    ]
    swapped = [LedgerDifference(d.ledger_id, d.theirs, d.ours) for d in expected]
    # Built in the same order, theirs numbers the bookies as ours does (encodings compare as
    # they are); built in reverse, it does not (they are translated).
    in_order = BookieIndex.from_scan(scan(theirs.values()))
    reverse = BookieIndex.from_scan(scan(reversed(list(theirs.values()))))
    assert in_order._numbers == ours._numbers != reverse._numbers
    for other in (in_order, reverse):
        assert ours.diff(other) == expected
        assert other.diff(ours) == swapped
    # Streamed, each side's scan against the other's index says the same.
    assert ours.diff_scan(theirs.values()) == expected
    for other in (in_order, reverse):
        assert other.diff_scan(mds.values()) == swapped


def test_a_scan_result_without_metadata_raises_unless_collected() -> None:
    good = scan([ledger(1, [bookie(1)])])
    bad = ScanResult(2, "/ledgers/L2", error=CorruptMetadataError("bad", ledger_id=2))
    with pytest.raises(CorruptMetadataError):
        BookieIndex.from_scan([*good, bad])
    errors: list[ScanResult] = []
    index = BookieIndex.from_scan([*good, bad], errors)
    assert errors == [bad] and len(index) == 1


@pytest.mark.parametrize("lid", [-1, 1 << 63])
def test_a_ledger_id_outside_a_long_is_refused(lid: int) -> None:
    with pytest.raises(IncorrectParameterError):
        BookieIndex().apply(lid, None)


def test_metadata_of_another_ledger_is_refused() -> None:
    with pytest.raises(IncorrectParameterError):
        BookieIndex().apply(1, ledger(2, [bookie(1)]))
