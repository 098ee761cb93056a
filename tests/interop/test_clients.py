"""Interop cells 1, 2, 3, 7 and 8: bklib's client and bookie against Apache BookKeeper 4.17's.

Every cell checks the data itself: each entry's payload as written, in order, and the
lastEntryId/length the other side records.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Sequence

import pytest

from bklib import availability
from bklib.client.reader import LedgerReader
from bklib.client.recovery import recover_ledger
from bklib.client.writer import LedgerWriter
from bklib.digest import digest_manager, master_key
from bklib.errors import (
    BKTimeoutError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    WriteOnReadOnlyBookieError,
)
from bklib.meta.model import DigestType, LedgerState
from tests.interop import harness
from tests.interop.conftest import InteropCluster
from tests.interop.harness import JavaBookie, JavaClient, JavaClientError, payloads

pytestmark = pytest.mark.interop

PWD = b"interop-pwd"
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


async def python_write(
    c: InteropCluster,
    bookies: Sequence[str],
    data: Sequence[bytes],
    *,
    e: int,
    wq: int,
    aq: int,
    digest: DigestType = DigestType.CRC32C,
    close: bool = True,
) -> LedgerWriter:
    async with c.client(only=bookies) as ctx:
        w = await LedgerWriter.create(
            ctx, ensemble_size=e, write_quorum=wq, ack_quorum=aq, digest_type=digest, password=PWD
        )
        ids = await asyncio.gather(*(w.add_async(p) for p in data))
        assert ids == list(range(len(data)))
        if close:
            await w.close()
        else:
            await w.abort()
        return w


async def python_read(c: InteropCluster, ledger_id: int, password: bytes = PWD) -> list[bytes]:
    async with c.client() as ctx:
        r = await LedgerReader.open(ctx, ledger_id, password=password)
        return [e.payload for e in await r.read_entries(0, r.lac)] if r.lac >= 0 else []


def assert_closed_at(md: dict, data: Sequence[bytes]) -> None:
    assert md["state"] == "CLOSED", md
    assert md["lastEntryId"] == len(data) - 1, md
    assert md["length"] == sum(len(p) for p in data), md


# ---- cell 1: Python client writes to Java bookies; Java client reads --------------------------


@pytest.mark.parametrize(
    ("e", "wq", "aq", "which"),
    [(3, 2, 2, "db"), (4, 3, 2, "db+sorted")],
    ids=["E3W2A2-dbstorage", "E4W3A2-with-sortedstorage"],
)
def test_python_writes_java_bookies_java_reads(
    mixed: InteropCluster, java_client: JavaClient, e: int, wq: int, aq: int, which: str
) -> None:
    bookies = mixed.java_ids[:3] if which == "db" else mixed.java_ids
    data = payloads(f"py-to-java-{which}", 300, size=700)
    with explain(mixed, java_client):
        w = asyncio.run(python_write(mixed, bookies, data, e=e, wq=wq, aq=aq))
        assert set(w.metadata.last_segment.ensemble) == set(bookies)
        for recovery in (False, True):
            entries, reply = java_client.read(
                mixed.uri, w.ledger_id, password=PWD, recovery=recovery
            )
            assert entries == data
            assert_closed_at(reply["metadata"], data)


def test_python_open_ledger_recovered_by_java(
    mixed: InteropCluster, java_client: JavaClient
) -> None:
    """A Python writer that never closed: Java's openLedger (recovery) fences and closes it at
    the last acknowledged entry, and the Python writer is then fenced."""
    data = payloads("py-open", 40)

    async def scenario() -> None:
        async with mixed.client(only=mixed.java_ids[:3]) as ctx:
            w = await LedgerWriter.create(
                ctx, ensemble_size=3, write_quorum=2, ack_quorum=2, password=PWD
            )
            for p in data:
                await w.add(p)
            entries, reply = await asyncio.to_thread(
                java_client.read, mixed.uri, w.ledger_id, password=PWD, recovery=True
            )
            assert entries == data
            assert_closed_at(reply["metadata"], data)
            with pytest.raises(LedgerFencedError):
                await w.add(b"after the fence")
            await w.abort()

    with explain(mixed, java_client):
        asyncio.run(scenario())


# ---- cell 2: Java client writes to Java bookies; Python reads and recovers --------------------


def test_java_writes_python_reads(mixed: InteropCluster, java_client: JavaClient) -> None:
    data = payloads("java-to-py", 250, size=900)
    with explain(mixed, java_client):
        lid = java_client.write(mixed.uri, data, password=PWD, bookies=mixed.java_ids[:3])
        assert asyncio.run(python_read(mixed, lid)) == data
        md = mixed.store.read_ledger(lid).value
        assert md.state is LedgerState.CLOSED
        assert (md.last_entry_id, md.length) == (len(data) - 1, sum(map(len, data)))


def test_python_recovers_java_open_ledger(mixed: InteropCluster, java_client: JavaClient) -> None:
    """A Java writer leaves its ledger open: bklib recovery fences it and closes it at the
    last entry the Java writer had acknowledged; the Java writer's next add is refused."""
    data = payloads("java-open", 60)
    with explain(mixed, java_client):
        lid = java_client.write(
            mixed.uri, data, password=PWD, close=False, bookies=mixed.java_ids[:3]
        )
        assert mixed.store.read_ledger(lid).value.state is LedgerState.OPEN

        async def recover() -> None:
            async with mixed.client() as ctx:
                md = await recover_ledger(ctx, lid)
                assert md.state is LedgerState.CLOSED
                assert (md.last_entry_id, md.length) == (len(data) - 1, sum(map(len, data)))

        asyncio.run(recover())
        assert asyncio.run(python_read(mixed, lid)) == data
        with pytest.raises(JavaClientError) as err:
            java_client.add(lid, [b"after recovery"])
        # Our recovery fenced the Java bookies: the Java writer's add is refused as fenced.
        assert err.value.code == JAVA_FENCED, err.value
        entries, reply = java_client.read(mixed.uri, lid, password=PWD)
        assert entries == data
        assert_closed_at(reply["metadata"], data)


