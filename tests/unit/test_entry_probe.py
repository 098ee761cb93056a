"""The pure half of probing a bookie by reads (bklib/audit/entry_probe.py): which ids a sample
reads, what each answer says, and how a pair's answers sum up."""

from __future__ import annotations

import random

import pytest

from bklib.audit.entry_probe import (
    BAD,
    HELD,
    MISSING,
    UNKNOWN,
    EntryTally,
    all_held,
    answer_kind,
    sampled_ids,
    stripe_plan,
)
from bklib.audit.model import SegmentSpan
from bklib.digest import digest_manager
from bklib.errors import BKError, BKTimeoutError, NoSuchEntryError, NoSuchLedgerError
from bklib.meta.model import DigestType
from bklib.quorum import sample_stripe
from bklib.states import ReplicaStatus

A, B, C, D = "a:1", "b:1", "c:1", "d:1"


def test_stripe_plan_ends_an_open_segment_at_the_lac_and_skips_it_without_one() -> None:
    segments = (SegmentSpan(0, 9, (A, B, C)), SegmentSpan(10, None, (A, D, C)))
    assert stripe_plan(segments, A, 14) == [(0, 0, 9), (0, 10, 14)]
    assert stripe_plan(segments, D, 14) == [(1, 10, 14)]
    assert stripe_plan(segments, D, None) == []  # no LAC: nothing of the open segment
    assert stripe_plan(segments, B, 9) == [(1, 0, 9)]
    assert stripe_plan(segments, A, 8) == [(0, 0, 9)]  # the open segment has not begun


def test_sampled_ids_are_each_ranges_sample_in_order_with_each_ranges_first_id() -> None:
    plan = [(0, 0, 99), (2, 100, 100), (1, 101, 300)]
    ids, starts = sampled_ids(plan, 3, 2, 10.0, random.Random(7))
    again = random.Random(7)
    expected = [x for i, lo, hi in plan for x in sample_stripe(i, lo, hi, 3, 2, 10.0, again)]
    assert ids == expected
    firsts = []
    rng = random.Random(7)
    for i, lo, hi in plan:
        firsts.append(sample_stripe(i, lo, hi, 3, 2, 10.0, rng)[0])
    assert starts == set(firsts)
    assert sampled_ids([], 3, 2, 0.0, None) == ([], set())


def test_answer_kind_is_missing_only_on_a_negative_answer() -> None:
    dm = digest_manager(5, DigestType.CRC32C, b"pw")
    body = dm.package_entry(3, 2, 10, b"x" * 10)
    assert answer_kind(3, body, None, dm) == HELD
    assert answer_kind(3, body, None, None) == HELD  # not checked: held
    assert answer_kind(4, body, None, dm) == BAD  # another entry's body fails the digest
    damaged = body[:-1] + bytes([body[-1] ^ 1])
    assert answer_kind(3, damaged, None, dm) == BAD
    assert answer_kind(3, None, NoSuchEntryError("no"), dm) == MISSING
    assert answer_kind(3, None, NoSuchLedgerError("no"), dm) == MISSING
    assert answer_kind(3, None, BKTimeoutError("slow"), dm) == UNKNOWN
    assert answer_kind(3, None, BKError("EIO"), dm) == UNKNOWN
    assert answer_kind(3, None, None, dm) == UNKNOWN  # no body and no error: unknown


def test_a_tally_makes_runs_cut_at_each_range_and_at_every_other_answer() -> None:
    tally = EntryTally(range_starts={0, 20})
    for x, kind in [(0, HELD), (3, HELD), (6, BAD), (9, MISSING), (12, HELD), (15, UNKNOWN)]:
        tally.add(x, kind, BKTimeoutError("slow") if kind == UNKNOWN else None)
    tally.add(18, UNKNOWN, BKError("EIO"))
    tally.add(20, HELD)  # a new range: never merged with the run before
    got = tally.result([(0, 0, 18), (0, 20, 20)], sample=False)
    assert got.status == ReplicaStatus.OK
    assert got.entries == ((0, 6), (12, 12), (20, 20))  # a missing id ends a run
    assert got.bad == ((6, 6),)
    assert got.unknown == ((15, 18),)
    assert got.answered == 6 and got.unknown_count == 2
    assert got.error == "slow; EIO"


def test_a_tally_keeps_three_errors_and_is_unreachable_without_one_answer() -> None:
    tally = EntryTally()
    for x in range(5):
        tally.add(x, UNKNOWN, f"timeout {x}")
    got = tally.result([(0, 0, 4)], sample=True)
    assert got.status == ReplicaStatus.UNREACHABLE
    assert got.error == "timeout 0; timeout 1; timeout 2"
    assert got.entries == ()  # a sample takes nothing unknown as held
    assert got.unknown == ((0, 4),)


def test_a_sample_takes_what_it_did_not_read_as_held_except_the_missing() -> None:
    tally = EntryTally(range_starts={0, 10})
    for x, kind in [(0, HELD), (9, MISSING), (10, HELD), (19, HELD)]:
        tally.add(x, kind)
    got = tally.result([(0, 0, 9), (1, 10, 19)], sample=True)
    assert got.entries == ((0, 8), (10, 19))
    assert got.status == ReplicaStatus.OK and got.answered == 4


@pytest.mark.parametrize("seed", range(40))
def test_all_held_is_what_the_tally_gives_when_every_read_is_held(seed: int) -> None:
    rng = random.Random(seed)
    e = rng.choice([2, 3, 5])
    wq = rng.randint(1, e)
    segments, first = [], 0
    for _ in range(rng.randint(1, 4)):
        last = first + rng.randint(0, 40)
        segments.append(SegmentSpan(first, last, tuple(f"b{i}:1" for i in range(e))))
        first = last + 1
    plan = stripe_plan(segments, "b0:1", None)
    ids, starts = sampled_ids(plan, e, wq, rng.choice([0.0, 30.0]), rng)
    tally = EntryTally(starts)
    for x in ids:
        tally.add(x, HELD)
    assert all_held(plan, len(ids)) == tally.result(plan, sample=True)
