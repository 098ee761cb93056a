"""Bookie TLS between bklib's client and Python bookie processes, over real sockets.

START_TLS on v3 and v2 connections, mTLS, and what goes wrong: an expired or untrusted bookie
certificate, a client certificate the bookie refuses, a TLS client at a plaintext bookie and a
plaintext client at a TLS bookie each fail with an error naming the bookie. An audit that
cannot reach a bookie through TLS records BOOKIE_UNREACHABLE with the reason, never missing
entries. Certificates are made here with ``cryptography`` (bklib.testing.sandbox).
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from bklib.audit.engine import check_ledgers
from bklib.audit.model import LedgerView
from bklib.client.operations import ClientConfig
from bklib.client.pool import BookieClientPool, SyncBookieClient
from bklib.client.transport import TlsConnectionLostError
from bklib.digest import digest_manager, master_key
from bklib.errors import UnauthorizedAccessError
from bklib.meta.model import DigestType, LedgerMetadata, Segment
from bklib.meta.store import LedgerStore
from bklib.quorum import write_set
from bklib.states import Check, Reason
from bklib.testing.sandbox import (
    BookieProcess,
    SandboxPki,
    bookie_tls_flags,
    client_tls_flags,
    generate_pki,
    issue_cert,
    make_ca,
)
from bklib.testing.zkclient import connect
from bklib.tls import (
    TlsConfigError,
    TlsHandshakeError,
    TlsNotConfiguredError,
    TlsSettings,
)
from jobs.runtime.exit_status import ExitStatus
from jobs.tables import delta
from tests.bookie_helpers import wait_for_znode
from tests.cli_helpers import bkaudit, error_lines

pytestmark = pytest.mark.integration

ROOT = "/ledgers"
PASSWORD = b"tls-test"
CONFIG = ClientConfig(
    add_timeout=5.0,
    read_timeout=5.0,
    connect_timeout=5.0,
    reconnect_backoff_initial=0.01,
    reconnect_backoff_max=0.05,
)


@dataclass
class TlsCluster:
    zk: str
    pki: SandboxPki
    base: Path
    store: LedgerStore
    tls: BookieProcess  # TLS, no client authentication
    mtls: BookieProcess  # TLS, client certificate required
    plain: BookieProcess  # no TLS
    expired: BookieProcess  # TLS with an expired certificate
    untrusted: BookieProcess  # TLS with a certificate of another CA
    named: BookieProcess  # TLS with a certificate for bookie.example only

    def client(self, mtls: bool = False) -> TlsSettings:
        return self.pki.client_settings(client_authentication=mtls)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, zk_server: Any) -> Iterator[TlsCluster]:
    base = tmp_path_factory.mktemp("bookie-tls")
    pki = generate_pki(base / "pki")
    now = datetime.now(timezone.utc)
    expired = issue_cert(
        base / "pki",
        "expired bookie",
        pki.ca,
        not_before=now - timedelta(days=10),
        not_after=now - timedelta(days=1),
    )
    stranger = make_ca(base / "pki" / "other", "another CA")
    foreign = issue_cert(base / "pki" / "other", "foreign bookie", stranger)
    named = issue_cert(base / "pki", "named bookie", pki.ca, hosts=("bookie.example",))
    good = pki.bookie_settings()
    flags = {
        "tls": bookie_tls_flags(good),
        "mtls": bookie_tls_flags(pki.bookie_settings(client_authentication=True)),
        "plain": [],
        "expired": bookie_tls_flags(
            replace(good, certificate_path=str(expired.cert), key_store=str(expired.key))
        ),
        "untrusted": bookie_tls_flags(
            replace(good, certificate_path=str(foreign.cert), key_store=str(foreign.key))
        ),
        "named": bookie_tls_flags(
            replace(good, certificate_path=str(named.cert), key_store=str(named.key))
        ),
    }
    with zk_server.private_chroot("tls") as zk_connect:
        zk = connect(zk_connect)
        store = LedgerStore(zk, ROOT)
        store.init_cluster()
        procs = {
            name: BookieProcess(
                zk_connect, base / name, extra=["--ledgers-root", ROOT, *extra], zk_timeout=10
            )
            for name, extra in flags.items()
        }
        try:
            for p in procs.values():
                p.spawn()
            for p in procs.values():
                wait_for_znode(zk, f"{ROOT}/available/{p.bookie_id}")
            yield TlsCluster(zk_connect, pki, base, store, **procs)
        finally:
            for p in procs.values():
                p.stop()
            zk.stop()
            zk.close()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def entry(ledger_id: int, entry_id: int) -> bytes:
    dm = digest_manager(ledger_id, DigestType.CRC32C, PASSWORD)
    return dm.package_entry(entry_id, entry_id - 1, 10 * (entry_id + 1), b"e%d" % entry_id)


KEY = master_key(PASSWORD)


def _ssl_object(pool: BookieClientPool, bookie: str, v2: bool = False) -> Any:
    conn = pool.connection_v2(bookie) if v2 else pool.connection(bookie)
    ch = conn._channel
    assert ch is not None and not ch.closed
    return ch.writer.get_extra_info("ssl_object")


# ---- working TLS -------------------------------------------------------------------------------


def test_v3_and_v2_connections_upgrade_with_start_tls(cluster: TlsCluster) -> None:
    b = cluster.tls.bookie_id

    async def go() -> None:
        async with (
            BookieClientPool(
                cluster.zk, ledgers_root=ROOT, config=CONFIG, tls=cluster.client()
            ) as p3,
            BookieClientPool(
                cluster.zk, ledgers_root=ROOT, config=CONFIG, tls=cluster.client(), protocol="v2"
            ) as p2,
        ):
            for x in range(3):
                await p3.add(b, 7001, x, KEY, entry(7001, x))
            for x in range(3, 6):
                await p2.add(b, 7001, x, KEY, entry(7001, x))  # v2 ADD over TLS
            assert (await p3.read(b, 7001, 4)).body == entry(7001, 4)
            assert (await p2.read(b, 7001, 1)).body == entry(7001, 1)
            batch = await p2.batch_read(b, 7001, 0, 10, 1 << 20)
            assert batch == [entry(7001, x) for x in range(6)]
            assert (await p3.bookie_info(b)).total_disk_capacity
            # Both connections really are TLS sessions verified against our CA.
            for obj in (_ssl_object(p3, b), _ssl_object(p2, b, v2=True)):
                assert isinstance(obj, ssl.SSLObject)
                assert obj.getpeercert()["subject"] == ((("commonName", "bookie"),),)

    run(go())


def test_requests_sent_the_moment_the_handshake_ends_are_served(cluster: TlsCluster) -> None:
    # A client whose side of the handshake is done sends its queued requests at once; they
    # can reach the bookie before its own start_tls() returns. They are TLS data, not
    # plaintext after START_TLS, and are answered (a copy burst once lost its connection).
    b = cluster.tls.bookie_id

    async def burst(ledger_id: int, protocol: str) -> None:
        async with BookieClientPool(
            cluster.zk, ledgers_root=ROOT, config=CONFIG, tls=cluster.client(), protocol=protocol
        ) as pool:
            adds = [pool.add(b, ledger_id, x, KEY, entry(ledger_id, x)) for x in range(20)]
            await asyncio.gather(*adds)

    for i in range(30):
        run(burst(7100 + i, "v2" if i % 2 else "v3"))


def test_mtls_with_a_client_certificate(cluster: TlsCluster) -> None:
    b = cluster.mtls.bookie_id
    with SyncBookieClient(
        cluster.zk, ledgers_root=ROOT, config=CONFIG, tls=cluster.client(mtls=True)
    ) as client:
        client.add(b, 7002, 0, KEY, entry(7002, 0))
        assert client.read(b, 7002, 0).body == entry(7002, 0)
    with SyncBookieClient(
        cluster.zk,
        ledgers_root=ROOT,
        config=CONFIG,
        tls=cluster.client(mtls=True),
        protocol="v2",
    ) as client:
        assert client.read(b, 7002, 0).body == entry(7002, 0)


# ---- what goes wrong ---------------------------------------------------------------------------


def _fails(
    cluster: TlsCluster, bookie: str, tls: TlsSettings | None, protocol: str = "v3"
) -> BaseException:
    """The error of one read of ledger 1 on ``bookie``; it must name the bookie."""
    with (
        SyncBookieClient(
            cluster.zk,
            ledgers_root=ROOT,
            config=CONFIG,
            tls=tls,
            protocol=protocol,  # type: ignore[arg-type]
        ) as client,
        pytest.raises(Exception) as info,
    ):
        client.read(bookie, 1, 0)
    assert bookie in str(info.value), info.value
    return info.value


@pytest.mark.parametrize("protocol", ["v3", "v2"])
def test_expired_bookie_certificate(cluster: TlsCluster, protocol: str) -> None:
    exc = _fails(cluster, cluster.expired.bookie_id, cluster.client(), protocol)
    assert isinstance(exc, TlsHandshakeError)
    assert "not valid now" in str(exc) and "expired" in str(exc)
    assert exc.code == -24  # BookKeeper's SecurityException


def test_untrusted_bookie_certificate(cluster: TlsCluster) -> None:
    exc = _fails(cluster, cluster.untrusted.bookie_id, cluster.client())
    assert isinstance(exc, TlsHandshakeError)
    assert "not trusted by tlsTrustStore" in str(exc)


def test_bookie_refuses_a_client_without_certificate(cluster: TlsCluster) -> None:
    exc = _fails(cluster, cluster.mtls.bookie_id, cluster.client(mtls=False))
    # TLS 1.3 checks the client certificate after the client's side of the handshake is done:
    # the bookie's alert fails the first request instead of the handshake.
    assert isinstance(exc, (TlsHandshakeError, TlsConnectionLostError)), exc
    assert "client certificate" in str(exc)


def test_bookie_refuses_a_client_certificate_of_another_ca(cluster: TlsCluster) -> None:
    other = cluster.base / "pki" / "other"
    foreign_ca = make_ca(other / "clients", "client CA")
    cert = issue_cert(other / "clients", "foreign client", foreign_ca)
    tls = replace(
        cluster.client(mtls=True), certificate_path=str(cert.cert), key_store=str(cert.key)
    )
    exc = _fails(cluster, cluster.mtls.bookie_id, tls)
    assert isinstance(exc, (TlsHandshakeError, TlsConnectionLostError)), exc
    assert "refused our client certificate" in str(exc)


def test_hostname_verification_is_off_unless_enabled(cluster: TlsCluster) -> None:
    b = cluster.named.bookie_id  # dialled as 127.0.0.1; its certificate names bookie.example
    with SyncBookieClient(cluster.zk, ledgers_root=ROOT, config=CONFIG, tls=cluster.client()) as c:
        c.add(b, 7003, 0, KEY, entry(7003, 0))  # trusted CA, name not checked: as BookKeeper
    exc = _fails(cluster, b, replace(cluster.client(), hostname_verification=True))
    assert isinstance(exc, TlsHandshakeError)
    assert "does not name the host dialled" in str(exc), exc


@pytest.mark.parametrize("protocol", ["v3", "v2"])
def test_tls_client_at_a_plaintext_bookie(cluster: TlsCluster, protocol: str) -> None:
    exc = _fails(cluster, cluster.plain.bookie_id, cluster.client(), protocol)
    assert isinstance(exc, TlsNotConfiguredError)
    assert "has no TLS configured" in str(exc) and "EBADREQ" in str(exc)


@pytest.mark.parametrize("protocol", ["v3", "v2"])
def test_plaintext_client_at_a_tls_bookie(cluster: TlsCluster, protocol: str) -> None:
    exc = _fails(cluster, cluster.tls.bookie_id, None, protocol)
    assert isinstance(exc, UnauthorizedAccessError)
    assert "requires TLS" in str(exc)


def test_bad_tls_settings_are_one_error_naming_the_file(cluster: TlsCluster) -> None:
    missing = str(cluster.base / "nope.pem")
    bad = [
        (TlsSettings(), "needs tlsTrustStore"),
        (TlsSettings(trust_store=missing), f"tlsTrustStore {missing}: not a readable file"),
        (
            TlsSettings(trust_store=str(cluster.pki.ca.cert), client_authentication=True),
            "needs tlsCertificatePath",
        ),
        (
            TlsSettings(
                trust_store=str(cluster.pki.ca.cert),
                certificate_path=str(cluster.pki.client.cert),
                key_store=str(cluster.pki.bookie.key),  # not the certificate's key
            ),
            "cannot load certificate",
        ),
    ]
    for tls, message in bad:
        with pytest.raises(TlsConfigError, match=message):
            BookieClientPool(None, tls=tls)._tls.get()  # type: ignore[union-attr]
    # A bookie with a broken certificate refuses to start (exit 2) and says why.
    b = BookieProcess(
        cluster.zk,
        cluster.base / "broken",
        extra=[
            "--ledgers-root",
            ROOT,
            *bookie_tls_flags(replace(cluster.pki.bookie_settings(), key_store=missing)),
        ],
    )
    assert b.run_to_exit() == 2
    assert f"tlsKeyStore {missing}: not a readable file" in b.log_tail()


# ---- the audit: unreachable through TLS is BOOKIE_UNREACHABLE with the reason ------------------


def _write(
    cluster: TlsCluster, client: SyncBookieClient, ensemble: list[str], skip: str | None
) -> LedgerMetadata:
    lid = cluster.store.generate_ledger_id()
    md = LedgerMetadata(
        ledger_id=lid,
        ensemble_size=3,
        write_quorum=3,
        ack_quorum=2,
        segments=(Segment(0, tuple(ensemble)),),
        digest_type=DigestType.CRC32C,
        password=PASSWORD,
    ).closed(4, 50)
    cluster.store.create_ledger(md)
    for x in range(5):
        for i in write_set(x, 3, 3):
            if ensemble[i] != skip:
                client.add(ensemble[i], lid, x, KEY, entry(lid, x))
    return md


def test_audit_records_a_bookie_unreachable_through_tls_never_missing_entries(
    cluster: TlsCluster,
) -> None:
    good = [cluster.tls.bookie_id, cluster.mtls.bookie_id]
    with SyncBookieClient(
        cluster.zk, ledgers_root=ROOT, config=CONFIG, tls=cluster.client(mtls=True)
    ) as client:
        # The expired and untrusted bookies never got the entries (a TLS client cannot write
        # there): the audit cannot know, so it must not call them missing.
        expired = _write(
            cluster, client, [*good, cluster.expired.bookie_id], skip=cluster.expired.bookie_id
        )
        untrusted = _write(
            cluster, client, [*good, cluster.untrusted.bookie_id], skip=cluster.untrusted.bookie_id
        )
        views = [LedgerView.from_metadata(md, f"{ROOT}/x", 0) for md in (expired, untrusted)]
        found = [
            f
            for _, _, fs in check_ledgers(views, frozenset(), Check.REPLICAS, client=client)
            for f in fs
        ]
    by_bookie = {f.bookie_id: f for f in found}
    assert set(by_bookie) == {cluster.expired.bookie_id, cluster.untrusted.bookie_id}, found
    for f in found:
        assert f.reason == Reason.BOOKIE_UNREACHABLE and not f.missing_entries, f
    assert "certificate is not valid now" in (by_bookie[cluster.expired.bookie_id].error or "")
    assert "not trusted" in (by_bookie[cluster.untrusted.bookie_id].error or "")


def test_audit_cli_with_tls_flags(cluster: TlsCluster, tmp_path: Path) -> None:
    """``bkaudit audit --check replicas`` with the TLS flags (local executor): the TLS bookies
    answer, the expired one is BOOKIE_UNREACHABLE with the reason; without the flags every TLS
    bookie is unreachable (EUA), and no entry is ever reported missing."""
    good = [cluster.tls.bookie_id, cluster.mtls.bookie_id]
    with SyncBookieClient(
        cluster.zk, ledgers_root=ROOT, config=CONFIG, tls=cluster.client(mtls=True)
    ) as client:
        md = _write(
            cluster, client, [*good, cluster.expired.bookie_id], skip=cluster.expired.bookie_id
        )
    wh = tmp_path / "wh"
    tls_flags = client_tls_flags(cluster.client(mtls=True))
    args = (
        "audit",
        "--zk",
        cluster.zk,
        "--warehouse",
        str(wh),
        "--check",
        "replicas",
        "--executor",
        "local",
        "--read-timeout",
        "3",
        "--connect-timeout",
        "3",
        *tls_flags,
    )
    proc = bkaudit(*args)
    # The expired certificate's bookie is unreachable: unknown, so the run is incomplete (3).
    assert proc.returncode == ExitStatus.INCOMPLETE, proc.stderr[-3000:]
    run = delta.latest_run(str(wh))
    assert run is not None
    rows = delta.run_fragments(str(wh), run["run_id"], {"ledger_id": md.ledger_id})
    assert [(r["bookie_id"], r["reason"]) for r in rows] == [
        (cluster.expired.bookie_id, Reason.BOOKIE_UNREACHABLE)
    ], rows
    assert not rows[0]["missing_entries"]
    assert "not valid now" in json.dumps(rows[0], default=str)

    # The same cluster audited without the flags: every TLS bookie refuses the plaintext
    # client (EUA), so each one is unreachable with that reason, and nothing is missing.
    proc = bkaudit(*args[: -len(tls_flags)])
    assert proc.returncode == ExitStatus.INCOMPLETE, proc.stderr[-3000:]
    run = delta.latest_run(str(wh))
    assert run is not None
    rows = delta.run_fragments(str(wh), run["run_id"], {"ledger_id": md.ledger_id})
    assert sorted((r["bookie_id"], r["reason"]) for r in rows) == sorted(
        (b, Reason.BOOKIE_UNREACHABLE) for b in [*good, cluster.expired.bookie_id]
    ), rows
    for r in rows:
        assert not r["missing_entries"] and "requires TLS" in (r["error"] or ""), r


def test_tls_flag_mistakes_are_one_line_usage_errors(cluster: TlsCluster, tmp_path: Path) -> None:
    base = ("audit", "--zk", cluster.zk, "--warehouse", str(tmp_path / "wh"), "--check", "lost")
    ca = str(cluster.pki.ca.cert)
    for extra, message in [
        (("--tls-trust-store", ca), "--tls-trust-store given but bookie TLS is off"),
        (
            (
                "--tls-provider-factory-class",
                "TLSContextFactory",
                "--tls-trust-store",
                ca,
                "--tls-key-store-type",
                "JKS",
            ),
            "--tls-key-store-type JKS: only PEM files are supported",
        ),
    ]:
        proc = bkaudit(*base, *extra)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert [line for line in error_lines(proc) if message in line], proc.stderr[-2000:]
    assert not (tmp_path / "wh").exists()  # refused before anything ran
