"""Processes of a real Apache Pulsar 4.0 for the tests, from Maven Central's jars.

* :func:`install` runs ``scripts/install_pulsar.sh`` (``org.apache.pulsar:pulsar-broker`` and its
  runtime jars, cached under ``$BKAUDIT_CACHE/pulsar``; a no-op once stamped) and returns the
  classpath. The same classpath runs the broker, ``PulsarClusterMetadataSetup`` and Java bookies
  (BookKeeper at the version Pulsar pins), on either metadata driver.
* :func:`cluster_metadata_setup` is ``bin/pulsar initialize-cluster-metadata``.
* :func:`bookkeeper_uri` is a ``metadataServiceUri`` for Pulsar's driver
  (``metadata-store:zk:HOST:PORT[/chroot]``, ``pulsar-metadata``) or BookKeeper's own
  (``zk+hierarchical://HOST:PORT[/chroot]/ledgers``); :func:`java_bookie` makes a
  :class:`~tests.interop.harness.JavaBookie` that can load either.
* :class:`PulsarBroker` is one ``PulsarBrokerStarter`` with a generated minimal ``broker.conf``
  on free loopback ports, small and gentle on two cores.
* :func:`pulsar_cluster` puts them together: metadata, bookies, a broker.

Java processes log to files under the test's tmp dir; :func:`~tests.interop.harness.tail` gives
their last lines for assertion messages.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from kazoo.client import KazooClient

from bklib.maven import cache_dir
from bklib.testing.ports import free_port
from bklib.testing.zkserver import terminate
from tests.interop.harness import (
    DB_STORAGE,
    JVM_OPTS,
    JavaBookie,
    JavaShell,
    JavaUnavailable,
    java_command,
    metadata_uri,
    spawn_logged,
    tail,
    write_conf,
)

REPO = Path(__file__).resolve().parents[2]
# The default of scripts/install_pulsar.sh: the newest 4.0.x whose artifacts are all on Maven
# Central (4.0.8's pom is listed there, but some of its modules are not).
PULSAR_VERSION = os.environ.get("BKAUDIT_PULSAR_VERSION", "4.0.7")
DEFAULT_CLUSTER = "bkaudit-test"
LEDGERS_ROOT = "/ledgers"

# Pulsar's BookKeeper metadata driver (pulsar-metadata). BookKeeper loads the drivers named in
# these system properties, as Pulsar's bin/pulsar and bin/bookkeeper set them; then
# ``metadata-store:`` URIs resolve to them. Harmless with a zk+hierarchical:// URI.
PULSAR_CLIENT_DRIVER = "org.apache.pulsar.metadata.bookkeeper.PulsarMetadataClientDriver"
PULSAR_BOOKIE_DRIVER = "org.apache.pulsar.metadata.bookkeeper.PulsarMetadataBookieDriver"
DRIVER_PROPS = [
    f"-Dbookkeeper.metadata.client.drivers={PULSAR_CLIENT_DRIVER}",
    f"-Dbookkeeper.metadata.bookie.drivers={PULSAR_BOOKIE_DRIVER}",
]
# What bin/pulsar opens on Java 17 (Netty's direct buffers, the load manager's OS metrics).
ADD_OPENS = [
    "--add-opens=java.base/java.io=ALL-UNNAMED",
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.misc=ALL-UNNAMED",
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-opens=java.base/java.util.zip=ALL-UNNAMED",
    "--add-opens=java.management/sun.management=ALL-UNNAMED",
    "--add-opens=jdk.management/com.sun.management.internal=ALL-UNNAMED",
    "-Dio.netty.tryReflectionSetAccessible=true",
]
# A bookie on either driver: the interop bookies' small JVM plus the driver properties.
BOOKIE_JVM = [*JVM_OPTS, *DRIVER_PROPS]
# Tools (metadata setup, the BookKeeper shell): short-lived, C1 only.
TOOL_JVM = [*JVM_OPTS, *ADD_OPENS, *DRIVER_PROPS]
# The broker: small heap and direct memory, serial GC, C1 only (a fraction of the CPU to start).
BROKER_JVM = [
    "-Xms64m",
    "-Xmx384m",
    "-XX:MaxDirectMemorySize=256m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Xshare:auto",
    "-Djava.net.preferIPv4Stack=true",
    "-Dio.netty.leakDetection.level=disabled",
    "-Dpulsar.allocator.exit_on_oom=true",
    *ADD_OPENS,
    *DRIVER_PROPS,
]

Driver = Literal["pulsar", "zk"]


def pulsar_home(version: str = PULSAR_VERSION) -> Path:
    return cache_dir() / "pulsar" / version


def install(version: str = PULSAR_VERSION) -> str:
    """Make sure Pulsar ``version``'s jars are in the cache; return the classpath."""
    if shutil.which("java") is None and shutil.which("apt-get") is None:
        raise JavaUnavailable("java not found on PATH")
    res = subprocess.run(
        [str(REPO / "scripts" / "install_pulsar.sh")],
        capture_output=True,
        text=True,
        timeout=1200,
        env={**os.environ, "PULSAR_VERSION": version},
        check=False,
    )
    if res.returncode != 0:
        raise JavaUnavailable(
            f"scripts/install_pulsar.sh failed ({res.returncode}):\n{res.stderr[-3000:]}"
        )
    return res.stdout.strip().splitlines()[-1]


