"""The watch's leader election, on a real ZooKeeper and a real Oxia: lowest member leads, a
session expiry ends the term (the member is gone, ``is_leader`` says no in the new session),
the standby leads, and the old leader rejoins as a standby. Never in BookKeeper's
``auditorelection`` nor Pulsar's ``underreplication/leader``."""

from __future__ import annotations

import time

import pytest
from kazoo.client import KazooClient

from bklib.meta.stores import MetadataStore, StoreUnavailable, open_store
from bklib.meta.stores.oxia import OxiaStore
from bklib.meta.stores.zookeeper import ZooKeeperStore
from jobs.watch.election import LeaderElection, LeaderFence, election_path, read_leader

pytestmark = pytest.mark.integration


def expire(store: MetadataStore) -> None:
    """End ``store``'s session on the server and wait until the store has a new one.

    ZooKeeper: another connection with the session's id and password closes it. Oxia: the
    client stops sending keepalives (a paused or partitioned client), so the server expires
    the session after its timeout and deletes its ephemeral keys."""
    owner = store.session_owner
    if isinstance(store, ZooKeeperStore):
        sid, password = store.client.client_id
        ghost = KazooClient(hosts=store.hosts, client_id=(sid, password))
        ghost.start(timeout=10)
        ghost.stop()
        ghost.close()
    else:
        assert isinstance(store, OxiaStore)
        # Test-only reach into the client: there is no public way to pause its heartbeats.
        for session in store._client._session_manager.sessions_by_shard.values():
            session._stop_event.set()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if store.connected and store.session_owner not in (None, owner):
            return
        time.sleep(0.05)
    raise AssertionError("the session did not expire and come back")


def join_when_ready(election: LeaderElection) -> None:
    """Join as the watch loop does: a store still replacing its session is retried."""
    deadline = time.monotonic() + 15
    while True:
        try:
            election.join()
            return
        except StoreUnavailable:
            assert time.monotonic() < deadline
            time.sleep(0.2)


def test_session_expiry_ends_the_term_and_the_standby_leads(store_locator: str) -> None:
    a, b = open_store(store_locator, timeout=3), open_store(store_locator, timeout=3)
    try:
        ea = LeaderElection(a, "/ledgers", {"id": "a"})
        eb = LeaderElection(b, "/ledgers", {"id": "b"})
        ea.join()
        eb.join()
        assert ea.is_leader() and not eb.is_leader()
        assert read_leader(b, "/ledgers") == ({"id": "a"}, 2)
        assert election_path("/ledgers") == "/bkaudit/ledgers/watch-leader"
        assert a.exists("/ledgers/underreplication/auditorelection") is None
        assert a.exists("/ledgers/underreplication/leader") is None

        expire(a)
        # The old leader's store has a new session: it must not act.
        assert not ea.in_current_session() and not ea.is_leader()
        assert eb.is_leader()
        join_when_ready(ea)
        assert not ea.is_leader() and read_leader(a, "/ledgers") == ({"id": "b"}, 2)

        eb.leave()  # a clean stop hands over at once
        assert ea.is_leader()
    finally:
        for c in (a, b):
            c.close()


def test_a_fence_checked_over_another_session_ends_with_the_term(store_locator: str) -> None:
    """What a repair worker process asks before each ledger, over its own session: the
    leader's member still leads. Not once the leader's session expired, even after the old
    leader rejoined (a new member), and never for a standby's member."""
    a, b = open_store(store_locator, timeout=3), open_store(store_locator, timeout=3)
    worker = open_store(store_locator, timeout=3)
    try:
        ea = LeaderElection(a, "/ledgers", {"id": "a"})
        eb = LeaderElection(b, "/ledgers", {"id": "b"})
        assert ea.fence() is None  # not joined: nothing to fence on
        ea.join()
        eb.join()
        fence, standby = ea.fence(), eb.fence()
        assert fence is not None and standby is not None
        assert fence.holds(worker) and not standby.holds(worker)
        assert not LeaderFence(fence.path, fence.node, "another session").holds(worker)
        expire(a)
        assert not fence.holds(worker)
        join_when_ready(ea)
        assert not fence.holds(worker)
        assert standby.holds(worker)  # the standby leads now
    finally:
        for s in (a, b, worker):
            s.close()
