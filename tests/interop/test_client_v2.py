"""bklib's v2 client against Apache BookKeeper 4.17's bookies, and Java's v2 client batch-reading
from bklib's bookie.

* entries the Java client wrote, read back by our v2 READ and BATCH_READ from Java bookies on
  DbLedgerStorage (Pulsar's default) and SortedLedgerStorage, byte-identical to our v3 reads,
  with Java's maxCount / maxSize semantics;
* a ledger our writer adds over v2 to Java bookies, read back by the Java client (v2 and v3);
* a v2 fencing read on Java bookies fences the Java writer;
* Java's v2 client (``LedgerHandle.batchReadEntries``) reading our bookie with BATCH_READ.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Iterator

import pytest

from bklib.client.operations import ClientConfig
from bklib.client.pool import BookieClientPool
from bklib.client.reader import ClientContext
from bklib.client.writer import LedgerWriter
from bklib.digest import digest_manager, master_key
from bklib.errors import LedgerFencedError, NoSuchEntryError
from bklib.meta.model import DigestType
from tests.interop.conftest import ROOT, InteropCluster, Only
from tests.interop.harness import JavaClient, JavaClientError, b64, payloads, unb64

pytestmark = pytest.mark.interop

PWD = b"interop-v2-pwd"
KEY = master_key(PWD)
JAVA_FENCED = -101  # BKException.Code.LedgerFencedException


@contextlib.contextmanager
def explain(cluster: InteropCluster, java: JavaClient) -> Iterator[None]:
    """Attach the Java logs to any failure in the block."""
    try:
        yield
    except (AssertionError, JavaClientError) as e:
        raise AssertionError(
            f"{e}\n--- Java client ---\n{java.log_tail(40)}\n{cluster.logs(20)}"
        ) from e


@contextlib.asynccontextmanager
async def v2_client(
    cluster: InteropCluster, only: Iterable[str] | None = None
) -> AsyncIterator[ClientContext]:
    """Like ``cluster.client`` but reads and adds go over v2 (what Pulsar's brokers speak)."""
    config = ClientConfig(add_timeout=10.0, read_timeout=10.0, connect_timeout=5.0)
    pool = BookieClientPool(cluster.zk, ledgers_root=ROOT, config=config, protocol="v2")
    placement = Only(only) if only is not None else Only(cluster.java_ids + cluster.python_ids)
    try:
        yield ClientContext(cluster.store, pool, placement)
    finally:
        await pool.close()


def reply_size(entries: list[bytes]) -> int:
    """A BATCH_READ reply's bytes on the wire (ResponseEnDeCoderPreV3), what maxSize bounds."""
    return 36 + sum(4 + len(b) for b in entries)


@pytest.mark.parametrize("storage", ["db", "sorted"])
def test_v2_reads_and_batch_reads_of_java_written_entries(
    mixed: InteropCluster, java_client: JavaClient, storage: str
) -> None:
    # E == WQ: every bookie of the ensemble stores every entry, so one bookie serves batches.
    bookie = mixed.java_ids[0] if storage == "db" else mixed.java_ids[3]
    other = mixed.java_ids[1]
    data = payloads(f"v2-batch-{storage}", 300, size=700)

    async def scenario(lid: int) -> None:
        dm = digest_manager(lid, DigestType.CRC32C, PWD)
        async with v2_client(mixed) as ctx:
            pool = ctx.pool
            everything = await pool.batch_read(bookie, lid, 0, 0, 0)
            assert len(everything) == len(data)
            for e, body in enumerate(everything):
                assert bytes(dm.verify_entry(body, e).payload) == data[e]
            # The same bytes as single v2 reads and as v3 reads of the same bookie.
            v2_single = await asyncio.gather(*(pool.read(bookie, lid, e) for e in range(300)))
            assert [r.body for r in v2_single] == everything
            v3_single = await asyncio.gather(
                *(pool.connection(bookie).read(lid, e) for e in range(0, 300, 7))
            )
            assert [r.body for r in v3_single] == everything[::7]
            assert await pool.batch_read(other, lid, 0, 0, 0) == everything
            # Java's limits: maxCount; maxSize bounds the reply frame, the first entry always.
            assert await pool.batch_read(bookie, lid, 10, 25, 0) == everything[10:35]
            size = reply_size(everything[50:62])
            assert await pool.batch_read(bookie, lid, 50, 100, size) == everything[50:62]
            assert await pool.batch_read(bookie, lid, 50, 100, size - 1) == everything[50:61]
            assert await pool.batch_read(bookie, lid, 50, 100, 1) == everything[50:51]
            assert await pool.batch_read(bookie, lid, 290, 100, 0) == everything[290:]
            with pytest.raises(NoSuchEntryError) as ei:
                await pool.batch_read(bookie, lid, 300, 10, 0)
            assert (ei.value.bookie, ei.value.ledger_id, ei.value.entry_id) == (bookie, lid, 300)
            with pytest.raises(NoSuchEntryError):
                await pool.read(bookie, lid, 300)
            assert pool.connection_v2(bookie).connected

    with explain(mixed, java_client):
        lid = java_client.write(
            mixed.uri,
            data,
            ensemble=2,
            write_quorum=2,
            ack_quorum=2,
            password=PWD,
            bookies=[bookie, other],
            pipelined=True,
        )
        asyncio.run(scenario(lid))


def test_python_v2_writer_read_by_java(mixed: InteropCluster, java_client: JavaClient) -> None:
    bookies = mixed.java_ids[:3]
    data = payloads("py-v2-writer", 200, size=300)

    async def write() -> int:
        async with v2_client(mixed, only=bookies) as ctx:
            w = await LedgerWriter.create(
                ctx, ensemble_size=3, write_quorum=3, ack_quorum=3, password=PWD
            )
            ids = await asyncio.gather(*(w.add_async(p) for p in data))
            assert ids == list(range(len(data)))
            await w.close()
            pool = ctx.pool
            assert isinstance(pool, BookieClientPool)
            # Every add went over v2: no v3 connection was ever made to these bookies.
            assert not set(bookies) & set(pool._connections)
            assert set(bookies) <= set(pool._v2_connections)
            # And each Java bookie hands the whole ledger back in one batch.
            dm = digest_manager(w.ledger_id, DigestType.CRC32C, PWD)
            for b in bookies:
                got = await pool.batch_read(b, w.ledger_id, 0, 0, 0)
                assert [bytes(dm.verify_entry(x, e).payload) for e, x in enumerate(got)] == data
            return w.ledger_id

    with explain(mixed, java_client):
        lid = asyncio.run(write())
        for v2 in (False, True):
            entries, reply = java_client.read(mixed.uri, lid, password=PWD, v2=v2)
            assert entries == data
            assert reply["metadata"]["state"] == "CLOSED"
            assert reply["metadata"]["lastEntryId"] == len(data) - 1


def test_v2_fencing_read_fences_the_java_writer(
    mixed: InteropCluster, java_client: JavaClient
) -> None:
    bookies = mixed.java_ids[:2]
    data = payloads("v2-fence", 10)

    async def fence(lid: int) -> None:
        async with v2_client(mixed) as ctx:
            for b in bookies:
                res = await ctx.pool.read(b, lid, -1, fence=True, master_key=KEY)
                dm = digest_manager(lid, DigestType.CRC32C, PWD)
                assert dm.verify_entry(res.body, None).entry_id == len(data) - 1
            late = dm.package_entry(len(data), len(data) - 1, 1, b"late")
            with pytest.raises(LedgerFencedError) as err:
                await ctx.pool.add(bookies[0], lid, len(data), KEY, late)
            assert err.value.bookie == bookies[0]

    with explain(mixed, java_client):
        lid = java_client.write(
            mixed.uri,
            data,
            ensemble=2,
            write_quorum=2,
            ack_quorum=2,
            password=PWD,
            bookies=bookies,
            close=False,
            v2=True,
        )
        asyncio.run(fence(lid))
        with pytest.raises(JavaClientError) as err:
            java_client.add(lid, [b"after-fence"])
        assert err.value.code == JAVA_FENCED


def test_java_v2_client_batch_reads_python_bookies(
    mixed: InteropCluster, java_client: JavaClient
) -> None:
    data = payloads("java-batch-on-py", 120, size=500)
    bookies = mixed.python_ids[:2]

    def batch(lid: int, start: int, max_count: int, max_size: int) -> tuple[list[int], list[bytes]]:
        reply = java_client.call(
            "batchRead",
            uri=mixed.uri,
            ledgerId=lid,
            password=b64(PWD),
            start=start,
            maxCount=max_count,
            maxSize=max_size,
            v2=True,
        )
        return [int(e) for e in reply["entryIds"]], [unb64(e) for e in reply["entries"]]

    async def stored(lid: int) -> list[bytes]:
        async with v2_client(mixed) as ctx:
            return await ctx.pool.batch_read(bookies[0], lid, 0, 0, 0)

    with explain(mixed, java_client):
        lid = java_client.write(
            mixed.uri,
            data,
            ensemble=2,
            write_quorum=2,
            ack_quorum=2,
            password=PWD,
            bookies=bookies,
            v2=True,
        )
        ids, entries = batch(lid, 0, 50, 0)
        assert ids == list(range(50)) and entries == data[:50]
        ids, entries = batch(lid, 100, 50, 0)
        assert ids == list(range(100, 120)) and entries == data[100:]
        # A maxSize smaller than maxCount entries: the bookie's size cut shows that BATCH_READ
        # was used (Java's fallback to single reads honours maxCount only).
        bodies = asyncio.run(stored(lid))
        size = reply_size(bodies[10:17])
        ids, entries = batch(lid, 10, 50, size)
        assert ids == list(range(10, 17)) and entries == data[10:17]
        ids, entries = batch(lid, 10, 50, size - 1)
        assert ids == list(range(10, 16))
