"""The copy path of re-replication reading from Apache BookKeeper 4.17's bookies.

The Java client writes ledgers to Java bookies on DbLedgerStorage (Pulsar's default);
``copy_fragment`` copies position 0's stripe, as if that bookie were lost, to a Java bookie on
SortedLedgerStorage or to a Python bookie. E == WQ goes through v2 BATCH_READ (Java's
``BatchedReadEntryProcessor``), E > WQ through runs of WQ - 1 entries and single reads; v3 is
the old path. Every copy is compared byte for byte with the source bookies' bodies, its digest
verified, and the Java client reads the ledger back from an ensemble naming the replacement.
"""

from __future__ import annotations

import asyncio

import pytest

from bklib.client.pool import WireProtocol
from bklib.client.replicator import copy_fragment
from bklib.digest import digest_manager, master_key
from bklib.meta.model import DigestType
from bklib.quorum import iter_stripe, write_set
from tests.interop.conftest import InteropCluster
from tests.interop.harness import JavaClient, payloads

pytestmark = pytest.mark.interop

PWD = b"interop-copy-pwd"


@pytest.mark.parametrize(
    ("e", "wq", "target", "protocol"),
    [
        (3, 3, "java", "v2"),
        (3, 3, "python", "v2"),
        (3, 2, "java", "v2"),
        (2, 2, "python", "v2"),
        (3, 3, "java", "v3"),
    ],
)
def test_copy_from_java_bookies_byte_identical(
    mixed: InteropCluster,
    java_client: JavaClient,
    e: int,
    wq: int,
    target: str,
    protocol: WireProtocol,
) -> None:
    ensemble = mixed.java_ids[:e]  # DbLedgerStorage
    new = mixed.java_ids[3] if target == "java" else mixed.python_ids[0]
    data = payloads(f"copy-{e}{wq}{target}{protocol}", 400, size=900)
    lid = java_client.write(
        mixed.uri,
        data,
        ensemble=e,
        write_quorum=wq,
        ack_quorum=2,
        password=PWD,
        bookies=ensemble,
        pipelined=True,
    )
    dm = digest_manager(lid, DigestType.CRC32C, PWD)
    stripe = list(iter_stripe(0, 0, len(data) - 1, e, wq))

    async def scenario() -> None:
        async with mixed.client() as ctx:
            res = await copy_fragment(
                ctx.pool,
                ledger_id=lid,
                ensemble=ensemble,
                ensemble_size=e,
                write_quorum=wq,
                first_entry_id=0,
                last_entry_id=len(data) - 1,
                targets={0: new},
                dead={ensemble[0]},
                digest=dm,
                master_key=master_key(PWD),
                protocol=protocol,
            )
            assert res.no_replica == [] and res.entries == len(stripe), res
            if protocol == "v3" or (e > wq and wq == 2):
                assert res.batch_reads == 0 and res.single_reads == len(stripe), res
            else:
                assert res.batch_reads > 0 and res.single_reads == 0, res
            for x in stripe:
                copied = (await ctx.pool.read(new, lid, x)).body
                source = next(ensemble[i] for i in write_set(x, e, wq) if i != 0)
                assert copied == (await ctx.pool.read(source, lid, x)).body, x
                assert dm.verify_entry(copied, x).payload == data[x], x

    asyncio.run(scenario())

    # The Java client reads the copies: the ensemble now names the replacement.
    def swap(md):  # type: ignore[no-untyped-def]
        return md.with_bookies_replaced(0, {ensemble[0]: new})

    mixed.store.update_ledger(lid, swap)
    got, _ = java_client.read(mixed.uri, lid, password=PWD)
    assert got == data
