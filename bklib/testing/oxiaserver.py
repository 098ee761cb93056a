"""A real Oxia server (``oxia standalone``) on free loopback ports, for tests and the sandbox.

Oxia is the metadata store Pulsar runs BookKeeper on since PIP-335 (``metadataServiceUri=
metadata-store:oxia://HOST:PORT/NAMESPACE``). ``scripts/install_oxia.sh`` builds the server
from its Go module into ``$BKAUDIT_CACHE/oxia/<version>/oxia``; :class:`OxiaServer` runs it
with its data and WAL under a directory of the caller's, serving the ``default`` namespace.

``oxia standalone`` (v0.14) has no TLS or authentication flags, so a server given
:class:`OxiaSecurity` runs as production does: ``oxia server`` (TLS on its public port with
``--tls-cert-file``/``--tls-key-file``, client certificates with ``--tls-trusted-ca-file``
and ``--tls-client-auth``, tokens with ``--auth-provider-name oidc --auth-provider-params``)
with an ``oxia coordinator`` that assigns it the namespace's shards (``--conf``, the file
metadata provider), both on loopback and plain text between them (the internal port).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from bklib.maven import cache_dir
from bklib.testing.ports import free_port
from bklib.testing.zkserver import terminate

log = logging.getLogger(__name__)

OXIA_VERSION = "v0.14.0-bkaudit1"
"""The server ``scripts/install_oxia.sh`` builds."""

DEFAULT_NAMESPACE = "default"
"""The one namespace a standalone server serves."""


@dataclass(frozen=True)
class OxiaSecurity:
    """TLS and authentication of the public port: ``cert``/``key`` the server's certificate
    (PEM); ``client_ca`` set, clients must present a certificate it signed
    (``--tls-client-auth``); ``oidc_issuer`` set, every call needs a token from that issuer
    for ``audience`` (``--auth-provider-name oidc``), and ``issuer_ca`` is what the server
    trusts to fetch the issuer's documents over HTTPS (``SSL_CERT_FILE``, read by Go)."""

    cert: str
    key: str
    client_ca: str | None = None
    oidc_issuer: str | None = None
    audience: str = "oxia"
    issuer_ca: str | None = None

    def server_flags(self) -> list[str]:
        """The ``oxia server`` flags for these settings."""
        flags = ["--tls-cert-file", self.cert, "--tls-key-file", self.key]
        if self.client_ca:
            flags += ["--tls-trusted-ca-file", self.client_ca, "--tls-client-auth"]
        if self.oidc_issuer:
            params = {"allowedIssueURLs": self.oidc_issuer, "allowedAudiences": self.audience}
            flags += ["--auth-provider-name", "oidc", "--auth-provider-params", json.dumps(params)]
        return flags


class OxiaUnavailable(RuntimeError):
    """The Oxia server binary is missing, or the server did not come up; says why."""


def oxia_binary() -> Path:
    """``$BKAUDIT_OXIA_BIN``, else what ``scripts/install_oxia.sh`` built."""
    return Path(os.environ.get("BKAUDIT_OXIA_BIN", cache_dir() / "oxia" / OXIA_VERSION / "oxia"))


