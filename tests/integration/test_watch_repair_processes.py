"""The watch's repair in more than one process (jobs/watch/repair_workers.py), with real
processes on a real sandbox: every ledger moved once across the shares, a worker that starts
no ledger once the leader's fence fails, and a SIGKILLed leader that takes its workers with it
while the standby finishes."""

from __future__ import annotations

import re
import time
from pathlib import Path

import psutil
import pytest

from bklib.meta.stores import open_store
from bklib.meta.underreplication import UnderReplicationManager
from bklib.repair.requests import mark_requests
from jobs.tables.schema import ACTIONS
from jobs.watch.config import WatchConfig, repair_config
from jobs.watch.election import LeaderElection, LeaderFence
from jobs.watch.repair_workers import RepairWorkers
from tests.audit_helpers import AuditCluster, audit_cluster
from tests.integration.test_watch import (
    SLOW_COPY,
    Watch,
    assert_clean,
    ledgers,
    naming,
    repaired,
    rows,
    wait_for,
    watching,
)

pytestmark = pytest.mark.integration


def locked_ids(c: AuditCluster) -> list[int]:
    """The ledgers whose under-replication lock someone holds (a repair is copying them)."""
    path = UnderReplicationManager(c.store.zk).base + "/locks"
    if not c.store.meta.exists(path):
        return []
    return [int(name.removeprefix("urL")) for name in c.store.meta.children(path)]


STARTED = re.compile(r"repair worker processes started: pid (\d+)")


def first_worker(w: Watch) -> psutil.Process:
    """The first repair worker process the watch's log names."""
    match = STARTED.search(w.log.read_text())
    assert match is not None, w.tail()
    return psutil.Process(int(match.group(1)))


def assert_swapped_once(wh: str) -> None:
    """No segment's metadata swapped twice: one METADATA_UPDATE DONE per segment moved."""
    done = [(a["ledger_id"], a["segment_first_entry_id"]) for a in rows(wh, ACTIONS)
            if a["action"] == "METADATA_UPDATE" and a["status"] == "DONE"]  # fmt: skip
    assert len(done) == len(set(done))


def _workers(config, reqs, fence, proceed=lambda: True):  # type: ignore[no-untyped-def]
    """Workers for ``reqs`` in one share; their rows once done, and their failures."""
    workers = RepairWorkers(config, [reqs], fence, proceed, stop_timeout=10)
    answered = [r for rows_ in workers.finish() for r in rows_]
    assert list(workers.close()) == []
    return answered, workers.failed


def test_a_worker_starts_no_ledger_once_the_leaders_fence_fails_or_it_says_stop(
    tmp_path: Path, zk_chroot: str
) -> None:
    config = repair_config(WatchConfig(zk=zk_chroot, warehouse=str(tmp_path / "wh")), None)
    reqs = mark_requests([11, 12, 13], ())  # verify marks of ledgers that do not exist
    leader = open_store(zk_chroot, timeout=5)
    try:
        election = LeaderElection(leader, "/ledgers", {"id": "leader"})
        election.join()
        fence = election.fence()
        assert fence is not None
        # While the fence holds, the worker answers every request it was given...
        answered, failed = _workers(config, reqs, fence)
        assert {r["ledger_id"] for r in answered} == {11, 12, 13} and failed == []
        # ...once the leader's member is gone, none, and it fails nowhere...
        election.leave()
        assert _workers(config, reqs, fence) == ([], [])
        # ...nor when the leader's check says no (its member intact).
        election.join()
        fence = election.fence()
        assert fence is not None
        assert _workers(config, reqs, fence, proceed=lambda: False) == ([], [])
    finally:
        leader.close()


def test_a_worker_that_cannot_open_its_session_is_reported(tmp_path: Path) -> None:
    unreachable = WatchConfig(zk="127.0.0.1:1", warehouse=str(tmp_path / "wh"),
                              zk_session_timeout=2)  # fmt: skip
    config = repair_config(unreachable, None)
    fence = LeaderFence("/bkaudit/ledgers/watch-leader", "member-0000000000", None)
    answered, failed = _workers(config, mark_requests([1], ()), fence)
    assert answered == []
    assert len(failed) == 1 and "repair worker 1" in failed[0] and "failed" in failed[0], failed


