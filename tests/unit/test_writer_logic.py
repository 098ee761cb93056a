"""The writer's pure logic (ack queue, CAS transforms) and the add pipeline over a fake pool."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from bklib.client.add_pipeline import AckQueue, AddPipeline
from bklib.client.placement import PlacementPolicy
from bklib.client.writer import ensemble_change_transform, writer_close_transform
from bklib.errors import (
    BKError,
    BKTimeoutError,
    ClientClosedError,
    LedgerClosedError,
    LedgerFencedError,
    MetadataVersionError,
    NotEnoughBookiesError,
    UnexpectedConditionError,
    WriteError,
)
from bklib.meta.model import LedgerMetadata, LedgerState, Segment

B = [f"b{i}:3181" for i in range(8)]


# ---- AckQueue ------------------------------------------------------------------------------


def test_acks_delivered_in_order_only() -> None:
    q = AckQueue(3, 2, 2)
    for e in range(3):
        q.push(e, (e + 1) * 10, b"")
    # Entry 1 reaches AQ first: nothing can be delivered before entry 0.
    assert q.ack(1, 1) is False
    assert q.ack(1, 2) is True
    assert q.pop_deliverable() == []
    assert q.ack(0, 0) is False
    assert q.ack(0, 1) is True
    assert [a.entry_id for a in q.pop_deliverable()] == [0, 1]
    assert (q.lac, q.lac_length) == (1, 20)
    assert q.snapshot() == [(2, (), False)]


def test_ack_outside_write_set_or_for_unknown_entry_is_ignored() -> None:
    q = AckQueue(3, 2, 2)
    q.push(0, 1, b"")
    assert q.ack(0, 2) is False  # e0 lives on [0, 1]
    assert q.ack(5, 0) is False
    assert q.snapshot() == [(0, (), False)]


def test_nothing_delivered_while_blocked() -> None:
    q = AckQueue(3, 3, 2)
    q.push(0, 1, b"")
    q.ack(0, 0)
    q.ack(0, 1)
    assert q.pop_deliverable(blocked=True) == []
    assert q.lac == -1
    assert [a.entry_id for a in q.pop_deliverable()] == [0]


def test_unset_replaced_drops_acks_and_lists_resends() -> None:
    q = AckQueue(3, 2, 2, lac=2, length=30)
    q.push(3, 40, b"")  # write set [0, 1]
    q.push(4, 50, b"")  # write set [1, 2]
    for e, i in ((3, 0), (3, 1), (4, 1), (4, 2)):
        q.ack(e, i)
    resend = q.unset_replaced([1])
    assert sorted((a.entry_id, i) for a, i in resend) == [(3, 1), (4, 1)]
    assert q.snapshot() == [(3, (0,), False), (4, (2,), False)]
    # An index outside every write set needs nothing.
    q2 = AckQueue(3, 2, 2)
    q2.push(0, 1, b"")
    q2.ack(0, 0)
    q2.ack(0, 1)
    assert q2.unset_replaced([2]) == []
    assert q2.snapshot() == [(0, (0, 1), True)]


def test_push_must_be_contiguous_and_drain_rewinds() -> None:
    q = AckQueue(2, 2, 1, lac=4, length=5)
    with pytest.raises(UnexpectedConditionError):
        q.push(6, 1, b"")
    q.push(5, 6, b"")
    q.push(6, 7, b"")
    assert [a.entry_id for a in q.drain()] == [5, 6]
    assert (q.lac, q.last_pushed, len(q)) == (4, 4, 0)


# ---- transforms ----------------------------------------------------------------------------


def md(segments: list[tuple[int, list[str]]], state: LedgerState = LedgerState.OPEN) -> Any:
    return LedgerMetadata(
        ledger_id=7,
        ensemble_size=3,
        write_quorum=3,
        ack_quorum=2,
        segments=tuple(Segment(k, tuple(e)) for k, e in segments),
        state=state,
    )


def test_ensemble_change_appends_segment_at_lac_plus_one() -> None:
    m = md([(0, B[0:3])])
    new = ensemble_change_transform(m, 2, {2: B[2]}, B[:5], PlacementPolicy(random.Random(1)))
    assert new is not None
    assert [s.first_entry_id for s in new.segments] == [0, 3]
    assert new.segments[0].ensemble == tuple(B[0:3])
    assert new.segments[1].ensemble[:2] == tuple(B[0:2])
    assert new.segments[1].ensemble[2] in {B[3], B[4]}


def test_ensemble_change_replaces_last_segment_when_it_starts_at_lac_plus_one() -> None:
    m = md([(0, B[0:3]), (3, [B[0], B[1], B[3]])])
    # B[2] failed in the first change: avoided while another bookie is available.
    new = ensemble_change_transform(m, 2, {2: B[3]}, B[:5], PlacementPolicy(), avoid={B[2]})
    assert new is not None
    assert [s.first_entry_id for s in new.segments] == [0, 3]
    assert new.segments[1].ensemble == (B[0], B[1], B[4])


def test_ensemble_change_refused_once_in_recovery_or_closed() -> None:
    p = PlacementPolicy()
    with pytest.raises(LedgerFencedError):
        ensemble_change_transform(md([(0, B[0:3])], LedgerState.IN_RECOVERY), 2, {2: B[2]}, B, p)
    closed = md([(0, B[0:3])]).closed(2, 30)
    with pytest.raises(LedgerClosedError):
        ensemble_change_transform(closed, 2, {2: B[2]}, B, p)


def test_ensemble_change_noop_when_bookie_already_replaced() -> None:
    m = md([(0, B[0:3]), (3, [B[0], B[1], B[5]])])
    assert ensemble_change_transform(m, 2, {2: B[2]}, B, PlacementPolicy()) is None


def test_ensemble_change_avoids_earlier_failures_unless_nothing_else() -> None:
    m = md([(0, B[0:3])])
    new = ensemble_change_transform(m, 0, {2: B[2]}, B[:5], PlacementPolicy(), avoid={B[3]})
    assert new is not None and new.segments[1].ensemble[2] == B[4]
    new = ensemble_change_transform(m, 0, {2: B[2]}, B[:4], PlacementPolicy(), avoid={B[3]})
    assert new is not None and new.segments[1].ensemble[2] == B[3]
    with pytest.raises(NotEnoughBookiesError):
        ensemble_change_transform(m, 0, {2: B[2]}, B[:3], PlacementPolicy())


def test_ensemble_change_key_below_last_segment_is_unexpected() -> None:
    m = md([(0, B[0:3]), (5, B[0:3])])
    with pytest.raises(UnexpectedConditionError):
        ensemble_change_transform(m, 2, {2: B[2]}, B, PlacementPolicy())


def test_writer_close_transform() -> None:
    m = md([(0, B[0:3])])
    closed = writer_close_transform(m, 9, 100)
    assert closed is not None
    assert (closed.state, closed.last_entry_id, closed.length) == (LedgerState.CLOSED, 9, 100)
    # The writer's close overrides IN_RECOVERY.
    rec = writer_close_transform(md([(0, B[0:3])], LedgerState.IN_RECOVERY), 9, 100)
    assert rec is not None and rec.state == LedgerState.CLOSED and rec.last_entry_id == 9
    # Same values already closed: success without a write; different: version conflict.
    assert writer_close_transform(closed, 9, 100) is None
    with pytest.raises(MetadataVersionError):
        writer_close_transform(closed, 10, 110)
    with pytest.raises(MetadataVersionError):
        writer_close_transform(closed, 9, 99)


# ---- AddPipeline over a fake pool ------------------------------------------------------------


class FakePool:
    """Adds wait on futures the test resolves: ``replies[(bookie, entry)]``."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int, bool]] = []
        self.replies: dict[tuple[str, int], asyncio.Future[None]] = {}

    async def add(
        self,
        bookie: str,
        ledger_id: int,
        entry_id: int,
        master_key: bytes,
        body: bytes,
        *,
        recovery: bool = False,
        high_priority: bool = False,
    ) -> None:
        self.sent.append((bookie, entry_id, recovery))
        fut = asyncio.get_running_loop().create_future()
        self.replies[(bookie, entry_id)] = fut
        await fut

    def ok(self, bookie: str, entry_id: int) -> None:
        self.replies[(bookie, entry_id)].set_result(None)

    def fail(self, bookie: str, entry_id: int, exc: BKError) -> None:
        self.replies[(bookie, entry_id)].set_exception(exc)