@dataclass
class OxiaServer:
    """``oxia standalone`` under ``base_dir``, on free loopback ports."""

    base_dir: Path
    host: str = "127.0.0.1"
    port: int = 0
    metrics_port: int = 0
    shards: int = 1
    """Shards of the namespace: above 1, a client must hash keys to shards as the server does."""
    start_new_session: bool = False
    """Detach the server from our process group (``bkaudit sandbox up`` leaves it running)."""
    security: OxiaSecurity | None = None
    """TLS and tokens on the public port: ``oxia server`` with a coordinator, not standalone."""
    advertised: str | None = None
    """With :attr:`security`: the public address the coordinator gives clients for the shard
    leader, when not :attr:`address` (a test relays every connection through it)."""
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    coordinator: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        """``HOST:PORT`` of the public (client) service."""
        return f"{self.host}:{self.port}"

    def uri(self, namespace: str = DEFAULT_NAMESPACE) -> str:
        """The metadata service URI a Pulsar-configured bookie would be given."""
        return f"metadata-store:oxia://{self.address}/{namespace}"

    def locator(self, namespace: str = DEFAULT_NAMESPACE) -> str:
        """The store locator bkaudit opens (:func:`bklib.meta.stores.open_store`)."""
        return f"oxia://{self.address}/{namespace}"

    def start(self, timeout: float = 60.0) -> OxiaServer:
        """Start the server and wait until it accepts connections."""
        binary = oxia_binary()
        if not binary.is_file():
            raise OxiaUnavailable(
                f"Oxia server not found at {binary}; run scripts/install_oxia.sh (needs Go)"
            )
        self.port = self.port or free_port(self.host)
        self.metrics_port = self.metrics_port or free_port(self.host)
        data, wal = self.base_dir / "data", self.base_dir / "wal"
        data.mkdir(parents=True, exist_ok=True)
        wal.mkdir(parents=True, exist_ok=True)
        if self.security is not None:
            self._start_cluster(binary, data, wal)
        else:
            argv = [
                str(binary), "standalone",
                "-p", self.address, "-m", f"{self.host}:{self.metrics_port}",
                "--data-dir", str(data), "--wal-dir", str(wal), "--shards", str(self.shards),
            ]  # fmt: skip
            self.proc = self._spawn(argv, "oxia.log")
        self._wait_serving(timeout)
        log.info("Oxia up at %s (data %s)", self.address, self.base_dir)
        return self

    def _spawn(
        self, argv: list[str], log_name: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        out = (self.base_dir / log_name).open("ab")
        try:
            return subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=self.start_new_session,
                env=env,
            )
        finally:
            out.close()

    def _start_cluster(self, binary: Path, data: Path, wal: Path) -> None:
        """``oxia server`` with :attr:`security` and a coordinator assigning it the shards."""
        assert self.security is not None
        internal = f"{self.host}:{free_port(self.host)}"
        conf = self.base_dir / "cluster.yaml"
        conf.write_text(
            json.dumps(  # YAML is a superset of JSON
                {
                    "namespaces": [
                        {
                            "name": DEFAULT_NAMESPACE,
                            "initialShardCount": self.shards,
                            "replicationFactor": 1,
                        }
                    ],
                    "servers": [
                        {
                            "name": "s0",
                            "public": self.advertised or self.address,
                            "internal": internal,
                        }
                    ],
                }
            )
        )
        env = dict(os.environ)
        if self.security.issuer_ca:
            env["SSL_CERT_FILE"] = self.security.issuer_ca
        server_argv = [
            str(binary), "server",
            "-p", self.address, "-i", internal, "-m", f"{self.host}:{self.metrics_port}",
            "--data-dir", str(data), "--wal-dir", str(wal),
            *self.security.server_flags(),
        ]  # fmt: skip
        self.proc = self._spawn(server_argv, "oxia.log", env)
        coordinator_argv = [
            str(binary), "coordinator",
            "-i", f"{self.host}:{free_port(self.host)}",
            "-m", f"{self.host}:{free_port(self.host)}",
            "--metadata", "file",
            "--file-clusters-status-path", str(self.base_dir / "cluster-status.json"),
            "--conf", str(conf),
        ]  # fmt: skip
        self.coordinator = self._spawn(coordinator_argv, "coordinator.log")

    def _wait_serving(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for proc, what in ((self.proc, "oxia"), (self.coordinator, "coordinator")):
                if proc is not None and proc.poll() is not None:
                    self.stop()
                    name = "oxia server" if self.security else "oxia standalone"
                    raise OxiaUnavailable(
                        f"{name if what == 'oxia' else 'oxia coordinator'} exited with "
                        f"{proc.returncode}; see {self.base_dir / (what + '.log')}"
                    )
            try:
                with socket.create_connection((self.host, self.port), timeout=1.0):
                    return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise OxiaUnavailable(f"Oxia did not listen on {self.address} within {timeout}s")

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``; returns the exit status."""
        if self.coordinator is not None:
            terminate(self.coordinator, timeout)
        if self.proc is None:
            return None
        return terminate(self.proc, timeout)

    def __enter__(self) -> OxiaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
