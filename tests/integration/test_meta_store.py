"""LedgerStore against a real ZooKeeper server."""

from __future__ import annotations

import threading

import pytest

from bklib.errors import (
    CompatibilityError,
    CorruptMetadataError,
    LedgerExistsError,
    MetadataVersionError,
    NoSuchLedgerOnMetadataServerError,
)
from bklib.meta.model import LedgerMetadata, LedgerState, Segment
from bklib.meta.paths import LayoutKind
from bklib.meta.store import LedgerStore
from bklib.testing.zkclient import connect

BOOKIES = ("127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183")


def make_md(ledger_id: int, **kw) -> LedgerMetadata:
    base = dict(
        ledger_id=ledger_id,
        ensemble_size=3,
        write_quorum=2,
        ack_quorum=2,
        segments=(Segment(0, BOOKIES),),
        ctoken=12345,
    )
    base.update(kw)
    return LedgerMetadata(**base)


@pytest.fixture
def store(zk):
    s = LedgerStore(zk)
    s.init_cluster()
    return s


def test_init_cluster_writes_bookkeeper_layout(zk, store):
    assert zk.get("/ledgers/LAYOUT")[0] == (
        b"2\norg.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1"
    )
    assert zk.exists("/ledgers/available/readonly")
    iid = store.instance_id()
    assert iid and len(iid) == 36
    assert store.init_cluster() == iid  # idempotent
    assert store.kind is LayoutKind.HIERARCHICAL


def test_layout_mismatch_is_refused(zk, store):
    with pytest.raises(CompatibilityError):
        LedgerStore(zk).ensure_layout(LayoutKind.FLAT)


def test_create_read_update_delete(zk, store):
    created = store.create_ledger(make_md(7))
    assert created.version == 0
    got = store.read_ledger(7)
    assert got.value == make_md(7).replace(ctime=got.value.ctime)
    assert zk.exists("/ledgers/00/0000/L0007")

    closed = store.update_ledger(7, lambda md: md.closed(41, 4200))
    assert closed.version == 1
    again = store.read_ledger(7)
    assert again.value.state is LedgerState.CLOSED
    assert (again.value.last_entry_id, again.value.length) == (41, 4200)
    assert again.value.ctoken == 0  # BookKeeper does not carry cToken through updates

    store.delete_ledger(7)
    with pytest.raises(NoSuchLedgerOnMetadataServerError) as err:
        store.read_ledger(7)
    assert "/ledgers/00/0000/L0007" in str(err.value)
    # empty hierarchical parents are pruned, the root stays
    assert not zk.exists("/ledgers/00")
    store.delete_ledger(7)  # deleting a missing ledger succeeds


def test_create_is_never_an_overwrite(store):
    store.create_ledger(make_md(9))
    # same cToken: our own retried create, success
    assert store.create_ledger(make_md(9)).version == 0
    with pytest.raises(LedgerExistsError):
        store.create_ledger(make_md(9, ctoken=999))


def test_stale_version_write_is_rejected(store):
    store.create_ledger(make_md(3))
    v = store.read_ledger(3)
    store.write_ledger(v.value.closed(1, 10), v.version)
    with pytest.raises(MetadataVersionError):
        store.write_ledger(v.value.closed(5, 50), v.version)


def test_cas_loop_reapplies_transform_on_conflict(store):
    """A re-replication swap racing a writer's close: both changes survive."""
    store.create_ledger(make_md(11))
    stale = store.read_ledger(11)
    store.update_ledger(11, lambda md: md.closed(99, 990))
    seen = []

    def swap(md: LedgerMetadata):
        seen.append(md.state)
        if "127.0.0.1:3181" not in md.segments[0].ensemble:
            return None
        return md.with_bookies_replaced(0, {"127.0.0.1:3181": "127.0.0.1:3190"})

    result = store.update_ledger(11, swap, current=stale)
    assert seen == [LedgerState.OPEN, LedgerState.CLOSED]  # re-applied to the fresh copy
    final = store.read_ledger(11).value
    assert final.state is LedgerState.CLOSED and final.last_entry_id == 99
    assert final.segments[0].ensemble[0] == "127.0.0.1:3190"
    assert result.version == store.read_ledger(11).version
    # already applied: predicate false, no write
    before = store.read_ledger(11).version
    assert store.update_ledger(11, swap).version == before


def test_concurrent_updates_from_threads_all_land(zk_chroot, store):
    """Eight threads each append their own custom key by CAS; none is lost."""
    store.create_ledger(make_md(12))
    errors = []

    def worker(i: int) -> None:
        client = connect(zk_chroot)
        try:
            s = LedgerStore(client)
            for j in range(5):
                key = f"k{i}-{j}"
                s.update_ledger(
                    12,
                    lambda md, key=key: md.replace(
                        custom_metadata={**md.custom_metadata, key: b"v"}
                    ),
                )
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            client.stop()
            client.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    md = store.read_ledger(12).value
    assert len(md.custom_metadata) == 40