class FakeCtx:
    def __init__(self, max_ensemble_changes: int | None = None) -> None:
        self.pool = FakePool()
        self.max_ensemble_changes = max_ensemble_changes


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def make_pipeline(
    ctx: FakeCtx, ensemble: list[str], aq: int, change: Any, errors: list[BKError]
) -> AddPipeline:
    return AddPipeline(
        ctx,  # type: ignore[arg-type]
        7,
        len(ensemble),
        len(ensemble),
        aq,
        ensemble,
        b"k" * 20,
        change_ensemble=change,
        on_unrecoverable=errors.append,
    )


def test_pipeline_blocks_delivery_during_ensemble_change_then_resends() -> None:
    async def main() -> None:
        ctx = FakeCtx()
        release = asyncio.Event()
        calls: list[dict[int, str]] = []

        async def change(failed: dict[int, str]) -> tuple[str, ...]:
            calls.append(dict(failed))
            await release.wait()
            return (B[0], B[1], B[3])

        errors: list[BKError] = []
        p = make_pipeline(ctx, B[0:3], 2, change, errors)
        futs = [p.submit(e, b"body", e + 1) for e in range(5)]
        await settle()
        for e in range(3):
            for b in B[0:3]:
                ctx.pool.ok(b, e)
        await settle()
        assert [f.result() for f in futs[:3]] == [0, 1, 2]
        ctx.pool.fail(B[2], 3, WriteError("EIO"))
        await settle()
        assert calls == [{2: B[2]}] and p.changing_ensemble
        for b in B[0:2]:
            ctx.pool.ok(b, 3)
            ctx.pool.ok(b, 4)
        await settle()
        # Both reached AQ, but nothing may be delivered while the change is pending.
        assert p.queue.snapshot() == [(3, (0, 1), True), (4, (0, 1), True)]
        assert not futs[3].done() and not futs[4].done() and p.lac == 2
        # A late failure of the bookie being replaced (for an entry with AQ) changes nothing.
        ctx.pool.fail(B[2], 4, WriteError("EIO"))
        release.set()
        await settle()
        assert [f.result() for f in futs[3:]] == [3, 4]
        assert p.ensemble == (B[0], B[1], B[3]) and calls == [{2: B[2]}]
        assert [(b, e) for b, e, _ in ctx.pool.sent if b == B[3]] == [(B[3], 3), (B[3], 4)]
        assert errors == []
        p.stop()
        await p.wait_stopped()

    asyncio.run(main())


