"""Pure re-replication planning: fragments to repair, closedness, the grace rule, target
choice, and the job's duration/rate parsing."""

from __future__ import annotations

import argparse
import asyncio
import random
import time

import pytest

from bklib.client.replicator import _entries_to_copy
from bklib.client.throttle import RateLimiter
from bklib.errors import NotEnoughBookiesError
from bklib.meta.model import LedgerMetadata, LedgerState, Segment
from bklib.meta.racks import parse_racks
from bklib.repair.actions import recovery_swap
from bklib.repair.actions import replace_in_segment as _replace_in_segment
from bklib.repair.plan import (
    GraceDecision,
    TargetChooser,
    grace_decision,
    plan_ledger,
    stripe_entries,
)
from jobs.options.units import parse_duration, parse_rate


def md(segments, *, last=None, e=3, wq=2, aq=2, lid=7) -> LedgerMetadata:  # type: ignore[no-untyped-def]
    m = LedgerMetadata(
        ledger_id=lid,
        ensemble_size=e,
        write_quorum=wq,
        ack_quorum=aq,
        segments=tuple(Segment(f, tuple(b)) for f, b in segments),
    )
    return m.closed(last, 10 * (last + 1)) if last is not None else m


def test_closed_ledger_every_segment_naming_the_bad_bookie_is_a_closed_fragment() -> None:
    m = md([(0, "abc"), (10, "abd"), (20, "xyz")], last=29)
    work = plan_ledger(m, {"c", "x"})
    got = [(f.first_entry_id, f.last_entry_id, dict(f.moves), f.closed) for f in work.fragments]
    assert got == [(0, 9, {2: "c"}, True), (20, 29, {0: "x"}, True)]
    assert stripe_entries(m, work.fragments[0], 2) == 6  # x % 3 in {1, 2} over [0, 9]


def test_per_segment_findings_only_touch_their_segment() -> None:
    m = md([(0, "abc"), (10, "abc")], last=19)
    work = plan_ledger(m, set(), segments={10: {"b"}})
    assert [(f.first_entry_id, dict(f.moves)) for f in work.fragments] == [(10, {1: "b"})]


def test_open_ledger_last_segment_is_open_and_middle_segment_needs_the_lac() -> None:
    m = md([(0, "abc"), (10, "abd")])
    assert [f.closed for f in plan_ledger(m, {"a"}).fragments] == [False, False]
    # LAC 8 < 9: the first segment may still be written (BookKeeper #3917).
    assert [f.closed for f in plan_ledger(m, {"a"}, lac=8).fragments] == [False, False]
    work = plan_ledger(m, {"a"}, lac=12)
    assert [(f.closed, f.last_entry_id) for f in work.fragments] == [(True, 9), (False, 12)]


def test_empty_segment_and_already_repaired() -> None:
    m = md([(0, "abc")], last=-1)
    (frag,) = plan_ledger(m, {"a"}).fragments
    assert frag.empty and frag.closed and stripe_entries(m, frag, 0) == 0
    assert plan_ledger(m, {"z"}).fragments == ()


def test_grace_rule() -> None:
    m = md([(0, "abc"), (10, "abd")])
    assert grace_decision(m, None, None, 30) is GraceDecision.FENCE  # manual recover
    assert grace_decision(m, {10}, 5.0, 30) is GraceDecision.WAIT_GRACE
    assert grace_decision(m, {10}, 31.0, 30) is GraceDecision.FENCE
    assert grace_decision(m, {0}, 31.0, 30) is GraceDecision.WAIT_PROGRESS  # writer moved on
    assert grace_decision(m, {10}, None, 30) is GraceDecision.WAIT_GRACE


