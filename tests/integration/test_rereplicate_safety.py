"""Repair safety on a real sandbox: the grace period and live writers (b, c), locks between
concurrent repairers and after a worker dies (e), and SIGKILL at random points (d)."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from bklib.errors import LedgerFencedError
from bklib.meta.model import LedgerState
from bklib.meta.stores import open_store
from bklib.meta.underreplication import UnderReplicationManager
from bklib.repair.requests import LedgerRequest
from jobs.commands.repair import RepairConfig
from jobs.local.repair import LocalRepair
from jobs.runs.stop_marker import stop_marker_path
from jobs.spark.repair_job import RepairJob, _repair_task
from tests.audit_helpers import audit_cluster
from tests.audit_helpers import spark as spark  # the session fixture
from tests.repair_helpers import (
    SyncWriter,
    actions_of,
    assert_fully_replicated,
    audit_and_fragments,
    repair_args,
    run_repair,
)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _by_run(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    runs = sorted({r["run_id"] for r in rows})
    return [[r for r in rows if r["run_id"] == rid] for rid in runs]


def test_b_grace_period_spares_live_writers_and_fences_idle_open_ledgers(
    spark: SparkSession, tmp_path: Path, zk_chroot: str
) -> None:
    warehouse = str(tmp_path / "warehouse")
    with audit_cluster(tmp_path / "sandbox", zk_chroot, bookies=4) as c:
        b0, b1, b2, b3 = c.bookie_ids
        live = SyncWriter(c.store, c.client, [b0, b1, b2])
        for _ in range(10):
            live.add()
        idle = c.ledger([b0, b1, b2], 8, wq=2, aq=2, closed=False)  # writer gone
        c.sandbox.stop_bookie(b2)
        audit_and_fragments(spark, c.zk, warehouse)

        # Within the grace period: nothing is fenced, both wait.
        code, out = run_repair(spark, c.zk, warehouse, "--grace-period", "1h")
        assert code == 1, out
        first = actions_of(spark, warehouse)
        assert {(a["ledger_id"], a["status"]) for a in first} == {
            (live.ledger_id, "WAITING_GRACE"),
            (idle.ledger_id, "WAITING_GRACE"),
        }
        for lid in (live.ledger_id, idle.ledger_id):
            assert c.store.read_ledger(lid).value.state == LedgerState.OPEN
        # The writer goes on: its next adds replace b2 in a new segment.
        for _ in range(10):
            live.add()
        assert len(c.store.read_ledger(live.ledger_id).value.segments) == 2

        # Past the grace period: the idle ledger is fenced, closed at entry 7 and repaired;
        # the live writer made progress, so its ledger is not fenced and its old segment
        # (now closed: LAC past its end) is copied.
        code, out = run_repair(spark, c.zk, warehouse, "--grace-period", "0s")
        assert code == 0, out
        second = _by_run(actions_of(spark, warehouse))[-1]
        fenced = [a for a in second if a["action"] == "FENCE_AND_CLOSE"]
        assert [(a["ledger_id"], a["status"]) for a in fenced] == [(idle.ledger_id, "DONE")]
        idle_md = assert_fully_replicated(
            c.store, c.client, idle.ledger_id, excluded=frozenset({b2})
        )
        assert idle_md.last_entry_id == 7
        assert c.store.read_ledger(live.ledger_id).value.state == LedgerState.OPEN
        for _ in range(5):
            live.add()
        live_md = live.close()
        assert live_md.last_entry_id == 24
        assert_fully_replicated(c.store, c.client, live.ledger_id, excluded=frozenset({b2}))
        assert b3 in live_md.bookies()
        assert audit_and_fragments(spark, c.zk, warehouse, "replicas") == []


def test_c_writer_alive_when_fenced_gets_fenced_error_and_loses_no_acked_entry(
    spark: SparkSession, tmp_path: Path, zk_chroot: str
) -> None:
    warehouse = str(tmp_path / "warehouse")
    with audit_cluster(tmp_path / "sandbox", zk_chroot, bookies=4) as c:
        b0, b1, b2, _ = c.bookie_ids
        w = SyncWriter(c.store, c.client, [b0, b1, b2])
        acked = [w.add() for _ in range(12)]
        c.sandbox.stop_bookie(b2)  # the writer is idle: it has not noticed yet
        audit_and_fragments(spark, c.zk, warehouse)

        code, out = run_repair(spark, c.zk, warehouse, "--grace-period", "0s")
        assert code == 0, out
        md = c.store.read_ledger(w.ledger_id).value
        assert md.state == LedgerState.CLOSED and md.last_entry_id == acked[-1] == 11
        with pytest.raises(LedgerFencedError):
            w.add()
        assert_fully_replicated(c.store, c.client, w.ledger_id, excluded=frozenset({b2}))


def test_e_two_jobs_never_copy_the_same_ledger_and_dead_locks_expire(
    spark: SparkSession, tmp_path: Path, zk_chroot: str
) -> None:
    warehouse = str(tmp_path / "warehouse")
    with audit_cluster(tmp_path / "sandbox", zk_chroot, bookies=5) as c:
        b0, b1, b2, _, _ = c.bookie_ids
        mds = [c.ledger([b0, b1, b2], 40, wq=2, aq=2) for _ in range(12)]
        c.sandbox.stop_bookie(b2)
        audit_and_fragments(spark, c.zk, warehouse)

        # A worker that took a lock and died: its lock lives until its session expires.
        dead = subprocess.Popen(
            [sys.executable, "-c", _LOCK_AND_HANG, c.zk, str(mds[0].ledger_id)],
            stdout=subprocess.PIPE,
            cwd=ROOT,
        )
        assert dead.stdout is not None and dead.stdout.readline().strip() == b"locked"
        dead.send_signal(signal.SIGKILL)
        dead.wait()

        # Two copies at once, one task each, slowed so they overlap.
        argv = ["--zk", c.zk, "--warehouse", warehouse, "--grace-period", "0s"]
        argv += ["--tasks", "1", "--ledgers-in-flight", "1", "--rate", "3KB"]
        argv += ["--zk-session-timeout", "4s"]
        codes: list[int] = []
        errors: list[BaseException] = []

        def job() -> None:
            try:
                cfg = RepairConfig.from_args(repair_args("rereplicate", *argv), "rereplicate")
                with open_store(cfg.zk) as session:
                    requests = LocalRepair(cfg, session).requests_from_audit()
                    assert requests is not None
                    rows = RepairJob(spark, cfg, session).execute(requests)
                codes.append(0 if rows else 2)
            except BaseException as e:  # reported below: a thread's traceback is otherwise lost
                errors.append(e)

        threads = [threading.Thread(target=job) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert not errors, errors
        assert codes == [0, 0]
        rows = actions_of(spark, warehouse)
        assert len({r["run_id"] for r in rows}) == 2
        copied: dict[int, set[str]] = {}
        for r in rows:
            if r["action"] == "COPY" and r["status"] == "DONE":
                copied.setdefault(r["ledger_id"], set()).add(r["run_id"])
        # No ledger was copied by both jobs; each job skipped what the other held.
        assert all(len(runs) == 1 for runs in copied.values()), copied
        assert len({next(iter(v)) for v in copied.values()}) == 2, "both jobs did work"
        statuses = {(r["ledger_id"], r["status"]) for r in rows}
        assert (mds[0].ledger_id, "LOCKED") in statuses or mds[0].ledger_id in copied
        for md in mds[1:]:
            assert_fully_replicated(c.store, c.client, md.ledger_id, excluded=frozenset({b2}))

        # The dead worker's lock goes with its session; then the ledger is repaired.
        urm = UnderReplicationManager(c.store.zk)
        deadline = time.monotonic() + 30
        while urm.lock_holder(mds[0].ledger_id) is not None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert urm.lock_holder(mds[0].ledger_id) is None
        code, out = run_repair(spark, c.zk, warehouse, "--grace-period", "0s")
        assert code == 0, out
        assert_fully_replicated(c.store, c.client, mds[0].ledger_id, excluded=frozenset({b2}))
        assert list(urm.list_underreplicated()) == []


_LOCK_AND_HANG = """
import sys, time
from bklib.testing.zkclient import connect
from bklib.meta.underreplication import UnderReplicationManager
zk = connect(sys.argv[1], timeout=4.0)
assert UnderReplicationManager(zk, worker_id="doomed-worker").try_acquire(int(sys.argv[2]))
print("locked", flush=True)
time.sleep(600)
"""


# ---- (d) SIGKILL at random points ------------------------------------------------------------


def _run_worker(cfg: RepairConfig, rows: list[LedgerRequest], started: str) -> None:
    """A child process running exactly the executors' per-partition function (its driver
    never asks it to stop)."""
    Path(started).touch()
    for _ in _repair_task(cfg, stop_marker_path(cfg.ledgers_root, "not-this-run"))(iter(rows)):
        pass


def test_d_killed_at_random_points_then_rerun_converges(
    spark: SparkSession, tmp_path: Path, zk_chroot: str, pytestconfig: pytest.Config
) -> None:
    warehouse = str(tmp_path / "warehouse")
    seed = int(os.environ.get("BKAUDIT_KILL_SEED", "20261122"))
    rng = random.Random(seed)
    with audit_cluster(tmp_path / "sandbox", zk_chroot, bookies=5) as c:
        b0, b1, b2, b3, b4 = c.bookie_ids
        mds = [c.ledger([b0, b1, b2], 60, wq=2, aq=2) for _ in range(8)]
        mds += [c.ledger([b2, b3, b4], 60, wq=3, aq=2) for _ in range(4)]
        mds += [c.ledger([b1, b2, b3], 30, wq=2, aq=2, closed=False) for _ in range(3)]
        original = {m.ledger_id: [s.first_entry_id for s in m.segments] for m in mds}
        c.sandbox.stop_bookie(b2)
        audit_and_fragments(spark, c.zk, warehouse)

        argv = ["--zk", c.zk, "--warehouse", warehouse, "--grace-period", "0s"]
        argv += ["--rate", "2KB", "--ledgers-in-flight", "2", "--zk-session-timeout", "3s"]
        cfg = RepairConfig.from_args(repair_args("rereplicate", *argv), "rereplicate")
        with open_store(cfg.zk) as session:
            requests = LocalRepair(cfg, session).requests_from_audit()
        assert requests is not None
        rows = list(requests)

        # Five worker processes killed by SIGKILL at seeded random moments mid-repair
        # (spawned, not forked: a fork would share the Spark gateway's socket).
        ctx = multiprocessing.get_context("spawn")
        kills = []
        for i in range(5):
            started = tmp_path / f"worker-{i}.started"
            proc = ctx.Process(target=_run_worker, args=(cfg, rows, str(started)))
            proc.start()
            while not started.exists() and proc.is_alive():
                time.sleep(0.05)
            delay = rng.uniform(0.2, 1.5)
            time.sleep(delay)
            os.kill(proc.pid, signal.SIGKILL)
            proc.join()
            kills.append((round(delay, 2), proc.exitcode))
        assert all(code == -signal.SIGKILL for _, code in kills), kills

        # Also the real command line, killed mid-run with its Spark JVM and workers.
        cli = subprocess.Popen(
            [sys.executable, "-m", "jobs.cli", "rereplicate", *argv, "--master", "local[1]"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        time.sleep(rng.uniform(15.0, 25.0))
        os.killpg(cli.pid, signal.SIGKILL)
        cli.wait()

        # Reruns converge once the killed sessions' locks have expired.
        for _ in range(10):
            code, out = run_repair(spark, c.zk, warehouse, "--grace-period", "0s")
            if code == 0:
                break
            time.sleep(2)
        assert code == 0, f"no convergence (seed {seed}, kills {kills}): {out}"
        assert audit_and_fragments(spark, c.zk, warehouse, "replicas") == []
        for m in mds:
            md = assert_fully_replicated(c.store, c.client, m.ledger_id, excluded=frozenset({b2}))
            firsts = [s.first_entry_id for s in md.segments]
            # No duplicate or lost segment: the original keys, plus at most one recovery
            # segment at the end for a ledger that was open.
            assert firsts[: len(original[m.ledger_id])] == original[m.ledger_id]
            assert len(firsts) <= len(original[m.ledger_id]) + (0 if m.is_closed else 1)
            assert len(set(firsts)) == len(firsts)
        for m in mds:
            if m.is_closed:
                assert c.store.read_ledger(m.ledger_id).value.last_entry_id == 59
            else:
                assert c.store.read_ledger(m.ledger_id).value.last_entry_id == 29
