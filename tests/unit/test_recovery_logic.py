"""Recovery's pure decisions: LAC coverage, start point, entry verdicts, close transform; and
the replica-by-replica request engine with fake replies."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bklib.client.reader import LacReadTracker, Reply, ask_replicas, first_error
from bklib.client.recovery import (
    ENTRY_ABSENT,
    decide_recovery_read,
    mark_in_recovery_transform,
    recovery_close_transform,
    recovery_start_lac,
)
from bklib.digest import EntryView
from bklib.errors import (
    BKTimeoutError,
    BookieHandleNotAvailableError,
    DigestMatchError,
    NoSuchEntryError,
    NoSuchLedgerError,
    ReadError,
    UnauthorizedAccessError,
    UnexpectedConditionError,
)
from bklib.meta.model import LedgerMetadata, LedgerState, Segment

B = [f"b{i}:3181" for i in range(6)]


def md(segments: list[tuple[int, list[str]]], state: LedgerState = LedgerState.OPEN) -> Any:
    return LedgerMetadata(
        ledger_id=3,
        ensemble_size=3,
        write_quorum=3,
        ack_quorum=2,
        segments=tuple(Segment(k, tuple(e)) for k, e in segments),
        state=state,
    )


# ---- first_error ---------------------------------------------------------------------------


def test_first_error_never_reports_no_such_entry_over_an_unknown() -> None:
    nse, to = NoSuchEntryError("n"), BKTimeoutError("t")
    assert first_error([nse, to, NoSuchEntryError("n2")]) is to
    assert first_error([nse]) is nse
    nsl = NoSuchLedgerError("l")
    assert first_error([nse, nsl]) is nsl  # negatives overwrite each other
    bh, rd = BookieHandleNotAvailableError("down"), ReadError("eio")
    assert first_error([bh, nse]) is bh
    assert first_error([bh, rd]) is rd
    assert first_error([rd, to]) is rd
    assert first_error([]) is None


# ---- LAC read coverage -----------------------------------------------------------------------


def test_lac_tracker_e3_wq3_aq2() -> None:
    t = LacReadTracker(3, 3, 2)
    t.record(0, lac=4, length=50)
    t.record(1, error=BKTimeoutError("t"))
    assert not t.covered and not t.finished
    t.record(2, error=BKTimeoutError("t"))
    assert not t.covered and t.finished
    err = t.failure(3)
    assert isinstance(err, BKTimeoutError)
    t2 = LacReadTracker(3, 3, 2)
    t2.record(0, lac=4, length=50)
    t2.record(1, error=NoSuchLedgerError("l"))
    assert t2.covered and (t2.max_lac, t2.length) == (4, 50)


def test_lac_tracker_per_window_not_global_count() -> None:
    ok = LacReadTracker(5, 2, 2)
    for i in (0, 2, 4):
        ok.record(i, lac=1, length=1)
    assert ok.covered
    bad = LacReadTracker(5, 2, 2)
    for i in (0, 1, 2):
        bad.record(i, lac=1, length=1)
    assert not bad.covered


def test_lac_tracker_digest_failure_is_unknown_and_keeps_highest_pair() -> None:
    t = LacReadTracker(2, 2, 2)
    t.record(0, error=DigestMatchError("bad"))
    assert not t.covered
    t.record(1, lac=7, length=70)
    assert t.covered  # E=WQ=AQ=2: one known reply covers the only window
    t3 = LacReadTracker(3, 2, 2)
    t3.record(0, lac=3, length=30)
    t3.record(1, lac=5, length=55)
    t3.record(2, lac=4, length=99)
    assert (t3.max_lac, t3.length) == (5, 55)
    t4 = LacReadTracker(3, 2, 2)
    t4.record(0, error=ReadError("eio"))
    t4.record(1, error=BookieHandleNotAvailableError("down"))
    t4.record(2, lac=1, length=1)
    assert isinstance(t4.failure(3), ReadError)


def test_lac_tracker_unauthorized_finishes_at_once() -> None:
    t = LacReadTracker(3, 2, 2)
    t.record(0, error=UnauthorizedAccessError("key"))
    assert t.finished
    assert isinstance(t.failure(3), UnauthorizedAccessError)


# ---- start point and transforms ----------------------------------------------------------------


def test_recovery_start_is_floored_at_the_last_segment() -> None:
    assert recovery_start_lac(-1, 0) == -1
    assert recovery_start_lac(-1, 1) == 0  # #2615: never re-read entry 0 of segment 0
    assert recovery_start_lac(9, 5) == 9
    assert recovery_start_lac(3, 10) == 9


def test_mark_in_recovery() -> None:
    m = md([(0, B[:3])])
    r = mark_in_recovery_transform(m)
    assert r is not None and r.state == LedgerState.IN_RECOVERY
    assert mark_in_recovery_transform(r) is None
    closed = m.closed(4, 40)
    assert mark_in_recovery_transform(closed) is None
    forced = mark_in_recovery_transform(closed, force=True)
    assert forced is not None
    assert (forced.state, forced.last_entry_id, forced.length) == (LedgerState.IN_RECOVERY, -1, 0)
    forced.validate()


def test_recovery_close_commits_replacements() -> None:
    m = md([(0, B[:3]), (5, [B[0], B[1], B[3]])], LedgerState.IN_RECOVERY)
    # Same key as the stored last segment: replaced in place; greater: appended.
    out = recovery_close_transform(m, {5: (B[0], B[4], B[3]), 8: (B[5], B[4], B[3])}, 9, 90)
    assert out is not None
    assert [(s.first_entry_id, s.ensemble) for s in out.segments] == [
        (0, tuple(B[:3])),
        (5, (B[0], B[4], B[3])),
        (8, (B[5], B[4], B[3])),
    ]
    assert (out.state, out.last_entry_id, out.length) == (LedgerState.CLOSED, 9, 90)
    plain = recovery_close_transform(m, {}, -1, 0)
    assert plain is not None and plain.segments == m.segments and plain.last_entry_id == -1


def test_recovery_close_refuses_key_below_stored_last_segment() -> None:
    m = md([(0, B[:3]), (10, [B[0], B[1], B[3]])], LedgerState.IN_RECOVERY)
    with pytest.raises(UnexpectedConditionError):
        recovery_close_transform(m, {5: (B[0], B[4], B[3])}, 9, 90)


def test_recovery_close_adopts_a_closed_ledger() -> None:
    closed = md([(0, B[:3])]).closed(7, 70)
    assert recovery_close_transform(closed, {3: tuple(B[3:6])}, 9, 90) is None


# ---- entry verdicts --------------------------------------------------------------------------

VIEW = EntryView(3, 10, 9, 100, b"payload")


def rep(pos: int, error: Exception | None = None) -> Reply[EntryView]:
    return Reply(pos, B[pos], value=None if error else VIEW, error=error)


def verdict(replies: list[Reply[EntryView]], wq: int = 3, aq: int = 2) -> object:
    return decide_recovery_read(replies, wq, aq, ledger_id=3, entry_id=10)


def test_entry_found_on_one_positive() -> None:
    assert verdict([rep(0, NoSuchEntryError("n")), rep(1)]) is VIEW


def test_entry_absent_needs_wq_minus_aq_plus_one_negatives() -> None:
    assert verdict([rep(0, NoSuchEntryError("n"))]) is None
    assert verdict([rep(0, NoSuchEntryError("n")), rep(1, NoSuchLedgerError("l"))]) is ENTRY_ABSENT
    # E=WQ=AQ=2: a single negative ends the ledger.
    assert verdict([rep(1, NoSuchEntryError("n"))], wq=2, aq=2) is ENTRY_ABSENT


def test_entry_with_unknowns_fails_and_never_truncates() -> None:
    got = verdict(
        [rep(0, NoSuchEntryError("n")), rep(1, BKTimeoutError("t")), rep(2, BKTimeoutError("t"))]
    )
    assert isinstance(got, BKTimeoutError)
    got = verdict(
        [rep(0, DigestMatchError("d")), rep(1, NoSuchEntryError("n")), rep(2, ReadError("e"))]
    )
    assert isinstance(got, ReadError)


# ---- ask_replicas --------------------------------------------------------------------------------


def first_positive(replies: list[Reply[str]], everyone: bool) -> str | None:
    for r in replies:
        if r.error is None:
            return r.value
    return "all failed" if everyone else None


def test_ask_replicas_sequential_on_errors() -> None:
    asked: list[str] = []

    async def send(b: str) -> str:
        asked.append(b)
        if b != B[2]:
            raise NoSuchEntryError("n", bookie=b)
        return b

    got = asyncio.run(ask_replicas(B[:3], send, first_positive, speculative_timeout=60))
    assert got == B[2] and asked == B[:3]


def test_ask_replicas_speculates_past_a_silent_replica() -> None:
    asked: list[str] = []

    async def send(b: str) -> str:
        asked.append(b)
        if b == B[0]:
            await asyncio.Event().wait()  # never answers
        return b

    got = asyncio.run(ask_replicas(B[:3], send, first_positive, speculative_timeout=0.01))
    assert got == B[1] and asked == B[:2]


def test_ask_replicas_stops_asking_once_decided() -> None:
    asked: list[str] = []

    async def send(b: str) -> str:
        asked.append(b)
        return b

    got = asyncio.run(ask_replicas(B[:3], send, first_positive, speculative_timeout=60))
    assert got == B[0] and asked == [B[0]]
