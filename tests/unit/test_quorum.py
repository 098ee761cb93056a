"""Write sets, stripes, coverage and recovery-read decisions (docs/safety-rules.md)."""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Sequence

import pytest

from bklib.errors import (
    BKTimeoutError,
    DataUnknownError,
    DigestMatchError,
    NoSuchEntryError,
    NoSuchLedgerError,
    ReadError,
    UnauthorizedAccessError,
)
from bklib.errors import IncorrectParameterError as IPE
from bklib.quorum import (
    BELOW_AQ,
    BELOW_WQ,
    NO_REPLICA,
    RecoveryReadDecision,
    ReplyKind,
    RRQuorumCoverageSet,
    classify_replicas,
    contiguous_chunks,
    has_entry,
    is_covered,
    iter_stripe,
    recovery_read_decision,
    reply_kind,
    stripe_contains,
    stripe_count,
    stripe_first_last,
    stripe_residues,
    write_set,
)

P, N, U = ReplyKind.POSITIVE, ReplyKind.NEGATIVE, ReplyKind.UNKNOWN
D = RecoveryReadDecision


# ---- write sets (docs/safety-rules.md scenario 1) ---------------------------------------------


def test_write_sets_checklist_item_1() -> None:
    assert [write_set(x, 3, 2) for x in range(4)] == [(0, 1), (1, 2), (2, 0), (0, 1)]
    assert write_set(4, 5, 3) == (4, 0, 1)
    assert write_set(10**15 + 4, 5, 3) == (4, 0, 1)
    assert write_set(5, 4, 4) == (1, 2, 3, 0)


def test_stripe_checklist_item_1() -> None:
    assert list(iter_stripe(0, 0, 5, 3, 2)) == [0, 2, 3, 5]
    assert stripe_count(0, 0, 5, 3, 2) == 4
    assert stripe_first_last(0, 0, 5, 3, 2) == (0, 5)
    assert stripe_residues(0, 3, 2) == frozenset({0, 2})
    assert [x for x in range(6) if stripe_contains(0, x, 0, 5, 3, 2)] == [0, 2, 3, 5]


def test_has_entry_matches_write_set() -> None:
    for e in range(1, 7):
        for wq in range(1, e + 1):
            for x in range(3 * e):
                ws = write_set(x, e, wq)
                assert len(set(ws)) == wq
                assert {i for i in range(e) if has_entry(x, i, e, wq)} == set(ws)


def test_stripe_residue_window_wraps() -> None:
    assert stripe_residues(1, 5, 3) == frozenset({4, 0, 1})
    assert stripe_residues(4, 5, 3) == frozenset({2, 3, 4})
    assert stripe_residues(2, 4, 4) == frozenset({0, 1, 2, 3})


def test_empty_ranges() -> None:
    assert stripe_count(0, 5, 4, 3, 2) == 0
    assert stripe_first_last(0, 5, 4, 3, 2) is None
    assert list(iter_stripe(0, 5, 4, 3, 2)) == []
    assert stripe_count(1, 0, -1, 3, 2) == 0
    assert not stripe_contains(0, 5, 5, 4, 3, 2)


def test_range_with_nothing_on_the_bookie() -> None:
    # E=5, WQ=2: index 3 stores residues {2, 3}; [4, 6] holds residues 4, 0, 1.
    assert stripe_count(3, 4, 6, 5, 2) == 0
    assert stripe_first_last(3, 4, 6, 5, 2) is None
    assert list(iter_stripe(3, 4, 6, 5, 2)) == []