def test_pipeline_resend_restores_lost_ack_quorum() -> None:
    async def main() -> None:
        ctx = FakeCtx()

        async def change(failed: dict[int, str]) -> tuple[str, ...]:
            return (B[0], B[1], B[4])

        errors: list[BKError] = []
        p = make_pipeline(ctx, B[0:3], 3, change, errors)  # AQ = 3: every replica needed
        fut = p.submit(0, b"body", 1)
        await settle()
        ctx.pool.ok(B[0], 0)
        ctx.pool.ok(B[1], 0)
        ctx.pool.fail(B[2], 0, BKTimeoutError("slow"))
        await settle()
        assert not fut.done()
        ctx.pool.ok(B[4], 0)
        await settle()
        assert fut.result() == 0 and p.lac == 0

    asyncio.run(main())


def test_pipeline_fenced_pending_add_is_unrecoverable() -> None:
    async def main() -> None:
        ctx = FakeCtx()

        async def change(failed: dict[int, str]) -> tuple[str, ...]:
            raise AssertionError("a fenced add must not trigger an ensemble change")

        errors: list[BKError] = []
        p = make_pipeline(ctx, B[0:3], 2, change, errors)
        p.submit(0, b"body", 1)
        await settle()
        ctx.pool.fail(B[1], 0, LedgerFencedError("EFENCED"))
        await settle()
        assert [type(e) for e in errors] == [LedgerFencedError]

    asyncio.run(main())