def test_a_repair_in_two_processes_moves_every_ledger_once(tmp_path: Path, zk_chroot: str) -> None:
    wh = str(tmp_path / "wh")
    with audit_cluster(tmp_path / "sb", zk_chroot, bookies=4) as c:
        victim = c.bookie_ids[3]
        ids = [md.ledger_id for md in ledgers(c, victim, n=9)]
        assert {i % 2 for i in ids} == {0, 1}  # both shares have work
        extra = ("--lost-bookie-recovery-delay", "0s", "--repair-processes", "2")
        with watching(c.zk, wh, tmp_path, "w", *extra) as w:
            w.wait_role("leader")
            c.sandbox.kill_bookie(victim)
            wait_for(lambda: repaired(c, ids, victim), 120, "repair", w)
        assert w.proc.returncode == 0, w.tail()
        log = w.log.read_text()
        assert "in 2 processes" in log and "repair worker processes started" in log, w.tail()
        assert_clean(c, ids, victim)
    actions = rows(wh, ACTIONS)
    copies = [a for a in actions if a["action"] == "COPY" and a["status"] == "DONE"]
    assert {a["ledger_id"] for a in copies} == set(ids)
    assert_swapped_once(wh)


def test_a_killed_leader_takes_its_repair_workers_with_it(tmp_path: Path, zk_chroot: str) -> None:
    wh = str(tmp_path / "wh")
    with audit_cluster(tmp_path / "sb", zk_chroot, bookies=4) as c:
        victim = c.bookie_ids[3]
        ids = [md.ledger_id for md in ledgers(c, victim, n=8, entries=60)]
        # No first ledgers: at this pace they would hold the workers' start for minutes.
        only_workers = ("--repair-processes", "2", "--first-ledgers", "0")
        with watching(c.zk, wh, tmp_path, "a", *SLOW_COPY, *only_workers) as a:
            a.wait_role("leader")
            with watching(c.zk, wh, tmp_path, "b", "--lost-bookie-recovery-delay", "0s") as b:
                b.wait_role("standby")
                c.sandbox.kill_bookie(victim)
                wait_for(lambda: STARTED.search(a.log.read_text()), 60, "a worker", a, b)
                worker = first_worker(a)
                assert worker.ppid() == a.proc.pid
                odd = [lid for lid in ids if lid % 2 == 1]  # the worker's share
                wait_for(lambda: set(locked_ids(c)) & set(odd), 60, "a worker's lock", a, b)
                a.kill9()
                assert naming(c, odd, victim), "the worker finished before the leader died"
                # Within the leader's session (3 s): the fence still holds, so only the death
                # signal can have ended the worker this soon.
                deadline = time.monotonic() + 2
                while worker.is_running() and worker.status() != psutil.STATUS_ZOMBIE:
                    assert time.monotonic() < deadline, "the worker outlived its leader"
                    time.sleep(0.1)
                b.wait_role("leader", 30)
                wait_for(lambda: repaired(c, ids, victim), 120, "the standby's repair", b)
        assert b.proc.returncode == 0, b.tail()
        assert_clean(c, ids, victim)
    assert_swapped_once(wh)


def test_sigterm_stops_the_workers_too_and_leaves_no_lock(tmp_path: Path, zk_chroot: str) -> None:
    wh = str(tmp_path / "wh")
    with audit_cluster(tmp_path / "sb", zk_chroot, bookies=4) as c:
        victim = c.bookie_ids[3]
        ids = [md.ledger_id for md in ledgers(c, victim, n=8, entries=60)]
        odd = [lid for lid in ids if lid % 2 == 1]
        slow = ("--lost-bookie-recovery-delay", "0s", "--rate", "2KB", "--ledgers-in-flight",
                "1", "--repair-processes", "2", "--first-ledgers", "0")  # fmt: skip
        w = Watch(c.zk, wh, tmp_path / "w1.log", *slow)
        try:
            w.wait_role("leader")
            c.sandbox.kill_bookie(victim)
            wait_for(lambda: set(locked_ids(c)) & set(odd), 60, "a worker's lock", w)
            worker = first_worker(w)
            t0 = time.monotonic()
            assert w.stop() == 0, w.tail()
            assert time.monotonic() - t0 < 30
        finally:
            w.stop()
        # The worker finished its ledger in flight, started no other, and went with its locks.
        assert not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE
        assert locked_ids(c) == []
        assert naming(c, odd, victim), "the worker finished its share before the SIGTERM"
        with watching(c.zk, wh, tmp_path, "w2", "--lost-bookie-recovery-delay", "0s") as w2:
            wait_for(lambda: repaired(c, ids, victim), 90, "the next run's repair", w2)
        assert_clean(c, ids, victim)
