"""Each ``--metadata-uri`` form means to bkaudit what it means to a Java bookie given it.

For each form, bkaudit's parser (:func:`bklib.meta.uri.parse_metadata_uri`) says where the
ledgers root is; a cluster is formatted there, as that driver formats one (Pulsar's: no
``LAYOUT``), and a Java bookie on Pulsar's classpath is started with the same URI. It starts
and registers only if it reads the same root: BookKeeper refuses an unformatted one
("BookKeeper cluster not initialized"). Then ``bkaudit status`` through the URI sees it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from bklib.meta.cluster import MetadataDriver
from bklib.meta.store import LedgerStore
from bklib.meta.uri import parse_metadata_uri
from bklib.testing.zkclient import connect
from bklib.testing.zkserver import ZooKeeperServer
from tests.cli_helpers import bkaudit
from tests.pulsar.harness import java_bookie

pytestmark = [pytest.mark.integration, pytest.mark.pulsar]

FORMS: dict[str, Callable[[str, str], str]] = {
    # Pulsar's driver: the path is a chroot, the ledgers are at /ledgers inside it.
    "pulsar-chroot": lambda hosts, c: f"metadata-store:zk:{hosts}/{c}",
    "pulsar-no-zk-prefix": lambda hosts, c: f"metadata-store:{hosts};{hosts}/{c}",
    # ...so a /ledgers suffix is /<chroot>/ledgers/ledgers, for Java and for us.
    "pulsar-ledgers-suffix": lambda hosts, c: f"metadata-store:zk:{hosts}/{c}/ledgers",
    # BookKeeper's driver: the path is the whole ledgers root.
    "bookkeeper": lambda hosts, c: f"zk+hierarchical://{hosts}/{c}/ledgers",
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_java_bookie_and_bkaudit_read_the_same_root(
    form: str, pulsar_classpath: str, zk_server: ZooKeeperServer, tmp_path: Path
) -> None:
    with zk_server.private_chroot("uri") as scratch:
        hosts, _, chroot = scratch.partition("/")
        uri = FORMS[form](hosts, chroot)
        target = parse_metadata_uri(uri)
        driver = MetadataDriver.PULSAR if target.pulsar_driver else MetadataDriver.BOOKKEEPER
        # Format at the root bkaudit resolved, seen without a chroot: <chroot><ledgers root>.
        within = target.connect.partition("/")[2]
        root = f"/{within}{target.ledgers_root}" if within else target.ledgers_root
        zk = connect(hosts)
        try:
            LedgerStore(zk, root).init_cluster(driver=driver)
        finally:
            zk.stop()
            zk.close()
        bookie = java_bookie(pulsar_classpath, uri, tmp_path / "bookie")
        bookie.spawn()
        try:
            zk = connect(target.connect)
            try:
                bookie.wait_registered(zk, target.ledgers_root, timeout=60)
            finally:
                zk.stop()
                zk.close()
            proc = bkaudit("status", "--metadata-uri", uri, "--format", "json")
            assert proc.returncode in (0, 1), (proc.stdout, proc.stderr)
            status = json.loads(proc.stdout)
            assert status["writable"] == [bookie.bookie_id], (uri, status)
            assert status["metadata_driver"] == driver.value
        finally:
            bookie.stop()
