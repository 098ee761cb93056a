"""The metadata-store interface, the same tests on a real ZooKeeper and a real Oxia server:
what every caller above ``bklib.meta.stores`` relies on."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
from kazoo.client import KazooClient

from bklib.meta.stores import (
    BadVersion,
    KeyExists,
    KeyNotFound,
    MetadataStore,
    NotEmpty,
    SessionState,
    StoreUnavailable,
    open_store,
)
from bklib.meta.stores.session_guard import SessionGuard, SessionLost
from bklib.meta.stores.zookeeper import ZooKeeperStore
from bklib.testing.ports import free_port

pytestmark = pytest.mark.integration


def test_create_get_and_compare_and_set(meta_store: MetadataStore) -> None:
    created = meta_store.create("/ledgers/00/0000/L0001", b"v1", parents=True)
    data, stat = meta_store.get("/ledgers/00/0000/L0001")
    assert data == b"v1" and stat.version == created.version
    with pytest.raises(KeyExists):
        meta_store.create("/ledgers/00/0000/L0001", b"again")
    after = meta_store.set("/ledgers/00/0000/L0001", b"v2", stat.version)
    assert after.version != stat.version
    # The version read before the write is stale now: the CAS must fail, the value stay.
    with pytest.raises(BadVersion):
        meta_store.set("/ledgers/00/0000/L0001", b"lost update", stat.version)
    assert meta_store.get("/ledgers/00/0000/L0001")[0] == b"v2"
    with pytest.raises(KeyNotFound):
        meta_store.set("/ledgers/00/0000/L0002", b"x", 0)
    with pytest.raises(KeyNotFound):
        meta_store.get("/ledgers/00/0000/L0002")
    assert meta_store.exists("/ledgers/00/0000/L0002") is None


def test_parents_are_keys_and_children_are_one_level(meta_store: MetadataStore) -> None:
    meta_store.create("/ledgers/00/0000/L0001", b"a", parents=True)
    meta_store.create("/ledgers/00/0000/L0002", b"b")
    meta_store.create("/ledgers/00/0001/L0003", b"c", parents=True)
    # Java's Auditor walks the tree by listing children: every parent must be a key.
    assert meta_store.children("/ledgers") == ["00"]
    assert meta_store.children("/ledgers/00") == ["0000", "0001"]
    assert meta_store.children("/ledgers/00/0000") == ["L0001", "L0002"]
    assert meta_store.children("/ledgers/00/0001/L0003") == []
    with pytest.raises(KeyNotFound):
        meta_store.children("/ledgers/01")
    with pytest.raises(KeyNotFound):
        meta_store.create("/ledgers/02/0000/L0009", b"no parent")


def test_scan_children_matches_one_by_one_reads(meta_store: MetadataStore) -> None:
    # Names whose order differs between bytes and numbers, a grandchild that is not a child,
    # a sibling directory sharing the prefix, an ephemeral child. On Oxia this is the scan's
    # own gRPC path (bklib/meta/stores/oxia_scan.py), so it must agree with the client's gets.
    names = ["L0010", "L0002", "L0001", "L0100"]
    for i, name in enumerate(names):
        meta_store.create(f"/ledgers/00/0000/{name}", b"v%d" % i, parents=True)
    meta_store.set(
        "/ledgers/00/0000/L0002", b"changed", meta_store.get("/ledgers/00/0000/L0002")[1].version
    )
    meta_store.create("/ledgers/00/0000/L0001/deeper", b"not a child")
    meta_store.create("/ledgers/00/00000/L0005", b"sibling dir", parents=True)
    meta_store.create("/ledgers/00/0000/Lephemeral", b"e", ephemeral=True)
    scanned = list(meta_store.scan_children("/ledgers/00/0000"))
    assert [r.path for r in scanned] == [
        f"/ledgers/00/0000/{n}" for n in sorted([*names, "Lephemeral"])
    ]
    for r in scanned:
        data, stat = meta_store.get(r.path)
        assert (r.data, r.stat) == (data, stat), r.path
        assert r.error is None
    owners = {r.path.rsplit("/", 1)[1]: r.stat.ephemeral_owner for r in scanned if r.stat}
    assert owners.pop("Lephemeral") == meta_store.session_owner
    assert set(owners.values()) == {None}
    assert list(meta_store.scan_children("/ledgers/00/0009")) == []


def test_delete_by_version_and_not_empty(meta_store: MetadataStore) -> None:
    meta_store.create("/a/b", b"x", parents=True)
    _, stat = meta_store.get("/a/b")
    with pytest.raises(NotEmpty):
        meta_store.delete("/a")
    with pytest.raises(BadVersion):
        meta_store.delete("/a/b", stat.version + 1000)
    meta_store.delete("/a/b", stat.version)
    with pytest.raises(KeyNotFound):
        meta_store.delete("/a/b")
    meta_store.delete("/a")
    assert meta_store.exists("/a") is None


def test_ephemeral_keys_end_with_their_session(store_locator: str) -> None:
    with open_store(store_locator, timeout=15) as reader:
        writer = open_store(store_locator, timeout=15)
        try:
            writer.create("/ledgers/available/127.0.0.1:3181", b"", ephemeral=True, parents=True)
            stat = reader.exists("/ledgers/available/127.0.0.1:3181")
            assert stat is not None
            assert stat.ephemeral_owner == writer.session_owner
            assert stat.ephemeral_owner != reader.session_owner
        finally:
            writer.close()
        deadline = time.monotonic() + 15
        while reader.exists("/ledgers/available/127.0.0.1:3181") is not None:
            assert time.monotonic() < deadline, "ephemeral key outlived its session"
            time.sleep(0.1)
        assert reader.exists("/ledgers/available") is not None  # the parent is persistent


def test_watch_children_sees_creates_and_deletes(
    meta_store: MetadataStore, store_locator: str
) -> None:
    meta_store.ensure_path("/ledgers/available")
    seen: list[list[str] | None] = []
    changed = threading.Event()

    def listener(children: list[str] | None) -> None:
        seen.append(children)
        changed.set()

    meta_store.watch_children("/ledgers/available", listener)
    assert changed.wait(10) and seen[-1] == []

    def wait_for(expected: list[str]) -> None:
        deadline = time.monotonic() + 10
        while seen[-1] != expected:
            assert time.monotonic() < deadline, f"watch saw {seen}, not {expected}"
            changed.clear()
            changed.wait(0.5)

    with open_store(store_locator, timeout=15) as other:
        other.create("/ledgers/available/b1:3181", b"", ephemeral=True)
        wait_for(["b1:3181"])
        other.create("/ledgers/available/b2:3181", b"")
        wait_for(["b1:3181", "b2:3181"])
        other.delete("/ledgers/available/b2:3181")
        wait_for(["b1:3181"])
    wait_for([])  # the ephemeral one went with the other session


def test_get_many_reports_missing_keys(meta_store: MetadataStore) -> None:
    for i in range(50):
        meta_store.create(f"/many/k{i:03d}", f"v{i}".encode(), parents=True)
    keys = [f"/many/k{i:03d}" for i in range(0, 60, 3)]
    got = list(meta_store.get_many(keys, max_in_flight=8))
    assert [g.path for g in got] == keys  # input order
    for g in got:
        i = int(g.path[-3:])
        if i < 50:
            assert g.data == f"v{i}".encode() and g.stat is not None
        else:
            assert g.missing


def test_state_listener_reports_a_connected_session(meta_store: MetadataStore) -> None:
    states: list[SessionState] = []
    meta_store.add_state_listener(states.append)
    assert meta_store.connected
    meta_store.remove_state_listener(states.append)
    assert SessionState.LOST not in states


@pytest.mark.parametrize("kind", ["zookeeper", "oxia"])
def test_an_unreachable_store_is_one_line(kind: str) -> None:
    port = free_port("127.0.0.1")  # nothing listens there
    locator = f"oxia://127.0.0.1:{port}/default" if kind == "oxia" else f"127.0.0.1:{port}"
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as info:
        open_store(locator, timeout=3)
    assert time.monotonic() - started < 20
    message = str(info.value)
    assert "\n" not in message and f"127.0.0.1:{port}" in message


def test_sequential_keys_count_up_under_their_parent(meta_store: MetadataStore) -> None:
    made = [meta_store.create_sequential("/ledgers/idgen/ID-", ephemeral=True) for _ in range(3)]
    ids = [int(p.rsplit("ID-", 1)[1]) for p in made]
    assert ids == sorted(set(ids)) and len(ids) == 3  # unique and increasing
    assert all(p.startswith("/ledgers/idgen/ID-") and len(p.rsplit("-", 1)[1]) == 10 for p in made)
    assert meta_store.children("/ledgers/idgen") == sorted(p.rsplit("/", 1)[1] for p in made)


def test_nested_bulk_reads_do_not_block_each_other(meta_store: MetadataStore) -> None:
    # Pulsar's reference reader reads cursors while it streams managed ledgers.
    for i in range(5):
        meta_store.create(f"/outer/o{i}", b"o", parents=True)
        meta_store.create(f"/inner/i{i}", b"i", parents=True)
    pairs = []
    for outer in meta_store.get_many(f"/outer/o{i}" for i in range(5)):
        inner = list(meta_store.get_many(f"/inner/i{i}" for i in range(5)))
        pairs.append((outer.data, [g.data for g in inner]))
    assert pairs == [(b"o", [b"i"] * 5)] * 5


def test_empty_mark_directories_are_pruned_only_where_it_is_atomic(
    meta_store: MetadataStore,
) -> None:
    from bklib.meta.paths import ur_ledger_path
    from bklib.meta.underreplication import UnderReplicationManager

    urm = UnderReplicationManager(meta_store)
    urm.ensure_layout()
    assert urm.mark_underreplicated(5, ["b1:3181"])
    lock = urm.try_acquire(5)
    assert lock is not None and urm.mark_replicated(lock)
    parent = ur_ledger_path("/ledgers", 5).rsplit("/", 1)[0]
    assert meta_store.exists(ur_ledger_path("/ledgers", 5)) is None
    # ZooKeeper refuses to delete a non-empty parent atomically, so BookKeeper prunes; on Oxia
    # a mark created between the listing and the delete would be orphaned, so Pulsar keeps it.
    assert (meta_store.exists(parent) is None) == meta_store.prunes_safely


def test_bulk_reads_after_a_silence_longer_than_the_session(store_locator: str) -> None:
    # A long check between the scan and the re-read of flagged ledgers: the pipelined reads'
    # session sends no pings meanwhile, so it is reopened, not found expired.
    with open_store(store_locator, timeout=15, session_timeout=2) as store:
        for i in range(20):
            store.create(f"/quiet/k{i:02d}", f"v{i}".encode(), parents=True)
        keys = [f"/quiet/k{i:02d}" for i in range(20)]
        assert [g.data for g in store.get_many(keys)] == [f"v{i}".encode() for i in range(20)]
        time.sleep(3.5)
        assert [g.data for g in store.get_many(keys)] == [f"v{i}".encode() for i in range(20)]


def test_a_run_whose_session_expired_is_stopped_by_its_guard(zk_chroot: str) -> None:
    with open_store(zk_chroot, timeout=15, session_timeout=4) as store:
        assert isinstance(store, ZooKeeperStore)
        with SessionGuard(store) as guard:
            guard.check("the metadata scan")  # a live session: nothing to say
            # Closing a second connection that shares the session id expires the session.
            ghost = KazooClient(hosts=zk_chroot, client_id=store.client.client_id)
            ghost.start()
            ghost.stop()
            ghost.close()
            deadline = time.monotonic() + 30
            while not guard.lost:
                assert time.monotonic() < deadline, "the session never expired"
                with contextlib.suppress(StoreUnavailable):
                    store.exists("/")  # provokes the server's SESSIONEXPIRED
                time.sleep(0.1)
            with pytest.raises(SessionLost) as info:
                guard.check("the check")
        # kazoo has a new session: the store works, but the run that lost it stays failed.
        assert store.children("/") is not None
    message = str(info.value)
    assert "\n" not in message and zk_chroot in message and "expired during the check" in message