def test_long_ids_and_both_trees_are_listed(zk, store):
    ids = [0, 1, 10_001, 123_456_789, 2_147_483_646, 2_147_483_647, 4_294_967_296, 9_999_999_999]
    for i in ids:
        store.create_ledger(make_md(i))
    assert zk.exists("/ledgers/000/0000/0042/9496/L7296")
    assert zk.exists("/ledgers/000/0000/0021/4748/L3647")
    # special znodes and junk never look like ledgers
    zk.ensure_path("/ledgers/idgen")
    zk.ensure_path("/ledgers/underreplication/ledgers")
    zk.create("/ledgers/ID-0000000001", b"")
    zk.ensure_path("/ledgers/bookies")
    zk.ensure_path("/ledgers/00/0000/junk")
    assert list(store.list_ledger_ids()) == ids
    for i in ids:
        assert store.read_ledger(i).value.ledger_id == i


def test_short_id_generation_uses_javas_znodes(zk, store):
    ids = [store.generate_ledger_id() for _ in range(5)]
    assert ids == sorted(ids) and len(set(ids)) == 5
    assert zk.exists("/ledgers/idgen")
    assert zk.get_children("/ledgers/idgen") == []  # sequential nodes are removed


def test_long_id_generation_after_switch(zk, store):
    zk.ensure_path("/ledgers/idgen-long")
    first = store.generate_ledger_id()
    second = store.generate_ledger_id()
    assert first >> 32 == 1 and second > first
    assert zk.exists("/ledgers/idgen-long/HOB-0000000001")
    store.create_ledger(make_md(first))
    assert store.read_ledger(first).value.ledger_id == first


def test_flat_layout(zk):
    s = LedgerStore(zk)
    s.init_cluster(LayoutKind.FLAT)
    lid = s.generate_ledger_id()
    s.create_ledger(make_md(lid))
    assert zk.exists(f"/ledgers/L{lid:010d}")
    assert list(s.list_ledger_ids()) == [lid]


def test_corrupt_znode_names_its_path(zk, store):
    zk.create("/ledgers/00/0000/L0042", b"not metadata", makepath=True)
    with pytest.raises(CorruptMetadataError) as err:
        store.read_ledger(42)
    assert err.value.path == "/ledgers/00/0000/L0042"
    assert "/ledgers/00/0000/L0042" in str(err.value)


def test_chroot_and_custom_root(zk_chroot):
    client = connect(zk_chroot)
    try:
        s = LedgerStore(client, root="/pulsar/ledgers")
        s.init_cluster()
        s.create_ledger(make_md(1))
        assert client.exists("/pulsar/ledgers/00/0000/L0001")
        assert list(s.list_ledger_ids()) == [1]
    finally:
        client.stop()
        client.close()


def test_digest_auth_connect(zk_chroot):
    from kazoo.security import make_digest_acl

    client = connect(zk_chroot, auth="bk:secret")
    try:
        acl = [make_digest_acl("bk", "secret", all=True)]
        client.create("/secured", b"x", acl=acl)
        assert client.get("/secured")[0] == b"x"
    finally:
        client.stop()
        client.close()
    other = connect(zk_chroot)
    try:
        from kazoo.exceptions import NoAuthError

        with pytest.raises(NoAuthError):
            other.get("/secured")
    finally:
        other.stop()
        other.close()
    client = connect(zk_chroot, auth="bk:secret")  # the fixture's wipe cannot read it
    client.delete("/secured")
    client.stop()
    client.close()


def test_store_works_again_after_session_expiry(zk_chroot):
    """An expired session (a long GC pause, a partition) is survived: kazoo opens a new
    session and the store's next operations succeed; nothing stored is lost."""
    import contextlib
    import time

    from kazoo.client import KazooClient
    from kazoo.protocol.states import KazooState

    client = connect(zk_chroot, timeout=4)
    try:
        store = LedgerStore(client)
        store.init_cluster()
        store.create_ledger(make_md(1))
        states = []
        client.add_listener(states.append)
        old_session = client.client_id[0]
        # Closing a second connection that shares the session id expires the session.
        ghost = KazooClient(hosts=zk_chroot, client_id=client.client_id)
        ghost.start()
        ghost.stop()
        ghost.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if KazooState.LOST in states and client.connected:
                break
            with contextlib.suppress(Exception):
                client.exists("/")  # provokes the server's SESSIONEXPIRED
            time.sleep(0.1)
        assert KazooState.LOST in states
        assert client.client_id[0] != old_session
        assert store.read_ledger(1).value.ledger_id == 1
        store.update_ledger(1, lambda md: md.closed(0, 1))
        assert store.read_ledger(1).value.is_closed
    finally:
        client.stop()
        client.close()
