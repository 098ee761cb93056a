"""The ledger writer on real bookie processes: pipelined adds, close, and acceptance scenarios
11-13 of docs/safety-rules.md (ensemble change, writer vs recovery metadata, writer vs
re-replication), each with the exact expected outcome."""

from __future__ import annotations

import asyncio

import pytest

from bklib.client.reader import LedgerReader
from bklib.client.recovery import LedgerRecovery, mark_in_recovery_transform, recover_ledger
from bklib.client.writer import LedgerWriter
from bklib.errors import (
    LedgerClosedError,
    LedgerFencedError,
    MetadataVersionError,
    NotEnoughBookiesError,
)
from bklib.meta.model import DigestType, LedgerState, Segment
from tests.integration.conftest import (
    LEDGERS_ROOT,
    BlockingStore,
    Cluster,
    GatedPool,
    OrderedPlacement,
    run,
    stored_on,
    wait_until,
)

pytestmark = pytest.mark.integration

PW = b"writer-pw"
OPEN, IN_RECOVERY, CLOSED = LedgerState.OPEN, LedgerState.IN_RECOVERY, LedgerState.CLOSED


def payload(e: int) -> bytes:
    return b"w-%d" % e


# ---- basics --------------------------------------------------------------------------------


@pytest.mark.parametrize("digest", [DigestType.CRC32C, DigestType.CRC32, DigestType.HMAC])
def test_pipelined_adds_close_and_read_back(cluster: Cluster, digest: DigestType) -> None:
    async def main() -> None:
        async with cluster.client() as ctx:
            w = await LedgerWriter.create(
                ctx,
                ensemble_size=3,
                write_quorum=2,
                ack_quorum=2,
                digest_type=digest,
                password=PW,
                custom_metadata={"app": b"test"},
            )
            futs = [w.add_async(payload(e)) for e in range(200)]
            assert [await f for f in futs] == list(range(200))
            total = sum(len(payload(e)) for e in range(200))
            assert (w.lac, w.length) == (199, total)
            md = await w.close()
            assert (md.state, md.last_entry_id, md.length) == (CLOSED, 199, total)
            assert md.custom_metadata == {"app": b"test"}
            assert md.digest_type == digest and md.password == PW
            assert await w.close() == md  # idempotent
            with pytest.raises(LedgerClosedError):
                await w.add(b"late")
            r = await LedgerReader.open(ctx, w.ledger_id)
            assert r.lac == 199
            assert [e.payload for e in await r.read_entries(0, 199)] == [
                payload(e) for e in range(200)
            ]
            # Each entry is on exactly its write set (E=3, WQ=2).
            ens = md.segments[0].ensemble
            assert [await stored_on(ctx, b, w.ledger_id, 4) for b in ens] == [False, True, True]

    run(main())


def test_create_needs_enough_writable_bookies(cluster: Cluster) -> None:
    async def main() -> None:
        async with cluster.client() as ctx:
            with pytest.raises(NotEnoughBookiesError):
                await LedgerWriter.create(ctx, ensemble_size=7, write_quorum=2, ack_quorum=2)

    run(main())


# ---- scenario 11 ------------------------------------------------------------------------------


def test_s11_bookie_failure_new_segment_at_lac_plus_one(cluster: Cluster) -> None:
    """E=WQ=3, AQ=2, LAC=2, entries 3 and 4 in flight, b3 fails them. The change CAS is held
    open: meanwhile 3 and 4 reach AQ on b1, b2 but no callback fires. Then the new segment is
    keyed 3 with b3 replaced, both entries are re-sent to the replacement, and the callbacks
    fire in order 3, 4."""

    async def main() -> None:
        store = BlockingStore(cluster.zk, LEDGERS_ROOT)
        async with cluster.client(
            store=store, placement=OrderedPlacement(), pool_class=GatedPool
        ) as ctx:
            pool = ctx.pool
            assert isinstance(pool, GatedPool)
            w = await LedgerWriter.create(
                ctx, ensemble_size=3, write_quorum=3, ack_quorum=2, password=PW
            )
            lid, (b1, b2, b3) = w.ledger_id, w.ensemble
            for e in range(3):
                await w.add(payload(e))
            cluster.fault(b3, "fail", op="ADD_ENTRY", ledger=lid, entries=[3, 4], status="EIO")
            # b1's and b2's copies of 3 and 4 stay in the network until b3's failure started
            # the ensemble change, so the change happens with 3 and 4 in flight at LAC 2.
            for b in (b1, b2):
                for e in (3, 4):
                    pool.hold(b, e)
            store.armed = True
            delivered: list[int] = []
            futs = [w.add_async(payload(e)) for e in (3, 4)]
            for f in futs:
                f.add_done_callback(lambda f: delivered.append(f.result()))
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, store.entered.wait, 30)
            assert w.lac == 2 and w.pipeline.changing_ensemble
            for b in (b1, b2):
                for e in (3, 4):
                    pool.release(b, e)
            await wait_until(
                lambda: w.pending_entries() == [(3, (0, 1), True), (4, (0, 1), True)],
                "entries 3 and 4 acked by b1 and b2",
            )
            assert delivered == [] and w.lac == 2  # blocked while the CAS is pending
            store.release.set()
            assert [await f for f in futs] == [3, 4]
            await asyncio.sleep(0)  # let the done-callbacks scheduled with the results run
            assert delivered == [3, 4]
            md = w.metadata
            x = w.ensemble[2]
            assert md.segments == (Segment(0, (b1, b2, b3)), Segment(3, (b1, b2, x)))
            assert x not in (b1, b2, b3)
            for e in (3, 4):
                assert await stored_on(ctx, x, lid, e)
            md = await w.close()
            assert (md.last_entry_id, md.segments[1].first_entry_id) == (4, 3)

    run(main())


