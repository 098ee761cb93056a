"""Runs a real standalone ZooKeeper server process (Apache ZooKeeper from Maven Central).

Used by the test fixtures and the sandbox. The jars are fetched from Maven Central by
:mod:`bklib.testing.zookeeper_dist` into ``$BKAUDIT_CACHE/zookeeper/lib``.

A secured server (:class:`ServerTls`, ``sasl_users``) adds a TLS ``secureClientPort`` on the
Netty connection factory with PEM key and trust stores, and SASL DIGEST-MD5 from a JAAS
``Server`` section, enforced for every session (``enforce.auth.schemes=sasl``). The plaintext
``clientPort`` stays for the readiness check (four-letter words need no auth); with SASL
enforced it serves nothing else to a client without credentials.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bklib.meta.stores.zookeeper.connect_string import format_server
from bklib.testing.ports import free_port
from bklib.testing.zookeeper_dist import is_complete, zookeeper_lib

if TYPE_CHECKING:
    from bklib.meta.stores.zookeeper.security import ZkAuth

log = logging.getLogger(__name__)


class ZooKeeperUnavailable(RuntimeError):
    """No ZooKeeper server can be started here (jars or Java missing, or it did not come up)."""


JAVA_MISSING = (
    "java not found on PATH: ZooKeeper needs a Java 11+ runtime "
    "(e.g. apt-get install openjdk-17-jre-headless)"
)


def zookeeper_classpath() -> str:
    """Classpath of the ZooKeeper server jars, or raise with the command that fetches them."""
    lib = zookeeper_lib()
    if not is_complete(lib) and not any(lib.glob("zookeeper-*.jar")):
        raise ZooKeeperUnavailable(
            f"ZooKeeper jars not found in {lib}; run python -m bklib.testing.zookeeper_dist"
        )
    return f"{lib}/*"


def four_letter_word(host: str, port: int, word: bytes = b"ruok", timeout: float = 1.0) -> bytes:
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(word)
        chunks = []
        while True:
            data = s.recv(4096)
            if not data:
                break
            chunks.append(data)
        return b"".join(chunks)


def terminate(proc: subprocess.Popen[bytes], timeout: float) -> int:
    """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL; returns the exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


@dataclass(frozen=True)
class ServerTls:
    """The server side of ZooKeeper TLS: ``key_store`` is one PEM file holding the server's
    private key (PKCS#8) and certificate chain, ``trust_store`` the PEM CA certificates client
    certificates must chain to; ``client_auth`` is ZooKeeper's ``ssl.clientAuth`` (none,
    want, need)."""

    key_store: Path
    trust_store: Path
    client_auth: str = "need"


def _jaas_quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _listening(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=1.0).close()
    except OSError:
        return False
    return True


