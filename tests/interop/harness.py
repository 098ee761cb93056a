"""Processes of real Apache BookKeeper 4.17 for the interop tests.

* :func:`install` runs ``scripts/install_bookkeeper.sh`` (jars from Maven Central and our Java
  driver, cached under ``$BKAUDIT_CACHE/bookkeeper``; a no-op once stamped).
* :class:`JavaBookie` is one ``org.apache.bookkeeper.server.Main`` process (DbLedgerStorage by
  default) with its conf, data and log under a directory of the test's tmp_path.
* :class:`JavaShell` runs ``BookieShell`` commands; :class:`AutoRecovery` runs
  ``AutoRecoveryMain`` (Auditor + ReplicationWorker).
* :class:`JavaClient` talks JSON lines to our driver (scripts/java/interop-driver), one JVM
  holding BookKeeper clients for the whole session.

Java processes log to files; :func:`tail` gives their last lines for assertion messages.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient

from bklib.maven import cache_dir
from bklib.testing.ports import free_port
from bklib.testing.zkserver import terminate
from tests.interop import versions

REPO = Path(__file__).resolve().parents[2]
CONF_DIR = REPO / "scripts" / "java" / "bookkeeper"
# $BKAUDIT_BK_VERSION (tests/interop/versions.py) picks the release; default the newest 4.17.
BK_VERSION = versions.selected()
DB_STORAGE = "org.apache.bookkeeper.bookie.storage.ldb.DbLedgerStorage"
SORTED_STORAGE = "org.apache.bookkeeper.bookie.SortedLedgerStorage"
# Small JVMs: the whole matrix runs on 2 cores next to ZooKeeper, Python bookies and Spark.
JVM_OPTS = [
    "-Xms64m",
    "-Xmx256m",
    "-XX:MaxDirectMemorySize=256m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Xshare:auto",
    "-Djava.net.preferIPv4Stack=true",
    "-Dio.netty.leakDetection.level=disabled",
]


class JavaUnavailable(RuntimeError):
    """Java, Maven or the BookKeeper jars are missing and could not be installed."""


class JavaClientError(Exception):
    """The Java client failed an operation: ``code`` is its BKException code."""

    def __init__(self, code: int, name: str, message: str) -> None:
        super().__init__(f"{name} ({code}): {message}")
        self.code = code
        self.name = name


def bk_home(version: str = BK_VERSION) -> Path:
    return cache_dir() / "bookkeeper" / version


def install(version: str = BK_VERSION) -> str:
    """Make sure BookKeeper ``version``'s jars and the driver are in the cache; return the
    classpath."""
    if shutil.which("java") is None and shutil.which("apt-get") is None:
        raise JavaUnavailable("java not found on PATH")
    res = subprocess.run(
        [str(REPO / "scripts" / "install_bookkeeper.sh")],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "BK_VERSION": version},
    )
    if res.returncode != 0:
        raise JavaUnavailable(
            f"scripts/install_bookkeeper.sh failed ({res.returncode}):\n{res.stderr[-3000:]}"
        )
    # The script prints the classpath last: the driver's classes live in a directory per
    # source hash under bk_home(version), so concurrent runs never rebuild classes in use.
    return res.stdout.strip().splitlines()[-1]


def tail(path: Path, n: int = 60) -> str:
    """The last ``n`` lines of a log file (for assertion messages)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except FileNotFoundError:
        return f"(no log at {path})"


def metadata_uri(connect: str, root: str = "/ledgers") -> str:
    """BookKeeper's metadataServiceUri for a kazoo connect string ``host:port[/chroot]``: the
    chroot becomes part of the ledgers root path, as BookKeeper has no chroot of its own."""
    hosts, _, chroot = connect.partition("/")
    path = f"/{chroot}{root}" if chroot else root
    return f"zk+hierarchical://{hosts}{path}"


