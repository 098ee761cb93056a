"""Under-replication marks, locks and flags against a real ZooKeeper, in BookKeeper's layout."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient

from bklib.errors import CompatibilityError, CorruptMetadataError
from bklib.meta import underreplication
from bklib.meta.underreplication import UnderReplicationManager
from bklib.testing.zkclient import connect
from bklib.testing.zkserver import ZooKeeperServer


@pytest.fixture
def urm(zk):
    m = UnderReplicationManager(zk, worker_id="worker-a")
    m.ensure_layout()
    return m


def test_layout_created_like_java(zk, urm):
    assert zk.get("/ledgers/underreplication/LAYOUT")[0] == b'type: "BASIC"\nversion: 1\n'
    assert zk.exists("/ledgers/underreplication/ledgers")
    assert zk.exists("/ledgers/underreplication/locks")


def test_unknown_layout_refused(zk):
    zk.create("/ledgers/underreplication/LAYOUT", b'type: "FANCY"\nversion: 1\n', makepath=True)
    with pytest.raises(CompatibilityError):
        UnderReplicationManager(zk).ensure_layout()


def test_mark_merges_replicas(zk, urm):
    assert urm.mark_underreplicated(5, ["10.0.0.7:3181"])
    path = "/ledgers/underreplication/ledgers/0000/0000/0000/0005/urL0000000005"
    data = zk.get(path)[0].decode()
    assert 'replica: "10.0.0.7:3181"' in data and "ctime:" in data
    assert not urm.mark_underreplicated(5, ["10.0.0.7:3181"])  # nothing new: no write
    assert zk.get(path)[1].version == 0
    assert urm.mark_underreplicated(5, ["10.0.0.7:3181", "10.0.0.8:3181"])
    got = urm.get(5)
    assert got.missing_replicas == ("10.0.0.7:3181", "10.0.0.8:3181")
    assert got.version == 1


def test_mark_many_batches_new_marks_and_merges_existing_ones(urm):
    # 70000 and 4294967296 have hex parents nobody made yet; 5 is marked already.
    urm.mark_underreplicated(5, ["a:1"])
    wanted = {lid: ["b:1"] for lid in range(1, 120)} | {70000: ["c:1"], 4294967296: ["d:1"]}
    assert urm.mark_many(wanted, per_request=10) == len(wanted)  # 5's merge is a write too
    assert urm.mark_many({5: ["b:1"], 6: ["b:1"]}) == 0  # nothing new: no write
    listed = {u.ledger_id: u.missing_replicas for u in urm.list_underreplicated()}
    assert listed == {**{lid: tuple(b) for lid, b in wanted.items()}, 5: ("a:1", "b:1")}


def _requests(server: ZooKeeperServer, zk: KazooClient) -> int:
    """Requests the server received on ``zk``'s connection (``cons``): not other sessions'."""
    return server.requests_on({zk._connection._socket.getsockname()[1]})


def test_mark_many_leaves_known_marks_alone_and_merges_the_rest_at_once(zk, zk_server, urm):
    """The marks the caller read a moment ago (a first loss's, still standing): one that
    lists the bookie already is not written, one that lacks it is merged, and the new ones
    still go many to a request, none of them failed by a mark already there."""
    urm.mark_many({lid: ["a:1"] for lid in range(1, 11)})
    known = {u.ledger_id: u.missing_replicas for u in urm.list_underreplicated()}
    before = _requests(zk_server, zk)
    wanted = {**{lid: ["a:1"] for lid in range(1, 6)}, **{lid: ["b:1"] for lid in range(6, 31)}}
    assert urm.mark_many(wanted, per_request=10, known=known) == 25  # 6..10 merged, 20 new
    # Five merges (a refused create, a read and a write each), the hex dirs' check and two
    # requests of ten new marks (a ping, perhaps). Without ``known`` the request holding
    # ledgers 1 to 10 fails whole and each of them is marked alone: 40 requests or more.
    sent = _requests(zk_server, zk) - before
    assert sent <= 5 * 3 + 2 + 2 + 1, sent
    listed = {u.ledger_id: u.missing_replicas for u in urm.list_underreplicated()}
    assert listed == {
        **{lid: ("a:1",) for lid in range(1, 6)},
        **{lid: ("a:1", "b:1") for lid in range(6, 11)},
        **{lid: ("b:1",) for lid in range(11, 31)},
    }


def test_list_underreplicated_walks_every_mark(urm):
    for lid, b in [(1, "a:1"), (70000, "b:1"), (4294967296, "c:1")]:
        urm.mark_underreplicated(lid, [b])
    listed = {u.ledger_id: u.missing_replicas for u in urm.list_underreplicated()}
    assert listed == {1: ("a:1",), 70000: ("b:1",), 4294967296: ("c:1",)}


def test_the_marks_listing_is_pipelined_and_misses_nothing(zk_chroot, zk, zk_server, urm,
                                                            monkeypatch):  # fmt: skip
    """Hundreds of marks, each in a hex dir of its own, listed a few rounds at a time: every
    readable mark in path order with its lock holder, the unreadable one handed over by key,
    and a few dozen requests where one at a time took three per mark."""
    monkeypatch.setattr(underreplication, "LISTINGS_PER_ROUND", 64)
    ids = [*range(1, 301), 70000, 4294967296]
    urm.mark_many({lid: ["a:1", f"b{lid % 3}:1"] for lid in ids})
    corrupt = "/ledgers/underreplication/ledgers/0000/0000/0000/0096/urL0000000150"
    zk.set(corrupt, b"replica: {{{")
    other_client = connect(zk_chroot)
    try:
        assert UnderReplicationManager(other_client, worker_id="w-b").try_acquire(7) is not None
        unreadable: list[str] = []
        before = _requests(zk_server, zk)
        listed = list(urm.list_underreplicated(on_unreadable=lambda key, _: unreadable.append(key)))
        sent = _requests(zk_server, zk) - before
        bulk = urm.meta._bulk  # the store's pipelined session, if the walk opened it
        if bulk is not None and bulk.sock is not None:
            sent += zk_server.requests_on({bulk.sock.getsockname()[1]})
        with pytest.raises(CorruptMetadataError, match="under-replicated ledger"):
            list(urm.list_underreplicated())  # without a handler the walk stops there
    finally:
        other_client.stop()
        other_client.close()
    assert unreadable == [corrupt]
    assert [u.ledger_id for u in listed] == [lid for lid in ids if lid != 150]
    by_id = {u.ledger_id: u for u in listed}
    assert by_id[299].missing_replicas == ("a:1", "b2:1") and by_id[299].version == 0
    assert by_id[7].lock_holder == "w-b"
    assert [u.ledger_id for u in listed if u.lock_holder is not None] == [7]
    # Five levels of listings (306 dirs) and 604 reads, fifty to a multiRead, a few rounds:
    # some twenty requests. One at a time it was 906 and more.
    assert sent <= 40, sent


def test_lock_excludes_second_worker_and_dies_with_session(zk_chroot, zk, urm):
    urm.mark_underreplicated(8, ["x:1"])
    other_client = connect(zk_chroot)
    other = UnderReplicationManager(other_client, worker_id="worker-b")
    lock = other.try_acquire(8)
    assert lock is not None and lock.mark_version == 0
    assert urm.try_acquire(8) is None
    assert urm.lock_holder(8) == "worker-b"
    assert urm.poll_ledger_to_rereplicate() is None  # the only marked ledger is locked
    # the holder dies: its ephemeral lock goes with its session
    other_client.stop()
    other_client.close()
    again = urm.try_acquire(8)
    assert again is not None
    urm.release(again)


def test_mark_replicated_only_if_unchanged(zk, urm):
    urm.mark_underreplicated(9, ["x:1"])
    lock = urm.try_acquire(9)
    urm.mark_underreplicated(9, ["y:1"])  # an auditor re-marks meanwhile
    assert not urm.mark_replicated(lock)
    assert urm.get(9) is not None  # mark survives
    assert urm.lock_holder(9) is None  # lock released anyway

    lock = urm.poll_ledger_to_rereplicate()
    assert lock is not None and lock.ledger_id == 9
    assert urm.mark_replicated(lock)
    assert urm.get(9) is None
    # empty hex dirs pruned
    assert zk.get_children("/ledgers/underreplication/ledgers") == []


def test_disable_flag_and_recovery_delay(zk, urm):
    assert urm.is_replication_enabled()
    urm.disable_replication()
    assert zk.get("/ledgers/underreplication/disable")[0] == b""
    assert not urm.is_replication_enabled()
    urm.enable_replication()
    assert urm.is_replication_enabled()
    assert urm.get_lost_bookie_recovery_delay() is None
    urm.set_lost_bookie_recovery_delay(60)
    assert zk.get("/ledgers/underreplication/lostBookieRecoveryDelay")[0] == b"60"
    assert urm.get_lost_bookie_recovery_delay() == 60


def test_concurrent_marks_and_clears_in_shared_parents_never_fail(zk, urm):
    # Ledgers 0..39 share their hex parents: one worker's pruning of an empty parent races
    # with another's makepath + create (seen at 10k ledgers); both must retry, not fail.
    import concurrent.futures

    def worker(lid: int) -> int:
        for _ in range(15):
            assert urm.mark_underreplicated(lid, ["10.0.0.1:3181"]) in (True, False)
            lock = urm.try_acquire(lid)
            assert lock is not None
            urm.mark_replicated(lock)
        return lid

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert sorted(pool.map(worker, range(40))) == list(range(40))
    assert list(urm.list_underreplicated()) == []


def test_a_repair_batch_prunes_the_emptied_dirs_once_at_its_end(zk, urm):
    # A repair clears many marks under one hex parent: the dirs stay until prune_cleared,
    # and a dir that still holds someone else's mark is kept.
    for lid in (1, 2, 70000):
        written, version = urm.mark(lid, ["x:1"])
        assert written and version == 0
        lock = urm.try_acquire_marked(lid, version)
        assert lock is not None and urm.mark_replicated(lock, prune=False)
        assert urm.get(lid) is None and urm.lock_holder(lid) is None
    urm.mark_underreplicated(3, ["y:1"])  # another worker's mark beside 1 and 2
    top = "/ledgers/underreplication/ledgers/0000/0000"
    assert sorted(zk.get_children(top)) == ["0000", "0001"]  # 70000 is 0x11170
    assert zk.get_children(f"{top}/0000") == ["0003"]
    assert zk.get_children(f"{top}/0001") == []
    # Each ledger's own leaf went with its mark; 70000's parent held nothing else.
    assert urm.prune_cleared() == 1
    assert zk.get_children(top) == ["0000"]
    assert zk.get_children(f"{top}/0000") == ["0003"]
    assert urm.prune_cleared() == 0  # nothing left to prune
    assert [m.ledger_id for m in urm.list_underreplicated()] == [3]


def test_a_lock_taken_with_the_markers_version_keeps_a_re_mark(urm):
    # The repair marks, an auditor re-marks with another bookie before the lock, and the
    # repair's clear must not delete the bookie it did not repair.
    _, version = urm.mark(11, ["x:1"])
    assert urm.mark(11, ["x:1"]) == (False, version)  # nothing new: the same version
    urm.mark_underreplicated(11, ["y:1"])
    lock = urm.try_acquire_marked(11, version)
    assert lock is not None
    assert not urm.mark_replicated(lock, prune=False)
    got = urm.get(11)
    assert got is not None and got.missing_replicas == ("x:1", "y:1")


@pytest.fixture
def counted(zk_chroot, restore_zk_budget):
    """A manager on a budgeted session (unlimited, counting every request) and its budget."""
    from bklib.meta.stores.zookeeper.budget import set_request_rate
    from bklib.meta.stores.zookeeper.client import new_client

    client = new_client(zk_chroot, timeout=10)
    client.start(timeout=15)
    budget = set_request_rate(None)
    try:
        m = UnderReplicationManager(client, worker_id="worker-c")
        m.ensure_layout()
        yield m, budget
    finally:
        client.stop()
        client.close()


def test_a_fresh_mark_and_its_clear_take_one_request_each(zk, counted):
    urm, budget = counted
    urm.mark(1, ["x:1"])  # the first mark under these parents makes them
    before = budget.requests
    written, version = urm.mark(2, ["x:1"])
    assert (written, version) == (True, 0)
    assert budget.requests - before == 1  # its own dir and the mark in one multi
    lock = urm.try_acquire_marked(2, version)
    assert lock is not None
    before = budget.requests
    assert urm.mark_replicated(lock, prune=False)
    assert budget.requests - before == 1  # the mark, its dir and the lock in one multi
    parent = "/ledgers/underreplication/ledgers/0000/0000/0000"
    assert zk.get_children(parent) == ["0001"]  # ledger 1's dir stays, 2's went
    assert urm.get(2) is None and urm.lock_holder(2) is None
    assert urm.get(1) is not None


def test_a_clear_whose_lock_is_gone_still_clears_one_step_at_a_time(zk, counted):
    # The lock vanished (its session expired, or an operator removed it): the one-request
    # clear cannot apply, and the steps run one at a time as before.
    urm, budget = counted
    _, version = urm.mark(5, ["x:1"])
    lock = urm.try_acquire_marked(5, version)
    assert lock is not None
    zk.delete("/ledgers/underreplication/locks/urL0000000005")
    before = budget.requests
    assert urm.mark_replicated(lock)
    assert budget.requests - before > 1
    assert urm.get(5) is None
    assert zk.get_children("/ledgers/underreplication/ledgers") == []  # pruned as before


def test_a_remark_and_a_clear_on_a_store_without_multi_take_the_old_steps(zk, urm, monkeypatch):
    # A mark whose dir exists (re-marked) takes the create / get / set path.
    urm.mark_underreplicated(12, ["x:1"])
    assert urm.mark(12, ["y:1"])[0]
    got = urm.get(12)
    assert got is not None and got.missing_replicas == ("x:1", "y:1")
    # A store without an atomic request (the base class's answer: Oxia's) clears step by step.
    from bklib.meta.stores.base import MetadataStore

    lock = urm.try_acquire(12)
    assert lock is not None
    monkeypatch.setattr(type(urm.meta), "delete_together", MetadataStore.delete_together)
    assert urm.mark_replicated(lock)
    assert urm.get(12) is None and urm.lock_holder(12) is None
    assert zk.get_children("/ledgers/underreplication/ledgers") == []


def test_a_clear_cut_off_by_a_lost_connection_still_releases_the_lock(zk, urm, monkeypatch):
    # The multi's answer is lost (applied or not): the error reaches the caller, and the
    # lock does not stay with the session for Java workers to find held.
    from bklib.meta.stores.base import StoreUnavailable

    _, version = urm.mark(13, ["x:1"])
    lock = urm.try_acquire_marked(13, version)
    assert lock is not None

    def cut_off(self, keys):
        raise StoreUnavailable("ZooKeeper at test: ConnectionLoss", path=keys[0][0])

    monkeypatch.setattr(type(urm.meta), "delete_together", cut_off)
    with pytest.raises(StoreUnavailable):
        urm.mark_replicated(lock)
    assert urm.lock_holder(13) is None
    assert urm.get(13) is not None  # the mark stays for the next attempt


def test_a_mark_the_caller_made_before_is_merged_without_the_create_request(zk, counted):
    # The watch marks its findings, then repairs: the repair's mark is expected to exist.
    urm, budget = counted
    urm.mark(20, ["x:1"])
    urm.mark_underreplicated(21, ["x:1"])
    before = budget.requests
    assert urm.mark(21, ["x:1"], likely_new=False) == (False, 0)
    assert budget.requests - before == 2  # the refused create and the read
    before = budget.requests
    assert urm.mark(21, ["x:1"]) == (False, 0)
    assert budget.requests - before == 3  # the refused multi first
    # Expected but missing: still created, the old way.
    assert urm.mark(22, ["y:1"], likely_new=False)[0]
    got = urm.get(22)
    assert got is not None and got.missing_replicas == ("y:1",)
