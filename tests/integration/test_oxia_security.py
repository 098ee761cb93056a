"""bkaudit on an Oxia that serves TLS and authenticates tokens, as production Pulsar runs it:
a real ``oxia server`` (``--tls-cert-file``, ``--auth-provider-name oidc``) with its
coordinator, an OpenID issuer of the test's own on loopback (HTTPS, a JWKS with a key the test
made) whose signed JWTs are the tokens, and Python bookies registering through the same TLS
and token (``--oxia-tls*``, ``--oxia-token-file``).

Every connection goes through a relay that records what the clients send (the coordinator
advertises the relay as the shard leader), so the test proves nothing left in clear: each
stream starts with a TLS ClientHello, and neither HTTP/2's preface nor the token ever appears.
A wrong CA, a token from another key, an expired token and no token are each one line and
exit 2 within seconds, never the client's 30 s of retries.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from bklib.meta.cluster import MetadataDriver
from bklib.meta.model import LedgerMetadata, LedgerState, Segment
from bklib.meta.oxia_security import TOKEN_ENV, OxiaAccess, OxiaTls
from bklib.meta.registration import list_bookies
from bklib.meta.store import LedgerStore
from bklib.meta.stores import MetadataStore, open_store
from bklib.meta.stores.oxia_transport import OxiaSecurityError
from bklib.meta.underreplication import UnderReplicationManager
from bklib.testing.oidc import OidcIssuer
from bklib.testing.oxiaserver import OxiaSecurity, OxiaServer
from bklib.testing.ports import free_port
from bklib.testing.relay import TcpRelay
from bklib.testing.sandbox import BookieProcess, SandboxPki, generate_pki, make_ca
from jobs.runtime.exit_status import ExitStatus
from jobs.watch.election import read_leader
from tests.cli_helpers import REPO, bkaudit, one_error_line

pytestmark = pytest.mark.integration

DEAD = "10.255.0.9:3181"  # a bookie that never registered: its fragments are lost
LEDGERS = 6
HTTP2_PREFACE = b"PRI * HTTP/2.0"


@dataclass
class SecureOxia:
    """The server, its issuer, the relay every client goes through, and the client files."""

    server: OxiaServer
    issuer: OidcIssuer
    relay: TcpRelay
    pki: SandboxPki
    token_file: Path
    rogue_ca: Path

    @property
    def locator(self) -> str:
        return f"oxia://{self.relay.address}/default"

    @property
    def uri(self) -> str:
        return f"metadata-store:{self.locator}"

    def access(self) -> OxiaAccess:
        return OxiaAccess(
            tls=OxiaTls(ca_file=str(self.pki.ca.cert)),
            token=self.token_file.read_text().strip(),
            token_file=str(self.token_file),
        )

    def flags(self, *, ca: Path | None = None, token: Path | None = None) -> list[str]:
        out = ["--oxia-tls", "--oxia-tls-ca", str(ca or self.pki.ca.cert)]
        return [*out, "--oxia-token-file", str(token or self.token_file)]


@pytest.fixture(scope="module")
def secure_oxia(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureOxia]:
    base = tmp_path_factory.mktemp("secure-oxia")
    pki = generate_pki(base / "tls")  # its "bookie" certificate names 127.0.0.1 and localhost
    rogue = make_ca(base / "rogue", "a CA Oxia's certificate is not from").cert
    with OidcIssuer(tls=pki.bookie) as issuer:
        token_file = base / "token"
        token_file.write_text(issuer.token(subject="bkaudit", audience="oxia") + "\n")
        relay = TcpRelay(target="127.0.0.1:0").start()
        server = OxiaServer(
            base / "oxia",
            shards=2,
            advertised=relay.address,
            security=OxiaSecurity(
                cert=str(pki.bookie.cert),
                key=str(pki.bookie.key),
                oidc_issuer=issuer.url,
                audience="oxia",
                issuer_ca=str(pki.ca.cert),
            ),
        )
        server.start()
        relay.target = server.address
        try:
            yield SecureOxia(server, issuer, relay, pki, token_file, rogue)
        finally:
            relay.stop()
            server.stop()


@pytest.fixture(scope="module")
def cluster(secure_oxia: SecureOxia, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Three Python bookies registered through TLS and the token, and ledgers (metadata only)
    on them and on a bookie that never registered. Yields the ids of the ledgers on it."""
    base = tmp_path_factory.mktemp("bookies")
    store = open_store(secure_oxia.locator, auth=secure_oxia.access(), timeout=60)
    bookies: list[BookieProcess] = []
    try:
        ledgers = LedgerStore(store, "/ledgers")
        ledgers.init_cluster(driver=MetadataDriver.PULSAR)
        for i in range(3):
            extra = ["--ledgers-root", "/ledgers", *secure_oxia.flags()]
            bookies.append(BookieProcess(secure_oxia.locator, base / f"b{i}", extra=extra).start())
        ids = [b.bookie_id for b in bookies]
        _wait_registered(store, ids)
        lost = []
        for n in range(LEDGERS):
            ensemble = (ids[0], ids[1], DEAD) if n % 2 else tuple(ids)
            lid = ledgers.generate_ledger_id()
            ledgers.create_ledger(
                LedgerMetadata(
                    ledger_id=lid, ensemble_size=3, write_quorum=2, ack_quorum=2,
                    state=LedgerState.CLOSED, last_entry_id=9, length=100,
                    segments=(Segment(0, ensemble),),
                )
            )  # fmt: skip
            if DEAD in ensemble:
                lost.append(lid)
        # Marks written through the secured store, for listunderreplicated --live.
        marks = UnderReplicationManager(store, "/ledgers")
        for lid in lost:
            marks.mark_underreplicated(lid, [DEAD])
        yield " ".join(str(lid) for lid in lost)
    finally:
        for b in bookies:
            b.stop()
        store.close()


