"""Opening and reading ledgers without recovery, on real bookie processes."""

from __future__ import annotations

import pytest

from bklib.client.pool import SyncBookieClient
from bklib.client.reader import LedgerReader, read_entries_blocking
from bklib.client.recovery import recover_ledger, recover_ledger_blocking
from bklib.client.writer import LedgerWriter
from bklib.errors import (
    BKTimeoutError,
    DigestMatchError,
    IncorrectParameterError,
    NoSuchEntryError,
    ReadError,
    UnauthorizedAccessError,
)
from bklib.meta.model import LedgerState
from bklib.quorum import write_set
from tests.integration.conftest import LEDGERS_ROOT, Cluster, run

pytestmark = pytest.mark.integration

PW = b"reader-pw"


def payload(e: int) -> bytes:
    return b"r-%d" % e


async def new_ledger(ctx, n: int, **kw) -> LedgerWriter:  # type: ignore[no-untyped-def]
    opts = {"ensemble_size": 3, "write_quorum": 2, "ack_quorum": 2, "password": PW, **kw}
    w = await LedgerWriter.create(ctx, **opts)
    for e in range(n):
        assert await w.add(payload(e)) == e
    return w


def test_open_without_recovery_learns_lac_and_does_not_fence(cluster: Cluster) -> None:
    """An OPEN ledger's LAC comes from the bookies (the last entry carries LAC n-2), the ledger
    stays OPEN and the writer keeps writing."""

    async def main() -> None:
        async with cluster.client() as ctx, cluster.client() as rctx:
            w = await new_ledger(ctx, 10)
            r = await LedgerReader.open(rctx, w.ledger_id)
            assert r.lac == 8 and r.metadata.state == LedgerState.OPEN
            assert [e.payload for e in await r.read_entries(0, 8)] == [payload(e) for e in range(9)]
            with pytest.raises(ReadError):
                await r.read_entry(9)  # beyond the LAC the reader knows
            assert await w.add(payload(10)) == 10  # not fenced
            assert await r.read_lac() == 9
            entry = await r.read_entry(9)
            assert (entry.entry_id, entry.payload, entry.lac) == (9, payload(9), 8)
            await w.close()
            assert await r.read_lac() == 10  # closed: lastEntryId

    run(main())


def test_lac_read_needs_coverage(cluster: Cluster) -> None:
    """E=3, WQ=2, AQ=2: one silent bookie still leaves every write set with a known reply;
    two make the read fail (timeouts -> BKTimeoutError, I/O errors -> ReadError)."""

    async def main() -> None:
        async with cluster.client(read_timeout=1.0) as ctx:
            w = await new_ledger(ctx, 5)
            lid, ens = w.ledger_id, w.ensemble
            cluster.fault(ens[0], "drop", op="READ_LAC", ledger=lid)
            assert (await LedgerReader.open(ctx, lid)).lac == 3
            cluster.fault(ens[1], "drop", op="READ_LAC", ledger=lid)
            with pytest.raises(BKTimeoutError):
                await LedgerReader.open(ctx, lid)
            for b in ens[:2]:
                cluster.admin(b).clear_faults()
                cluster.fault(b, "fail", op="READ_LAC", ledger=lid, status="EIO")
            with pytest.raises(ReadError):
                await LedgerReader.open(ctx, lid)

    run(main())


def test_bad_digest_tries_next_replica(cluster: Cluster) -> None:
    async def main() -> None:
        async with cluster.client() as ctx:
            w = await new_ledger(ctx, 6)
            await w.close()
            lid, ens = w.ledger_id, w.ensemble
            first, second = (ens[i] for i in write_set(4, 3, 2))
            cluster.admin(first).corrupt_entry(lid, 4)
            r = await LedgerReader.open(ctx, lid)
            assert (await r.read_entry(4)).payload == payload(4)
            cluster.admin(second).corrupt_entry(lid, 4)
            with pytest.raises(DigestMatchError):
                await r.read_entry(4)
            # The other entries are untouched.
            assert [e.payload for e in await r.read_entries(0, 3)] == [payload(e) for e in range(4)]

    run(main())


def test_missing_everywhere_is_no_such_entry(cluster: Cluster) -> None:
    async def main() -> None:
        async with cluster.client() as ctx:
            w = await new_ledger(ctx, 4)
            await w.close()
            lid, ens = w.ledger_id, w.ensemble
            holders = [ens[i] for i in write_set(2, 3, 2)]
            cluster.admin(holders[0]).delete_entries(lid, [2])
            r = await LedgerReader.open(ctx, lid)
            assert (await r.read_entry(2)).payload == payload(2)
            cluster.admin(holders[1]).delete_entries(lid, [2])
            with pytest.raises(NoSuchEntryError):
                await r.read_entry(2)

    run(main())


def test_wrong_password_and_bad_ranges(cluster: Cluster) -> None:
    async def main() -> None:
        async with cluster.client() as ctx:
            w = await new_ledger(ctx, 3)
            await w.close()
            w2 = await new_ledger(ctx, 1)
            await w2.abort()
            with pytest.raises(UnauthorizedAccessError):
                await LedgerReader.open(ctx, w.ledger_id, password=b"wrong")
            with pytest.raises(UnauthorizedAccessError):
                await recover_ledger(ctx, w2.ledger_id, password=b"wrong")
            # Refused before the metadata was touched.
            assert cluster.store.read_ledger(w2.ledger_id).value.state == LedgerState.OPEN
            r = await LedgerReader.open(ctx, w.ledger_id, password=PW)
            with pytest.raises(IncorrectParameterError):
                await r.read_entries(2, 1)
            with pytest.raises(IncorrectParameterError):
                await r.read_entries(-1, 1)
            with pytest.raises(ReadError):
                await r.read_entries(0, 3)

    run(main())


def test_blocking_wrappers(cluster: Cluster) -> None:
    """The sync helpers for threads / Spark tasks: recovery and reads on a SyncBookieClient."""

    async def make() -> tuple[int, int]:
        async with cluster.client() as ctx:
            w = await new_ledger(ctx, 7)
            await w.abort()
            return w.ledger_id, w.length

    lid, length = run(make())
    with SyncBookieClient(cluster.connect, ledgers_root=LEDGERS_ROOT) as client:
        md = recover_ledger_blocking(client, cluster.store, lid)
        assert (md.state, md.last_entry_id, md.length) == (LedgerState.CLOSED, 6, length)
        entries = read_entries_blocking(client, cluster.store, lid, 0, 6)
        assert [e.payload for e in entries] == [payload(e) for e in range(7)]
