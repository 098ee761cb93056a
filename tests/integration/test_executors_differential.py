"""The two executors are the same engine: local and Spark runs over the same clusters write the
same Delta rows, for every check and for repair, and each reads the other's tables.

Two identical sandbox clusters (same ledgers in fresh ZooKeeper chroots, so the same ledger
ids, ensembles named by bookie position) lose the same bookie and get the same damage. Cluster
A is audited by both executors into two warehouses; rows must be equal once run ids, times,
the executor and bookie addresses (mapped to positions) are set aside. Then A is repaired
by the local executor in two worker processes and B on Spark; the repair actions must match
(except which live bookie was chosen as the replacement, a load-spreading choice), and each
cluster re-audits clean under the other executor.
"""

from __future__ import annotations

import argparse
import contextlib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from bklib.audit.checks import replication_names
from bklib.states import ActionKind, Check, CountKey, Executor, RunStatus
from bklib.testing.zkserver import ZooKeeperServer
from jobs.commands.audit import add_audit_arguments, run_audit
from jobs.commands.repair import add_repair_arguments, run_rereplicate
from jobs.tables import delta
from jobs.tables.schema import ACTIONS, AUDIT_RUNS, BOOKIES, FRAGMENTS, LEDGERS
from tests.audit_helpers import AuditCluster, audit_cluster, by_position
from tests.audit_helpers import spark as spark  # the session fixture

pytestmark = pytest.mark.integration

VOLATILE = {"run_id", "detected_at", "first_detected_at", "started_at", "finished_at"}
VOLATILE |= {"executor", "audit_run_id", "znode_version", "run_date"}


def _build(c: AuditCluster) -> None:
    """The same ledgers and damage on any 5-bookie cluster, by bookie position."""
    b = c.bookie_ids
    for k in range(6):
        c.ledger([b[k % 5], b[(k + 1) % 5], b[(k + 2) % 5]], 40 + k, wq=2, aq=2)
    c.ledger([b[0], b[2], b[4]], 30, wq=3, aq=2)
    c.ledger([(0, [b[0], b[1], b[2]]), (20, [b[3], b[1], b[2]])], 35, wq=2, aq=2)
    c.ledger([b[1], b[2], b[3]], 25, wq=2, aq=2, closed=False)
    c.ledger([b[3], b[4], b[0]], 50, wq=3, aq=3)
    c.ledger([b[4], b[0], b[1]], 1, wq=2, aq=1)
    missing = c.ledger([b[0], b[1], b[3]], 30, wq=2, aq=2)
    c.admin(b[3]).delete_entries(missing.ledger_id, [1, 2, 3, 10])
    corrupt = c.ledger([b[0], b[3], b[4]], 20, wq=2, aq=2)
    c.admin(b[4]).corrupt_entry(corrupt.ledger_id, 7)
    c.sandbox.stop_bookie(b[2])
    c.sandbox.wait_unregistered(b[2])


@contextlib.contextmanager
def _two_clusters(base: Path, zk_server: ZooKeeperServer) -> Iterator[tuple[Any, Any]]:
    with (
        zk_server.private_chroot() as zk_a,
        zk_server.private_chroot() as zk_b,
        audit_cluster(base / "a", zk_a, bookies=5) as a,
        audit_cluster(base / "b", zk_b, bookies=5) as b,
    ):
        _build(a)
        _build(b)
        yield a, b


def _audit(zk: str, warehouse: Path, check: str, executor: str, spark: Any) -> None:
    argv = ["--zk", zk, "--warehouse", str(warehouse), "--check", check]
    argv += ["--read-timeout", "2", "--connect-timeout", "2", "--executor", executor]
    args = add_audit_arguments(argparse.ArgumentParser()).parse_args(argv)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = run_audit(args, spark if executor == Executor.SPARK else None)
    assert code == 0, out.getvalue()
    assert f"[{executor}]" in out.getvalue()


def _repair(zk: str, warehouse: Path, executor: str, spark: Any) -> str:
    argv = ["--zk", zk, "--warehouse", str(warehouse), "--grace-period", "0s"]
    argv += ["--read-timeout", "3", "--zk-session-timeout", "4s", "--executor", executor]
    if executor == Executor.LOCAL:
        argv += ["--local-processes", "2"]  # the multi-process path must agree too
    args = add_repair_arguments(argparse.ArgumentParser()).parse_args(argv)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = run_rereplicate(args, spark if executor == Executor.SPARK else None)
    assert code == 0, out.getvalue()
    return out.getvalue()