# ---- cell 3: Java client on Python bookies ----------------------------------------------------


@pytest.mark.parametrize("v2", [False, True], ids=["v3-protocol", "v2-protocol"])
def test_java_writes_python_bookies(
    mixed: InteropCluster, java_client: JavaClient, v2: bool
) -> None:
    """Also over the v2 binary protocol, which Pulsar brokers use by default."""
    data = payloads(f"java-on-py-v2={v2}", 250, size=600)
    with explain(mixed, java_client):
        lid = java_client.write(mixed.uri, data, password=PWD, bookies=mixed.python_ids, v2=v2)
        entries, reply = java_client.read(mixed.uri, lid, password=PWD, v2=v2)
        assert entries == data
        assert_closed_at(reply["metadata"], data)
        assert set(reply["metadata"]["ensembles"]["0"]) == set(mixed.python_ids)
        assert asyncio.run(python_read(mixed, lid)) == data


@pytest.mark.parametrize("writer", ["java", "java-v2", "python"])
def test_java_recovery_on_python_bookies(
    mixed: InteropCluster, java_client: JavaClient, writer: str
) -> None:
    """An open ledger on Python bookies (left by a Java or a Python writer) recovered by Java's
    openLedger: fenced on our bookies and closed at the last acknowledged entry."""
    data = payloads(f"{writer}-open-on-py", 45)
    with explain(mixed, java_client):
        v2 = writer == "java-v2"
        if writer.startswith("java"):
            lid = java_client.write(
                mixed.uri, data, password=PWD, close=False, bookies=mixed.python_ids, v2=v2
            )
        else:
            w = asyncio.run(
                python_write(mixed, mixed.python_ids, data, e=3, wq=2, aq=2, close=False)
            )
            lid = w.ledger_id
        assert mixed.store.read_ledger(lid).value.state is LedgerState.OPEN
        entries, reply = java_client.read(mixed.uri, lid, password=PWD, recovery=True, v2=v2)
        assert entries == data
        assert_closed_at(reply["metadata"], data)
        md = mixed.store.read_ledger(lid).value
        assert (md.state, md.last_entry_id) == (LedgerState.CLOSED, len(data) - 1)
        assert asyncio.run(python_read(mixed, lid)) == data
        if writer.startswith("java"):
            # Java's recovery fenced our bookies; they refuse the Java writer with EFENCED.
            with pytest.raises(JavaClientError) as err:
                java_client.add(lid, [b"after recovery"])
            assert err.value.code == JAVA_FENCED, err.value
        # Our bookies recorded the fence durably: a plain add with the key is refused.
        body = digest_manager(lid, DigestType.CRC32C, PWD).package_entry(len(data), -1, 1, b"x")
        bookie = mixed.python_ids[0]

        async def late_add() -> None:
            async with mixed.client() as ctx:
                await ctx.pool.add(bookie, lid, len(data), master_key(PWD), body)

        with pytest.raises(LedgerFencedError):
            asyncio.run(late_add())


# ---- cell 7: digest types both ways -----------------------------------------------------------

DIGESTS = {
    DigestType.CRC32: "CRC32",
    DigestType.CRC32C: "CRC32C",
    DigestType.HMAC: "MAC",
    DigestType.DUMMY: "DUMMY",
}


