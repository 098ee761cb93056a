"""The same cluster on ZooKeeper and on Oxia gives the same findings and the same repairs.

Two sandboxes, one on each store, get the same ledgers (explicit ids, ensembles by bookie
position), the same damage (a stopped bookie, deleted and corrupted entries, an open ledger).
Every check runs through the real CLI with ``--metadata-uri`` (``zk+hierarchical://`` and
Pulsar's ``metadata-store:oxia://``); the Delta rows must be equal once run ids, times, key
versions and bookie addresses (mapped to positions) are set aside. Then each cluster is
repaired, the actions compared, and both re-audit clean. One check also runs on the Spark
executor against Oxia.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bklib.states import ActionKind, Check, CountKey, RunStatus
from bklib.testing.oxiaserver import OxiaServer
from jobs.tables import delta
from jobs.tables.schema import ACTIONS, BOOKIES, FRAGMENTS, LEDGERS
from tests.audit_helpers import AuditCluster, audit_cluster, by_position
from tests.cli_helpers import bkaudit, failure
from tests.conftest import wipe_oxia

pytestmark = pytest.mark.integration

VOLATILE = {"run_id", "detected_at", "first_detected_at", "started_at", "finished_at"}
VOLATILE |= {"audit_run_id", "znode_version", "run_date", "duration_ms", "ctime", "port"}


def _build(c: AuditCluster) -> None:
    """The same ledgers and damage on any 5-bookie cluster, by bookie position."""
    b = c.bookie_ids
    for k in range(5):
        c.ledger([b[k % 5], b[(k + 1) % 5], b[(k + 2) % 5]], 30 + k, wq=2, aq=2, ledger_id=10 + k)
    c.ledger([(0, [b[0], b[1], b[2]]), (20, [b[3], b[1], b[2]])], 35, wq=2, aq=2, ledger_id=20)
    c.ledger([b[1], b[2], b[3]], 25, wq=2, aq=2, closed=False, ledger_id=21)
    missing = c.ledger([b[0], b[1], b[3]], 30, wq=2, aq=2, ledger_id=22)
    c.admin(b[3]).delete_entries(missing.ledger_id, [1, 2, 3, 10])
    corrupt = c.ledger([b[0], b[3], b[4]], 20, wq=2, aq=2, ledger_id=23)
    c.admin(b[4]).corrupt_entry(corrupt.ledger_id, 7)
    c.sandbox.stop_bookie(b[2])
    c.sandbox.wait_unregistered(b[2])


def _run(*args: str) -> str:
    proc = bkaudit(*args, timeout=300)
    assert proc.returncode == 0, failure(proc)
    return proc.stdout


def _audit(c: AuditCluster, warehouse: Path, check: str, executor: str = "local") -> None:
    _run(
        "audit", "--metadata-uri", c.sandbox.metadata_uri, "--warehouse", str(warehouse),
        "--check", check, "--executor", executor, "--read-timeout", "2", "--connect-timeout", "2",
        *(["--master", "local[2]"] if executor == "spark" else []),
    )  # fmt: skip


def _rows(c: AuditCluster, warehouse: Path, table: str, drop: frozenset[str] = frozenset()) -> Any:
    names = {bid: f"B{i}" for i, bid in enumerate(c.bookie_ids)}
    # The ZooKeeper sandbox lives in a chroot, which its URI makes part of the ledgers root.
    chroot = c.sandbox.zk_connect.partition("/")[2]
    if chroot and "://" not in c.sandbox.zk_connect:
        names[f"/{chroot}/ledgers/"] = "/ledgers/"
    rows = [
        by_position({k: v for k, v in r.items() if k not in VOLATILE and k not in drop}, names)
        for r in delta.read_rows(str(warehouse), table)
    ]
    return sorted(rows, key=repr)


@pytest.fixture
def clusters(
    tmp_path: Path, zk_chroot: str, oxia_server: OxiaServer
) -> Iterator[tuple[AuditCluster, AuditCluster]]:
    wipe_oxia(oxia_server.locator())
    with (
        audit_cluster(tmp_path / "zk", zk_chroot, bookies=5) as on_zk,
        audit_cluster(tmp_path / "oxia", oxia_server.locator(), bookies=5) as on_oxia,
    ):
        assert on_oxia.sandbox.metadata_uri.startswith("metadata-store:oxia://")
        _build(on_zk)
        _build(on_oxia)
        yield on_zk, on_oxia


def test_zookeeper_and_oxia_give_the_same_findings_and_repairs(
    clusters: tuple[AuditCluster, AuditCluster], tmp_path: Path
) -> None:
    on_zk, on_oxia = clusters
    wh = {id(on_zk): tmp_path / "wh-zk", id(on_oxia): tmp_path / "wh-oxia"}
    reasons: set[str] = set()
    for check in (Check.LOST, Check.REPLICAS, Check.SAMPLE, Check.DEEP):
        for c in clusters:
            _audit(c, wh[id(c)], check)
        zk_run, oxia_run = (delta.latest_run(str(wh[id(c)])) for c in clusters)
        assert zk_run is not None and oxia_run is not None
        assert zk_run["status"] == oxia_run["status"] == RunStatus.COMPLETED, check
        assert zk_run["counts"] == oxia_run["counts"], check
        assert zk_run["counts"][CountKey.FRAGMENTS] > 0, check
        for table in (FRAGMENTS, LEDGERS, BOOKIES):
            assert _rows(on_zk, wh[id(on_zk)], table) == _rows(on_oxia, wh[id(on_oxia)], table), (
                check,
                table,
            )
        reasons |= {r["reason"] for r in delta.read_rows(str(wh[id(on_oxia)]), FRAGMENTS)}
    assert reasons == {"BOOKIE_LOST", "ENTRIES_MISSING", "DIGEST_MISMATCH"}

    # The Spark executor on Oxia (its scan tasks open their own sessions): the same rows as
    # the local executor gave on ZooKeeper.
    spark_wh, local_wh = tmp_path / "wh-oxia-spark", tmp_path / "wh-zk-local"
    _audit(on_oxia, spark_wh, Check.REPLICAS, executor="spark")
    _audit(on_zk, local_wh, Check.REPLICAS)
    spark_run = delta.latest_run(str(spark_wh))
    assert spark_run is not None and spark_run["status"] == RunStatus.COMPLETED
    for table in (FRAGMENTS, LEDGERS, BOOKIES):
        assert _rows(on_zk, local_wh, table) == _rows(on_oxia, spark_wh, table), table

    for c in clusters:
        _run(
            "rereplicate", "--metadata-uri", c.sandbox.metadata_uri,
            "--warehouse", str(wh[id(c)]), "--grace-period", "0s", "--read-timeout", "3",
            "--zk-session-timeout", "4s", "--executor", "local",
        )  # fmt: skip
    drop = frozenset({"new_bookie", "error"})
    zk_actions = _rows(on_zk, wh[id(on_zk)], ACTIONS, drop)
    assert zk_actions == _rows(on_oxia, wh[id(on_oxia)], ACTIONS, drop)
    kinds = {r["action"] for r in zk_actions}
    assert {ActionKind.COPY, ActionKind.METADATA_UPDATE, ActionKind.FENCE_AND_CLOSE} <= kinds
    for c in clusters:
        _audit(c, wh[id(c)], Check.DEEP)
        run = delta.latest_run(str(wh[id(c)]))
        assert run is not None and run["counts"][CountKey.FRAGMENTS] == 0, c.sandbox.metadata_uri
