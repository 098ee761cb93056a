"""Java BookKeeper on Oxia, as Pulsar runs it: an ``oxia standalone`` server (3 shards, so
keys are routed by hash as in production), Java bookies at the BookKeeper Pulsar pins, loading
Pulsar's metadata driver for ``metadata-store:oxia://``, and the tools that go with them.

* The cluster is initialised by bkaudit (:meth:`LedgerStore.init_cluster` with Pulsar's
  driver writes what ``PulsarClusterMetadataSetup`` does: the root, ``available``,
  ``available/readonly`` and ``INSTANCEID``, no ``LAYOUT``).
* Java's session timeout is the bookie's ``zkTimeout``; Oxia accepts 2 s to 5 min.
* Our Java driver (``io.bkaudit.interop.Driver``, compiled against BookKeeper 4.17) runs on
  Pulsar's jars, never beside another BookKeeper's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path

from bklib.meta.cluster import MetadataDriver
from bklib.meta.store import LedgerStore
from bklib.meta.stores import open_store
from bklib.testing.oxiaserver import OxiaServer
from tests.interop import harness as interop
from tests.interop.conftest import InteropCluster
from tests.interop.harness import AutoRecovery, JavaBookie, JavaClient, JavaShell
from tests.pulsar.harness import BOOKIE_JVM, TOOL_JVM

JAVA_SESSION_MS = 4000
"""Bookies' and AutoRecovery's Oxia session: a killed bookie's registration goes in seconds."""


def driver_classpath(pulsar_classpath: str) -> str:
    """Our Java driver's classes on Pulsar's jars (its BookKeeper, its Oxia client)."""
    classes = interop.install().split(":", 1)[0]
    return f"{classes}:{pulsar_classpath}"


def java_client(pulsar_classpath: str, base: Path) -> JavaClient:
    """The Java BookKeeper client (our driver) with Pulsar's metadata drivers loaded."""
    return JavaClient(driver_classpath(pulsar_classpath), base, jvm=TOOL_JVM)


def autorecovery(
    pulsar_classpath: str, c: InteropCluster, extra: Mapping[str, object] | None = None
) -> AutoRecovery:
    """``AutoRecoveryMain`` on the cluster's Oxia, through Pulsar's driver."""
    conf = {"zkTimeout": JAVA_SESSION_MS, **(extra or {})}
    base = c.base / "autorecovery"
    return AutoRecovery(pulsar_classpath, c.uri, base, extra=conf, jvm=BOOKIE_JVM)


@contextlib.contextmanager
def oxia_java_cluster(
    pulsar_classpath: str, base: Path, *, bookies: int = 4
) -> Iterator[InteropCluster]:
    """A fresh Oxia server and ``bookies`` Java bookies registered on it (stopped after).

    A fresh server per cluster, not a wiped shared one: a killed JVM's ephemeral keys live
    until its session times out."""
    with OxiaServer(base / "oxia", shards=3) as server:
        store = open_store(server.locator(), timeout=15)
        try:
            ledgers = LedgerStore(store)
            ledgers.init_cluster(driver=MetadataDriver.PULSAR)
            uri = server.uri()
            c = InteropCluster(
                connect=server.locator(),
                zk=store,
                store=ledgers,
                shell=JavaShell(pulsar_classpath, uri, base, jvm=TOOL_JVM),
                base=base,
                metadata_uri=uri,
            )
            c.java = [
                JavaBookie(
                    pulsar_classpath,
                    uri,
                    base / f"bookie{i}",
                    extra={"zkTimeout": JAVA_SESSION_MS},
                    jvm=BOOKIE_JVM,
                )
                for i in range(bookies)
            ]
            try:
                interop.start_bookies(c.java, store)
                yield c
            finally:
                c.stop()
        finally:
            store.close()
