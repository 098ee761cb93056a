"""The Pulsar topics behind the ledgers a repair changed, read from a real ZooKeeper: each
ledger's topic from its custom metadata, pipelined, with deleted, untagged and unreadable
ledgers named as having none (docs/pulsar.md)."""

from __future__ import annotations

import pytest

from bklib.meta.model import LedgerMetadata, Segment
from bklib.meta.paths import LayoutKind
from bklib.meta.store import LedgerStore
from bklib.meta.stores import open_store
from bklib.meta.stores.zookeeper.store import ZooKeeperStore
from bklib.testing.zkserver import ZooKeeperServer
from jobs.runs.pulsar_unload import topics_of

pytestmark = pytest.mark.integration

BOOKIES = ("127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183")


def _md(ledger_id: int, managed_ledger: str | None) -> LedgerMetadata:
    tags = {} if managed_ledger is None else {
        "application": b"pulsar",
        "component": b"managed-ledger",
        "pulsar/managed-ledger": managed_ledger.encode(),
    }  # fmt: skip
    return LedgerMetadata(
        ledger_id=ledger_id, ensemble_size=3, write_quorum=2, ack_quorum=2,
        segments=(Segment(0, BOOKIES),), custom_metadata=tags,
    )  # fmt: skip


def _requests(server: ZooKeeperServer, store: ZooKeeperStore) -> int:
    """Requests received so far on the store's session and its pipelined one."""
    ports = {store.client._connection._socket.getsockname()[1]}
    if store._bulk is not None and store._bulk.sock is not None:
        ports.add(store._bulk.sock.getsockname()[1])
    return server.requests_on(ports)


@pytest.mark.parametrize("kind", [LayoutKind.HIERARCHICAL, LayoutKind.LONG_HIERARCHICAL])
def test_the_topics_of_hundreds_of_ledgers_in_a_few_requests(
    zk_chroot: str, zk_server: ZooKeeperServer, kind: LayoutKind
) -> None:
    meta = open_store(zk_chroot)
    try:
        assert isinstance(meta, ZooKeeperStore)
        ledgers = LedgerStore(meta)
        ledgers.init_cluster(kind)
        # Managed-ledger names as Pulsar writes them, and the topics they name.
        names = ["public/default/persistent/orders", "t/ns/persistent/pay%20ments"]
        topics = ["persistent://public/default/orders", "persistent://t/ns/pay ments"]
        want: dict[int, str | None] = {}
        for lid in range(1, 301):
            tagged = lid % 7 != 0  # every seventh untagged: not a Pulsar ledger
            ledgers.create_ledger(_md(lid, names[lid % 2] if tagged else None))
            want[lid] = topics[lid % 2] if tagged else None
        ledgers.delete_ledger(150)  # deleted since the repair: no handle to refresh
        want[150] = None
        meta.set(ledgers.path_for(151), b"\x00not metadata")  # unreadable: named, no topic
        want[151] = None
        want[10**9] = None  # never existed
        before = _requests(zk_server, meta)
        got = topics_of(meta, "/ledgers", [*want, 2, 2])
        sent = _requests(zk_server, meta) - before
    finally:
        meta.close()
    assert got == want
    # 301 reads fifty to a multiRead, plus the layout: about ten requests (one each: 301).
    assert sent <= 20, sent
