"""Runs a real standalone ZooKeeper server process (Apache ZooKeeper from Maven Central).

Used by the test fixtures and the sandbox. The jars are resolved by
``scripts/install_java_deps.sh`` into ``$BKAUDIT_CACHE/zookeeper/lib``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)


class ZooKeeperUnavailable(RuntimeError):
    """No ZooKeeper server can be started here (jars or Java missing, or it did not come up)."""


def cache_dir() -> Path:
    return Path(os.environ.get("BKAUDIT_CACHE", Path.home() / ".cache" / "bkaudit"))


def zookeeper_classpath() -> str:
    """Classpath of the ZooKeeper server jars, or raise with the command that installs them."""
    lib = Path(os.environ.get("BKAUDIT_ZOOKEEPER_LIB", cache_dir() / "zookeeper" / "lib"))
    if not lib.is_dir() or not any(lib.glob("zookeeper-*.jar")):
        raise ZooKeeperUnavailable(
            f"ZooKeeper jars not found in {lib}; run scripts/install_java_deps.sh (make java-deps)"
        )
    return f"{lib}/*"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


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


class ZooKeeperServer:
    """One standalone ZooKeeper server on loopback, with its data under ``data_dir``."""

    def __init__(self, data_dir: str | Path, port: int = 0, host: str = "127.0.0.1") -> None:
        self.data_dir = Path(data_dir)
        self.host = host
        self.port = port or free_port(host)
        self.proc: subprocess.Popen[bytes] | None = None
        # Detached servers (``bkaudit sandbox up``) must outlive the command that started them.
        self.start_new_session = False

    @property
    def connect_string(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 60.0) -> ZooKeeperServer:
        java = shutil.which("java")
        if java is None:
            raise ZooKeeperUnavailable("java not found on PATH (run scripts/install_java_deps.sh)")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cfg = self.data_dir / "zoo.cfg"
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
                    "4lw.commands.whitelist=ruok,stat,srvr,mntr",
                    "autopurge.purgeInterval=0",
                ]
            )
            + "\n"
        )
        logf = open(self.data_dir / "zookeeper.log", "ab")  # noqa: SIM115 - owned by the process
        cmd = [
            java,
            "-Xmx512m",
            "-XX:+UseSerialGC",
            "-Dzookeeper.jmx.log4j.disable=true",
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
                if b"Mode:" in four_letter_word(self.host, self.port, b"srvr"):
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
    def private_chroot(self, prefix: str = "t") -> Iterator[str]:
        """A connect string ``host:port/<prefix>-<random>`` whose subtree is created now and
        deleted afterwards, so tests and sandboxes can share one server."""
        from kazoo.client import KazooClient

        chroot = f"/{prefix}-{uuid.uuid4().hex[:12]}"
        admin = KazooClient(hosts=self.connect_string, timeout=10)
        admin.start(timeout=15)
        admin.ensure_path(chroot)
        try:
            yield f"{self.connect_string}{chroot}"
        finally:
            admin.delete(chroot, recursive=True)
            admin.stop()
            admin.close()

    def __enter__(self) -> ZooKeeperServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
