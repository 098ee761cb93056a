"""A local BookKeeper cluster: a real ZooKeeper server plus N Python bookie processes.

Used by the test fixtures, the benchmarks, ``bkaudit sandbox up|down|status`` and the demo.
Everything listens on loopback; each process keeps its data and log under one directory.
A cluster started by the CLI outlives the command: its pids and ports are kept in
``<dir>/sandbox.json`` so ``down`` and ``status`` find it again.

With ``tls=True`` the sandbox makes a test CA and certificates under ``<dir>/tls``
(:func:`generate_pki`, needs the ``cryptography`` package of the dev extra) and its bookies
serve START_TLS only; clients use :attr:`Sandbox.client_tls`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, TypedDict

from bklib.bookie.faults import AdminClient
from bklib.meta.cluster import MetadataDriver
from bklib.meta.registration import list_bookies
from bklib.meta.store import LedgerStore
from bklib.meta.stores import MetadataStore, is_oxia, open_store, parse_oxia_locator
from bklib.meta.underreplication import UnderReplicationManager
from bklib.states import DEFAULT_LEDGERS_ROOT
from bklib.testing.oxiaserver import OxiaServer
from bklib.testing.ports import free_port
from bklib.testing.zkserver import ZooKeeperServer, four_letter_word, terminate
from bklib.tls import PROVIDER_FACTORY_CLASS, TlsSettings

log = logging.getLogger(__name__)

STATE_FILE = "sandbox.json"


class BookieState(TypedDict):
    """One bookie of a detached sandbox, as recorded in its state file."""

    id: str
    pid: int | None
    dir: str


class SandboxState(TypedDict):
    """The state file of a detached sandbox (JSON in ``STATE_FILE`` under its base dir)."""

    zk: str
    ledgers_root: str
    zk_pid: int | None
    bookies: list[BookieState]


ZOOKEEPER = "zookeeper"
OXIA = "oxia"
METADATA_STORES = (ZOOKEEPER, OXIA)
"""What ``bkaudit sandbox --metadata`` may run on."""


class SandboxError(RuntimeError):
    """A sandbox process did not start or stop as asked."""


# ---- test certificates ------------------------------------------------------------------------


@dataclass(frozen=True)
class CertFiles:
    """A PEM certificate and its unencrypted PEM key."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class SandboxPki:
    """A test CA with one bookie and one client certificate signed by it."""

    ca: CertFiles
    bookie: CertFiles
    client: CertFiles

    def bookie_settings(self, *, client_authentication: bool = False) -> TlsSettings:
        """A bookie's settings: its certificate; with mTLS, the CA to check clients with."""
        return TlsSettings(
            trust_store=str(self.ca.cert),
            certificate_path=str(self.bookie.cert),
            key_store=str(self.bookie.key),
            client_authentication=client_authentication,
        )

    def client_settings(self, *, client_authentication: bool = False) -> TlsSettings:
        """A client's settings: the CA; with mTLS, the client certificate too."""
        return TlsSettings(
            trust_store=str(self.ca.cert),
            certificate_path=str(self.client.cert) if client_authentication else None,
            key_store=str(self.client.key) if client_authentication else None,
            client_authentication=client_authentication,
        )


def _crypto() -> Any:
    try:
        from cryptography import x509
    except ImportError as exc:  # the dev extra: tests and `sandbox --tls` only
        raise SandboxError(
            "test certificates need the cryptography package (pip install 'bkaudit[dev]')"
        ) from exc
    return x509


