"""A loss's marks published beside its repair (jobs/watch/marking.py) on a real ZooKeeper:
when a ledger is let through, its mark is in ZooKeeper, merged with one already standing; and
a session closed under the publishing stops the ledgers whose marks are not out."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient

from bklib.meta import paths
from bklib.meta.underreplication import UnderReplicationManager
from bklib.testing.zkclient import connect
from jobs.watch.marking import MarksFailed, MarksInFlight

pytestmark = pytest.mark.integration


@pytest.fixture
def urm(zk: KazooClient) -> UnderReplicationManager:
    m = UnderReplicationManager(zk, worker_id="watch")
    m.ensure_layout()
    return m


def test_a_ledger_let_through_has_its_mark_in_zookeeper(
    zk: KazooClient, urm: UnderReplicationManager
) -> None:
    ids = [lid * 23 for lid in range(1, 601)]
    urm.mark_underreplicated(ids[400], ["old:3181"])  # standing: merged, not replaced
    order = ids[::-1]
    marks = MarksInFlight(urm, {lid: ["lost:3181"] for lid in ids}, order, per_chunk=100)
    missing = []
    for lid in order[::7]:  # the repair's threads, sampled, in its order
        assert marks.wait_for(lid)
        if zk.exists(paths.ur_ledger_path(urm.root, lid)) is None:
            missing.append(lid)
    marks.join()
    assert missing == []
    listed = {u.ledger_id: u.missing_replicas for u in urm.list_underreplicated()}
    assert set(listed) == set(ids)
    assert sorted(listed[ids[400]]) == ["lost:3181", "old:3181"]
    assert marks.written == 600  # the merge too


def test_a_session_closed_under_the_marks_stops_the_rest(zk_chroot: str) -> None:
    client = connect(zk_chroot)
    urm = UnderReplicationManager(client, worker_id="watch")
    urm.ensure_layout()
    ids = list(range(1, 2001))
    first = MarksInFlight(urm, {lid: ["lost:3181"] for lid in ids[:100]}, ids[:100])
    first.join()  # the session works
    marks = MarksInFlight(urm, {lid: ["lost:3181"] for lid in ids[100:]}, ids[100:], per_chunk=50)
    client.stop()
    client.close()
    assert not marks.wait_for(ids[-1])
    with pytest.raises(MarksFailed):
        marks.join()
