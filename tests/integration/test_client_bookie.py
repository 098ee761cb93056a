"""bklib.client against the real Python bookie process, resolved through ZooKeeper.

Each test starts ``python -m bklib.bookie`` in its own chroot with a custom bookie id (not
host:port), so every request proves that the pool found the address in the bookie's
registration znode.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from bklib.availability import decode as decode_availability
from bklib.availability import from_entry_ids
from bklib.client.operations import ClientConfig
from bklib.client.pool import BookieClientPool, SyncBookieClient
from bklib.client.transport import ConnectionLostError
from bklib.digest import DigestManager, digest_manager, master_key
from bklib.errors import (
    BKTimeoutError,
    BookieHandleNotAvailableError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedAccessError,
    WriteOnReadOnlyBookieError,
)
from bklib.meta.model import DigestType
from tests.bookie_helpers import BookieProcess, wait_for_znode, wait_rule_hits

pytestmark = pytest.mark.integration

ROOT = "/ledgers"
PASSWORD = b"client-test"
KEY = master_key(PASSWORD)
WRONG_KEY = master_key(b"wrong")

CONFIG = ClientConfig(
    add_timeout=5.0,
    read_timeout=5.0,
    connect_timeout=5.0,
    reconnect_backoff_initial=0.05,
    reconnect_backoff_max=0.5,
)


def start_bookie(
    zk_chroot: str, zk: KazooClient, data_dir: Path, *extra: str, port: int | None = None
) -> tuple[BookieProcess, str]:
    bookie_id = f"bk-{uuid.uuid4().hex[:8]}"
    proc = BookieProcess(
        zk_chroot, data_dir, port, extra=["--bookie-id", bookie_id, *extra], fault_injection=True
    )
    proc.start()
    sub = "readonly/" if "--readonly" in extra else ""
    wait_for_znode(zk, f"{ROOT}/available/{sub}{bookie_id}")
    return proc, bookie_id


@pytest.fixture
def bookie(zk_chroot: str, zk: KazooClient, tmp_path: Path) -> Iterator[tuple[BookieProcess, str]]:
    proc, bookie_id = start_bookie(zk_chroot, zk, tmp_path / "data")
    try:
        yield proc, bookie_id
        assert proc.alive(), proc.log_tail()
    finally:
        proc.stop()


def packer(ledger_id: int) -> DigestManager:
    return digest_manager(ledger_id, DigestType.CRC32C, PASSWORD)


def payload(ledger_id: int, entry_id: int) -> bytes:
    return f"ledger {ledger_id} entry {entry_id} ".encode() * 4


def bodies(ledger_id: int, entry_ids: list[int]) -> dict[int, bytes]:
    """Entry bodies as a writer packs them: LAC = previous entry, cumulative length."""
    dm = packer(ledger_id)
    out, length = {}, 0
    for e in entry_ids:
        length += len(payload(ledger_id, e))
        out[e] = dm.package_entry(e, e - 1, length, payload(ledger_id, e))
    return out


def test_write_read_verify_fence_and_errors(
    zk_chroot: str, bookie: tuple[BookieProcess, str]
) -> None:
    _, bid = bookie
    ledger, other, gappy = 101, 102, 103

    async def scenario() -> None:
        async with BookieClientPool(zk_chroot, ledgers_root=ROOT, config=CONFIG) as pool:
            written = bodies(ledger, list(range(10)))
            # Pipelined adds on one connection.
            await asyncio.gather(*(pool.add(bid, ledger, e, KEY, b) for e, b in written.items()))
            results = await asyncio.gather(*(pool.read(bid, ledger, e) for e in range(10)))
            dm = packer(ledger)
            for e, res in enumerate(results):
                assert res.body == written[e]  # stored byte-identical
                view = dm.verify_entry(res.body, e)
                assert bytes(view.payload) == payload(ledger, e)
                assert (view.entry_id, view.lac) == (e, e - 1)
                assert res.max_lac == 8  # the highest LAC piggybacked on stored entries
            last = await pool.read(bid, ledger, -1)
            assert dm.verify_entry(last.body, None).entry_id == 9

            with pytest.raises(NoSuchEntryError) as ei:
                await pool.read(bid, ledger, 10)
            assert (ei.value.ledger_id, ei.value.entry_id, ei.value.bookie) == (ledger, 10, bid)
            with pytest.raises(NoSuchLedgerError) as ei2:
                await pool.read(bid, 999_999, 0)
            assert ei2.value.bookie == bid and ei2.value.ledger_id == 999_999

            # A wrong master key on a keyed request is EUA.
            with pytest.raises(UnauthorizedAccessError) as ei3:
                await pool.add(bid, ledger, 10, WRONG_KEY, bodies(ledger, [10])[10])
            assert (ei3.value.ledger_id, ei3.value.entry_id) == (ledger, 10)
            with pytest.raises(UnauthorizedAccessError):
                await pool.read(bid, ledger, -1, fence=True, master_key=WRONG_KEY)

            # Explicit LAC, force, bookie info.
            await pool.write_lac(bid, ledger, 7, KEY, dm.package_lac(7))
            lac = await pool.read_lac(bid, ledger)
            assert lac.lac_body is not None and dm.verify_lac(lac.lac_body) == 7
            assert lac.last_entry_body == written[9]
            await pool.force_ledger(bid, ledger)
            info = await pool.bookie_info(bid)
            assert info.total_disk_capacity and info.free_disk_space is not None
            assert 0 < info.free_disk_space <= info.total_disk_capacity

            # Fencing read (read-LAC style: entry -1, key, no priority) returns the last entry;
            # afterwards normal adds are EFENCED and recovery adds are accepted.
            fenced = await pool.read(bid, ledger, -1, fence=True, master_key=KEY)
            assert dm.verify_entry(fenced.body, None).entry_id == 9
            late = bodies(ledger, list(range(11)))[10]
            with pytest.raises(LedgerFencedError) as ei4:
                await pool.add(bid, ledger, 10, KEY, late)
            assert (ei4.value.ledger_id, ei4.value.entry_id, ei4.value.bookie) == (ledger, 10, bid)
            await pool.add(bid, ledger, 10, KEY, late, recovery=True, high_priority=True)
            assert dm.verify_entry((await pool.read(bid, ledger, 10)).body, 10).entry_id == 10
            # A fencing read of a ledger the bookie never saw creates, fences it: ENOENTRY.
            with pytest.raises(NoSuchEntryError):
                await pool.read(bid, other, -1, fence=True, master_key=KEY, high_priority=True)
            with pytest.raises(LedgerFencedError):
                await pool.add(bid, other, 0, KEY, bodies(other, [0])[0])

            # list_entries decodes to exactly what was stored.
            runs = decode_availability(await pool.list_entries(bid, ledger))
            assert runs == from_entry_ids(range(11))
            gaps = [0, 1, 2, 5, 6, 9]
            for e, b in bodies(gappy, gaps).items():
                await pool.add(bid, gappy, e, KEY, b)
            gappy_runs = decode_availability(await pool.list_entries(bid, gappy))
            assert list(gappy_runs.runs()) == [(0, 2), (5, 6), (9, 9)]
            with pytest.raises(NoSuchLedgerError):
                await pool.list_entries(bid, 999_998)
            assert pool.connection(bid).connected

    asyncio.run(scenario())


def test_timeout_and_outstanding_request_when_the_bookie_is_killed(
    zk_chroot: str, zk: KazooClient, tmp_path: Path
) -> None:
    proc, bid = start_bookie(zk_chroot, zk, tmp_path / "data")
    ledger = 201
    written = bodies(ledger, list(range(5)))
    try:
        with SyncBookieClient(zk_chroot, ledgers_root=ROOT, config=CONFIG) as client:
            for e, b in written.items():
                client.add(bid, ledger, e, KEY, b)
            admin = proc.admin()
            # A bookie that never answers: timeout, the connection survives.
            rule = admin.add_fault("drop", ops=["READ_ENTRY"], ledger=ledger, entry=3)
            t0 = time.monotonic()
            with pytest.raises(BKTimeoutError) as ei:
                client.read(bid, ledger, 3, timeout=0.5)
            assert 0.45 <= time.monotonic() - t0 < 3.0
            assert (ei.value.ledger_id, ei.value.entry_id, ei.value.bookie) == (ledger, 3, bid)
            assert client.read(bid, ledger, 2).body == written[2]

            # kill -9 with a request outstanding: the caller learns "unknown", not "missing".
            fut = client.submit(lambda p: p.read(bid, ledger, 3, timeout=30))
            wait_rule_hits(admin, rule, 2)  # it reached the bookie before the crash
            proc.kill9()
            with pytest.raises(ConnectionLostError) as ei2:
                fut.result(10)
            assert ei2.value.bookie == bid and ei2.value.entry_id == 3

            # Down: every request fails fast as unavailable (or times out), naming the bookie.
            with pytest.raises((BookieHandleNotAvailableError, BKTimeoutError)) as ei3:
                client.read(bid, ledger, 0)
            assert ei3.value.bookie == bid

            # Restart on the same port and data: the client reconnects by itself.
            proc = BookieProcess(
                zk_chroot,
                tmp_path / "data",
                proc.port,
                extra=["--bookie-id", bid],
                fault_injection=True,
            ).start()
            deadline = time.monotonic() + 20
            while True:
                try:
                    res = client.read(bid, ledger, 4)
                    break
                except BookieHandleNotAvailableError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            # Acknowledged before the crash, so durable across kill -9.
            assert res.body == written[4]
            assert packer(ledger).verify_entry(res.body, 4).entry_id == 4
            assert client.read(bid, ledger, 3).body == written[3]
    finally:
        proc.stop()


def test_sync_client_threads_and_readonly_registration(
    zk_chroot: str, zk: KazooClient, tmp_path: Path
) -> None:
    writable, wid = start_bookie(zk_chroot, zk, tmp_path / "w")
    readonly, rid = start_bookie(zk_chroot, zk, tmp_path / "r", "--readonly")
    ledger = 301
    written = bodies(ledger, list(range(40)))
    try:
        with SyncBookieClient(zk_chroot, ledgers_root=ROOT, config=CONFIG) as client:

            def add(item: tuple[int, bytes]) -> None:
                client.add(wid, ledger, item[0], KEY, item[1])

            def read(e: int) -> Any:
                return client.read(wid, ledger, e).body

            with ThreadPoolExecutor(8) as ex:
                list(ex.map(add, written.items()))
                got = list(ex.map(read, range(40)))
            assert got == [written[e] for e in range(40)]
            # The read-only bookie is found under available/readonly and refuses writes.
            with pytest.raises(WriteOnReadOnlyBookieError) as ei:
                client.add(rid, ledger, 0, KEY, written[0])
            assert ei.value.bookie == rid
            with pytest.raises(NoSuchLedgerError):
                client.read(rid, ledger, 0)
            assert client.bookie_info(rid).free_disk_space
    finally:
        writable.stop()
        readonly.stop()
