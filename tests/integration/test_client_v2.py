"""The v2 client (BookieConnectionV2, BookieClientPool(protocol="v2"), batch_read) against the
real Python bookie process, resolved through ZooKeeper like the v3 tests in
test_client_bookie.py: what v2 writes v3 reads byte for byte and the other way round, batch
limits, fencing across protocols, timeouts, and a bookie killed with a batch outstanding."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from bklib.client.pool import BookieClientPool, SyncBookieClient
from bklib.client.transport import BadResponseError, ConnectionLostError
from bklib.errors import (
    BKTimeoutError,
    BookieHandleNotAvailableError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedAccessError,
)
from tests.bookie_helpers import BookieProcess, wait_rule_hits
from tests.integration.test_client_bookie import (
    CONFIG,
    KEY,
    ROOT,
    WRONG_KEY,
    bodies,
    packer,
    payload,
    start_bookie,
)

pytestmark = pytest.mark.integration


def frame_size(entries: list[bytes]) -> int:
    """Bytes of a BATCH_READ reply on the wire, what maxSize bounds."""
    return 36 + sum(4 + len(b) for b in entries)


def test_v2_and_v3_read_each_others_entries_batch_limits_and_fencing(
    zk_chroot: str, zk: KazooClient, tmp_path: Path
) -> None:
    proc, bid = start_bookie(zk_chroot, zk, tmp_path / "data")
    ledger, v3_ledger = 301, 302
    written = bodies(ledger, list(range(40)))
    v3_written = bodies(v3_ledger, list(range(5)))

    async def scenario() -> None:
        async with (
            BookieClientPool(zk_chroot, ledgers_root=ROOT, config=CONFIG, protocol="v2") as p2,
            BookieClientPool(zk_chroot, ledgers_root=ROOT, config=CONFIG) as p3,
        ):
            # Pipelined v2 adds, read back over v3 (byte-identical, digest valid) and over v2.
            await asyncio.gather(*(p2.add(bid, ledger, e, KEY, b) for e, b in written.items()))
            assert p2.connection_v2(bid).connected and bid not in p2._connections
            v3_reads = await asyncio.gather(*(p3.read(bid, ledger, e) for e in written))
            v2_reads = await asyncio.gather(*(p2.read(bid, ledger, e) for e in written))
            dm = packer(ledger)
            for e, (r3, r2) in enumerate(zip(v3_reads, v2_reads, strict=True)):
                assert r3.body == r2.body == written[e]
                assert bytes(dm.verify_entry(r2.body, e).payload) == payload(ledger, e)
                assert r2.max_lac is None  # v2 replies carry no LAC
            assert (await p2.read(bid, ledger, -1)).body == written[39]
            # And v3 adds read over v2.
            for e, b in v3_written.items():
                await p3.add(bid, v3_ledger, e, KEY, b)
            assert await p2.batch_read(bid, v3_ledger, 0, 0, 0) == list(v3_written.values())

            # Batch reads: everything; maxCount; maxSize (the reply frame's size); the first
            # entry even when alone it is over maxSize; a start in the middle; the end.
            everything = [written[e] for e in range(40)]
            assert await p2.batch_read(bid, ledger, 0, 0, 0) == everything
            assert await p2.batch_read(bid, ledger, 0, 7, 0) == everything[:7]
            assert await p2.batch_read(bid, ledger, 10, 5, 0) == everything[10:15]
            size = frame_size(everything[:9])
            assert await p2.batch_read(bid, ledger, 0, 100, size) == everything[:9]
            assert await p2.batch_read(bid, ledger, 0, 100, size - 1) == everything[:8]
            assert await p2.batch_read(bid, ledger, 3, 100, 1) == everything[3:4]
            assert await p2.batch_read(bid, ledger, 35, 100, 0) == everything[35:]
            for got, e in zip(
                await p2.batch_read(bid, ledger, 20, 4, 0), range(20, 24), strict=True
            ):
                assert dm.verify_entry(got, e).entry_id == e
            with pytest.raises(NoSuchEntryError) as ei:
                await p2.batch_read(bid, ledger, 40, 10, 0)
            assert (ei.value.ledger_id, ei.value.entry_id, ei.value.bookie) == (ledger, 40, bid)
            with pytest.raises(NoSuchLedgerError):
                await p2.batch_read(bid, 999_997, 0, 10, 0)
            with pytest.raises(NoSuchEntryError):
                await p2.read(bid, ledger, 40)

            # Fencing over v2: wrong key refused; the right one fences for both protocols.
            with pytest.raises(UnauthorizedAccessError):
                await p2.read(bid, ledger, -1, fence=True, master_key=WRONG_KEY)
            with pytest.raises(UnauthorizedAccessError):
                await p2.add(bid, ledger, 40, WRONG_KEY, bodies(ledger, list(range(41)))[40])
            fenced = await p2.read(bid, ledger, -1, fence=True, master_key=KEY)
            assert dm.verify_entry(fenced.body, None).entry_id == 39
            late = bodies(ledger, list(range(41)))[40]
            with pytest.raises(LedgerFencedError) as ei2:
                await p3.add(bid, ledger, 40, KEY, late)
            assert ei2.value.bookie == bid
            with pytest.raises(LedgerFencedError):
                await p2.add(bid, ledger, 40, KEY, late)
            # A recovery add over v2 is accepted on the fenced ledger and readable over v3.
            await p2.add(bid, ledger, 40, KEY, late, recovery=True, high_priority=True)
            assert (await p3.read(bid, ledger, 40)).body == late
            # v3 fencing binds v2 adds too; a fencing batch read fences as well.
            await p3.read(bid, v3_ledger, -1, fence=True, master_key=KEY)
            with pytest.raises(LedgerFencedError):
                await p2.add(bid, v3_ledger, 5, KEY, bodies(v3_ledger, list(range(6)))[5])
            third = 303
            await p2.add(bid, third, 0, KEY, bodies(third, [0])[0])
            got = await p2.batch_read(bid, third, 0, 10, 0, fence=True, master_key=KEY)
            assert got == [bodies(third, [0])[0]]
            with pytest.raises(LedgerFencedError):
                await p2.add(bid, third, 1, KEY, bodies(third, [0, 1])[1])
            assert p2.connection_v2(bid).connected

    try:
        asyncio.run(scenario())
        assert proc.alive(), proc.log_tail()
    finally:
        proc.stop()


def test_v2_timeouts_and_a_bookie_killed_mid_batch(
    zk_chroot: str, zk: KazooClient, tmp_path: Path
) -> None:
    proc, bid = start_bookie(zk_chroot, zk, tmp_path / "data")
    ledger = 401
    written = bodies(ledger, list(range(20)))
    try:
        with SyncBookieClient(zk_chroot, ledgers_root=ROOT, config=CONFIG, protocol="v2") as client:
            for e, b in written.items():
                client.add(bid, ledger, e, KEY, b)
            admin = proc.admin()
            # A bookie that never answers the batch: timeout; the connection stays up.
            rule = admin.add_fault("drop", ops=["BATCH_READ_ENTRY"], ledger=ledger, entry=5)
            t0 = time.monotonic()
            with pytest.raises(BKTimeoutError) as ei:
                client.batch_read(bid, ledger, 5, 10, 0, timeout=0.5)
            assert 0.45 <= time.monotonic() - t0 < 3.0
            assert (ei.value.ledger_id, ei.value.entry_id, ei.value.bookie) == (ledger, 5, bid)
            assert client.call("batch_read", bid, ledger, 0, 3, 0) == [
                written[e] for e in (0, 1, 2)
            ]
            # A delayed single read times out too, and its late reply is dropped harmlessly.
            admin.add_fault("delay", ops=["READ_ENTRY"], ledger=ledger, entry=7, delay_ms=800)
            with pytest.raises(BKTimeoutError):
                client.read(bid, ledger, 7, timeout=0.2)
            time.sleep(1.0)
            assert client.read(bid, ledger, 8).body == written[8]

            # kill -9 with batch reads outstanding (the drop rule keeps them so): "unknown"
            # (ConnectionLostError naming the bookie), not a bad reply, never missing entries.
            assert admin.faults()[0]["id"] == rule
            futs = [
                client.submit(lambda p: p.batch_read(bid, ledger, 5, 10, 0, timeout=30)),
                client.submit(lambda p: p.batch_read(bid, ledger, 5, 2, 0, timeout=30)),
            ]
            wait_rule_hits(admin, rule, 3)  # the two reached the bookie before the crash
            proc.kill9()
            for fut in futs:
                with pytest.raises(ConnectionLostError) as ei2:
                    fut.result(10)
                assert not isinstance(ei2.value, BadResponseError)
                assert not isinstance(ei2.value, NoSuchEntryError)
                assert ei2.value.bookie == bid and ei2.value.entry_id == 5

            with pytest.raises((BookieHandleNotAvailableError, BKTimeoutError)) as ei3:
                client.batch_read(bid, ledger, 0, 10, 0)
            assert ei3.value.bookie == bid

            # Restarted on the same port and data: the v2 connection comes back by itself and
            # every acknowledged entry is there.
            proc = BookieProcess(
                zk_chroot, tmp_path / "data", proc.port, extra=["--bookie-id", bid]
            ).start()
            deadline = time.monotonic() + 20
            while True:
                try:
                    got = client.batch_read(bid, ledger, 0, 0, 0)
                    break
                except BookieHandleNotAvailableError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            assert got == [written[e] for e in range(20)]
    finally:
        proc.stop()