def test_s11_no_ack_since_last_change_replaces_segment_in_place(cluster: Cluster) -> None:
    """E=WQ=AQ=3: b3 fails entry 3 -> segment keyed 3 with x; x fails entry 3 too before anything
    was acknowledged since -> the change is again keyed 3 and replaces that segment in place."""

    async def main() -> None:
        async with cluster.client(placement=OrderedPlacement()) as ctx:
            w = await LedgerWriter.create(
                ctx, ensemble_size=3, write_quorum=3, ack_quorum=3, password=PW
            )
            lid, (b1, b2, b3) = w.ledger_id, w.ensemble
            x, y = sorted(b for b in cluster.bookie_ids if b not in (b1, b2, b3))[:2]
            for e in range(3):
                await w.add(payload(e))
            cluster.fault(b3, "fail", op="ADD_ENTRY", ledger=lid, entry=3, status="EIO")
            cluster.fault(x, "fail", op="ADD_ENTRY", ledger=lid, entry=3, status="EIO")
            assert await w.add(payload(3)) == 3
            assert w.metadata.segments == (
                Segment(0, (b1, b2, b3)),
                Segment(3, (b1, b2, y)),
            )
            assert w.pipeline.ensemble_changes == 2
            assert await stored_on(ctx, y, lid, 3)
            await w.close()

    run(main())


# ---- scenario 12 ------------------------------------------------------------------------------


def test_s12_ensemble_change_while_in_recovery_fails_adds_without_closing(
    cluster: Cluster,
) -> None:
    """The stored ledger is IN_RECOVERY (a recoverer's first step) when a bookie fails: the
    change is refused with LedgerFenced, the pending add fails, the writer does not close the
    ledger; its own close() later is honoured over IN_RECOVERY and a recoverer adopts it."""

    async def main() -> None:
        async with cluster.client() as ctx:
            w = await LedgerWriter.create(
                ctx, ensemble_size=3, write_quorum=2, ack_quorum=2, password=PW
            )
            lid, ens = w.ledger_id, w.ensemble
            await w.add(payload(0))
            cluster.store.update_ledger(lid, mark_in_recovery_transform)
            cluster.fault(ens[1], "fail", op="ADD_ENTRY", ledger=lid, entry=1, status="EIO")
            with pytest.raises(LedgerFencedError):
                await w.add(payload(1))
            md = cluster.store.read_ledger(lid).value
            assert (md.state, md.segments) == (IN_RECOVERY, (Segment(0, ens),))
            assert not w.closed
            with pytest.raises(LedgerFencedError):
                await w.add(payload(2))  # refused: the ledger belongs to the recoverer now

            # A recoverer is running; the writer closes while it is between write-back and
            # close: the writer's CLOSED wins and the recoverer adopts it without a write.
            closed_by_writer: list[int] = []

            class Racing(LedgerRecovery):
                async def before_close(self) -> None:
                    md = await w.close()
                    closed_by_writer.append(cluster.store.read_ledger(lid).version)
                    assert (md.state, md.last_entry_id) == (CLOSED, 0)

            v = await Racing(ctx, lid).run()
            assert (v.value.state, v.value.last_entry_id, v.value.length) == (
                CLOSED,
                0,
                len(payload(0)),
            )
            assert [v.version] == closed_by_writer  # adopted: no write after the writer's

    run(main())


def test_s12_ensemble_change_after_close_is_ledger_closed(cluster: Cluster) -> None:
    """The stored ledger was closed (same values as the writer's) when a bookie fails: the
    change is refused with LedgerClosed, pending adds fail, the writer is closed, and its
    close() is a success because the stored (lastEntryId, length) equal its own."""

    async def main() -> None:
        async with cluster.client() as ctx:
            w = await LedgerWriter.create(
                ctx, ensemble_size=3, write_quorum=2, ack_quorum=2, password=PW
            )
            lid, ens = w.ledger_id, w.ensemble
            for e in range(2):
                await w.add(payload(e))
            cluster.store.update_ledger(lid, lambda m: m.closed(w.lac, w.length))
            cluster.fault(ens[2], "fail", op="ADD_ENTRY", ledger=lid, entry=2, status="EIO")
            with pytest.raises(LedgerClosedError):
                await w.add(payload(2))
            await wait_until(lambda: w.closed, "writer closed")
            with pytest.raises(LedgerClosedError):
                await w.add(payload(3))
            md = await w.close()
            assert (md.state, md.last_entry_id, md.length) == (CLOSED, 1, w.length)
            assert md.segments == (Segment(0, ens),)

    run(main())