def test_pipeline_failed_change_reports_unrecoverable() -> None:
    async def main() -> None:
        ctx = FakeCtx()

        async def change(failed: dict[int, str]) -> tuple[str, ...]:
            raise NotEnoughBookiesError("none left")

        errors: list[BKError] = []
        p = make_pipeline(ctx, B[0:3], 2, change, errors)
        p.submit(0, b"body", 1)
        await settle()
        ctx.pool.fail(B[0], 0, WriteError("EIO"))
        await settle()
        assert [type(e) for e in errors] == [NotEnoughBookiesError]
        assert not p.changing_ensemble

    asyncio.run(main())


def test_pipeline_client_closed_fails_everything() -> None:
    async def main() -> None:
        ctx = FakeCtx()

        async def change(failed: dict[int, str]) -> tuple[str, ...]:
            raise AssertionError("no change on client close")

        errors: list[BKError] = []
        p = make_pipeline(ctx, B[0:3], 2, change, errors)
        futs = [p.submit(e, b"x", e + 1) for e in range(2)]
        await settle()
        ctx.pool.fail(B[0], 0, ClientClosedError("closed"))
        await settle()
        for e, f in enumerate(futs):
            exc = f.exception()
            assert isinstance(exc, ClientClosedError) and exc.entry_id == e
        assert len(p.queue) == 0

    asyncio.run(main())


def test_pipeline_gives_up_after_max_ensemble_changes() -> None:
    async def main() -> None:
        ctx = FakeCtx(max_ensemble_changes=1)
        spares = iter(B[3:])

        async def change(failed: dict[int, str]) -> tuple[str, ...]:
            return (B[0], B[1], next(spares))

        errors: list[BKError] = []
        p = make_pipeline(ctx, B[0:3], 3, change, errors)
        p.submit(0, b"x", 1)
        await settle()
        ctx.pool.fail(B[2], 0, WriteError("EIO"))
        await settle()
        assert p.ensemble == (B[0], B[1], B[3]) and errors == []
        ctx.pool.fail(B[3], 0, WriteError("EIO"))
        await settle()
        assert [type(e) for e in errors] == [WriteError]
        assert p.ensemble == (B[0], B[1], B[3])

    asyncio.run(main())


def test_pipeline_failure_after_aq_is_a_delayed_failure() -> None:
    """A replica failing an entry that already reached AQ does not change the ensemble at once;
    the change happens when the next entry is sent."""

    async def main() -> None:
        ctx = FakeCtx()
        calls: list[dict[int, str]] = []

        async def change(failed: dict[int, str]) -> tuple[str, ...]:
            calls.append(dict(failed))
            return (B[0], B[1], B[5])

        errors: list[BKError] = []
        p = make_pipeline(ctx, B[0:3], 2, change, errors)
        f0 = p.submit(0, b"x", 1)
        await settle()
        ctx.pool.ok(B[0], 0)
        ctx.pool.ok(B[1], 0)
        await settle()
        assert f0.result() == 0
        ctx.pool.fail(B[2], 0, LedgerFencedError("EFENCED"))
        await settle()
        assert calls == [] and errors == [] and not p.changing_ensemble
        f1 = p.submit(1, b"y", 2)
        await settle()
        assert calls == [{2: B[2]}] and p.ensemble == (B[0], B[1], B[5])
        for b in (B[0], B[1]):
            ctx.pool.ok(b, 1)
        await settle()
        assert f1.result() == 1
        # Entry 1 went to the old bookie first and was re-sent to the replacement.
        assert [b for b, e, _ in ctx.pool.sent if e == 1] == [B[1], B[2], B[0], B[5]]

    asyncio.run(main())
