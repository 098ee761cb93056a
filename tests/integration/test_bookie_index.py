"""The watch's bookie index against full scans, on a real ZooKeeper and a real Oxia
(docs/watch.md, "The index").

- 20,000 ledgers and random metadata changes (creates, ensemble changes, in-place
  replacements, closes, deletes), some of them while the index is built: after each refresh
  the index equals one built from a full scan. In the middle the change feed's session is
  lost (ZooKeeper: ended on the server; Oxia: expired); the index is stale until rebuilt, and
  is exact again after.
- Notifications held back: the barrier times out, the index is stale (it answers nothing),
  and stays so after they flow again, until a rebuild.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from kazoo.client import KazooClient

from bklib.audit.bookie_index import BookieIndex
from bklib.audit.engine import scan_dirs
from bklib.audit.index_keeper import IndexKeeper, IndexStale, RebuildCause
from bklib.audit.model import LedgerView
from bklib.meta.model import LedgerMetadata, LedgerState, Segment
from bklib.meta.serde import encode_metadata
from bklib.meta.store import LedgerStore
from bklib.meta.stores import KeyExists, MetadataStore, open_store
from bklib.meta.stores.zookeeper.bulk import ZNODEEXISTS, ZOK, BulkWriter
from bklib.meta.stores.zookeeper.change_feed import ZkChangeFeed
from bklib.testing.oxiaserver import OxiaServer
from bklib.testing.zkclient import connect
from bklib.testing.zkserver import ZooKeeperServer
from tests.integration.test_watch_election import expire

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

LEDGERS = 20_000
BOOKIES = [f"10.1.0.{n}:3181" for n in range(1, 25)]


@pytest.fixture(scope="module")
def oxia(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OxiaServer]:
    """An Oxia of this module's own (its 20,000 keys are nobody else's to wipe)."""
    with OxiaServer(tmp_path_factory.mktemp("oxia-index"), shards=3) as server:
        yield server


@pytest.fixture(scope="module")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    """A ZooKeeper of this module's own: its chroots are never wiped znode by znode."""
    with ZooKeeperServer(tmp_path_factory.mktemp("zk-index")) as server:
        yield server


