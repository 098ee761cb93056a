"""Interop TLS cell: Java BookKeeper 4.17 bookies with TLS on, next to one Python TLS bookie.

The Java bookies require TLS the way a secured cluster does: ``tlsClientAuthentication`` plus
BookKeeper's ``BookieAuthZFactory``, which refuses (EUA) every client without a certificate
whose OU carries an authorized role; so a request that succeeds went through START_TLS.

* bklib's writer writes to the Java TLS bookies; the Java client (TLS) reads every entry.
* The Java client writes to a ledger on our TLS bookie and Java ones; bklib reads it back.
* bkaudit's engine audits (a stopped Java bookie is BOOKIE_LOST, nothing else is found) and
  its repairer re-replicates through TLS; the Java client then reads every entry.

Certificates are made here with ``cryptography``; the JVMs use ``tlsProvider=JDK``
(netty-tcnative is not installed).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from bklib.audit.checker import CheckSettings
from bklib.audit.engine import check_ledgers
from bklib.audit.model import LedgerView
from bklib.client.operations import ClientConfig
from bklib.client.pool import BookieClientPool, SyncBookieClient
from bklib.client.reader import ClientContext, LedgerReader
from bklib.client.writer import LedgerWriter
from bklib.errors import UnauthorizedAccessError
from bklib.meta.model import DigestType, LedgerState
from bklib.repair.worker import LedgerRepairer, LedgerRequest, RepairSettings
from bklib.states import Check, Reason
from bklib.testing.sandbox import (
    BookieProcess,
    bookie_tls_flags,
    issue_cert,
    make_ca,
)
from bklib.testing.zkserver import ZooKeeperServer
from bklib.tls import PROVIDER_FACTORY_CLASS, TlsSettings
from tests.interop.conftest import ROOT, InteropCluster, Only, _wait_znode, build_cluster
from tests.interop.harness import JavaClient, b64, payloads, unb64

pytestmark = pytest.mark.interop

PWD = b"tls-pwd"
ROLE = "bkaudit"
CONFIG = ClientConfig(add_timeout=10.0, read_timeout=10.0, connect_timeout=5.0)


@dataclass
class TlsInterop:
    c: InteropCluster
    client_tls: TlsSettings  # bklib's client: CA, and a certificate with an authorized role
    java_conf: dict[str, str]  # the Java client's TLS keys
    py: BookieProcess  # our TLS bookie (client certificates required)


@pytest.fixture(scope="module")
def tls(
    bk_classpath: str, zk_server: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TlsInterop]:
    base = tmp_path_factory.mktemp("tls-interop")
    pki = base / "pki"
    ca = make_ca(pki)
    bookie = issue_cert(pki, "bookie", ca)
    client = issue_cert(pki, "bkaudit client", ca, ou=f"0:{ROLE}")
    bookie_conf: dict[str, object] = {
        "tlsProviderFactoryClass": PROVIDER_FACTORY_CLASS,
        "tlsProvider": "JDK",
        "tlsKeyStoreType": "PEM",
        "tlsKeyStore": bookie.key,
        "tlsCertificatePath": bookie.cert,
        "tlsTrustStoreType": "PEM",
        "tlsTrustStore": ca.cert,
        "tlsClientAuthentication": "true",
        "bookieAuthProviderFactoryClass": "org.apache.bookkeeper.tls.BookieAuthZFactory",
        "authorizedRoles": ROLE,
    }
    java_conf = {
        "tlsProviderFactoryClass": PROVIDER_FACTORY_CLASS,
        "tlsProvider": "JDK",
        "tlsClientAuthentication": "true",
        "tlsKeyStoreType": "PEM",
        "tlsKeyStore": str(client.key),
        "tlsCertificatePath": str(client.cert),
        "tlsTrustStoreType": "PEM",
        "tlsTrustStore": str(ca.cert),
    }
    client_tls = TlsSettings(
        trust_store=str(ca.cert),
        certificate_path=str(client.cert),
        key_store=str(client.key),
        client_authentication=True,
    )
    py_tls = TlsSettings(
        trust_store=str(ca.cert),
        certificate_path=str(bookie.cert),
        key_store=str(bookie.key),
        client_authentication=True,
    )
    with (
        zk_server.private_chroot("interop-tls") as connect,
        build_cluster(
            bk_classpath, connect, base, java=3, init="bklib", bookie_conf=bookie_conf
        ) as c,
    ):
        py = BookieProcess(
            connect, base / "py0", extra=["--ledgers-root", ROOT, *bookie_tls_flags(py_tls)]
        )
        c.python.append(py)  # stopped with the cluster
        py.spawn()
        _wait_znode(c.zk, f"{ROOT}/available/{py.bookie_id}", py.log_tail)
        yield TlsInterop(c, client_tls, java_conf, py)


def java_write(
    java: JavaClient, t: TlsInterop, data: Sequence[bytes], bookies: Sequence[str]
) -> int:
    reply = java.call(
        "write",
        uri=t.c.uri,
        conf=t.java_conf,
        ensemble=len(bookies),
        writeQuorum=2,
        ackQuorum=2,
        digest="CRC32C",
        password=b64(PWD),
        payloads=[b64(p) for p in data],
        close=True,
        bookies=list(bookies),
    )
    assert reply["lastEntryId"] == len(data) - 1, reply
    return int(reply["ledgerId"])


def java_read(java: JavaClient, t: TlsInterop, ledger_id: int) -> tuple[list[bytes], Any]:
    reply = java.call(
        "read",
        uri=t.c.uri,
        conf=t.java_conf,
        ledgerId=ledger_id,
        password=b64(PWD),
        digest="CRC32C",
        recovery=False,
    )
    return [unb64(e) for e in reply["entries"]], reply


def _ctx(t: TlsInterop, pool: BookieClientPool, only: Sequence[str] | None = None) -> ClientContext:
    from bklib.client.placement import PlacementPolicy

    return ClientContext(t.c.store, pool, Only(only) if only else PlacementPolicy())


async def bklib_write(t: TlsInterop, bookies: Sequence[str], data: Sequence[bytes]) -> int:
    async with BookieClientPool(t.c.zk, ledgers_root=ROOT, config=CONFIG, tls=t.client_tls) as pool:
        w = await LedgerWriter.create(
            _ctx(t, pool, bookies),
            ensemble_size=3,
            write_quorum=2,
            ack_quorum=2,
            digest_type=DigestType.CRC32C,
            password=PWD,
        )
        await asyncio.gather(*(w.add_async(p) for p in data))
        await w.close()
        return w.ledger_id


async def bklib_read(t: TlsInterop, ledger_id: int) -> list[bytes]:
    async with BookieClientPool(t.c.zk, ledgers_root=ROOT, config=CONFIG, tls=t.client_tls) as pool:
        r = await LedgerReader.open(_ctx(t, pool), ledger_id, password=PWD)
        return [e.payload for e in await r.read_entries(0, r.lac)]


def test_bklib_writes_java_tls_bookies_and_java_reads(
    tls: TlsInterop, java_client: JavaClient
) -> None:
    data = payloads("tls-py-to-java", 60, size=300)
    lid = asyncio.run(bklib_write(tls, tls.c.java_ids, data))
    entries, reply = java_read(java_client, tls, lid)
    assert entries == data
    assert reply["metadata"]["state"] == "CLOSED"
    # The Java bookies serve only authenticated TLS clients: without TLS, EUA.
    with (
        SyncBookieClient(tls.c.connect, ledgers_root=ROOT, config=CONFIG) as plain,
        pytest.raises(UnauthorizedAccessError, match="requires TLS"),
    ):
        plain.read(tls.c.java_ids[0], lid, 0)


def test_java_client_writes_our_tls_bookie(tls: TlsInterop, java_client: JavaClient) -> None:
    data = payloads("tls-java-to-py", 60, size=300)
    bookies = [tls.py.bookie_id, *tls.c.java_ids[:2]]
    lid = java_write(java_client, tls, data, bookies)
    assert asyncio.run(bklib_read(tls, lid)) == data
    with SyncBookieClient(
        tls.c.connect, ledgers_root=ROOT, config=CONFIG, tls=tls.client_tls
    ) as client:
        held = client.list_entries(tls.py.bookie_id, lid)
    assert held  # our bookie stored its share of the Java writer's entries


def test_audit_and_repair_java_tls_cluster(tls: TlsInterop, java_client: JavaClient) -> None:
    j0, j1, j2 = tls.c.java_ids
    data = payloads("tls-story", 40, size=400)
    lid = java_write(java_client, tls, data, [j0, j1, j2])
    healthy = java_write(java_client, tls, payloads("tls-healthy", 20), [j0, j1, tls.py.bookie_id])
    tls.c.java[2].stop()  # a clean stop unregisters at once
    deadline = time.monotonic() + 30
    while tls.c.zk.exists(f"{ROOT}/available/{j2}") and time.monotonic() < deadline:
        time.sleep(0.1)  # waiting for the registration to go
    lost = frozenset({j2})
    settings = CheckSettings(read_timeout=5.0, no_list=frozenset(tls.c.java_ids))

    def audit(client: SyncBookieClient) -> list[Any]:
        views = [
            LedgerView.from_metadata(tls.c.store.read_ledger(x).value, f"{ROOT}/{x}", 0)
            for x in (lid, healthy)
        ]
        return [
            f
            for _, _, fs in check_ledgers(
                views, lost, Check.REPLICAS, client=client, settings=settings
            )
            for f in fs
        ]

    with SyncBookieClient(
        tls.c.connect, ledgers_root=ROOT, config=CONFIG, tls=tls.client_tls
    ) as client:
        found = audit(client)
        assert {(f.ledger_id, f.bookie_id, f.reason) for f in found} == {
            (lid, j2, Reason.BOOKIE_LOST)
        }, found
        repairer = LedgerRepairer(tls.c.store, client, RepairSettings(grace_period=0, rate=None))
        actions = repairer.repair(LedgerRequest(lid, frozenset({j2})))
        # On failure: each action's error first, then our TLS bookie's own account.
        assert {a.status for a in actions} == {"DONE"}, (
            [(a.action, a.status, a.new_bookie, a.error) for a in actions],
            tls.py.log_tail(15),
        )
        assert audit(client) == []
    md = tls.c.store.read_ledger(lid).value
    assert md.state is LedgerState.CLOSED and j2 not in md.segments[0].ensemble, md
    entries, _ = java_read(java_client, tls, lid)
    assert entries == data