def metadata_store_url(connect: str) -> str:
    """Pulsar's metadata store URL for a kazoo connect string ``host:port[/chroot]``."""
    return f"zk:{connect}"


def bookkeeper_uri(connect: str, driver: Driver = "pulsar") -> str:
    """A BookKeeper ``metadataServiceUri`` for the cluster whose ZooKeeper is ``connect``
    (``host:port[/chroot]``), its ledgers under ``<chroot>/ledgers`` either way:

    * ``"pulsar"``: ``metadata-store:zk:host:port[/chroot]``, Pulsar's driver (the ledgers root
      is BookKeeper's ``zkLedgersRootPath``, ``/ledgers`` by default, inside the chroot);
    * ``"zk"``: ``zk+hierarchical://host:port[/chroot]/ledgers``, BookKeeper's own.
    """
    if driver == "pulsar":
        return f"metadata-store:{metadata_store_url(connect)}"
    if driver == "zk":
        return metadata_uri(connect, LEDGERS_ROOT)
    raise ValueError(f"unknown metadata driver {driver!r}")


def java_bookie(
    classpath: str,
    uri: str,
    base: Path,
    *,
    port: int | None = None,
    storage: str = DB_STORAGE,
    extra: Mapping[str, object] | None = None,
) -> JavaBookie:
    """A Java bookie on Pulsar's classpath that loads Pulsar's driver for ``metadata-store:``
    URIs (and BookKeeper's for ``zk+hierarchical://``)."""
    return JavaBookie(classpath, uri, base, port=port, storage=storage, extra=extra, jvm=BOOKIE_JVM)