@pytest.fixture(params=["zookeeper", "oxia"])
def locator(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "zookeeper":
        server: ZooKeeperServer = request.getfixturevalue("zookeeper")
        chroot = f"/index-{random.randrange(1 << 30)}"
        client = connect(server.connect_string)
        try:
            client.ensure_path(chroot)
        finally:
            client.stop()
            client.close()
        yield server.connect_string + chroot
        return
    oxia: OxiaServer = request.getfixturevalue("oxia")
    yield oxia.locator()  # each test lays its ledgers under a root of its own


@pytest.fixture
def root() -> str:
    """A ledgers root of this test's own (one Oxia namespace serves the module)."""
    return f"/ledgers-{random.randrange(1 << 30)}"


def metadata(ledger_id: int, rng: random.Random) -> LedgerMetadata:
    ensemble = tuple(rng.sample(BOOKIES, 3))
    return LedgerMetadata(ledger_id, 3, 3, 2, (Segment(0, ensemble),))


def _parents(root: str, path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(len(root.split("/")) + 1, len(parts))]


def seed(store: MetadataStore, locator: str, root: str, mds: list[LedgerMetadata]) -> None:
    """Lay the cluster out and create every ledger: pipelined on ZooKeeper, in threads on
    Oxia (parents first on both)."""
    ledgers = LedgerStore(store, root)
    ledgers.init_cluster()
    leaves = [(ledgers.path_for(md.ledger_id), encode_metadata(md)) for md in mds]
    parents = {p for path, _ in leaves for p in _parents(root, path)}
    parents = sorted(parents, key=lambda p: p.count("/"))
    if store.kind == "zookeeper":
        with BulkWriter(locator) as writer:
            for path, err in writer.create_many((p, b"") for p in parents):
                assert err in (ZOK, ZNODEEXISTS), (path, err)
            for path, err in writer.create_many(leaves):
                assert err == ZOK, (path, err)
        return
    for p in parents:
        with contextlib.suppress(KeyExists):
            store.create(p, b"", parents=True)
    # Test-only reach into the client: plain puts, the parents being there (a create checks
    # its parent first, which triples the seeding's time).
    client = store._client  # type: ignore[attr-defined]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda kv: client.put(kv[0], kv[1]), leaves))


def scan(store: MetadataStore, root: str) -> list[LedgerView]:
    return list(scan_dirs(store, LedgerStore(store, root).leaf_dirs()))


def index_of(views: list[LedgerView]) -> BookieIndex:
    index = BookieIndex()
    for v in views:
        assert v.ok, v
        index.apply(v.ledger_id, v)
    return index


class Churn:
    """Random changes through :class:`LedgerStore`, as writers, the Auditor and repairs make
    them: new ledgers, a new segment on an open ledger, a bookie replaced in place, closes
    and deletes."""

    def __init__(self, store: MetadataStore, root: str, seed_: int, ids: list[int]) -> None:
        self.ledgers = LedgerStore(store, root)
        self.rng = random.Random(seed_)
        self.ids = ids
        self.next_id = max(ids) + 1
        self.counts: dict[str, int] = {}

    def step(self) -> None:
        rng = self.rng
        op = rng.choices(["create", "segment", "replace", "close", "delete"], [3, 3, 2, 2, 1])[0]
        self.counts[op] = self.counts.get(op, 0) + 1
        if op == "create":
            self.ledgers.create_ledger(metadata(self.next_id, rng))
            self.ids.append(self.next_id)
            self.next_id += 1
            return
        lid = self.ids[rng.randrange(len(self.ids))]
        current = self.ledgers.read_ledger(lid)
        md = current.value
        if op == "delete":
            self.ledgers.delete_ledger(lid, current.version)
            self.ids.remove(lid)
            return
        if op == "close":
            if md.state is LedgerState.OPEN:
                end = md.segments[-1].first_entry_id + 9
                closed = md.replace(state=LedgerState.CLOSED, last_entry_id=end, length=1000)
                self.ledgers.write_ledger(closed, current.version)
            return
        segments = list(md.segments)
        last = segments[-1]
        other = rng.choice([b for b in BOOKIES if b not in last.ensemble])
        ensemble = tuple(other if i == 0 else b for i, b in enumerate(last.ensemble))
        if op == "segment" and md.state is LedgerState.OPEN:
            segments.append(Segment(last.first_entry_id + 10, ensemble))
        else:
            segments[-1] = Segment(last.first_entry_id, ensemble)
        self.ledgers.write_ledger(md.replace(segments=tuple(segments)), current.version)

    def run(self, n: int) -> None:
        for _ in range(n):
            self.step()


class CountedScan:
    """A full scan that a reconciliation may read twice; counts its reads."""

    def __init__(self, views: Callable[[], list[LedgerView]]) -> None:
        self.views, self.calls = views, 0

    def __call__(self) -> list[LedgerView]:
        self.calls += 1
        return self.views()


def assert_exact(keeper: IndexKeeper, store: MetadataStore) -> None:
    keeper.refresh()
    scanned = index_of(scan(store, keeper.root))
    assert keeper.index.diff(scanned) == []
    for b in BOOKIES[:5]:
        assert keeper.ledgers_of_any([b]) == scanned.ledgers_of(b)


def lose_feed_session(keeper: IndexKeeper, store: MetadataStore) -> None:
    """End the session the change feed reads: on ZooKeeper another client takes its id and
    closes it; on Oxia the store's session expires (and is replaced)."""
    feed = keeper.feed
    if isinstance(feed, ZkChangeFeed):
        sid, password = feed.client_id
        ghost = KazooClient(hosts=store.hosts, client_id=(sid, password))  # type: ignore[attr-defined]
        ghost.start(timeout=10)
        ghost.stop()
        ghost.close()
    else:
        # An Oxia session matters to a store through its ephemeral keys (the watch's election
        # member): hold one, as the watch does, so the expiry is noticed.
        store.create(f"{keeper.root}-member", b"", ephemeral=True)
        expire(store)


def wait_stale(keeper: IndexKeeper) -> IndexStale:
    done = threading.Event()
    for _ in range(300):
        stale = keeper.stale
        if stale is not None:
            return stale
        done.wait(0.1)
    raise AssertionError("the lost session did not make the index stale")


def test_index_equals_a_full_scan_through_changes_and_a_session_loss(
    locator: str, root: str
) -> None:
    rng = random.Random(48)
    mds = [metadata(lid, rng) for lid in range(1, LEDGERS + 1)]
    with open_store(locator, timeout=30, session_timeout=6.0) as store:
        seed(store, locator, root, mds)
        keeper = IndexKeeper(store, root, LedgerStore(store, root).kind, barrier_timeout=15)
        churn = Churn(store, root, 7, [md.ledger_id for md in mds])
        try:
            keeper.start()
            # Changes while the index is built from its scan: the feed has them all.
            writer = threading.Thread(target=churn.run, args=(800,))
            writer.start()
            views = scan(store, root)
            writer.join()
            keeper.build(views, RebuildCause.TAKE_OVER)
            assert_exact(keeper, store)
            churn.run(1500)
            assert_exact(keeper, store)

            lose_feed_session(keeper, store)
            stale = wait_stale(keeper)
            assert stale.cause == RebuildCause.GAP, stale
            churn.run(300)  # changes no feed announces
            with pytest.raises(IndexStale):
                keeper.refresh()
            with pytest.raises(IndexStale):
                keeper.refresh()  # stale until rebuilt, whatever flows meanwhile

            keeper.start()
            keeper.build(scan(store, root), RebuildCause.GAP)
            churn.run(1000)
            assert_exact(keeper, store)
        finally:
            keeper.close()
    assert all(churn.counts.get(op, 0) > 50 for op in ("create", "segment", "replace")), (
        churn.counts
    )
    assert all(churn.counts.get(op, 0) > 20 for op in ("close", "delete")), churn.counts


def test_held_notifications_make_the_index_stale_until_a_rebuild(locator: str, root: str) -> None:
    rng = random.Random(5)
    mds = [metadata(lid, rng) for lid in range(1, 201)]
    with open_store(locator, timeout=30) as store:
        seed(store, locator, root, mds)
        keeper = IndexKeeper(store, root, LedgerStore(store, root).kind, barrier_timeout=2)
        held = threading.Event()
        flowing = threading.Event()
        announced = keeper._announced  # the listener the feed calls (private: the test holds it)

        def hold(path: str) -> None:
            held.set()
            flowing.wait(60)
            announced(path)

        keeper._announced = hold  # type: ignore[method-assign]
        churn = Churn(store, root, 3, [md.ledger_id for md in mds])
        try:
            keeper.start()
            keeper.build(scan(store, root), RebuildCause.TAKE_OVER)
            victim = BOOKIES[0]
            before = keeper.ledgers_of_any([victim])
            churn.run(20)
            assert held.wait(30)  # the feed's thread is inside the listener now
            with pytest.raises(IndexStale) as stale:
                keeper.refresh()
            assert stale.value.cause == RebuildCause.BARRIER
            flowing.set()  # the notifications flow again: the index still answers nothing
            with pytest.raises(IndexStale):
                keeper.refresh()
            assert keeper.ledgers_of_any([victim]) == before  # what a caller must not use

            keeper.start()
            keeper.build(scan(store, root), RebuildCause.BARRIER)
            assert_exact(keeper, store)
        finally:
            flowing.set()
            keeper.close()


def test_reconciliation_reports_real_differences_only(locator: str, root: str) -> None:
    """Changes made while the reconciling scan runs are no difference; a ledger the index
    holds wrongly is one (reported, and the index rebuilt from the scan)."""
    rng = random.Random(9)
    mds = [metadata(lid, rng) for lid in range(1, 2001)]
    with open_store(locator, timeout=30) as store:
        seed(store, locator, root, mds)
        keeper = IndexKeeper(store, root, LedgerStore(store, root).kind, barrier_timeout=15)
        churn = Churn(store, root, 11, [md.ledger_id for md in mds])
        try:
            keeper.start()
            keeper.build(scan(store, root), RebuildCause.TAKE_OVER)
            with keeper.announced_since() as window:
                writer = threading.Thread(target=churn.run, args=(400,))
                writer.start()
                views = scan(store, root)
                writer.join()
                first = CountedScan(lambda: views)
                assert keeper.reconcile(first, window.ids) == []
            assert keeper.differences == 0 and first.calls == 1  # no rebuild, no second pass

            wrong = churn.ids[0]  # the index is made to hold something no store ever said
            keeper.index.apply(wrong, metadata(wrong, random.Random(1)))
            keeper.index.apply(wrong, None)
            with keeper.announced_since() as window:
                second = CountedScan(lambda: scan(store, root))
                diffs = keeper.reconcile(second, window.ids)
            assert [d.ledger_id for d in diffs] == [wrong]
            assert diffs[0].ours is None and diffs[0].theirs is not None
            assert keeper.differences == 1 and keeper.rebuilds[RebuildCause.RECONCILIATION] == 1
            assert second.calls == 2  # the rebuild read the scan again
            assert_exact(keeper, store)
        finally:
            keeper.close()