def test_huge_ranges_are_arithmetic() -> None:
    last = 10**15
    t0 = time.perf_counter()
    for idx in range(7):
        # Residue r occurs (last - r) // E + 1 times in [0, last].
        expected = sum((last - r) // 7 + 1 for r in stripe_residues(idx, 7, 3))
        assert stripe_count(idx, 0, last, 7, 3) == expected
        fl = stripe_first_last(idx, 1, last, 7, 3)
        assert fl is not None and has_entry(fl[0], idx, 7, 3) and has_entry(fl[1], idx, 7, 3)
    it = iter_stripe(0, 10**14, last, 7, 3)
    assert [next(it) for _ in range(3)] == sorted(
        x for x in range(10**14, 10**14 + 7) if has_entry(x, 0, 7, 3)
    )[:3]
    assert time.perf_counter() - t0 < 1.0


@pytest.mark.parametrize(
    "call",
    [
        lambda: write_set(-1, 3, 2),
        lambda: write_set(0, 0, 0),
        lambda: write_set(0, 2, 3),
        lambda: write_set(0, 3, 0),
        lambda: has_entry(0, 3, 3, 2),
        lambda: has_entry(0, -1, 3, 2),
        lambda: has_entry(-2, 0, 3, 2),
        lambda: stripe_residues(3, 3, 2),
        lambda: stripe_count(0, -1, 5, 3, 2),
        lambda: stripe_count(3, 0, 5, 3, 2),
        lambda: stripe_count(0, 0, 5, 3, 4),
        lambda: stripe_first_last(-1, 0, 5, 3, 2),
        lambda: stripe_contains(0, 1, -5, 5, 3, 2),
        lambda: list(iter_stripe(0, -1, 5, 3, 2)),
        lambda: iter_stripe(5, 0, 5, 3, 2),
        lambda: is_covered(set(), 3, 2, 3),
        lambda: is_covered(set(), 3, 2, 0),
        lambda: is_covered({3}, 3, 2, 2),
        lambda: is_covered({-1}, 3, 2, 2),
        lambda: RRQuorumCoverageSet(2, 3, 1),
        lambda: recovery_read_decision([None, None], 3, 2),
        lambda: recovery_read_decision([None], 1, 2),
        lambda: classify_replicas(4, 3, 2),
        lambda: classify_replicas(-1, 3, 2),
        lambda: classify_replicas(1, 2, 3),
    ],
)
def test_invalid_arguments(call: object) -> None:
    with pytest.raises(IPE):
        call()  # type: ignore[operator]


def test_iter_stripe_validates_eagerly() -> None:
    # Validation happens at the call, not at the first next().
    with pytest.raises(IPE):
        iter_stripe(0, -3, 5, 3, 2)


def test_stripe_arithmetic_matches_brute_force() -> None:
    rng = random.Random(20240917)
    for _ in range(3000):
        e = rng.randint(1, 9)
        wq = rng.randint(1, e)
        idx = rng.randrange(e)
        first = rng.randint(0, 60)
        last = first + rng.randint(-4, 90)
        expected = [x for x in range(first, last + 1) if idx in write_set(x, e, wq)]
        assert list(iter_stripe(idx, first, last, e, wq)) == expected
        assert stripe_count(idx, first, last, e, wq) == len(expected)
        assert stripe_first_last(idx, first, last, e, wq) == (
            (expected[0], expected[-1]) if expected else None
        )
        probe = rng.randint(max(0, first - 5), last + 5)
        assert stripe_contains(idx, probe, first, last, e, wq) == (probe in expected)
        assert stripe_residues(idx, e, wq) == frozenset(
            r for r in range(e) if idx in write_set(r, e, wq)
        )


def test_stripes_partition_replicas() -> None:
    # Summed over all indices, every entry in range is counted exactly WQ times.
    rng = random.Random(7)
    for _ in range(300):
        e = rng.randint(1, 12)
        wq = rng.randint(1, e)
        first = rng.randint(0, 10**9)
        last = first + rng.randint(0, 10**6)
        total = sum(stripe_count(i, first, last, e, wq) for i in range(e))
        assert total == wq * (last - first + 1)


# ---- coverage (docs/safety-rules.md scenario 2) ----------------------------------------------


def test_coverage_checklist_item_2() -> None:
    # E=3, WQ=3, AQ=2: {b0 OK, b1/b2 timeout} not covered; {b0 OK, b1 NoSuchLedger} covered.
    assert not is_covered({0: P, 1: U, 2: U}, 3, 3, 2)
    assert not is_covered({0: P}, 3, 3, 2)
    assert is_covered({0: P, 1: N}, 3, 3, 2)
    assert is_covered({0: P, 1: N, 2: None}, 3, 3, 2)
    # E=5, WQ=2, AQ=2: a plain count of 3 known is not the rule.
    assert is_covered({0, 2, 4}, 5, 2, 2)
    assert not is_covered({0, 1, 2}, 5, 2, 2)


def test_coverage_one_reply_suffices_when_e_wq_aq_2() -> None:
    assert is_covered({0}, 2, 2, 2)
    assert is_covered({1: N}, 2, 2, 2)
    assert not is_covered(set(), 2, 2, 2)
    assert not is_covered({0: U, 1: None}, 2, 2, 2)


def test_digest_failure_counts_as_unknown() -> None:
    # Java counts the transport rc before verifying; a digest failure must be unknown here.
    assert not is_covered({0: P, 1: reply_kind(DigestMatchError()), 2: U}, 3, 3, 2)


def _covered_by_definition(unknown: set[int], e: int, wq: int, aq: int) -> bool:
    return all(sum(1 for w in range(wq) if (i + w) % e in unknown) < aq for i in range(e))


def test_coverage_matches_definition_and_sufficient_count() -> None:
    rng = random.Random(99)
    for _ in range(4000):
        e = rng.randint(1, 9)
        wq = rng.randint(1, e)
        aq = rng.randint(1, wq)
        replies = {i: rng.choice([P, N, U, None]) for i in range(e) if rng.random() < 0.8}
        unknown = {i for i in range(e) if replies.get(i) not in (P, N)}
        expected = _covered_by_definition(unknown, e, wq, aq)
        assert is_covered(replies, e, wq, aq) == expected
        assert is_covered(set(range(e)) - unknown, e, wq, aq) == expected
        cs = RRQuorumCoverageSet(e, wq, aq)
        for i, kind in replies.items():
            cs.add(i, kind)
        assert cs.is_covered() == expected
        if e - len(unknown) >= e - aq + 1:
            assert expected  # the global sufficient condition (known >= E - AQ + 1)


def test_coverage_set_keeps_last_reply() -> None:
    cs = RRQuorumCoverageSet(3, 3, 2)
    cs.add(0, P)
    cs.add(1, N)
    assert cs.is_covered()
    cs.add(1, U)  # a later timeout replaces the NoSuchLedger
    assert not cs.is_covered()
    with pytest.raises(IPE):
        cs.add(3, P)


def test_reply_kind_mapping() -> None:
    assert reply_kind(None) is P
    assert reply_kind(NoSuchEntryError()) is N
    assert reply_kind(NoSuchLedgerError()) is N
    for err in (
        BKTimeoutError(),
        ReadError(),
        DigestMatchError(),
        UnauthorizedAccessError(),
        DataUnknownError(),
        OSError(),
    ):
        assert reply_kind(err) is U


# ---- recovery reads (docs/safety-rules.md scenarios 3, 6, 7) ---------------------------------


@pytest.mark.parametrize(
    ("replies", "wq", "aq", "expected"),
    [
        ([N, U, U], 3, 2, D.UNKNOWN_FAIL),  # scenario 7: must not truncate
        ([N, N, None], 3, 2, D.ABSENT),  # scenario 7: no waiting for the zombie
        ([None, N, N], 3, 2, D.ABSENT),
        ([N, None, None], 3, 2, D.PENDING),
        ([N, U, None], 3, 2, D.PENDING),
        ([U, U, U], 3, 2, D.UNKNOWN_FAIL),
        ([U, P, None], 3, 2, D.FOUND),
        ([N, N, P], 3, 2, D.FOUND),
        ([None, None, None], 3, 2, D.PENDING),
        ([N, None], 2, 2, D.ABSENT),  # scenario 3: WQ-AQ+1 = 1
        ([U, None], 2, 2, D.PENDING),
        ([U, U], 2, 2, D.UNKNOWN_FAIL),
        ([N, N, U], 3, 1, D.UNKNOWN_FAIL),  # AQ=1 needs all 3 negatives
        ([N, N, N], 3, 1, D.ABSENT),
        ([N, U, N], 3, 3, D.ABSENT),  # AQ=WQ: one negative suffices
        ([None], 1, 1, D.PENDING),
        ([N], 1, 1, D.ABSENT),
    ],
)
def test_recovery_read_decision(
    replies: Sequence[ReplyKind | None], wq: int, aq: int, expected: RecoveryReadDecision
) -> None:
    assert recovery_read_decision(replies, wq, aq) is expected


def test_recovery_read_decision_exhaustive_rules() -> None:
    import itertools

    for wq in range(1, 5):
        for aq in range(1, wq + 1):
            for replies in itertools.product([P, N, U, None], repeat=wq):
                got = recovery_read_decision(replies, wq, aq)
                if P in replies:
                    assert got is D.FOUND
                elif replies.count(N) >= wq - aq + 1:
                    assert got is D.ABSENT
                elif None not in replies:
                    assert got is D.UNKNOWN_FAIL
                else:
                    assert got is D.PENDING
                if got is D.ABSENT:
                    # Safety: AQ acks would leave at most WQ-AQ replicas without the entry.
                    assert replies.count(N) > wq - aq


# ---- replicas classification (docs/safety-rules.md scenario 19) ------------------------------


def test_classify_replicas_checklist_item_19() -> None:
    # E=3, WQ=3, AQ=2.
    assert classify_replicas(3, 3, 2) is None
    assert classify_replicas(2, 3, 2) == BELOW_WQ == "BELOW_WQ"
    assert classify_replicas(1, 3, 2) == BELOW_AQ == "BELOW_AQ"
    assert classify_replicas(0, 3, 2) == NO_REPLICA == "NO_REPLICA"


def test_classify_replicas_edges() -> None:
    assert classify_replicas(1, 2, 1) == BELOW_WQ
    assert classify_replicas(1, 1, 1) is None
    assert classify_replicas(0, 1, 1) == NO_REPLICA
    assert classify_replicas(2, 2, 2) is None
    assert classify_replicas(1, 2, 2) == BELOW_AQ


def test_sample_stripe_needs_no_random_source_at_zero_percent() -> None:
    from bklib.quorum import sample_stripe, stripe_first_last

    assert sample_stripe(1, 0, 99, 3, 2, 0.0, None) == sample_stripe(
        1, 0, 99, 3, 2, 0.0, random.Random(7)
    )
    assert sample_stripe(1, 0, 99, 3, 2, 0.0, None) == list(stripe_first_last(1, 0, 99, 3, 2) or ())
    with pytest.raises(ValueError, match="random source"):
        sample_stripe(1, 0, 99, 3, 2, 10.0, None)


def test_sample_stripe_follows_ledger_checker() -> None:
    from bklib.quorum import sample_stripe, stripe_first_last

    rng = random.Random(7)
    for _ in range(400):
        e = rng.randint(1, 6)
        wq = rng.randint(1, e)
        idx = rng.randrange(e)
        first = rng.randint(0, 50)
        last = first + rng.randint(-1, 300)
        pct = rng.choice([0.0, 1.0, 10.0, 33.3, 99.0, 100.0])
        got = sample_stripe(idx, first, last, e, wq, pct, random.Random(1))
        stripe = list(iter_stripe(idx, first, last, e, wq)) if last >= first else []
        if not stripe:
            assert got == []
            continue
        lo, hi = stripe_first_last(idx, first, last, e, wq) or (None, None)
        assert got == sorted(set(got)) and set(got) <= set(stripe)
        assert got[0] == lo and got[-1] == hi  # always the fragment's first and last
        length = hi - lo + 1
        if pct >= 100.0 or int(length * pct / 100) >= length:
            assert got == stripe
        elif pct == 0.0:
            assert got == sorted({lo, hi})
        else:
            # At most one pick per bucket of the fragment's length, plus its two ends.
            assert len(got) <= int(length * pct / 100) + 2
    # The same seed gives the same sample; another seed another one.
    a = sample_stripe(0, 0, 9999, 3, 2, 5.0, random.Random(1))
    assert a == sample_stripe(0, 0, 9999, 3, 2, 5.0, random.Random(1))
    assert a != sample_stripe(0, 0, 9999, 3, 2, 5.0, random.Random(2))
    assert 250 <= len(a) <= 502  # ~5% of 10,000 ids, about 2/3 of them on index 0's stripe


@pytest.mark.parametrize(
    ("ids", "limit", "want"),
    [
        ([], 4, []),
        ([5], 4, [[5]]),
        ([0, 1, 2, 3, 4, 5], 4, [[0, 1, 2, 3], [4, 5]]),
        ([0, 2, 3, 5, 6, 8], 64, [[0], [2, 3], [5, 6], [8]]),
        ([1, 2, 3, 7, 8], 1, [[1], [2], [3], [7], [8]]),
    ],
)
def test_contiguous_chunks_are_what_one_batch_read_can_return(
    ids: list[int], limit: int, want: list[list[int]]
) -> None:
    assert list(contiguous_chunks(iter(ids), limit)) == want


def test_contiguous_chunks_of_a_stripe_cover_it_in_order() -> None:
    for e in range(1, 6):
        for wq in range(1, e + 1):
            for idx in range(e):
                stripe = list(iter_stripe(idx, 3, 60, e, wq))
                chunks = list(contiguous_chunks(stripe, 7))
                assert [x for c in chunks for x in c] == stripe
                assert all(len(c) <= 7 and c == list(range(c[0], c[-1] + 1)) for c in chunks)
                # A chunk ends only at the limit or at a gap of the stripe.
                for a, b in itertools.pairwise(chunks):
                    assert len(a) == 7 or b[0] != a[-1] + 1