@pytest.mark.parametrize("digest", list(DIGESTS), ids=[d.name for d in DIGESTS])
def test_digest_types_cross_both_ways(
    mixed: InteropCluster, java_client: JavaClient, digest: DigestType
) -> None:
    java_name = DIGESTS[digest]
    data = payloads(f"digest-{digest.name}", 50, size=300)
    # Both kinds of bookie in every ensemble: the digest is end to end, bookies never check it.
    bookies = [mixed.java_ids[0], mixed.python_ids[0], mixed.java_ids[3]]
    with explain(mixed, java_client):
        w = asyncio.run(python_write(mixed, bookies, data, e=3, wq=2, aq=2, digest=digest))
        entries, reply = java_client.read(mixed.uri, w.ledger_id, password=PWD, digest=java_name)
        assert entries == data
        assert reply["metadata"]["digestType"] == java_name
        lid = java_client.write(mixed.uri, data, password=PWD, digest=java_name, bookies=bookies)
        md = mixed.store.read_ledger(lid).value
        assert md.digest_type is digest
        assert asyncio.run(python_read(mixed, lid)) == data


# ---- cell 8: a Java bookie's EFENCED and EREADONLY ---------------------------------------------


def test_java_bookie_fenced_maps_to_ledger_fenced(
    mixed: InteropCluster, java_client: JavaClient
) -> None:
    data = payloads("fence", 10)
    bookies = mixed.java_ids[:3]

    async def scenario() -> None:
        async with mixed.client(only=bookies) as ctx:
            w = await LedgerWriter.create(
                ctx, ensemble_size=3, write_quorum=3, ack_quorum=2, password=PWD
            )
            for p in data:
                await w.add(p)
            # Java recovery fences the ledger on the Java bookies.
            await asyncio.to_thread(
                java_client.read, mixed.uri, w.ledger_id, password=PWD, recovery=True
            )
            body = w.digest.package_entry(len(data), len(data) - 1, 1, b"late")
            for b in bookies:
                with pytest.raises(LedgerFencedError) as err:
                    await ctx.pool.add(b, w.ledger_id, len(data), master_key(PWD), body)
                assert err.value.bookie == b and err.value.ledger_id == w.ledger_id
            with pytest.raises(LedgerFencedError):
                await w.add(b"late")
            await w.abort()

    with explain(mixed, java_client):
        asyncio.run(scenario())


def test_java_bookie_readonly_maps_to_write_on_readonly(
    mixed: InteropCluster, java_client: JavaClient, bk_classpath: str
) -> None:
    ro = JavaBookie(
        bk_classpath,
        mixed.uri,
        mixed.base / "java-readonly",
        extra={"readOnlyModeEnabled": "true", "forceReadOnlyBookie": "true"},
    )
    try:
        harness.start_bookies([ro], mixed.zk)
        assert mixed.zk.exists(f"/ledgers/available/readonly/{ro.bookie_id}"), ro.log_tail()
        dm = digest_manager(424242, DigestType.CRC32C, PWD)

        async def scenario() -> None:
            async with mixed.client() as ctx:
                with pytest.raises(WriteOnReadOnlyBookieError) as err:
                    await ctx.pool.add(
                        ro.bookie_id, 424242, 0, master_key(PWD), dm.package_entry(0, -1, 1, b"x")
                    )
                assert err.value.bookie == ro.bookie_id
                # Writers never pick it: it is not among the writable bookies.
                assert ro.bookie_id not in await ctx.writable_bookies()

        with explain(mixed, java_client):
            asyncio.run(scenario())
    finally:
        ro.stop()


def test_java_bookie_list_entries_and_negative_reads(
    mixed: InteropCluster, java_client: JavaClient
) -> None:
    """What the audit relies on: SortedLedgerStorage answers list-entries in the format bklib
    decodes (every entry of the ledger); DbLedgerStorage never answers it for a ledger it holds
    (the request times out, hence the audit's probe fallback); both answer reads of absent
    data with the negative codes NoSuchLedger / NoSuchEntry."""
    data = payloads("list", 30)
    db, srt = mixed.java_ids[0], mixed.java_ids[3]
    lid = java_client.write(
        mixed.uri, data, ensemble=2, write_quorum=2, ack_quorum=2, bookies=[db, srt]
    )

    async def scenario() -> None:
        async with mixed.client() as ctx:
            runs = availability.decode(await ctx.pool.list_entries(srt, lid))
            assert list(runs.runs()) == [(0, len(data) - 1)]
            with pytest.raises(BKTimeoutError):
                await ctx.pool.list_entries(db, lid, timeout=1.5)
            for b in (db, srt):
                # The connection still serves after the unanswered request.
                with pytest.raises(NoSuchLedgerError):
                    await ctx.pool.list_entries(b, lid + 10_000)
                with pytest.raises(NoSuchLedgerError):
                    await ctx.pool.read(b, lid + 10_000, 0)
                with pytest.raises(NoSuchEntryError):
                    await ctx.pool.read(b, lid, len(data) + 5)

    with explain(mixed, java_client):
        asyncio.run(scenario())
