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
from bklib.repair.requests import mark_requests
from jobs.tables.schema import ACTIONS
from jobs.watch.config import WatchConfig, repair_config
from jobs.watch.election import LeaderElection, LeaderFence
from jobs.watch.repair_workers import RepairWorkers
from tests.audit_helpers import audit_cluster
from tests.integration.test_watch import (
    SLOW_COPY,
    assert_clean,
    ledgers,
    locked,
    repaired,
    rows,
    wait_for,
    watching,
)

pytestmark = pytest.mark.integration


def test_a_worker_starts_no_ledger_once_the_leaders_fence_fails(
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
        live = RepairWorkers(config, [reqs], fence)
        try:
            answered = [r for rows_ in live.finish(lambda: True, 10) for r in rows_]
        finally:
            live.close()
        assert {r["ledger_id"] for r in answered} == {11, 12, 13}
        # ...and once the leader's member is gone, none.
        election.leave()
        dead = RepairWorkers(config, [reqs], fence)
        try:
            assert list(dead.finish(lambda: True, 10)) == []
        finally:
            dead.close()
        # Nor when the leader says stop before the first ledger (fence intact).
        election.join()
        fence = election.fence()
        assert fence is not None
        told = RepairWorkers(config, [reqs], fence)
        told.stop.set()
        try:
            assert list(told.finish(lambda: True, 10)) == []
        finally:
            told.close()
        assert LeaderFence(fence.path, fence.node, leader.session_owner).holds(leader)
    finally:
        leader.close()


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
    updates = [(a["ledger_id"], a["segment_first_entry_id"]) for a in actions
               if a["action"] == "METADATA_UPDATE" and a["status"] == "DONE"]  # fmt: skip
    assert len(updates) == len(set(updates))


def test_a_killed_leader_takes_its_repair_workers_with_it(tmp_path: Path, zk_chroot: str) -> None:
    wh = str(tmp_path / "wh")
    with audit_cluster(tmp_path / "sb", zk_chroot, bookies=4) as c:
        victim = c.bookie_ids[3]
        ids = [md.ledger_id for md in ledgers(c, victim, n=8, entries=60)]
        with watching(c.zk, wh, tmp_path, "a", *SLOW_COPY, "--repair-processes", "2") as a:
            a.wait_role("leader")
            with watching(c.zk, wh, tmp_path, "b", "--lost-bookie-recovery-delay", "0s") as b:
                b.wait_role("standby")
                c.sandbox.kill_bookie(victim)
                started = re.compile(r"repair worker processes started: pid (\d+)")
                wait_for(lambda: started.search(a.log.read_text()), 60, "a worker", a, b)
                match = started.search(a.log.read_text())
                assert match is not None
                worker = psutil.Process(int(match.group(1)))
                assert worker.ppid() == a.proc.pid
                wait_for(lambda: locked(c), 60, "a repair lock", a, b)
                a.kill9()
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
    updates = [(a["ledger_id"], a["segment_first_entry_id"]) for a in rows(wh, ACTIONS)
               if a["action"] == "METADATA_UPDATE" and a["status"] == "DONE"]  # fmt: skip
    assert len(updates) == len(set(updates))
