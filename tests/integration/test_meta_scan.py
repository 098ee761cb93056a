"""The parallel metadata scan against a real ZooKeeper."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from bklib.errors import CorruptMetadataError
from bklib.meta.scan import ScanResult, read_ledgers_by_id
from bklib.meta.store import LedgerStore
from bklib.meta.stores import open_store
from bklib.meta.stores.zookeeper import ZkAuth
from tests.integration.test_meta_store import make_md


def scan_ledgers(
    locator: str, ledger_ids: Iterable[int], *, auth: ZkAuth = None, **kw: Any
) -> list[ScanResult]:
    """The ledgers read over a session of their own on ``locator``, as a command reads them."""
    with open_store(locator, auth=auth) as session:
        return list(read_ledgers_by_id(session, ledger_ids, **kw))


def test_scan_reads_everything_reports_corrupt_and_skips_deleted(zk, zk_chroot):
    store = LedgerStore(zk)
    store.init_cluster()
    ids = list(range(0, 600))
    for i in ids:
        store.create_ledger(make_md(i))
    zk.set(store.path_for(17), b"BookieMetadataFormatVersion\t3\n\xff\xff\xff")
    zk.set(store.path_for(18), b"garbage")
    store.delete_ledger(300)

    results = list(scan_ledgers(zk_chroot, store.list_ledger_ids(), max_in_flight=50))
    by_id = {r.ledger_id: r for r in results}
    assert len(results) == 599
    assert 300 not in by_id
    for bad in (17, 18):
        r = by_id[bad]
        assert not r.ok and r.metadata is None
        assert isinstance(r.error, CorruptMetadataError)
        assert r.error.path == store.path_for(bad)
        assert store.path_for(bad) in str(r.error)
    good = [r for r in results if r.ok]
    assert len(good) == 597
    assert all(r.metadata.ledger_id == r.ledger_id and r.version == 0 for r in good)
    assert [r.ledger_id for r in results] == sorted(by_id)  # input order is kept
    assert good[0].metadata == store.read_ledger(good[0].ledger_id).value


def test_ledger_deleted_while_scan_is_running(zk, zk_chroot):
    store = LedgerStore(zk)
    store.init_cluster()
    for i in range(400):
        store.create_ledger(make_md(i))
    ids = [*store.list_ledger_ids(), 100_000]  # listed, then gone before the read
    deleted = threading.Event()

    def ids_with_delete():
        for n, i in enumerate(ids):
            if n == 200:
                for victim in range(300, 350):
                    store.delete_ledger(victim)
                deleted.set()
            yield i

    results = list(scan_ledgers(zk_chroot, ids_with_delete(), max_in_flight=10))
    assert deleted.is_set()
    assert all(r.ok for r in results)
    assert sorted(r.ledger_id for r in results) == [i for i in range(400) if not 300 <= i < 350]


def test_in_flight_bound_one_still_works(zk, zk_chroot):
    store = LedgerStore(zk)
    store.init_cluster()
    for i in range(5):
        store.create_ledger(make_md(i))
    assert sorted(r.ledger_id for r in scan_ledgers(zk_chroot, range(5), max_in_flight=1)) == list(
        range(5)
    )


def test_scan_with_digest_auth_and_unreadable_znode(zk_chroot):
    """ACL-protected metadata: readable with the right credentials; without them, each ledger
    gets an error row naming its znode and the scan goes on."""
    from kazoo.security import make_digest_acl

    from bklib.testing.zkclient import connect

    client = connect(zk_chroot, auth="bk:pw")
    store = LedgerStore(client)
    store.init_cluster()
    acl = [make_digest_acl("bk", "pw", all=True)]
    for i in range(3):
        path = store.path_for(i)
        client.ensure_path(path.rsplit("/", 1)[0])
        from bklib.meta.serde import encode_metadata

        client.create(path, encode_metadata(make_md(i)), acl=acl)
    try:
        authed = list(scan_ledgers(zk_chroot, range(3), auth="bk:pw"))
        assert [r.ok for r in authed] == [True, True, True]
        anon = list(scan_ledgers(zk_chroot, range(3)))
        assert [r.ok for r in anon] == [False, False, False]
        assert "NOAUTH" in str(anon[0].error) and store.path_for(0) in str(anon[0].error)
    finally:
        for i in range(3):
            client.delete(store.path_for(i))
        client.stop()
        client.close()
