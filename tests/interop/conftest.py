"""Fixtures for the Java BookKeeper interop matrix.

The release is ``$BKAUDIT_BK_VERSION`` (tests/interop/versions.py; default the newest 4.17,
4.16.x and 4.18.x work too); pytest's header names it.

* ``bk_classpath``: installs (once, cached) that release's jars and our Java driver. A missing
  Java, Maven or jar fails the test, in CI and locally -- never a skip.
* ``java_client``: one JVM running our driver for the whole session.
* ``mixed``: one shared cluster for the session, initialised by the Java shell
  (``initnewcluster``): four Java bookies -- three on DbLedgerStorage (Pulsar's default), one
  on SortedLedgerStorage -- and three Python bookies. Tests pin ensembles to the side they test.

Cells that kill bookies or run autorecovery build their own cluster (``own_cluster``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from bklib.client.operations import ClientConfig
from bklib.client.placement import PlacementPolicy
from bklib.client.pool import BookieClientPool
from bklib.client.reader import ClientContext
from bklib.meta.store import LedgerStore
from bklib.meta.stores.base import MetadataStore
from bklib.testing.sandbox import BookieProcess
from bklib.testing.zkserver import ZooKeeperServer
from tests.interop import harness
from tests.interop.harness import JavaBookie, JavaClient, JavaShell, JavaUnavailable
from tests.interop.versions import ROTATION_ENV, rotation_version, selected

ROOT = "/ledgers"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "interop: runs real Apache BookKeeper (Java)")


def _versions_line() -> str:
    return (
        f"interop: Apache BookKeeper {selected()} ($BKAUDIT_BK_VERSION); rotation today: "
        f"{rotation_version()} (${ROTATION_ENV}, tests/interop/test_version_rotation.py)"
    )


def pytest_report_header(config: pytest.Config) -> str:
    return _versions_line()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    # The header is hidden under -q (as `make test` runs): name the versions at the end too.
    terminalreporter.write_line(_versions_line())


class Only(PlacementPolicy):
    """Placement restricted to the given bookies, in the given order (ensemble pinning)."""

    def __init__(self, bookies: Iterable[str]) -> None:
        super().__init__()
        self.bookies = list(bookies)

    def new_ensemble(
        self, candidates: Iterable[str], size: int, exclude: Iterable[str] = ()
    ) -> tuple[str, ...]:
        allowed = [b for b in self.bookies if b in set(candidates) and b not in set(exclude)]
        return super().new_ensemble(allowed, size) if len(allowed) < size else tuple(allowed[:size])


@dataclass
class InteropCluster:
    """One ZooKeeper chroot (or Oxia namespace) with Java and/or Python bookies, a Java shell
    and a metadata client: kazoo on ZooKeeper, a :class:`MetadataStore` on Oxia."""

    connect: str
    zk: KazooClient | MetadataStore
    store: LedgerStore
    shell: JavaShell
    base: Path
    java: list[JavaBookie] = field(default_factory=list)
    python: list[BookieProcess] = field(default_factory=list)
    metadata_uri: str | None = None
    """The bookies' ``metadataServiceUri`` when not BookKeeper's ZooKeeper one (Oxia)."""

    @property
    def uri(self) -> str:
        return self.metadata_uri or harness.metadata_uri(self.connect, ROOT)

    @property
    def java_ids(self) -> list[str]:
        return [b.bookie_id for b in self.java]

    @property
    def python_ids(self) -> list[str]:
        return [b.bookie_id for b in self.python]

    def logs(self, n: int = 30) -> str:
        """Tails of every bookie log, for assertion messages."""
        parts = [f"--- Java bookie {b.bookie_id} ---\n{b.log_tail(n)}" for b in self.java]
        parts += [f"--- Python bookie {b.bookie_id} ---\n{b.log_tail(n)}" for b in self.python]
        parts.append(f"--- shell ---\n{harness.tail(self.shell.log_path, n)}")
        return "\n".join(parts)

    @contextlib.asynccontextmanager
    async def client(
        self, only: Iterable[str] | None = None, **ctx: Any
    ) -> AsyncIterator[ClientContext]:
        """A bklib client on the running loop; ``only`` pins new ensembles to those bookies."""
        config = ClientConfig(add_timeout=10.0, read_timeout=10.0, connect_timeout=5.0)
        pool = BookieClientPool(self.zk, ledgers_root=ROOT, config=config)
        placement = Only(only) if only is not None else PlacementPolicy()
        try:
            yield ClientContext(self.store, pool, placement, **ctx)
        finally:
            await pool.close()

    def stop(self) -> None:
        for b in self.java:
            b.stop()
        for p in self.python:
            p.stop()


@pytest.fixture(scope="session")
def bk_classpath() -> str:
    """Classpath of the selected BookKeeper plus our driver. Fails (never skips) when
    unavailable."""
    try:
        return harness.install(selected())
    except JavaUnavailable as e:
        pytest.fail(f"Java BookKeeper unavailable: {e}", pytrace=False)


@pytest.fixture(scope="session")
def java_client(
    bk_classpath: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[JavaClient]:
    with JavaClient(bk_classpath, tmp_path_factory.mktemp("java-client")) as client:
        yield client


@contextlib.contextmanager
def build_cluster(
    classpath: str,
    connect: str,
    base: Path,
    *,
    java: int = 0,
    python: int = 0,
    init: str = "java",
    storages: list[str] | None = None,
    bookie_conf: dict[str, object] | None = None,
) -> Iterator[InteropCluster]:
    """Initialise a cluster (Java ``initnewcluster`` or bklib ``init_cluster``) and start the
    bookies, Java and Python in parallel."""
    zk = KazooClient(hosts=connect, timeout=10)
    zk.start(timeout=15)
    store = LedgerStore(zk, ROOT)
    uri = harness.metadata_uri(connect, ROOT)
    shell = JavaShell(classpath, uri, base)
    cluster = InteropCluster(connect, zk, store, shell, base)
    try:
        if init == "java":
            shell.run("initnewcluster")
        else:
            store.init_cluster()
        storages = storages or []
        for i in range(java):
            storage = storages[i] if i < len(storages) else harness.DB_STORAGE
            cluster.java.append(
                JavaBookie(classpath, uri, base / f"java{i}", storage=storage, extra=bookie_conf)
            )
        for i in range(python):
            cluster.python.append(BookieProcess(connect, base / f"py{i}"))
        for b in cluster.java:
            b.spawn()
        for p in cluster.python:
            p.spawn()
        for b in cluster.java:
            b.wait_registered(zk, ROOT)
        for p in cluster.python:
            _wait_znode(zk, f"{ROOT}/available/{p.bookie_id}", p.log_tail)
        yield cluster
    finally:
        cluster.stop()
        zk.stop()
        zk.close()


def _wait_znode(zk: KazooClient, path: str, log: Callable[[], str], timeout: float = 60) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if zk.exists(path):
            return
        time.sleep(0.1)  # readiness polling
    raise RuntimeError(f"{path} did not appear:\n{log()}")


@pytest.fixture(scope="session")
def mixed(
    bk_classpath: str, zk_server: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[InteropCluster]:
    """The shared mixed cluster (see the module docstring)."""
    base = tmp_path_factory.mktemp("interop-mixed")
    with (
        zk_server.private_chroot("interop") as connect,
        build_cluster(
            bk_classpath,
            connect,
            base,
            java=4,
            python=3,
            init="java",
            storages=[harness.DB_STORAGE] * 3 + [harness.SORTED_STORAGE],
        ) as cluster,
    ):
        yield cluster


@pytest.fixture
def own_cluster(
    bk_classpath: str, zk_server: ZooKeeperServer, tmp_path: Path
) -> Callable[..., contextlib.AbstractContextManager[InteropCluster]]:
    """A factory for a private cluster: ``with own_cluster(java=4, init="bklib") as c``."""

    @contextlib.contextmanager
    def make(**kw: Any) -> Iterator[InteropCluster]:
        with (
            zk_server.private_chroot("interop-own") as connect,
            build_cluster(bk_classpath, connect, tmp_path, **kw) as cluster,
        ):
            yield cluster

    return make