def make_ca(directory: Path, name: str = "bkaudit test CA", *, days: int = 30) -> CertFiles:
    """A self-signed CA certificate and key (EC P-256) in ``directory``."""
    x509 = _crypto()
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, name)])
    now = datetime.now(timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(hours=1))
        .not_valid_after(now + timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return _write(Path(directory), _slug(name), cert, key)


def issue_cert(
    directory: Path,
    name: str,
    ca: CertFiles,
    *,
    hosts: Sequence[str] = ("127.0.0.1", "localhost"),
    not_before: datetime | None = None,
    not_after: datetime | None = None,
    ou: str | None = None,
) -> CertFiles:
    """A certificate for ``name`` signed by ``ca``, valid for ``hosts`` (IPs and DNS names)
    for both server and client authentication; an expired one with ``not_after`` in the past.
    ``ou`` is the subject's organizational unit, e.g. ``0:role`` for BookKeeper's
    ``BookieAuthZFactory`` (``authorizedRoles``)."""
    import ipaddress

    x509 = _crypto()
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    ca_cert = x509.load_pem_x509_certificate(Path(ca.cert).read_bytes())
    ca_key = serialization.load_pem_private_key(Path(ca.key).read_bytes(), None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(timezone.utc)
    names: list[Any] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    subject = [x509.NameAttribute(x509.NameOID.COMMON_NAME, name)]
    if ou is not None:
        subject.append(x509.NameAttribute(x509.NameOID.ORGANIZATIONAL_UNIT_NAME, ou))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(subject))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before or now - timedelta(hours=1))
        .not_valid_after(not_after or now + timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [x509.ExtendedKeyUsageOID.SERVER_AUTH, x509.ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return _write(Path(directory), _slug(name), cert, key)


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")


def _write(directory: Path, stem: str, cert: Any, key: Any) -> CertFiles:
    from cryptography.hazmat.primitives import serialization

    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / f"{stem}.crt", directory / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)
    return CertFiles(cert_path, key_path)


def generate_pki(directory: Path) -> SandboxPki:
    """A CA, a bookie certificate for 127.0.0.1/localhost and a client certificate."""
    ca = make_ca(directory)
    return SandboxPki(
        ca,
        issue_cert(directory, "bookie", ca),
        issue_cert(directory, "bkaudit client", ca),
    )


def bookie_tls_flags(settings: TlsSettings) -> list[str]:
    """``python -m bklib.bookie`` flags serving TLS with ``settings``."""
    flags = ["--tls-provider-factory-class", PROVIDER_FACTORY_CLASS]
    for flag, value in (
        ("--tls-certificate-path", settings.certificate_path),
        ("--tls-key-store", settings.key_store),
        ("--tls-trust-store", settings.trust_store),
    ):
        if value:
            flags += [flag, value]
    if settings.client_authentication:
        flags.append("--tls-client-authentication")
    return flags


def client_tls_flags(settings: TlsSettings) -> list[str]:
    """``bkaudit`` job flags for a client with ``settings``."""
    flags = ["--tls-provider-factory-class", PROVIDER_FACTORY_CLASS]
    for flag, value in (
        ("--tls-trust-store", settings.trust_store),
        ("--tls-certificate-path", settings.certificate_path),
        ("--tls-key-store", settings.key_store),
    ):
        if value:
            flags += [flag, value]
    if settings.client_authentication:
        flags.append("--tls-client-authentication")
    if settings.hostname_verification:
        flags.append("--tls-hostname-verification-enabled")
    return flags


class BookieProcess:
    """``python -m bklib.bookie`` as a child process, its log in ``<data_dir>.log``."""

    def __init__(
        self,
        zk: str,
        data_dir: Path,
        port: int | None = None,
        *,
        fault_injection: bool = False,
        extra: Iterable[str] = (),
        zk_timeout: float = 4.0,
        detach: bool = False,
    ) -> None:
        self.zk = zk
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.fault_injection = fault_injection
        self.extra = list(extra)
        self.zk_timeout = zk_timeout
        self.detach = detach
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.data_dir.with_suffix(".log")

    @property
    def bookie_id(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def command(self) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "bklib.bookie",
            "--zk",
            self.zk,
            "--port",
            str(self.port),
            "--data-dir",
            str(self.data_dir),
            "--zk-timeout",
            str(self.zk_timeout),
            *self.extra,
        ]
        if self.fault_injection:
            cmd.append("--fault-injection")
        return cmd

    def spawn(self) -> subprocess.Popen[bytes]:
        """Start the process without waiting for it to serve."""
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                self.command(),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                start_new_session=self.detach,
            )
        return self.proc

    def start(self, timeout: float = 30.0) -> BookieProcess:
        """Start and wait until the bookie port accepts connections."""
        proc = self.spawn()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SandboxError(f"bookie exited with {proc.returncode}:\n{self.log_tail()}")
            try:
                socket.create_connection(self.address, timeout=1).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.kill9()
        raise SandboxError(f"bookie did not come up on port {self.port}:\n{self.log_tail()}")

    def run_to_exit(self, timeout: float = 30.0) -> int:
        """Start and wait for the process to exit (for refusal tests)."""
        return self.spawn().wait(timeout)

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except FileNotFoundError:
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        """SIGKILL, as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM and wait; returns the exit status."""
        if self.proc is None:
            return None
        return terminate(self.proc, timeout)

    def admin(self) -> AdminClient:
        """The fault-injection admin client (only with ``fault_injection=True``)."""
        return AdminClient.for_data_dir(self.data_dir)

    def __enter__(self) -> BookieProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class Sandbox:
    """A metadata store (ZooKeeper, or Oxia with ``metadata="oxia"``) plus ``num_bookies``
    Python bookies under ``base_dir``.

    Tests share one store server: pass its locator as ``external_zk`` (a ZooKeeper connect
    string with a chroot, or an Oxia locator) and the sandbox lives there.
    """

    base_dir: Path
    num_bookies: int = 3
    ledgers_root: str = DEFAULT_LEDGERS_ROOT
    fault_injection: bool = False
    external_zk: str | None = None
    detach: bool = False
    tls: bool = False
    """Bookies serve TLS only, with certificates made under ``<base_dir>/tls``."""
    metadata_driver: MetadataDriver = MetadataDriver.BOOKKEEPER
    """Lay the cluster out as this driver does: Pulsar's writes no ``LAYOUT`` and leaves the
    ``underreplication`` tree to the first Auditor or ReplicationWorker."""
    metadata: str = ZOOKEEPER
    """The store: ``zookeeper`` or ``oxia`` (Pulsar's driver, the only one on Oxia)."""
    bookies: list[BookieProcess] = field(default_factory=list)
    zk_server: ZooKeeperServer | None = None
    oxia_server: OxiaServer | None = None
    pki: SandboxPki | None = None

    @property
    def client_tls(self) -> TlsSettings | None:
        """What a client of this sandbox needs (None without ``tls``)."""
        return self.pki.client_settings() if self.pki is not None else None

    @property
    def zk_connect(self) -> str:
        """The store's locator: what ``--zk`` takes (and ``--metadata-uri`` names)."""
        if self.external_zk is not None:
            return self.external_zk
        if self.oxia_server is not None:
            return self.oxia_server.locator()
        if self.zk_server is None:
            raise SandboxError("sandbox not started")
        return self.zk_server.connect_string

    @property
    def metadata_uri(self) -> str:
        """The cluster's ``metadataServiceUri`` (Pulsar's form on Oxia)."""
        if is_oxia(self.zk_connect):
            address, namespace = parse_oxia_locator(self.zk_connect)
            return f"metadata-store:oxia://{address}/{namespace}"
        servers, _, chroot = self.zk_connect.partition("/")
        root = "/" + "/".join(p for p in (chroot, self.ledgers_root.strip("/")) if p)
        return f"zk+hierarchical://{servers.replace(',', ';')}{root}"

    @property
    def bookie_ids(self) -> list[str]:
        return [b.bookie_id for b in self.bookies]

    def start(self, timeout: float = 60.0) -> Sandbox:
        """Start ZooKeeper (unless external), initialise the cluster znodes, start the bookies
        and wait until each has registered."""
        self.base_dir = Path(self.base_dir)
        self.base_dir.mkdir(parents=True, exist_ok=True)
        if self.tls and self.pki is None:
            self.pki = generate_pki(self.base_dir / "tls")
        if self.metadata not in METADATA_STORES:
            raise SandboxError(f"unknown metadata store {self.metadata!r} ({METADATA_STORES})")
        if self.metadata == OXIA:
            # Pulsar's driver is the only one on Oxia, and its ledgers root is /ledgers.
            self.metadata_driver = MetadataDriver.PULSAR
        if self.external_zk is None and self.metadata == OXIA:
            self.oxia_server = OxiaServer(self.base_dir / "oxia")
            self.oxia_server.start_new_session = self.detach
            self.oxia_server.start()
        elif self.external_zk is None:
            self.zk_server = ZooKeeperServer(self.base_dir / "zookeeper")
            if self.detach:
                self.zk_server.start_new_session = True
            self.zk_server.start()
        zk = open_store(self.zk_connect, timeout=15)
        try:
            store = LedgerStore(zk, self.ledgers_root)
            store.init_cluster(driver=self.metadata_driver)
            if self.metadata_driver is MetadataDriver.BOOKKEEPER:
                UnderReplicationManager(zk, self.ledgers_root).ensure_layout()
            for i in range(self.num_bookies):
                self.add_bookie(index=i, wait=False)
            self.wait_registered(self.bookie_ids, zk, timeout)
        finally:
            zk.close()
        log.info("sandbox up: %s %s, bookies %s", zk.kind, self.zk_connect, self.bookie_ids)
        return self

    def add_bookie(self, index: int | None = None, *, wait: bool = True) -> BookieProcess:
        index = len(self.bookies) if index is None else index
        extra = ["--ledgers-root", self.ledgers_root]
        if self.pki is not None:
            extra += bookie_tls_flags(self.pki.bookie_settings())
        b = BookieProcess(
            self.zk_connect,
            self.base_dir / f"bookie-{index}",
            fault_injection=self.fault_injection,
            extra=extra,
            detach=self.detach,
        )
        b.start()
        self.bookies.append(b)
        if wait:
            self.wait_registered([b.bookie_id])
        return b

    def wait_registered(
        self, ids: list[str], zk: MetadataStore | None = None, timeout: float = 60.0
    ) -> None:
        """Block until every bookie in ``ids`` has a writable or read-only registration."""
        own = zk is None
        client = open_store(self.zk_connect, timeout=15) if zk is None else zk
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                reg = list_bookies(client, self.ledgers_root)
                if all(reg.is_available(i) for i in ids):
                    return
                time.sleep(0.1)
            raise SandboxError(f"bookies {ids} did not register within {timeout}s")
        finally:
            if own:
                client.close()

    def wait_unregistered(self, bookie_id: str, timeout: float = 60.0) -> float:
        """Block until ``bookie_id`` has no registration (a killed bookie's session expired);
        returns the seconds waited."""
        client = open_store(self.zk_connect, timeout=15)
        t0 = time.monotonic()
        try:
            while time.monotonic() - t0 < timeout:
                if not list_bookies(client, self.ledgers_root).is_available(bookie_id):
                    return time.monotonic() - t0
                time.sleep(0.1)
            raise SandboxError(f"bookie {bookie_id} still registered after {timeout}s")
        finally:
            client.close()

    def bookie(self, bookie_id: str) -> BookieProcess:
        for b in self.bookies:
            if b.bookie_id == bookie_id:
                return b
        raise KeyError(bookie_id)

    def kill_bookie(self, bookie_id: str) -> None:
        """SIGKILL one bookie; its registration goes when its store session expires."""
        self.bookie(bookie_id).kill9()

    def stop_bookie(self, bookie_id: str) -> None:
        """Stop one bookie cleanly (it unregisters at once)."""
        self.bookie(bookie_id).stop()

    def restart_bookie(self, bookie_id: str) -> None:
        b = self.bookie(bookie_id)
        b.stop()
        b.start()
        self.wait_registered([bookie_id])

    def stop(self) -> None:
        for b in self.bookies:
            b.stop()
        if self.zk_server is not None:
            self.zk_server.stop()
        if self.oxia_server is not None:
            self.oxia_server.stop()

    def __enter__(self) -> Sandbox:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- detached clusters for the CLI ----------------------------------------------------------

    def save_state(self) -> Path:
        state: SandboxState = {
            "zk": self.zk_connect,
            "ledgers_root": self.ledgers_root,
            "zk_pid": self._store_pid(),
            "bookies": [
                {"id": b.bookie_id, "pid": b.proc.pid if b.proc else None, "dir": str(b.data_dir)}
                for b in self.bookies
            ],
        }
        path = Path(self.base_dir) / STATE_FILE
        path.write_text(json.dumps(state, indent=2))
        return path

    def _store_pid(self) -> int | None:
        """The pid of the store server this sandbox started (ZooKeeper or Oxia)."""
        for server in (self.zk_server, self.oxia_server):
            if server is not None and server.proc is not None:
                return server.proc.pid
        return None