def spawn_logged(cmd: Sequence[str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start ``cmd`` with its output appended to ``log_path`` and no standard input."""
    with open(log_path, "ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def write_conf(path: Path, values: Mapping[str, object]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    return path


def _java() -> str:
    java = shutil.which("java")
    if java is None:
        raise JavaUnavailable("java not found on PATH")
    return java


def java_command(
    classpath: str,
    main: str,
    args: Sequence[str],
    log4j: str = "log4j2.xml",
    jvm: Sequence[str] = JVM_OPTS,
) -> list[str]:
    """``java <jvm options> -cp <classpath> <main> <args>`` with our log4j2 configuration."""
    return [
        _java(),
        *jvm,
        f"-Dlog4j.configurationFile={CONF_DIR / log4j}",
        "-cp",
        classpath,
        main,
        *args,
    ]


def bookies_cpu(bookies: Iterable[JavaBookie]) -> float:
    """CPU seconds (user + system) the live bookie processes have used so far (from /proc):
    benches report it beside wall times, since bookies and tools share the machine's cores."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for b in bookies:
        if b.alive() and b.proc is not None:
            fields = Path(f"/proc/{b.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def children_cpu() -> float:
    """CPU seconds used so far by this process's finished (waited-for) child processes: the
    tool a bench just ran."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


class JavaBookie:
    """One Java bookie process. Its id is ``127.0.0.1:<port>``."""

    def __init__(
        self,
        classpath: str,
        uri: str,
        base: Path,
        *,
        port: int | None = None,
        storage: str = DB_STORAGE,
        extra: Mapping[str, object] | None = None,
        jvm: Sequence[str] = JVM_OPTS,
    ) -> None:
        self.classpath = classpath
        self.uri = uri
        self.jvm = list(jvm)
        self.port = port or free_port()
        self.dir = Path(base)
        self.log_path = self.dir / "bookie.log"
        self.storage = storage
        self.extra = dict(extra or {})
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bookie_id(self) -> str:
        return f"127.0.0.1:{self.port}"

    def conf(self) -> dict[str, object]:
        return {
            "metadataServiceUri": self.uri,
            "bookiePort": self.port,
            "advertisedAddress": "127.0.0.1",
            "allowLoopback": "true",
            "useHostNameAsBookieID": "false",
            "journalDirectories": self.dir / "journal",
            "ledgerDirectories": self.dir / "ledgers",
            "ledgerStorageClass": self.storage,
            "httpServerEnabled": "false",
            "enableStatistics": "false",
            "zkTimeout": 10000,
            # Small caches (default: a quarter of direct memory each).
            "dbStorage_writeCacheMaxSizeMb": 16,
            "dbStorage_readAheadCacheMaxSizeMb": 8,
            "dbStorage_rocksDB_blockCacheSize": 8 * 1024 * 1024,
            "journalPreAllocSizeMB": 4,
            "journalWriteBufferSizeKB": 64,
            "skipListSizeLimit": 8 * 1024 * 1024,
            "entryLogSizeLimit": 64 * 1024 * 1024,
            "serverNumIOThreads": 2,
            "numAddWorkerThreads": 1,
            "numReadWorkerThreads": 2,
            "diskUsageThreshold": 0.99,
            "diskUsageWarnThreshold": 0.98,
            "gcWaitTime": 3600000,
            **self.extra,
        }

    def spawn(self) -> None:
        """Start the process (without waiting)."""
        conf = write_conf(self.dir / "bk_server.conf", self.conf())
        cmd = java_command(
            self.classpath, "org.apache.bookkeeper.server.Main", ["--conf", str(conf)], jvm=self.jvm
        )
        self.proc = spawn_logged(cmd, self.log_path)

    def wait_registered(self, zk: KazooClient, root: str = "/ledgers", timeout: float = 90) -> None:
        """Until the bookie's registration znode (writable or read-only) exists."""
        deadline = time.monotonic() + timeout
        paths = [
            f"{root}/available/{self.bookie_id}",
            f"{root}/available/readonly/{self.bookie_id}",
        ]
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"Java bookie {self.bookie_id} exited:\n{tail(self.log_path)}")
            if any(zk.exists(p) for p in paths):
                return
            time.sleep(0.1)  # readiness polling
        raise RuntimeError(f"Java bookie {self.bookie_id} did not register:\n{tail(self.log_path)}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        """SIGKILL: a crash (its registration goes when the ZooKeeper session expires)."""
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 20) -> None:
        if self.proc is not None:
            terminate(self.proc, timeout)

    def log_tail(self, n: int = 60) -> str:
        return tail(self.log_path, n)


def start_bookies(bookies: Iterable[JavaBookie], zk: KazooClient, root: str = "/ledgers") -> None:
    """Start several bookies in parallel and wait until all are registered."""
    bookies = list(bookies)
    for b in bookies:
        b.spawn()
    for b in bookies:
        b.wait_registered(zk, root)


def wait_port_free(port: int, timeout: float = 20) -> None:
    """Until nothing listens on ``port`` (a restarted bookie must be able to bind it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        except OSError:
            return
        time.sleep(0.1)


class JavaShell:
    """``BookieShell -conf <file> <command> ...`` against one cluster."""

    def __init__(self, classpath: str, uri: str, base: Path, jvm: Sequence[str] = JVM_OPTS) -> None:
        self.classpath = classpath
        self.jvm = list(jvm)
        self.conf = write_conf(
            Path(base) / "shell.conf",
            {"metadataServiceUri": uri, "zkTimeout": 10000, "allowLoopback": "true"},
        )
        self.log_path = Path(base) / "shell.log"

    def run(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run one shell command; its INFO output (the command's result) is on stdout."""
        cmd = java_command(
            self.classpath,
            "org.apache.bookkeeper.bookie.BookieShell",
            ["-conf", str(self.conf), *args],
            log4j="log4j2-shell.xml",
            jvm=self.jvm,
        )
        res = subprocess.run(
            cmd, capture_output=True, text=True, input=input, timeout=timeout, check=False
        )
        with open(self.log_path, "a") as log:
            log.write(f"$ shell {' '.join(args)}  -> {res.returncode}\n{res.stdout}{res.stderr}\n")
        if check and res.returncode != 0:
            raise AssertionError(
                f"shell {' '.join(args)} exited {res.returncode}:\n{res.stdout[-3000:]}\n"
                f"{res.stderr[-3000:]}"
            )
        return res


class AutoRecovery:
    """``AutoRecoveryMain``: a Java Auditor and ReplicationWorker for one cluster."""

    def __init__(
        self,
        classpath: str,
        uri: str,
        base: Path,
        extra: Mapping[str, object] | None = None,
        jvm: Sequence[str] = JVM_OPTS,
    ) -> None:
        self.classpath = classpath
        self.jvm = list(jvm)
        self.dir = Path(base)
        self.log_path = self.dir / "autorecovery.log"
        self.conf = write_conf(
            self.dir / "autorecovery.conf",
            {
                "metadataServiceUri": uri,
                "zkTimeout": 10000,
                "allowLoopback": "true",
                "useHostNameAsBookieID": "false",
                "httpServerEnabled": "false",
                **(extra or {}),
            },
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        cmd = java_command(
            self.classpath,
            "org.apache.bookkeeper.replication.AutoRecoveryMain",
            ["--conf", str(self.conf)],
            jvm=self.jvm,
        )
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def stop(self) -> None:
        if self.proc is not None:
            terminate(self.proc, 20)

    def log_tail(self, n: int = 80) -> str:
        return tail(self.log_path, n)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


class JavaClient:
    """Our Java driver (BookKeeper 4.17 client) as a child process speaking JSON lines."""

    def __init__(self, classpath: str, base: Path, jvm: Sequence[str] = JVM_OPTS) -> None:
        self.log_path = Path(base) / "java-client.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(
            java_command(classpath, "io.bkaudit.interop.Driver", [], jvm=jvm),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            bufsize=1,
        )
        self._lock = threading.Lock()
        first = self._readline(60)
        if json.loads(first) != {"ready": True}:
            raise RuntimeError(f"Java driver did not start: {first!r}\n{self.log_tail()}")

    def _readline(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        box: list[str] = []
        reader = threading.Thread(target=lambda: box.append(self.proc.stdout.readline()))  # type: ignore[union-attr]
        reader.start()
        reader.join(timeout)
        if not box or not box[0]:
            raise RuntimeError(f"no reply from the Java driver in {timeout}s:\n{self.log_tail()}")
        return box[0]

    def call(self, cmd: str, timeout: float = 120, **req: Any) -> dict[str, Any]:
        """Send one request; raise :class:`JavaClientError` if the Java client failed it."""
        with self._lock:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps({"cmd": cmd, **req}) + "\n")
            self.proc.stdin.flush()
            reply = json.loads(self._readline(timeout))
        if "error" in reply:
            raise JavaClientError(reply["error"], reply["name"], reply["message"])
        return reply

    # conveniences over call()

    def write(
        self,
        uri: str,
        payloads: Sequence[bytes],
        *,
        ensemble: int = 3,
        write_quorum: int = 2,
        ack_quorum: int = 2,
        digest: str = "CRC32C",
        password: bytes = b"pwd",
        close: bool = True,
        bookies: Sequence[str] | None = None,
        custom: Mapping[str, bytes] | None = None,
        pipelined: bool = False,
        v2: bool = False,
    ) -> int:
        """Create a ledger, add ``payloads`` (one by one, or all in flight with
        ``pipelined``), close it unless ``close=False``; its id."""
        req: dict[str, Any] = {
            "uri": uri,
            "ensemble": ensemble,
            "writeQuorum": write_quorum,
            "ackQuorum": ack_quorum,
            "digest": digest,
            "password": b64(password),
            "payloads": [b64(p) for p in payloads],
            "close": close,
            "custom": {k: b64(v) for k, v in (custom or {}).items()},
            "pipelined": pipelined,
            "v2": v2,
        }
        if bookies is not None:
            req["bookies"] = list(bookies)
        reply = self.call("write", **req)
        assert reply["lastEntryId"] == len(payloads) - 1, reply
        return int(reply["ledgerId"])

    def add(self, ledger_id: int, payloads: Sequence[bytes]) -> dict[str, Any]:
        return self.call("add", ledgerId=ledger_id, payloads=[b64(p) for p in payloads])

    def read(
        self,
        uri: str,
        ledger_id: int,
        *,
        password: bytes = b"pwd",
        digest: str = "CRC32C",
        recovery: bool = False,
        v2: bool = False,
    ) -> tuple[list[bytes], dict[str, Any]]:
        """Every entry up to lastEntryId (or the LAC of an open ledger) and the reply."""
        reply = self.call(
            "read",
            uri=uri,
            ledgerId=ledger_id,
            password=b64(password),
            digest=digest,
            recovery=recovery,
            v2=v2,
        )
        return [unb64(e) for e in reply["entries"]], reply

    def metadata(self, uri: str, ledger_id: int) -> dict[str, Any]:
        return self.call("metadata", uri=uri, ledgerId=ledger_id)

    def log_tail(self, n: int = 60) -> str:
        self._log.flush()
        return tail(self.log_path, n)

    def __enter__(self) -> JavaClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            assert self.proc.stdin is not None
            self.proc.stdin.write('{"cmd": "exit"}\n')
            self.proc.stdin.flush()
            self.proc.wait(20)
        terminate(self.proc, 5)
        self._log.close()


def payloads(tag: str, n: int, size: int = 100) -> list[bytes]:
    """Distinct, checkable payloads: ``<tag>:<i>:`` followed by bytes derived from ``i``."""
    out = []
    for i in range(n):
        head = f"{tag}:{i}:".encode()
        body = bytes((i * 31 + j) % 251 for j in range(max(0, size - len(head) + (i % 7))))
        out.append(head + body)
    return out