def _wait_registered(store: MetadataStore, ids: list[str], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(list_bookies(store, "/ledgers").is_available(i) for i in ids):
            return
        time.sleep(0.2)
    raise AssertionError(f"bookies {ids} did not register through the secured Oxia")


def _assert_nothing_in_clear(secure_oxia: SecureOxia) -> None:
    streams = [s for s in secure_oxia.relay.streams() if s]
    assert streams, "no connection went through the relay"
    token = secure_oxia.token_file.read_text().strip().encode()
    for stream in streams:
        assert stream[:2] == b"\x16\x03", stream[:32]  # a TLS handshake record first
        assert HTTP2_PREFACE not in stream and token not in stream
        assert b"/ledgers" not in stream  # no key of ours in clear either


def test_audit_listunderreplicated_and_status_on_a_tls_oxia_with_a_token(
    secure_oxia: SecureOxia, cluster: str, tmp_path: Path
) -> None:
    lost = cluster.split()
    wh = tmp_path / "wh"
    common = ["--metadata-uri", secure_oxia.uri, *secure_oxia.flags()]
    before = len(secure_oxia.relay.streams())
    audit = bkaudit(
        "audit", *common, "--warehouse", str(wh), "--check", "lost", "--executor", "local"
    )
    assert audit.returncode == 0, audit.stderr[-3000:]
    assert f"{LEDGERS} ledgers, {len(lost)} under-replicated" in audit.stdout, audit.stdout
    assert len(secure_oxia.relay.streams()) > before  # the audit went through the relay

    report = bkaudit("listunderreplicated", "--warehouse", str(wh))
    assert report.returncode == ExitStatus.FINDINGS, report.stderr[-2000:]
    assert all(lid in report.stdout for lid in lost), report.stdout

    live = bkaudit("listunderreplicated", "--live", *common)
    assert live.returncode == ExitStatus.FINDINGS, live.stderr[-2000:]
    assert all(lid in live.stdout for lid in lost), live.stdout

    status = bkaudit("status", *common)
    assert status.returncode in (ExitStatus.OK, ExitStatus.FINDINGS), status.stderr[-2000:]
    assert "Traceback" not in status.stderr
    token = secure_oxia.token_file.read_text().strip()
    for proc in (audit, live, status):
        assert token not in proc.stdout + proc.stderr
    _assert_nothing_in_clear(secure_oxia)


def test_the_spark_audit_reads_the_tls_oxia_with_the_token(
    secure_oxia: SecureOxia, cluster: str, tmp_path: Path
) -> None:
    lost = cluster.split()
    proc = bkaudit(
        "audit", "--metadata-uri", secure_oxia.uri, *secure_oxia.flags(),
        "--warehouse", str(tmp_path / "wh"), "--check", "lost", "--executor", "spark",
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{LEDGERS} ledgers, {len(lost)} under-replicated" in proc.stdout, proc.stdout
    _assert_nothing_in_clear(secure_oxia)


def _timed_refusal(
    secure_oxia: SecureOxia, tmp_path: Path, *extra: str, uri: str | None = None
) -> str:
    t0 = time.monotonic()
    proc = bkaudit(
        "audit", "--metadata-uri", uri or secure_oxia.uri, *extra,
        "--warehouse", str(tmp_path / "wh"), "--check", "lost", "--executor", "local",
    )  # fmt: skip
    elapsed = time.monotonic() - t0
    line = one_error_line(proc)
    assert elapsed < 20, (elapsed, line)  # not the client's 30 s of retries
    assert not (tmp_path / "wh" / "audit_runs").exists()
    return line


def test_a_wrong_ca_is_one_line_and_exit_2(secure_oxia: SecureOxia, tmp_path: Path) -> None:
    line = _timed_refusal(secure_oxia, tmp_path, *secure_oxia.flags(ca=secure_oxia.rogue_ca))
    assert f"Oxia TLS handshake with {secure_oxia.relay.address} failed" in line, line
    assert "certificate not trusted" in line, line


def test_a_token_the_issuer_never_signed_is_one_line_and_exit_2(
    secure_oxia: SecureOxia, tmp_path: Path
) -> None:
    forged = tmp_path / "forged"
    other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    forged.write_text(secure_oxia.issuer.token(key=other_key))
    line = _timed_refusal(secure_oxia, tmp_path, *secure_oxia.flags(token=forged))
    assert f"Oxia at {secure_oxia.relay.address} refused the token" in line, line
    assert forged.read_text() not in line


def test_an_expired_token_or_a_foreign_audience_is_refused(
    secure_oxia: SecureOxia, tmp_path: Path
) -> None:
    expired = tmp_path / "expired"
    expired.write_text(secure_oxia.issuer.token(lifetime=-60))
    line = _timed_refusal(secure_oxia, tmp_path, *secure_oxia.flags(token=expired))
    assert "refused the token" in line and "expired" in line, line
    foreign = tmp_path / "foreign"
    foreign.write_text(secure_oxia.issuer.token(audience="another-service"))
    line = _timed_refusal(secure_oxia, tmp_path, *secure_oxia.flags(token=foreign))
    assert "refused the token" in line and "audience" in line, line


def test_no_token_is_one_line_and_exit_2(secure_oxia: SecureOxia, tmp_path: Path) -> None:
    flags = ["--oxia-tls", "--oxia-tls-ca", str(secure_oxia.pki.ca.cert)]
    line = _timed_refusal(secure_oxia, tmp_path, *flags)
    assert f"Oxia at {secure_oxia.relay.address} requires a token" in line, line
    assert "--oxia-token-file" in line and TOKEN_ENV in line


def test_the_token_from_the_environment_works_and_is_never_logged(
    secure_oxia: SecureOxia, cluster: str, tmp_path: Path
) -> None:
    token = secure_oxia.token_file.read_text().strip()
    wh = tmp_path / "wh"
    tls = ["--oxia-tls", "--oxia-tls-ca", str(secure_oxia.pki.ca.cert)]
    common = ["--metadata-uri", secure_oxia.uri, *tls]
    live = bkaudit("-v", "listunderreplicated", "--live", *common, env={TOKEN_ENV: token})
    assert live.returncode == ExitStatus.FINDINGS, live.stderr[-2000:]
    assert all(lid in live.stdout for lid in cluster.split()), live.stdout
    # -v: whatever the run logs, the token is in none of it.
    audit = bkaudit(
        "-v", "audit", *common, "--warehouse", str(wh), "--check", "lost", "--executor", "local",
        env={TOKEN_ENV: token},
    )  # fmt: skip
    assert audit.returncode == 0, audit.stderr[-3000:]
    for proc in (live, audit):
        assert token not in proc.stdout + proc.stderr
        assert token.split(".")[2] not in proc.stdout + proc.stderr  # nor its signature


def test_the_library_raises_oxia_security_error(secure_oxia: SecureOxia) -> None:
    rogue = OxiaAccess(tls=OxiaTls(ca_file=str(secure_oxia.rogue_ca)))
    with pytest.raises(OxiaSecurityError, match="certificate not trusted"):
        open_store(secure_oxia.locator, auth=rogue, timeout=10)
    # The server's certificate names 127.0.0.1: another name is refused, the right one works.
    wrong_name = OxiaAccess(
        tls=OxiaTls(ca_file=str(secure_oxia.pki.ca.cert), server_name="oxia.example"),
        token=secure_oxia.access().token,
    )
    with pytest.raises(OxiaSecurityError, match="certificate not trusted"):
        open_store(secure_oxia.locator, auth=wrong_name, timeout=10)
    right_name = OxiaAccess(
        tls=OxiaTls(ca_file=str(secure_oxia.pki.ca.cert), server_name="localhost"),
        token=secure_oxia.access().token,
    )
    with open_store(secure_oxia.locator, auth=right_name, timeout=30) as store:
        assert store.exists("/ledgers") is not None


def test_a_bookie_with_a_wrong_token_refuses_to_start(
    secure_oxia: SecureOxia, tmp_path: Path
) -> None:
    forged = tmp_path / "forged"
    forged.write_text(
        secure_oxia.issuer.token(key=rsa.generate_private_key(public_exponent=65537, key_size=2048))
    )
    extra = ["--ledgers-root", "/ledgers", *secure_oxia.flags(token=forged)]
    bookie = BookieProcess(secure_oxia.locator, tmp_path / "b", extra=extra)
    assert bookie.run_to_exit(timeout=30) == 2
    assert "refused the token" in bookie.log_tail(), bookie.log_tail()


def test_a_plain_text_client_to_the_tls_port_is_one_line(
    secure_oxia: SecureOxia, tmp_path: Path
) -> None:
    # Straight to the server, not through the relay: this client sends plain text on purpose.
    address = secure_oxia.server.address
    line = _timed_refusal(secure_oxia, tmp_path, uri=f"metadata-store:oxia://{address}/default")
    assert f"Oxia at {address} serves TLS: give --oxia-tls" in line, line


def test_a_rotated_token_file_is_read_by_a_running_session(
    secure_oxia: SecureOxia, cluster: str, tmp_path: Path
) -> None:
    # A session opened with a token about to expire keeps working once the file holds a new
    # one (a Kubernetes Secret updated under a running watch): each call reads the file anew.
    token = tmp_path / "token"
    token.write_text(secure_oxia.issuer.token(lifetime=4))
    access = OxiaAccess(
        tls=OxiaTls(ca_file=str(secure_oxia.pki.ca.cert)),
        token=token.read_text(),
        token_file=str(token),
    )
    with open_store(secure_oxia.locator, auth=access, timeout=30) as store:
        assert store.exists("/ledgers") is not None
        token.write_text(secure_oxia.issuer.token(lifetime=3600))
        time.sleep(5)  # the first token has expired by now
        assert store.exists("/ledgers") is not None
        assert len(list(store.scan_children("/ledgers/underreplication/ledgers"))) >= 0


def test_mutual_tls_with_a_client_certificate(tmp_path: Path) -> None:
    # A server started with --tls-trusted-ca-file and --tls-client-auth: our certificate gets
    # in, no certificate is one line and exit 2.
    pki = generate_pki(tmp_path / "tls")
    security = OxiaSecurity(
        cert=str(pki.bookie.cert), key=str(pki.bookie.key), client_ca=str(pki.ca.cert)
    )
    with OxiaServer(tmp_path / "oxia", security=security) as server:
        uri = f"metadata-store:oxia://{server.address}/default"
        tls = ["--oxia-tls", "--oxia-tls-ca", str(pki.ca.cert)]
        cert = ["--oxia-tls-cert", str(pki.client.cert), "--oxia-tls-key", str(pki.client.key)]
        with open_store(
            server.locator(),
            auth=OxiaAccess(
                tls=OxiaTls(
                    ca_file=str(pki.ca.cert),
                    cert_file=str(pki.client.cert),
                    key_file=str(pki.client.key),
                )
            ),
            timeout=30,
        ) as store:
            LedgerStore(store, "/ledgers").init_cluster(driver=MetadataDriver.PULSAR)
        ok = bkaudit("status", "--metadata-uri", uri, *tls, *cert)
        assert ok.returncode in (ExitStatus.OK, ExitStatus.FINDINGS), ok.stderr[-2000:]
        t0 = time.monotonic()
        refused = bkaudit("status", "--metadata-uri", uri, *tls)
        line = one_error_line(refused)
        assert time.monotonic() - t0 < 20, line
        assert f"Oxia TLS handshake with {server.address} failed" in line, line
        assert "requires a client certificate (--oxia-tls-cert" in line, line


def test_the_watch_joins_its_election_on_the_secured_oxia(
    secure_oxia: SecureOxia, cluster: str, tmp_path: Path
) -> None:
    # The long-lived process: its store session, its leader election key (an ephemeral key
    # of its session) and its polling all go through TLS with the token.
    log = tmp_path / "watch.log"
    argv = [
        sys.executable, "-m", "jobs.cli", "watch", "--metadata-uri", secure_oxia.uri,
        *secure_oxia.flags(), "--warehouse", str(tmp_path / "wh"), "--every", "off",
        "--grace-period", "0s", "--poll-interval", "0.5s", "--metrics-port", str(free_port()),
        "--metrics-host", "127.0.0.1", "--instance-id", "secure-w1",
    ]  # fmt: skip
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    store = open_store(secure_oxia.locator, auth=secure_oxia.access(), timeout=30)
    try:
        deadline = time.monotonic() + 60
        leader: dict[str, object] | None = None
        while time.monotonic() < deadline and proc.poll() is None:
            leader, _ = read_leader(store, "/ledgers")
            if leader is not None:
                break
            time.sleep(0.5)
        assert leader is not None and leader.get("id") == "secure-w1", log.read_text()[-3000:]
    finally:
        proc.terminate()
        proc.wait(30)
        store.close()
    text = log.read_text()
    assert "Traceback" not in text and secure_oxia.token_file.read_text().strip() not in text
    _assert_nothing_in_clear(secure_oxia)
