"""The sampled check's reads across ledgers (bklib/audit/sampled_reads.py): how each bookie's
reads are grouped, bounded and settled, on a real event loop in its own thread, as the bookie
client runs it. The bookie is a stand-in pool that answers from a table and records each
group; the real client and bookies are in tests/integration/test_audit_read_bounds.py and
tests/integration/test_audit_sample.py."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from bklib.audit.model import LedgerView, SegmentSpan
from bklib.audit.sampled_reads import GROUPS_OUT, LedgerReads, SampledReads
from bklib.client.operations import ReadResult
from bklib.client.throttle import RateLimiter, ReadGate
from bklib.digest import digest_manager
from bklib.errors import BKError, BKTimeoutError, NoSuchEntryError
from bklib.meta.model import DigestType, LedgerState
from bklib.states import ReplicaStatus

BOOKIES = ("10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181")
PASSWORD = b"pw"


def _ledger(lid: int, last: int, *, closed: bool = True) -> LedgerView:
    state = LedgerState.CLOSED if closed else LedgerState.OPEN
    return LedgerView(
        ledger_id=lid,
        state=state.name,
        ensemble_size=3,
        write_quorum=3,
        ack_quorum=2,
        last_entry_id=last if closed else None,
        digest_type="CRC32C",
        password=PASSWORD,
        segments=(SegmentSpan(0, last if closed else None, BOOKIES),),
    )


def _body(lid: int, x: int) -> bytes:
    return digest_manager(lid, DigestType.CRC32C, PASSWORD).package_entry(x, x - 1, 8, b"x" * 8)


class _Pool:
    """Answers each read from ``answer(bookie, lid, x)``; records every group and the most
    groups outstanding on one bookie at once."""

    def __init__(self, answer: Callable[[str, int, int], ReadResult | BKError]) -> None:
        self.answer = answer
        self.groups: list[tuple[str, list[tuple[int, int]]]] = []
        self.out: dict[str, int] = {}
        self.most_out = 0
        self.release = asyncio.Event()

    async def read_many(
        self, bookie: str, reads: Sequence[tuple[int, int]], *, timeout: float
    ) -> list[ReadResult | BKError]:
        self.groups.append((bookie, list(reads)))
        self.out[bookie] = self.out.get(bookie, 0) + 1
        self.most_out = max(self.most_out, self.out[bookie])
        await self.release.wait()
        self.out[bookie] -= 1
        return [self.answer(bookie, lid, x) for lid, x in reads]

    async def read_lac(self, bookie: str, lid: int, *, timeout: float) -> Any:
        raise NoSuchEntryError("no LAC", ledger_id=lid)


class _Client:
    """What SampledReads needs of SyncBookieClient: ``post`` onto a loop in its own thread."""

    def __init__(self, pool: _Pool, loop: asyncio.AbstractEventLoop) -> None:
        self.pool = pool
        self.loop = loop

    def post(self, fn: Callable[[Any], None]) -> None:
        self.loop.call_soon_threadsafe(fn, self.pool)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    lp = asyncio.new_event_loop()
    t = threading.Thread(target=lp.run_forever, daemon=True)
    t.start()
    yield lp
    lp.call_soon_threadsafe(lp.stop)
    t.join(5)
    lp.close()


def _reads(
    pool: _Pool, loop: asyncio.AbstractEventLoop, *, gate: int, batch: int = 100
) -> SampledReads:
    gates = {b: ReadGate(gate) for b in BOOKIES}
    rl = RateLimiter(None)
    pool.release = asyncio.Event()
    loop.call_soon_threadsafe(lambda: None)  # the Event binds to the loop on first wait
    return SampledReads(
        _Client(pool, loop),  # type: ignore[arg-type]
        timeout=1.0,
        verify_percentage=100.0,  # every entry of the stripe: many reads per pair
        batch=batch,
        skip=lambda b: False,
        bounds=lambda b: (gates[b], rl),
        rng_of=lambda lid, b: None,
        lac_of=lambda answer, dm: None,
    )


def _held(bookie: str, lid: int, x: int) -> ReadResult | BKError:
    return ReadResult(_body(lid, x))


def test_a_batch_of_ledgers_leaves_in_groups_spanning_ledgers_within_each_bookies_gate(
    loop: asyncio.AbstractEventLoop,
) -> None:
    pool = _Pool(_held)
    reads = _reads(pool, loop, gate=8)
    items = [LedgerReads(_ledger(lid, 2), None) for lid in range(1, 7)]
    for item in items:
        reads.submit(item)
    reads.hand_over()
    loop.call_soon_threadsafe(pool.release.set)
    for item in items:
        item.future.result(5)
    for item in items:
        per_bookie = item.probes(True)
        assert set(per_bookie) == set(BOOKIES)
        for got in per_bookie.values():
            assert (got.status, got.entries, got.answered) == (ReplicaStatus.OK, ((0, 2),), 3)
    # Six ledgers of three reads per bookie: 18 reads each, in groups of at most half the
    # gate (4), each spanning ledgers, and never more than GROUPS_OUT out at once.
    for b in BOOKIES:
        groups = [g for bookie, g in pool.groups if bookie == b]
        assert sum(len(g) for g in groups) == 18
        assert max(len(g) for g in groups) == 4
        assert any(len({lid for lid, _ in g}) > 1 for g in groups)
    assert pool.most_out <= GROUPS_OUT


def test_each_read_settles_as_its_own_answer_says(loop: asyncio.AbstractEventLoop) -> None:
    def answer(bookie: str, lid: int, x: int) -> ReadResult | BKError:
        if bookie == BOOKIES[0] and x == 1:
            return NoSuchEntryError("no", ledger_id=lid, entry_id=x)
        if bookie == BOOKIES[1]:
            return BKTimeoutError("slow", ledger_id=lid, entry_id=x)
        if bookie == BOOKIES[2] and x == 2:
            return ReadResult(_body(lid, x + 1))  # another entry's body: a digest mismatch
        return ReadResult(_body(lid, x))

    pool = _Pool(answer)
    reads = _reads(pool, loop, gate=4)
    ledger = _ledger(9, 3)
    item = LedgerReads(ledger, digest_manager(9, DigestType.CRC32C, PASSWORD))
    reads.submit(item)
    reads.awaiting(item)  # not handed over yet: waiting for it hands it over
    loop.call_soon_threadsafe(pool.release.set)
    item.future.result(5)
    got = item.probes(True)
    assert got[BOOKIES[0]].entries == ((0, 0), (2, 3))
    assert got[BOOKIES[1]].status == ReplicaStatus.UNREACHABLE
    assert got[BOOKIES[1]].unknown == ((0, 3),) and got[BOOKIES[1]].error is not None
    assert got[BOOKIES[2]].bad == ((2, 2),) and got[BOOKIES[2]].entries == ((0, 3),)
    assert item.pairs == {}  # let go once read: each pair points back at the ledger


def test_an_abandoned_ledgers_reads_are_not_sent(loop: asyncio.AbstractEventLoop) -> None:
    pool = _Pool(_held)
    reads = _reads(pool, loop, gate=2)
    kept, dropped = LedgerReads(_ledger(1, 1), None), LedgerReads(_ledger(2, 1), None)
    reads.submit(kept)
    reads.submit(dropped)
    dropped.cancelled = True  # as abandon() marks it, before the loop takes the batch
    reads.hand_over()
    loop.call_soon_threadsafe(pool.release.set)
    kept.future.result(5)
    assert {lid for _, g in pool.groups for lid, _ in g} == {1}
    reads.abandon([dropped])
    assert dropped.future.cancelled()


def test_a_failure_that_is_no_bookies_answer_fails_the_ledgers_it_was_reading(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """A read call that breaks outside BookKeeper's errors is neither missing nor unknown: the
    ledgers whose reads it held end with it, so the check stops instead of waiting for ever."""

    def broken(bookie: str, lid: int, x: int) -> ReadResult | BKError:
        if bookie == BOOKIES[1]:
            raise RuntimeError("the client broke")
        return ReadResult(_body(lid, x))

    pool = _Pool(broken)
    reads = _reads(pool, loop, gate=8)
    items = [LedgerReads(_ledger(lid, 2), None) for lid in (1, 2)]
    for item in items:
        reads.submit(item)
    reads.hand_over()
    loop.call_soon_threadsafe(pool.release.set)
    for item in items:
        with pytest.raises(RuntimeError, match="the client broke"):
            item.future.result(5)


def test_a_failure_while_grouping_fails_the_ledgers_queued_on_that_bookie(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The queue's own grouping breaking (a programming error) after it took pairs off the
    queue leaves no pair unsettled: every ledger queued on that bookie, those of the group
    being formed included, ends with the error."""
    from bklib.audit import sampled_reads

    grouped = sampled_reads._BookieQueue._next_group

    def breaks_on_one_bookie(
        self: sampled_reads._BookieQueue, taken: list[sampled_reads._PairReads]
    ) -> tuple[list[tuple[int, int]], list[tuple[sampled_reads._PairReads, int]]]:
        out = grouped(self, taken)  # the pairs have left the queue for the group
        if self.bookie == BOOKIES[1]:
            raise RuntimeError("grouping broke")
        return out

    monkeypatch.setattr(sampled_reads._BookieQueue, "_next_group", breaks_on_one_bookie)
    pool = _Pool(_held)
    reads = _reads(pool, loop, gate=8)
    on_it = [LedgerReads(_ledger(lid, 2), None) for lid in (1, 2)]
    for item in on_it:
        assert BOOKIES[1] in item.ledger.bookies()
        reads.submit(item)
    reads.hand_over()
    loop.call_soon_threadsafe(pool.release.set)
    for item in on_it:
        with pytest.raises(RuntimeError, match="grouping broke"):
            item.future.result(5)
