"""A real warehouse for the report and notebook tests, built once per session.

Four Python bookies on a real ZooKeeper; ledgers chosen so the latest audit has every
severity (BELOW_WQ, BELOW_AQ, NO_REPLICA) and an open ledger; two ``lost`` audit runs by the
real audit job (one before the bookie stops, by the local executor through delta-rs; one
after, on Spark); then one repair run's
``replication_actions`` rows appended by Spark with ``jobs.spark.load.ACTIONS_SCHEMA``, exactly the
schema the Spark repair job writes: two ledgers repaired (COPY + METADATA_UPDATE DONE), one
NO_REPLICA, one open ledger WAITING_GRACE. The tables are read back here and by the report
through delta-rs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from bklib.quorum import classify_replicas, stripe_count
from bklib.states import ActionKind, ActionStatus, Executor, RepairMode
from bklib.testing.zkserver import ZooKeeperServer
from jobs.commands.audit import run_audit
from jobs.spark import load
from jobs.tables import delta
from tests.audit_helpers import audit_args, audit_cluster, shared_spark

REPAIR_RUN = "repair-20260101T000000Z-test"


@dataclass
class ReportWarehouse:
    """The warehouse and what the tests expect of it."""

    path: str
    bookies: list[str]
    victim: str
    replacement: str
    runs: list[str]  # the two audit run ids, oldest first; runs[0] has no findings
    below_aq: int  # ledger ids by role
    below_wq: int
    no_replica: int
    open_ledger: int
    healthy: int
    expected: dict[int, tuple[int | None, str]] = field(default_factory=dict)
    """ledger id -> (missing entries, severity) of its one fragment in the latest run."""
    repaired_at: dict[int, datetime] = field(default_factory=dict)
    copied: dict[int, tuple[int, int]] = field(default_factory=dict)  # ledger -> entries, bytes
    latest_fragments: list[dict[str, Any]] = field(default_factory=list)
    """The latest run's fragments as delta-rs reads them (timestamps UTC-aware)."""

    @property
    def latest_run(self) -> str:
        return self.runs[-1]


@pytest.fixture(scope="session")
def spark() -> SparkSession:
    return shared_spark()


@pytest.fixture(scope="session")
def report_warehouse(
    spark: SparkSession, zk_server: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ReportWarehouse]:
    base = tmp_path_factory.mktemp("report-warehouse")
    warehouse = str(base / "warehouse")
    with (
        zk_server.private_chroot("report") as chroot,
        audit_cluster(base / "sandbox", chroot, bookies=4) as c,
    ):
        b0, b1, b2, b3 = c.bookie_ids
        below_aq = c.ledger([b0, b1, b2], 10, wq=2, aq=2)
        below_wq = c.ledger([b0, b1, b2], 12, wq=3, aq=2)
        no_replica = c.ledger([b1, b2], 6, wq=1, aq=1)
        open_ledger = c.ledger([b2, b3, b0], 5, wq=2, aq=2, closed=False)
        healthy = c.ledger([b0, b1, b3], 7, wq=2, aq=2)
        runs = []
        # One run by each writer: the report reads delta-rs's and delta-spark's rows alike.
        local = ("--executor", "local")
        assert run_audit(audit_args(c.zk, warehouse, "lost", *local), spark) == 0
        runs.append(_latest_run_id(warehouse))
        c.sandbox.stop_bookie(b2)
        assert run_audit(audit_args(c.zk, warehouse, "lost"), spark) == 0
        runs.append(_latest_run_id(warehouse))

    wh = ReportWarehouse(
        path=warehouse,
        bookies=[b0, b1, b2, b3],
        victim=b2,
        replacement=b3,
        runs=runs,
        below_aq=below_aq.ledger_id,
        below_wq=below_wq.ledger_id,
        no_replica=no_replica.ledger_id,
        open_ledger=open_ledger.ledger_id,
        healthy=healthy.ledger_id,
    )
    for md in (below_aq, below_wq, no_replica, open_ledger):
        seg = md.segments[0]
        last = md.last_entry_id if md.is_closed else None
        idx = seg.ensemble.index(b2)
        missing = (
            stripe_count(idx, 0, last, md.ensemble_size, md.write_quorum)
            if last is not None
            else None
        )
        sev = classify_replicas(md.write_quorum - 1, md.write_quorum, md.ack_quorum)
        assert sev is not None
        wh.expected[md.ledger_id] = (missing, sev)
    wh.latest_fragments = delta.run_fragments(warehouse, wh.latest_run)
    _append_repair_run(spark, wh)
    yield wh


def _latest_run_id(warehouse: str) -> str:
    run = delta.latest_run(warehouse)
    assert run is not None
    return str(run["run_id"])


def _append_repair_run(spark: SparkSession, wh: ReportWarehouse) -> None:
    """One rereplicate run's actions, written the way jobs/rereplicate.py writes them."""
    frag = {f["ledger_id"]: f for f in wh.latest_fragments}
    t0 = max(f["detected_at"] for f in wh.latest_fragments) + timedelta(minutes=1)
    rows: list[tuple[Any, ...]] = []

    def action(
        lid: int,
        kind: str,
        status: str,
        start: datetime,
        minutes: float,
        *,
        old: str | None = None,
        new: str | None = None,
        entries: int = 0,
        nbytes: int = 0,
        no_replica: list[int] | None = None,
        error: str | None = None,
    ) -> datetime:
        f = frag[lid]
        end = start + timedelta(minutes=minutes)
        row = {
            "run_id": REPAIR_RUN,
            "mode": RepairMode.REREPLICATE,
            "audit_run_id": wh.latest_run,
            "ledger_id": lid,
            "segment_first_entry_id": f["segment_first_entry_id"],
            "segment_last_entry_id": f["segment_last_entry_id"],
            "old_bookie": old,
            "new_bookie": new,
            "action": kind,
            "entries_copied": entries,
            "bytes_copied": nbytes,
            "no_replica_entries": no_replica,
            "status": status,
            "error": error,
            "started_at": start,
            "finished_at": end,
            "executor": Executor.SPARK,
            "topic": None,
        }
        rows.append(tuple(row[col.name] for col in load.ACTIONS_SCHEMA.fields))
        return end

    # Two repaired ledgers, copies finishing in different minutes (two throughput columns).
    for i, lid in enumerate((wh.below_aq, wh.below_wq)):
        missing = int(frag[lid]["missing_entries"])
        nbytes = missing * 1000 * (i + 1)
        start = t0 + timedelta(minutes=3 * i)
        end = action(
            lid,
            ActionKind.COPY,
            ActionStatus.DONE,
            start,
            1.5,
            old=wh.victim,
            new=wh.replacement,
            entries=missing,
            nbytes=nbytes,
        )
        wh.repaired_at[lid] = action(
            lid,
            ActionKind.METADATA_UPDATE,
            ActionStatus.DONE,
            end,
            0.1,
            old=wh.victim,
            new=wh.replacement,
        )
        wh.copied[lid] = (missing, nbytes)
    action(
        wh.no_replica,
        ActionKind.COPY,
        ActionStatus.NO_REPLICA,
        t0,
        0.2,
        old=wh.victim,
        no_replica=[1, 3, 5],
        error="entries 1, 3, 5 exist on no bookie",
    )
    action(
        wh.open_ledger,
        ActionKind.FENCE_AND_CLOSE,
        ActionStatus.WAITING_GRACE,
        t0,
        0.0,
        error="open; grace period 30s not over",
    )
    # The Spark repair job's write (partitioned by run_date, schema merged).
    load.append_actions(spark, wh.path, rows)


REPO = Path(__file__).resolve().parents[2]
