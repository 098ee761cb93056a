"""A ZooKeeper with TLS (client certificates required) and SASL DIGEST-MD5 enforced: Python
bookies register through it, ``bkaudit audit`` and ``bkaudit rereplicate`` find and repair a
stopped bookie's fragments through it, and every znode they, the bookies and the watch
election created carries CREATOR_ALL ACLs. A wrong SASL password and an untrusted server
certificate are one line and exit 2, for the CLI and the bookie; the secret is never
printed or logged. Certificates are made here with ``cryptography``."""

from __future__ import annotations

import datetime
import ipaddress
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from bklib.client.operations import ClientConfig
from bklib.client.pool import SyncBookieClient
from bklib.meta.store import LedgerStore
from bklib.meta.stores.zookeeper import as_store
from bklib.meta.stores.zookeeper.security import ZkAccess, ZkSasl, ZkSecurityError, ZkTls
from bklib.testing.zkclient import connect
from bklib.testing.zkserver import ServerTls, ZooKeeperServer
from jobs.tables.delta import read_rows
from jobs.tables.schema import TABLES
from jobs.watch.election import LeaderElection
from tests.audit_helpers import metadata, write_ledger
from tests.bookie_helpers import BookieProcess, wait_for_no_znode, wait_for_znode
from tests.cli_helpers import bkaudit, failure, one_error_line
from tests.repair_helpers import assert_fully_replicated

pytestmark = pytest.mark.integration

USER = "bookkeeper"
SECRET = "zk-sasl-Secret-7c1e"  # must never show up in output, logs or tables
WRONG = "zk-sasl-Wrong-93ad"
CLIENT_CN = "bkaudit-client"


# ---- certificates ----------------------------------------------------------------------------


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _builder(
    subject: str, issuer: x509.Name, key: ec.EllipticCurvePrivateKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
    )