def _run_logged(
    cmd: Sequence[str], log_path: Path, what: str, timeout: float
) -> subprocess.CompletedProcess[str]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(
        list(cmd),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    with open(log_path, "a") as log:
        log.write(f"$ {what} -> {res.returncode}\n{res.stdout}{res.stderr}\n")
    if res.returncode != 0:
        raise RuntimeError(f"{what} exited {res.returncode}:\n{tail(log_path)}")
    return res


def cluster_metadata_setup(
    classpath: str,
    zk_connect: str,
    cluster: str = DEFAULT_CLUSTER,
    *,
    web_service_url: str = "http://127.0.0.1:8080",
    broker_service_url: str = "pulsar://127.0.0.1:6650",
    configuration_store: str | None = None,
    existing_bk_uri: str | None = None,
    bundles: int = 4,
    log_dir: Path | None = None,
    timeout: float = 180,
) -> subprocess.CompletedProcess[str]:
    """``PulsarClusterMetadataSetup`` (``bin/pulsar initialize-cluster-metadata``) on the
    ZooKeeper ``zk_connect`` (``host:port[/chroot]``): the cluster, the ``public`` tenant and
    ``public/default``, and, unless ``existing_bk_uri`` names an initialised BookKeeper cluster,
    BookKeeper's metadata under ``<chroot>/ledgers`` through Pulsar's driver.

    ``configuration_store`` (a connect string too) defaults to the same ZooKeeper. Its output
    goes to ``log_dir/metadata-setup.log``; a failure raises with its tail.
    """
    args = [
        "--cluster",
        cluster,
        "--metadata-store",
        metadata_store_url(zk_connect),
        "--configuration-metadata-store",
        metadata_store_url(configuration_store or zk_connect),
        "--web-service-url",
        web_service_url,
        "--broker-service-url",
        broker_service_url,
        "--default-namespace-bundle-number",
        str(bundles),
    ]
    if existing_bk_uri is not None:
        args += ["--existing-bk-metadata-service-uri", existing_bk_uri]
    cmd = java_command(
        classpath, "org.apache.pulsar.PulsarClusterMetadataSetup", args, jvm=TOOL_JVM
    )
    log_path = (log_dir or Path.cwd()) / "metadata-setup.log"
    return _run_logged(cmd, log_path, "initialize-cluster-metadata", timeout)


def init_bookkeeper(classpath: str, uri: str, base: Path) -> None:
    """BookKeeper's own ``initnewcluster`` (BookieShell) for ``uri``: for a cluster whose
    BookKeeper metadata Pulsar's setup is told not to write (``existing_bk_uri``)."""
    JavaShell(classpath, uri, base, jvm=TOOL_JVM).run("initnewcluster")


def _proc_stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


class PulsarBroker:
    """One ``org.apache.pulsar.PulsarBrokerStarter`` process on loopback, with its
    ``broker.conf`` and log under ``base``. Ports are picked when it is made, so the cluster
    metadata can name its URLs before it starts."""

    def __init__(
        self,
        classpath: str,
        zk_connect: str,
        base: Path,
        *,
        cluster: str = DEFAULT_CLUSTER,
        bookkeeper_metadata_uri: str | None = None,
        configuration_store: str | None = None,
        ensemble: int = 3,
        write_quorum: int = 2,
        ack_quorum: int = 2,
        max_entries_per_ledger: int = 50000,
        min_rollover_minutes: int = 0,
        extra: Mapping[str, object] | None = None,
        jvm: Sequence[str] = BROKER_JVM,
    ) -> None:
        self.classpath = classpath
        self.zk_connect = zk_connect
        self.dir = Path(base)
        self.cluster = cluster
        self.bookkeeper_metadata_uri = bookkeeper_metadata_uri or bookkeeper_uri(zk_connect)
        self.configuration_store = configuration_store or zk_connect
        self.ensemble = ensemble
        self.write_quorum = write_quorum
        self.ack_quorum = ack_quorum
        self.max_entries_per_ledger = max_entries_per_ledger
        self.min_rollover_minutes = min_rollover_minutes
        self.extra = dict(extra or {})
        self.jvm = list(jvm)
        self.port = free_port()
        self.web_port = free_port()
        self.log_path = self.dir / "broker.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at: float | None = None
        # Seconds from spawn until the admin API answered (set by start()).
        self.startup_seconds: float | None = None

    @property
    def service_url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    @property
    def broker_id(self) -> str:
        """How the broker names itself in the metadata (``host:webServicePort``)."""
        return f"127.0.0.1:{self.web_port}"

    def conf(self) -> dict[str, object]:
        return {
            "metadataStoreUrl": metadata_store_url(self.zk_connect),
            "configurationMetadataStoreUrl": metadata_store_url(self.configuration_store),
            "clusterName": self.cluster,
            "bindAddress": "127.0.0.1",
            "advertisedAddress": "127.0.0.1",
            "brokerServicePort": self.port,
            "webServicePort": self.web_port,
            "bookkeeperMetadataServiceUri": self.bookkeeper_metadata_uri,
            "managedLedgerDefaultEnsembleSize": self.ensemble,
            "managedLedgerDefaultWriteQuorum": self.write_quorum,
            "managedLedgerDefaultAckQuorum": self.ack_quorum,
            "managedLedgerMaxEntriesPerLedger": self.max_entries_per_ledger,
            "managedLedgerMinLedgerRolloverTimeMinutes": self.min_rollover_minutes,
            # Start fast: no functions worker, no system topics (topic policies need them), no
            # transactions, no websocket proxy, no package management.
            "functionsWorkerEnabled": "false",
            "systemTopicEnabled": "false",
            "topicLevelPoliciesEnabled": "false",
            "transactionCoordinatorEnabled": "false",
            "webSocketServiceEnabled": "false",
            "enablePackagesManagement": "false",
            "allowAutoTopicCreation": "true",
            "allowAutoTopicCreationType": "non-partitioned",
            "brokerDeleteInactiveTopicsEnabled": "false",
            "defaultNumberOfNamespaceBundles": 4,
            # Gentle on two cores (the defaults scale with the core count or are fixed at 8-10).
            "numIOThreads": 2,
            "numHttpServerThreads": 8,
            "numAcceptorThreads": 1,
            "numOrderedExecutorThreads": 2,
            "numExecutorThreadPoolSize": 2,
            "numCacheExecutorThreadPoolSize": 2,
            "topicOrderedExecutorThreadNum": 2,
            "numWorkerThreadsForNonPersistentTopic": 1,
            "numTransactionReplayThreadPoolSize": 1,
            "bookkeeperClientNumWorkerThreads": 2,
            "bookkeeperClientNumIoThreads": 2,
            "managedLedgerNumSchedulerThreads": 1,
            "managedLedgerNumWorkerThreads": 1,
            "managedLedgerCacheSizeMB": 16,
            # The load manager cannot read a NIC speed in containers.
            "loadBalancerOverrideBrokerNicSpeedGbps": 1,
            "brokerShutdownTimeoutMs": 10000,
            **self.extra,
        }

    def spawn(self) -> None:
        """Start the process (without waiting)."""
        conf = write_conf(self.dir / "broker.conf", self.conf())
        cmd = java_command(
            self.classpath,
            "org.apache.pulsar.PulsarBrokerStarter",
            ["--broker-conf", str(conf)],
            jvm=self.jvm,
        )
        self.started_at = time.monotonic()
        self.proc = spawn_logged(cmd, self.log_path)

    def start(self, timeout: float = 240) -> PulsarBroker:
        """Spawn and wait until the admin API answers ``GET /admin/v2/clusters`` with this
        broker's cluster; then make sure ``public/default`` exists."""
        self.spawn()
        self.wait_ready(timeout)
        self.ensure_namespace("public/default")
        return self

    def wait_ready(self, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"Pulsar broker exited:\n{self.log_tail()}")
            with contextlib.suppress(OSError, ValueError):
                status, body = self.admin("GET", "/admin/v2/clusters", timeout=2)
                if status == 200 and self.cluster in json.loads(body):
                    assert self.started_at is not None
                    self.startup_seconds = time.monotonic() - self.started_at
                    return
            time.sleep(0.25)  # readiness polling
        raise RuntimeError(f"Pulsar broker did not answer in {timeout}s:\n{self.log_tail()}")

    def admin(
        self, method: str, path: str, body: object = None, timeout: float = 30
    ) -> tuple[int, str]:
        """One admin REST call; ``(status, body)`` (HTTP errors are returned, not raised)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.admin_url + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return int(resp.status), resp.read().decode()
        except urllib.error.HTTPError as e:
            return int(e.code), e.read().decode(errors="replace")

    def ensure_namespace(self, namespace: str) -> None:
        """Create the tenant and ``namespace`` unless they exist (the metadata setup makes
        ``public/default``; a cluster set up otherwise may lack it)."""
        tenant = namespace.split("/", 1)[0]
        status, _ = self.admin("GET", f"/admin/v2/tenants/{tenant}")
        if status == 404:
            status, text = self.admin(
                "PUT",
                f"/admin/v2/tenants/{tenant}",
                {"adminRoles": [], "allowedClusters": [self.cluster]},
            )
            if status not in (204, 409):
                raise RuntimeError(f"creating tenant {tenant}: {status} {text}")
        status, text = self.admin("GET", f"/admin/v2/namespaces/{tenant}")
        if status != 200:
            raise RuntimeError(f"listing namespaces of {tenant}: {status} {text}")
        if namespace not in json.loads(text):
            status, text = self.admin("PUT", f"/admin/v2/namespaces/{namespace}", {})
            if status not in (204, 409):
                raise RuntimeError(f"creating namespace {namespace}: {status} {text}")

    def health_check(self, timeout: float = 60) -> None:
        """``GET /admin/v2/brokers/health``: the broker writes and reads a heartbeat topic (so
        its bookies work too)."""
        status, text = self.admin("GET", "/admin/v2/brokers/health", timeout=timeout)
        if status != 200 or text.strip() != "ok":
            raise RuntimeError(f"broker health check: {status} {text}\n{self.log_tail()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def rss_bytes(self) -> int:
        """Resident memory of the live broker process (from /proc)."""
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS in /proc status")

    def cpu_seconds(self) -> float:
        """CPU seconds (user + system) the live broker has used so far (from /proc)."""
        assert self.proc is not None
        fields = _proc_stat(self.proc.pid)
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self, timeout: float = 30) -> None:
        if self.proc is not None:
            terminate(self.proc, timeout)

    def log_tail(self, n: int = 60) -> str:
        return tail(self.log_path, n)


def znode_tree(zk: KazooClient, path: str, depth: int = 2) -> list[str]:
    """The znodes under ``path`` down to ``depth`` levels, as sorted absolute paths."""
    out: list[str] = []
    if depth <= 0 or not zk.exists(path):
        return out
    for child in sorted(zk.get_children(path)):
        full = f"{path.rstrip('/')}/{child}"
        out.append(full)
        out.extend(znode_tree(zk, full, depth - 1))
    return out


@dataclass
class PulsarCluster:
    """A Pulsar cluster in one ZooKeeper chroot: Java bookies on one metadata driver and one
    broker, with a kazoo client inside the chroot."""

    classpath: str
    connect: str
    driver: Driver
    zk: KazooClient
    base: Path
    bookies: list[JavaBookie] = field(default_factory=list)
    broker: PulsarBroker | None = None
    # Wall seconds of each step, for reports.
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def uri(self) -> str:
        return bookkeeper_uri(self.connect, self.driver)

    @property
    def bookie_ids(self) -> list[str]:
        return [b.bookie_id for b in self.bookies]

    def logs(self, n: int = 30) -> str:
        """Tails of every log, for assertion messages."""
        parts = [f"--- bookie {b.bookie_id} ---\n{b.log_tail(n)}" for b in self.bookies]
        if self.broker is not None:
            parts.append(f"--- broker ---\n{self.broker.log_tail(n)}")
        parts.append(f"--- metadata setup ---\n{tail(self.base / 'metadata-setup.log', n)}")
        return "\n".join(parts)

    def stop(self) -> None:
        if self.broker is not None:
            self.broker.stop()
        for b in self.bookies:
            b.stop()


@contextlib.contextmanager
def pulsar_cluster(
    classpath: str,
    connect: str,
    base: Path,
    *,
    driver: Driver = "pulsar",
    bookies: int = 3,
    cluster: str = DEFAULT_CLUSTER,
    bookie_conf: Mapping[str, object] | None = None,
    broker: bool = True,
    ensemble: int = 3,
    write_quorum: int = 2,
    ack_quorum: int = 2,
    max_entries_per_ledger: int = 50000,
    min_rollover_minutes: int = 0,
    broker_conf: Mapping[str, object] | None = None,
) -> Iterator[PulsarCluster]:
    """Set up the cluster metadata in the ZooKeeper chroot ``connect``, start ``bookies`` Java
    bookies on ``driver`` and (unless ``broker=False``) one broker whose managed ledgers use the
    same driver; stop them all afterwards. ``ensemble`` .. ``broker_conf`` are the broker's
    (see :class:`PulsarBroker`).

    With ``driver="pulsar"`` Pulsar's setup writes BookKeeper's metadata (through its driver,
    as a Pulsar deployment does); with ``"zk"`` BookKeeper's ``initnewcluster`` does, and the
    setup is given it as the existing cluster.
    """
    zk = KazooClient(hosts=connect, timeout=10)
    zk.start(timeout=15)
    pc = PulsarCluster(classpath, connect, driver, zk, Path(base))
    try:
        pc.broker = PulsarBroker(
            classpath,
            connect,
            pc.base / "broker",
            cluster=cluster,
            bookkeeper_metadata_uri=pc.uri,
            ensemble=ensemble,
            write_quorum=write_quorum,
            ack_quorum=ack_quorum,
            max_entries_per_ledger=max_entries_per_ledger,
            min_rollover_minutes=min_rollover_minutes,
            extra=broker_conf,
        )
        t0 = time.monotonic()
        existing = None
        if driver == "zk":
            init_bookkeeper(classpath, pc.uri, pc.base)
            existing = pc.uri
        cluster_metadata_setup(
            classpath,
            connect,
            cluster,
            web_service_url=pc.broker.admin_url,
            broker_service_url=pc.broker.service_url,
            existing_bk_uri=existing,
            log_dir=pc.base,
        )
        pc.timings["metadata_setup"] = time.monotonic() - t0
        t0 = time.monotonic()
        for i in range(bookies):
            pc.bookies.append(
                java_bookie(classpath, pc.uri, pc.base / f"bookie{i}", extra=bookie_conf)
            )
        for b in pc.bookies:
            b.spawn()
        for b in pc.bookies:
            b.wait_registered(zk, LEDGERS_ROOT)
        pc.timings["bookies_start"] = time.monotonic() - t0
        if broker:
            pc.broker.start()
            assert pc.broker.startup_seconds is not None
            pc.timings["broker_start"] = pc.broker.startup_seconds
        else:
            pc.broker = None
        yield pc
    finally:
        pc.stop()
        zk.stop()
        zk.close()