def test_target_chooser_spreads_and_excludes() -> None:
    ch = TargetChooser(random.Random(1))
    picks = [ch.choose("abcdef", "abc", {0: "a"}, weights={0: 10})[0] for _ in range(30)]
    assert set(picks) == {"d", "e", "f"}
    assert max(picks.count(b) for b in "def") - min(picks.count(b) for b in "def") <= 1
    two = ch.choose("abcdef", "abc", {0: "a", 2: "c"}, exclude={"d"})
    assert set(two.values()) == {"e", "f"}
    with pytest.raises(NotEnoughBookiesError) as exc:
        ch.choose("abcd", "abc", {0: "a"}, exclude={"d"}, ledger_id=9)
    assert exc.value.ledger_id == 9 and exc.value.bookie == "a"


def test_cas_transform_swaps_in_place_and_is_idempotent() -> None:
    m = md([(0, "abc"), (10, "abc")], last=19)
    t = _replace_in_segment(10, {"b": "x"})
    new = t(m)
    assert new is not None
    assert [s.ensemble for s in new.segments] == [("a", "b", "c"), ("a", "x", "c")]
    assert new.state == LedgerState.CLOSED and new.last_entry_id == 19
    assert t(new) is None  # someone already did it: no write


def test_recovery_swap_names_the_bookie_recovery_replaced() -> None:
    opened = md([(0, "abc"), (10, "abd")])
    # In place (the victim's position in the last segment) and as an appended segment.
    assert recovery_swap(opened, md([(0, "abc"), (10, "axd")], last=14)) == ("b", "x")
    assert recovery_swap(opened, md([(0, "abc"), (10, "abd"), (12, "abx")], last=14)) == (
        "d",
        "x",
    )
    assert recovery_swap(opened, md([(0, "abc"), (10, "abd")], last=14)) is None


def test_entries_to_copy_merges_overlapping_stripes() -> None:
    got = list(_entries_to_copy({0: "x", 1: "y"}, 0, 5, 3, 2))
    # E=3, WQ=2: index 0 holds x%3 in {0, 2}; index 1 holds {0, 1}.
    assert got == [(0, ["x", "y"]), (1, ["y"]), (2, ["x"]), (3, ["x", "y"]), (4, ["y"]), (5, ["x"])]


def test_rate_limiter_throttles() -> None:
    async def main() -> float:
        lim = RateLimiter(10_000)
        t0 = time.monotonic()
        for _ in range(4):
            await lim.acquire(5_000)  # 20 kB at 10 kB/s, 10 kB of burst
        return time.monotonic() - t0

    assert asyncio.run(main()) >= 0.9
    assert RateLimiter(None).rate is None


def test_parse_duration_and_rate() -> None:
    assert parse_duration("30s") == 30 and parse_duration("5m") == 300
    assert parse_duration("250ms") == 0.25 and parse_duration("2") == 2
    assert parse_rate("50MB") == 50e6 and parse_rate("1MiB/s") == 1024**2
    assert parse_rate("0") is None
    with pytest.raises(argparse.ArgumentTypeError):
        parse_duration("soon")
    with pytest.raises(argparse.ArgumentTypeError):
        parse_rate("fast")


def test_target_chooser_prefers_a_rack_the_segment_does_not_use() -> None:
    racks = {"a": "r1", "b": "r2", "c": "r3", "d": "r1", "e": "r2", "f": "r4"}
    ch = TargetChooser(random.Random(3), racks=racks)
    # Replacing c (r3): a and b stay on r1 and r2, so only f (r4) is on a fresh rack.
    assert [ch.choose("abcdef", "abc", {2: "c"})[2] for _ in range(5)] == ["f"] * 5
    # Moving b and c leaves only r1 in use: b's place goes to e (r2, fresher rack and less
    # loaded than f), then c's to f, the only rack still unused.
    assert ch.choose("abcdef", "abc", {1: "b", 2: "c"}) == {1: "e", 2: "f"}
    assert TargetChooser(random.Random(1)).choose("abcd", "abc", {0: "a"}) == {0: "d"}


def test_parse_pulsar_racks_json() -> None:
    doc = b'{"default": {"10.0.0.1:3181": {"rack": "/dc/r1", "hostname": "bk1"}, "x": {}}}'
    assert parse_racks(doc) == {"10.0.0.1:3181": "/dc/r1"}
    assert parse_racks(b"not json") == {}