class ZooKeeperServer:
    """One standalone ZooKeeper server on loopback, with its data under ``data_dir``;
    optionally with a TLS secure port (``tls``) and SASL DIGEST-MD5 required for every
    session (``sasl_users``: user -> password). ``host`` is the address it listens on
    (``clientPortAddress``): ``::1`` serves IPv6 loopback alone."""

    def __init__(
        self,
        data_dir: str | Path,
        port: int = 0,
        host: str = "127.0.0.1",
        *,
        tls: ServerTls | None = None,
        sasl_users: Mapping[str, str] | None = None,
        heap: str = "512m",
    ) -> None:
        self.data_dir = Path(data_dir)
        self.heap = heap  # the scale harness's million znodes need about 2 GB
        self.host = host
        self.port = port or free_port(host)
        self.tls = tls
        self.secure_port = free_port(host) if tls is not None else None
        self.sasl_users = dict(sasl_users or {})
        self.proc: subprocess.Popen[bytes] | None = None
        # Detached servers (``bkaudit sandbox up``) must outlive the command that started them.
        self.start_new_session = False

    @property
    def connect_string(self) -> str:
        """``host:clientPort``, an IPv6 host in brackets (``[::1]:2181``)."""
        return format_server(self.host, self.port)

    @property
    def secure_connect_string(self) -> str:
        """``host:secureClientPort`` (TLS only)."""
        if self.secure_port is None:
            raise ValueError("this ZooKeeper has no TLS port")
        return format_server(self.host, self.secure_port)

    def _security_config(self) -> tuple[list[str], list[str]]:
        """(zoo.cfg lines, JVM flags) for TLS and SASL. zoo.cfg keys ZooKeeper does not know
        become ``zookeeper.<key>`` system properties, which is where the ssl.* and
        authProvider.* settings are read from."""
        cfg: list[str] = []
        jvm: list[str] = []
        if self.tls is not None:
            cfg += [
                f"secureClientPort={self.secure_port}",
                f"secureClientPortAddress={self.host}",
                "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
                f"ssl.keyStore.location={self.tls.key_store}",
                "ssl.keyStore.type=PEM",
                f"ssl.trustStore.location={self.tls.trust_store}",
                "ssl.trustStore.type=PEM",
                f"ssl.clientAuth={self.tls.client_auth}",
            ]
        if self.sasl_users:
            jaas = self.data_dir / "jaas-server.conf"
            users = "\n".join(
                f"  user_{u}={_jaas_quote(p)}" for u, p in sorted(self.sasl_users.items())
            )
            jaas.write_text(
                "Server {\n  org.apache.zookeeper.server.auth.DigestLoginModule required\n"
                f"{users};\n}};\n"
            )
            jaas.chmod(0o600)
            jvm.append(f"-Djava.security.auth.login.config={jaas}")
            cfg += [
                "authProvider.sasl=org.apache.zookeeper.server.auth.SASLAuthenticationProvider",
                "enforce.auth.enabled=true",
                "enforce.auth.schemes=sasl",
            ]
        return cfg, jvm

    def start(self, timeout: float = 60.0) -> ZooKeeperServer:
        java = shutil.which("java")
        if java is None:
            raise ZooKeeperUnavailable(JAVA_MISSING)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cfg = self.data_dir / "zoo.cfg"
        secure_cfg, secure_jvm = self._security_config()
        cfg.write_text(
            "\n".join(
                [
                    "tickTime=500",
                    "initLimit=10",
                    "syncLimit=5",
                    f"dataDir={self.data_dir / 'data'}",
                    f"clientPort={self.port}",
                    f"clientPortAddress={self.host}",
                    "maxClientCnxns=0",
                    # Short minimum session so expiry tests run fast; clients may ask for more.
                    "minSessionTimeout=1000",
                    "maxSessionTimeout=60000",
                    "admin.enableServer=false",
                    "4lw.commands.whitelist=ruok,stat,srvr,mntr,cons",
                    "autopurge.purgeInterval=0",
                    *secure_cfg,
                ]
            )
            + "\n"
        )
        logf = open(self.data_dir / "zookeeper.log", "ab")  # noqa: SIM115 - owned by the process
        cmd = [
            java,
            f"-Xmx{self.heap}",
            "-XX:+UseSerialGC",
            "-Dzookeeper.jmx.log4j.disable=true",
            *secure_jvm,
            "-cp",
            zookeeper_classpath(),
            "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            str(cfg),
        ]
        self.proc = subprocess.Popen(
            cmd,
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=self.start_new_session,
        )
        logf.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ZooKeeperUnavailable(
                    f"ZooKeeper exited with {self.proc.returncode}; "
                    f"see {self.data_dir}/zookeeper.log"
                )
            with contextlib.suppress(OSError):
                # ruok answers imok before the server can serve; srvr shows Mode: once it can.
                if b"Mode:" in four_letter_word(self.host, self.port, b"srvr") and (
                    self.secure_port is None or _listening(self.host, self.secure_port)
                ):
                    log.info("ZooKeeper up at %s (data %s)", self.connect_string, self.data_dir)
                    return self
            time.sleep(0.1)
        self.stop()
        raise ZooKeeperUnavailable(f"ZooKeeper did not answer on {self.connect_string}")

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is not None:
            terminate(self.proc, timeout)
        self.proc = None

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    @contextlib.contextmanager
    def private_chroot(self, prefix: str = "t", auth: ZkAuth = None) -> Iterator[str]:
        """A connect string ``host:port/<prefix>-<random>`` whose subtree is created now and
        deleted afterwards, so tests and sandboxes can share one server. With ``auth`` (a
        :class:`~bklib.meta.stores.zookeeper.ZkAccess` using TLS: the secure port) the chroot
        is created and wiped through that access."""
        from bklib.meta.stores.zookeeper.security import ZkAccess
        from bklib.testing.zkclient import connect

        chroot = f"/{prefix}-{uuid.uuid4().hex[:12]}"
        hosts = (
            self.secure_connect_string if ZkAccess.of(auth).tls is not None else self.connect_string
        )
        admin = connect(hosts, timeout=15, auth=auth)
        admin.ensure_path(chroot)
        try:
            yield f"{hosts}{chroot}"
        finally:
            admin.delete(chroot, recursive=True)
            admin.stop()
            admin.close()

    def next_session_id(self) -> int:
        """The id ZooKeeper gives a new session now. A standalone server hands out session
        ids from one counter (ZooKeeper's ``SessionTrackerImpl``: +1 per session created), so
        the difference of two of these, less one for the first probe's own session, is the
        number of sessions every client created in between: ZooKeeper's own count, the
        short-lived ones included."""
        from bklib.testing.zkclient import connect

        probe = connect(self.connect_string, timeout=15)
        try:
            return int(probe.client_id[0])
        finally:
            probe.stop()
            probe.close()

    def connections(self) -> list[dict[str, str]]:
        """The client connections ZooKeeper holds now (the ``cons`` four-letter word): each
        with the client's ``address`` (``host:port`` as the server sees it), ``sid`` and
        ``recved`` (requests received on it)."""
        host = self.host.strip("[]")
        text = four_letter_word(host, self.port, b"cons", timeout=5.0).decode(errors="replace")
        out = []
        for line in text.splitlines():
            m = re.match(r"\s*/(.+?):(\d+)\[\d+\]\((.*)\)", line)
            if m is None:
                continue
            fields = dict(kv.split("=", 1) for kv in m.group(3).split(",") if "=" in kv)
            out.append(
                {
                    "address": f"{m.group(1)}:{m.group(2)}",
                    "sid": fields.get("sid", ""),
                    "recved": fields.get("recved", "0"),
                }
            )
        return out

    def requests_on(self, ports: set[int]) -> int:
        """Requests this server has received on the open connections from these local
        ``ports`` (the ``recved`` of each in ``cons``): one process's, when they are its."""
        conns = self.connections()
        return sum(int(c["recved"]) for c in conns if int(c["address"].rsplit(":", 1)[1]) in ports)

    def __enter__(self) -> ZooKeeperServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