def test_s12_writer_close_over_different_close_is_a_version_conflict(cluster: Cluster) -> None:
    async def main() -> None:
        async with cluster.client() as ctx:
            w = await LedgerWriter.create(
                ctx, ensemble_size=3, write_quorum=2, ack_quorum=2, password=PW
            )
            lid = w.ledger_id
            for e in range(3):
                await w.add(payload(e))
            other = cluster.store.update_ledger(lid, lambda m: m.closed(1, 7))
            with pytest.raises(MetadataVersionError):
                await w.close()
            assert w.closed
            assert cluster.store.read_ledger(lid) == other  # untouched

    run(main())


def test_s12_fenced_writer_closes_at_its_lac_and_recovery_adopts(cluster: Cluster) -> None:
    """A recoverer fences the bookies (but has not closed yet); the writer's next add gets
    EFENCED. Its local metadata is still OPEN, so it closes the ledger at its LAC -- over
    IN_RECOVERY -- and the recoverer's own close then adopts that."""

    async def main() -> None:
        async with cluster.client() as ctx, cluster.client() as rctx:
            w = await LedgerWriter.create(
                ctx, ensemble_size=3, write_quorum=3, ack_quorum=2, password=PW
            )
            lid = w.ledger_id
            for e in range(4):
                await w.add(payload(e))
            gate = asyncio.Event()
            fenced = asyncio.Event()

            class Pausing(LedgerRecovery):
                async def _fence_and_read_lac(self, md):  # type: ignore[no-untyped-def]
                    tracker = await super()._fence_and_read_lac(md)
                    fenced.set()
                    await gate.wait()
                    return tracker

            rec = asyncio.ensure_future(Pausing(rctx, lid).run())
            await fenced.wait()
            with pytest.raises(LedgerFencedError):
                await w.add(payload(4))
            await wait_until(lambda: w.closed, "writer closed itself")
            md = await w.close()
            assert (md.state, md.last_entry_id, md.length) == (CLOSED, 3, w.length)
            gate.set()
            v = await rec
            assert v.value == md

    run(main())


# ---- scenario 13 ------------------------------------------------------------------------------


def test_s13_replication_edits_survive_writer_changes_and_close(cluster: Cluster) -> None:
    """Re-replication rewrites segment 0 (b1 -> b4) concurrently with the writer's ensemble
    change and again with its close: the CAS retries re-apply the writer's transforms to fresh
    metadata, so the final metadata keeps every change."""

    async def main() -> None:
        async with cluster.client(placement=OrderedPlacement()) as ctx:
            w = await LedgerWriter.create(
                ctx, ensemble_size=3, write_quorum=2, ack_quorum=2, password=PW
            )
            lid, (b1, b2, b3) = w.ledger_id, w.ensemble
            spare = sorted(b for b in cluster.bookie_ids if b not in (b1, b2, b3))
            for e in range(3):
                await w.add(payload(e))
            # First change (b2 fails entry 3, write set [b1, b2]): 3: [b1, s0, b3].
            cluster.fault(b2, "fail", op="ADD_ENTRY", ledger=lid, entry=3, status="EIO")
            await w.add(payload(3))
            s0 = spare[0]
            assert w.metadata.segments == (Segment(0, (b1, b2, b3)), Segment(3, (b1, s0, b3)))
            await w.add(payload(4))

            # Replication replaces b1 in the now immutable segment 0 behind the writer's back...
            b4 = spare[1]
            cluster.store.update_ledger(lid, lambda m: m.with_bookies_replaced(0, {b1: b4}))
            # ...then b3 fails entry 5 (write set [b3, b1]): the writer's change CAS conflicts
            # and its transform is re-applied to the fresh metadata.
            cluster.fault(b3, "fail", op="ADD_ENTRY", ledger=lid, entry=5, status="EIO")
            await w.add(payload(5))
            md = w.metadata
            s_new = md.segments[2].ensemble[2]
            assert md.segments == (
                Segment(0, (b4, b2, b3)),
                Segment(3, (b1, s0, b3)),
                Segment(5, (b1, s0, s_new)),
            )
            assert s_new not in (b1, b2, b3, s0)

            # Replication touches segment 3 (b1 -> b4) while the writer closes.
            cluster.store.update_ledger(lid, lambda m: m.with_bookies_replaced(3, {b1: b4}))
            md = await w.close()
            assert (md.state, md.last_entry_id) == (CLOSED, 5)
            assert md.segments == (
                Segment(0, (b4, b2, b3)),
                Segment(3, (b4, s0, b3)),
                Segment(5, (b1, s0, s_new)),
            )
            assert cluster.store.read_ledger(lid).value == md
            # recover_ledger on a closed ledger does nothing.
            assert await recover_ledger(ctx, lid) == md

    run(main())
