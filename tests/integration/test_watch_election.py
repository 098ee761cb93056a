"""The watch's leader election on a real ZooKeeper: lowest member leads, a session expiry
ends the term (the member is gone, ``is_leader`` says no in the new session), the standby
leads, and the old leader rejoins as a standby. Never in BookKeeper's ``auditorelection``."""

from __future__ import annotations

import time

import pytest
from kazoo.client import KazooClient

from bklib.meta.store import connect
from jobs.watch.election import LeaderElection, election_path, read_leader

pytestmark = pytest.mark.integration


def expire(zk_hosts: str, client: KazooClient) -> None:
    """Expire ``client``'s session: another connection with its id closes it."""
    sid, password = client.client_id
    ghost = KazooClient(hosts=zk_hosts, client_id=(sid, password))
    ghost.start(timeout=10)
    ghost.stop()
    ghost.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if client.connected and client.client_id and client.client_id[0] != sid:
            return
        time.sleep(0.05)
    raise AssertionError("the session did not expire and reconnect")


def test_session_expiry_ends_the_term_and_the_standby_leads(zk_chroot: str) -> None:
    a, b = connect(zk_chroot, timeout=3), connect(zk_chroot, timeout=3)
    try:
        ea = LeaderElection(a, "/ledgers", {"id": "a"})
        eb = LeaderElection(b, "/ledgers", {"id": "b"})
        ea.join()
        eb.join()
        assert ea.is_leader() and not eb.is_leader()
        assert read_leader(b, "/ledgers") == ({"id": "a"}, 2)
        assert election_path("/ledgers") == "/bkaudit/ledgers/watch-leader"
        assert a.exists("/ledgers/underreplication/auditorelection") is None

        expire(zk_chroot, a)
        # The old leader's client reconnected with a new session: it must not act.
        assert not ea.in_current_session() and not ea.is_leader()
        assert eb.is_leader()
        ea.join()
        assert not ea.is_leader() and read_leader(a, "/ledgers") == ({"id": "b"}, 2)

        eb.leave()  # a clean stop hands over at once
        assert ea.is_leader()
    finally:
        for c in (a, b):
            c.stop()
            c.close()