def load_state(base_dir: Path) -> SandboxState:
    path = Path(base_dir) / STATE_FILE
    if not path.exists():
        raise SandboxError(f"no sandbox in {base_dir} (missing {path})")
    state: SandboxState = json.loads(path.read_text())
    return state


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_detached(base_dir: Path, timeout: float = 15.0) -> list[str]:
    """Stop a sandbox started with ``detach=True``: bookies first, then ZooKeeper."""
    state = load_state(base_dir)
    stopped = []
    pids = [(b["id"], b["pid"]) for b in state["bookies"]]
    store = "oxia" if is_oxia(str(state["zk"])) else "zookeeper"
    pids.append((store, state["zk_pid"]))
    for name, pid in pids:
        if pid is not None and pid_alive(pid):
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            stopped.append(name)
    (Path(base_dir) / STATE_FILE).unlink(missing_ok=True)
    return stopped


def detached_status(base_dir: Path) -> dict[str, object]:
    """Which sandbox processes are alive and which bookies are registered."""
    state = load_state(base_dir)
    zk_ok = False
    locator = str(state["zk"])
    if is_oxia(locator):
        host, _, port = parse_oxia_locator(locator)[0].rpartition(":")
        with contextlib.suppress(OSError), socket.create_connection((host, int(port)), 1):
            zk_ok = True
    else:
        host, _, port = locator.partition(":")
        with contextlib.suppress(OSError):
            zk_ok = b"Mode:" in four_letter_word(host, int(port.split("/")[0]), b"srvr")
    registered: dict[str, str] = {}
    if zk_ok:
        client = open_store(locator, timeout=15)
        try:
            reg = list_bookies(client, str(state["ledgers_root"]))
            registered = {i: "writable" for i in reg.writable} | {
                i: "readonly" for i in reg.readonly
            }
        finally:
            client.close()
    bookies = [
        {
            "id": b["id"],
            "alive": pid_alive(b["pid"]),
            "registered": registered.get(b["id"], "no"),
        }
        for b in state["bookies"]
    ]
    return {"zk": state["zk"], "zk_serving": zk_ok, "bookies": bookies}
