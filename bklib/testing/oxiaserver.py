"""A real Oxia server (``oxia standalone``) on free loopback ports, for tests and the sandbox.

Oxia is the metadata store Pulsar runs BookKeeper on since PIP-335 (``metadataServiceUri=
metadata-store:oxia://HOST:PORT/NAMESPACE``). ``scripts/install_oxia.sh`` builds the server
from its Go module into ``$BKAUDIT_CACHE/oxia/<version>/oxia``; :class:`OxiaServer` runs it
with its data and WAL under a directory of the caller's, serving the ``default`` namespace.
"""

from __future__ import annotations

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
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

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
        argv = [
            str(binary), "standalone",
            "-p", self.address, "-m", f"{self.host}:{self.metrics_port}",
            "--data-dir", str(data), "--wal-dir", str(wal), "--shards", str(self.shards),
        ]  # fmt: skip
        out = (self.base_dir / "oxia.log").open("ab")
        try:
            self.proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=self.start_new_session,
            )
        finally:
            out.close()
        self._wait_serving(timeout)
        log.info("Oxia up at %s (data %s)", self.address, self.base_dir)
        return self

    def _wait_serving(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise OxiaUnavailable(
                    f"oxia standalone exited with {self.proc.returncode}; "
                    f"see {self.base_dir / 'oxia.log'}"
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
        if self.proc is None:
            return None
        return terminate(self.proc, timeout)

    def __enter__(self) -> OxiaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