def _ca(cn: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(cn, _name(cn), key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _leaf(
    ca: tuple[ec.EllipticCurvePrivateKey, x509.Certificate], cn: str, *, server: bool
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    ca_key, ca_cert = ca
    key = ec.generate_private_key(ec.SECP256R1())
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    b = (
        _builder(cn, ca_cert.subject, key)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if server:  # hostname verification is on: the certificate names 127.0.0.1
        san = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return key, b.sign(ca_key, hashes.SHA256())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _jaas(path: Path, password: str) -> Path:
    path.write_text(
        "// ZooKeeper client login, as a Java bookie's -Djava.security.auth.login.config\n"
        "Client {\n"
        "  org.apache.zookeeper.server.auth.DigestLoginModule required\n"
        f'  username="{USER}"\n'
        f'  password="{password}";\n'
        "};\n"
    )
    path.chmod(0o600)
    return path


@dataclass
class SecureZk:
    server: ZooKeeperServer
    ca: Path
    rogue_ca: Path
    cert: Path
    key: Path
    jaas: Path
    wrong_jaas: Path
    intruder_cert: Path
    intruder_key: Path

    @property
    def access(self) -> ZkAccess:
        return ZkAccess(
            sasl=ZkSasl(username=USER, password=SECRET),
            tls=ZkTls(ca_file=str(self.ca), cert_file=str(self.cert), key_file=str(self.key)),
        )

    @property
    def intruder_access(self) -> ZkAccess:
        """Another identity ZooKeeper knows: SASL user ``intruder`` with its own certificate."""
        return ZkAccess(
            sasl=ZkSasl(username="intruder", password="intruder-pw"),
            tls=ZkTls(
                ca_file=str(self.ca),
                cert_file=str(self.intruder_cert),
                key_file=str(self.intruder_key),
            ),
        )

    def flags(self, *, jaas: Path | None = None, ca: Path | None = None) -> list[str]:
        """The CLI and bookie flags for this ZooKeeper."""
        return [
            "--zk-tls",
            "--zk-tls-ca", str(ca or self.ca),
            "--zk-tls-cert", str(self.cert),
            "--zk-tls-key", str(self.key),
            "--zk-sasl-jaas-file", str(jaas or self.jaas),
        ]  # fmt: skip


@pytest.fixture(scope="module")
def secure_zk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureZk]:
    d = tmp_path_factory.mktemp("zk-secure")
    ca, rogue = _ca("bkaudit test CA"), _ca("some other CA")
    server_key, server_cert = _leaf(ca, "zookeeper", server=True)
    client_key, client_cert = _leaf(ca, CLIENT_CN, server=False)
    other_key, other_cert = _leaf(ca, "intruder", server=False)
    (d / "ca.pem").write_bytes(_pem(ca[1]))
    (d / "rogue-ca.pem").write_bytes(_pem(rogue[1]))
    (d / "server.pem").write_bytes(_pem_key(server_key) + _pem(server_cert))
    (d / "client.pem").write_bytes(_pem(client_cert))
    (d / "client.key").write_bytes(_pem_key(client_key))
    (d / "intruder.pem").write_bytes(_pem_key(other_key) + _pem(other_cert))  # one file
    server = ZooKeeperServer(
        d / "zk",
        tls=ServerTls(key_store=d / "server.pem", trust_store=d / "ca.pem", client_auth="need"),
        sasl_users={USER: SECRET, "intruder": "intruder-pw"},
    )
    server.start()
    try:
        yield SecureZk(
            server,
            ca=d / "ca.pem",
            rogue_ca=d / "rogue-ca.pem",
            cert=d / "client.pem",
            key=d / "client.key",
            jaas=_jaas(d / "client.jaas", SECRET),
            wrong_jaas=_jaas(d / "wrong.jaas", WRONG),
            intruder_cert=d / "intruder.pem",
            intruder_key=d / "intruder.pem",
        )
    finally:
        server.stop()


def _tree(zk: KazooClient, path: str = "/") -> Iterator[str]:
    yield path
    for child in zk.get_children(path):
        yield from _tree(zk, f"{path.rstrip('/')}/{child}")


def _assert_no_secret(text: str, where: str) -> None:
    assert SECRET not in text and WRONG not in text, f"a SASL password leaked into {where}"


def test_bookies_register_audit_and_rereplicate_repair_with_creator_all_acls(
    secure_zk: SecureZk, tmp_path: Path
) -> None:
    access = secure_zk.access
    wh = tmp_path / "wh"
    with secure_zk.server.private_chroot("sec", auth=access) as chroot:
        zk = connect(chroot, auth=access)
        bookies = [
            BookieProcess(chroot, tmp_path / f"bookie{i}", extra=secure_zk.flags())
            for i in range(3)
        ]
        client = SyncBookieClient(
            chroot, config=ClientConfig(read_timeout=5.0, connect_timeout=5.0), zk_auth=access
        )
        try:
            store = LedgerStore(zk)
            store.init_cluster()
            for b in bookies:
                b.spawn()
            for b in bookies:
                wait_for_znode(zk, f"/ledgers/available/{b.bookie_id}")
            b0, b1, b2 = (b.bookie_id for b in bookies)
            ledgers = []
            for ensemble, n in [([b0, b2], 12), ([b2, b1], 9), ([b0, b1], 7)]:
                md = metadata(store.generate_ledger_id(), [(0, ensemble)], wq=2, aq=2, last=n - 1)
                ledgers.append(write_ledger(store, client, md, n))
            victim = bookies[2]
            victim.stop()  # a clean stop deletes the registration at once
            wait_for_no_znode(zk, f"/ledgers/available/{b2}")

            flags = ["--zk", chroot, "--warehouse", str(wh), "--executor", "local"]
            flags += secure_zk.flags()
            # --check replicas also resolves bookie addresses through the secured session.
            audit = bkaudit("-v", "audit", *flags, "--check", "replicas")
            assert audit.returncode == 0, failure(audit)
            assert "2 under-replicated" in audit.stdout, audit.stdout
            repair = bkaudit("-v", "rereplicate", *flags, "--grace-period", "0s")
            assert repair.returncode == 0, failure(repair)
            for md in ledgers:
                assert_fully_replicated(store, client, md.ledger_id, excluded=frozenset({b2}))
            actions = read_rows(str(wh), "replication_actions")
            assert {a["ledger_id"] for a in actions if a["action"] == "COPY"} == {
                ledgers[0].ledger_id,
                ledgers[1].ledger_id,
            }

            # Our own namespace, outside the ledgers root: the watch election.
            election = LeaderElection(as_store(zk), "/ledgers", {"host": "test"})
            election.join()
            assert election.is_leader()

            nodes = list(_tree(zk, "/"))
            assert "/bkaudit/ledgers/watch-leader" in nodes
            assert any(n.startswith("/ledgers/underreplication/") for n in nodes)
            assert any(n.startswith("/ledgers/cookies/") for n in nodes)
            expected = {(31, "sasl", USER), (31, "x509", f"CN={CLIENT_CN}")}
            for node in nodes:
                acls, _ = zk.get_acls(node)
                got = {(a.perms, a.id.scheme, a.id.id) for a in acls}
                assert got == expected, (node, acls)
            # And closed to a session with another identity (its own SASL user and cert).
            server_root = secure_zk.server.secure_connect_string
            intruder = connect(server_root, auth=secure_zk.intruder_access)
            try:
                with pytest.raises(NoAuthError):
                    intruder.get_children("/" + chroot.partition("/")[2] + "/ledgers")
            finally:
                intruder.stop()
                intruder.close()

            for proc, where in [(audit, "audit -v"), (repair, "rereplicate -v")]:
                _assert_no_secret(proc.stdout + proc.stderr, where)
            for b in bookies:
                _assert_no_secret(b.log_path.read_text(errors="replace"), f"{b.log_path}")
            for table in TABLES:
                if (wh / table).exists():
                    _assert_no_secret(repr(read_rows(str(wh), table)), f"table {table}")
        finally:
            client.close()
            for b in bookies:
                b.stop()
            zk.stop()
            zk.close()


def test_a_wrong_sasl_password_is_one_line_and_exit_2(secure_zk: SecureZk, tmp_path: Path) -> None:
    hosts = secure_zk.server.secure_connect_string
    wh = tmp_path / "wh"
    common = ["--zk", hosts, "--warehouse", str(wh), "--executor", "local"]
    proc = bkaudit("audit", *common, *secure_zk.flags(jaas=secure_zk.wrong_jaas))
    line = one_error_line(proc)
    assert "rejected SASL DIGEST-MD5 as bookkeeper" in line, line
    _assert_no_secret(proc.stdout + proc.stderr, "audit")
    assert not (wh / "audit_runs").exists()

    bookie = BookieProcess(
        hosts, tmp_path / "bookie", extra=secure_zk.flags(jaas=secure_zk.wrong_jaas)
    )
    assert bookie.run_to_exit() == 2
    last = bookie.log_tail().splitlines()[-1]
    assert re.search(r"refused to start: ZooKeeper at \S+ rejected SASL", last), last
    _assert_no_secret(bookie.log_path.read_text(), "the bookie log")


def test_an_untrusted_zookeeper_certificate_is_one_line_and_exit_2(
    secure_zk: SecureZk, tmp_path: Path
) -> None:
    hosts = secure_zk.server.secure_connect_string
    proc = bkaudit(
        "audit", "--zk", hosts, "--warehouse", str(tmp_path / "wh"), "--check", "lost",
        "--executor", "local", *secure_zk.flags(ca=secure_zk.rogue_ca),
    )  # fmt: skip
    line = one_error_line(proc)
    assert "TLS handshake failed" in line and "certificate not trusted" in line, line
    with pytest.raises(ZkSecurityError, match="certificate not trusted"):
        connect(hosts, auth=ZkAccess(tls=ZkTls(ca_file=str(secure_zk.rogue_ca))))
    # The plaintext port reached with TLS: a failed handshake, not an endless reconnect.
    with pytest.raises(ZkSecurityError, match="TLS handshake failed"):
        connect(secure_zk.server.connect_string, auth=secure_zk.access)