def _rows(
    warehouse: Path, table: str, names: dict[str, str], drop: frozenset[str] = frozenset()
) -> list[Any]:
    rows = []
    for r in delta.read_rows(str(warehouse), table):
        kept = {k: v for k, v in r.items() if k not in VOLATILE and k not in drop}
        rows.append(by_position(kept, names))
    return sorted(rows, key=repr)


def _latest(warehouse: Path) -> dict[str, Any]:
    run = delta.latest_run(str(warehouse))
    assert run is not None
    return run


def test_local_and_spark_write_the_same_rows_for_every_check_and_for_repair(
    spark: SparkSession, tmp_path: Path, zk_server: ZooKeeperServer
) -> None:
    with _two_clusters(tmp_path, zk_server) as (a, b):
        names_a = {bid: f"B{i}" for i, bid in enumerate(a.bookie_ids)}
        names_b = {bid: f"B{i}" for i, bid in enumerate(b.bookie_ids)}
        wh_local, wh_spark = tmp_path / "wh-local", tmp_path / "wh-spark"
        reasons: set[str] = set()
        checks = replication_names()
        for check in checks:
            _audit(a.zk, wh_local, check, Executor.LOCAL, spark)
            _audit(a.zk, wh_spark, check, Executor.SPARK, spark)
            local, remote = _latest(wh_local), _latest(wh_spark)
            assert (local["executor"], remote["executor"]) == (Executor.LOCAL, Executor.SPARK)
            assert local["status"] == remote["status"] == RunStatus.COMPLETED
            assert local["counts"] == remote["counts"], check
            assert local["counts"][CountKey.FRAGMENTS] > 0
            for table in (FRAGMENTS, LEDGERS, BOOKIES):
                got = _rows(wh_local, table, names_a)
                assert got == _rows(wh_spark, table, names_a), (check, table)
            reasons |= {r["reason"] for r in delta.read_rows(str(wh_local), FRAGMENTS)}
        assert reasons == {"BOOKIE_LOST", "ENTRIES_MISSING", "DIGEST_MISMATCH"}

        # Each executor reads the other's tables: Spark reads what delta-rs wrote ...
        runs = spark.read.format("delta").load(str(wh_local / AUDIT_RUNS)).collect()
        assert {r["executor"] for r in runs} == {Executor.LOCAL}
        assert len(runs) == len(checks)
        # ... and interleaved appends from both land in one table, nothing lost.
        _audit(a.zk, wh_local, Check.LOST, Executor.SPARK, spark)
        _audit(a.zk, wh_local, Check.LOST, Executor.LOCAL, spark)
        runs = delta.read_rows(str(wh_local), AUDIT_RUNS)
        execs = [r["executor"] for r in sorted(runs, key=lambda r: r["started_at"])]
        assert execs == [Executor.LOCAL] * len(checks) + [Executor.SPARK, Executor.LOCAL]
        assert spark.read.format("delta").load(str(wh_local / FRAGMENTS)).count() == len(
            delta.read_rows(str(wh_local), FRAGMENTS)
        )

        # Repair: A in-process, B on Spark, each from its own executor's deep audit.
        wh_b = tmp_path / "wh-b"
        _audit(a.zk, wh_local, Check.DEEP, Executor.LOCAL, spark)
        _audit(b.zk, wh_b, Check.DEEP, Executor.SPARK, spark)
        _repair(a.zk, wh_local, Executor.LOCAL, spark)
        _repair(b.zk, wh_b, Executor.SPARK, spark)
        drop = frozenset({"new_bookie", "error"})
        local_actions = _rows(wh_local, ACTIONS, names_a, drop)
        spark_actions = _rows(wh_b, ACTIONS, names_b, drop)
        assert local_actions == spark_actions
        kinds = {r["action"] for r in local_actions}
        assert {ActionKind.COPY, ActionKind.METADATA_UPDATE, ActionKind.FENCE_AND_CLOSE} <= kinds
        for r in delta.read_rows(str(wh_local), ACTIONS):
            assert r["executor"] == Executor.LOCAL
            if r["action"] == ActionKind.COPY:
                assert r["new_bookie"] in a.bookie_ids and r["new_bookie"] != a.bookie_ids[2]

        # Both clusters re-audit clean, each by the executor that did not repair it.
        for zk, wh, executor in ((a.zk, wh_local, Executor.SPARK), (b.zk, wh_b, Executor.LOCAL)):
            _audit(zk, wh, Check.DEEP, executor, spark)
            assert _latest(wh)["counts"][CountKey.FRAGMENTS] == 0, (zk, executor)
