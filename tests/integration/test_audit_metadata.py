"""Audit integration (d) and (e): a corrupt metadata znode is recorded and the run
completes; a ledger deleted or changed while the audit runs is not reported."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bklib.meta.stores import open_store
from bklib.states import RunStatus
from jobs.commands.audit import AuditConfig, run_audit
from jobs.runtime.exit_status import ExitStatus
from jobs.spark import load
from jobs.spark.audit_job import AuditJob
from tests.audit_helpers import audit_args, audit_cluster, fragments_of, list_report
from tests.audit_helpers import spark as spark  # the session fixture

pytestmark = pytest.mark.integration


def test_corrupt_znode_is_recorded_and_the_run_completes(
    spark: SparkSession, tmp_path: Path, zk_chroot: str
) -> None:
    warehouse = str(tmp_path / "warehouse")
    with audit_cluster(tmp_path / "sandbox", zk_chroot, bookies=3) as c:
        b0, b1, b2 = c.bookie_ids
        good = [c.ledger([b0, b1, b2], 8, wq=2, aq=2) for _ in range(3)]
        bad = c.ledger([b0, b1, b2], 8, wq=2, aq=2)
        bad_path = c.store.path_for(bad.ledger_id)
        c.store.zk.set(bad_path, b"BookieMetadataFormatVersion\t3\n\x05garbage")

        assert run_audit(audit_args(c.zk, warehouse, "replicas"), spark) == ExitStatus.INCOMPLETE

        run = load.latest_run(spark, warehouse)
        assert run is not None
        assert run["status"] == RunStatus.COMPLETED_WITH_ERRORS
        assert run["counts"]["metadata_errors"] == 1
        assert run["counts"]["ledgers"] == 4
        errors = (
            load.read_table(spark, warehouse, load.LEDGERS)
            .filter((F.col("run_id") == run["run_id"]) & F.col("error").isNotNull())
            .collect()
        )
        assert [(r.ledger_id, r.znode_path) for r in errors] == [(bad.ledger_id, bad_path)]
        assert bad_path in errors[0].error
        # The healthy ledgers were still checked, and are clean.
        assert fragments_of(spark, warehouse, run["run_id"]) == []
        states = (
            load.read_table(spark, warehouse, load.LEDGERS)
            .filter((F.col("run_id") == run["run_id"]) & F.col("error").isNull())
            .select("ledger_id")
            .collect()
        )
        assert sorted(r.ledger_id for r in states) == sorted(m.ledger_id for m in good)
        # No secret reaches the tables.
        assert "password" not in load.read_table(spark, warehouse, load.LEDGERS).columns

        code, text = list_report(spark, warehouse)
        assert code == ExitStatus.INCOMPLETE and text.startswith("INCOMPLETE: ")
        assert f"unreadable metadata: ledger {bad.ledger_id} at {bad_path}" in text


def test_ledgers_deleted_or_changed_during_the_audit_are_not_reported(
    spark: SparkSession, tmp_path: Path, zk_chroot: str
) -> None:
    warehouse = str(tmp_path / "warehouse")
    with audit_cluster(tmp_path / "sandbox", zk_chroot, bookies=4) as c:
        b0, b1, b2, b3 = c.bookie_ids
        deleted = c.ledger([b0, b1, b2], 6, wq=2, aq=2)
        repaired = c.ledger([b0, b1, b2], 6, wq=2, aq=2)
        kept = c.ledger([b0, b1, b2], 6, wq=2, aq=2)
        c.ledger([b0, b1, b3], 6, wq=2, aq=2)
        c.sandbox.stop_bookie(b2)

        session = open_store(c.zk)
        job = AuditJob(
            spark, AuditConfig(zk=c.zk, warehouse=warehouse, check="lost"), None, session
        )
        try:
            job.scan()
            found = job.check()
            assert sorted(r.ledger_id for r in found.select("ledger_id").collect()) == sorted(
                [deleted.ledger_id, repaired.ledger_id, kept.ledger_id]
            )
            # Meanwhile: one ledger is deleted, another re-replicated (b2 -> b3, by CAS).
            c.store.delete_ledger(deleted.ledger_id)
            c.store.update_ledger(
                repaired.ledger_id, lambda m: m.with_bookies_replaced(0, {b2: b3})
            )
            job.recheck()
            run = job.load()
        finally:
            job.close()
            session.close()
        rows = fragments_of(spark, warehouse, run.run_id)
        assert [(r["ledger_id"], r["bookie_id"]) for r in rows] == [(kept.ledger_id, b2)]
        assert run.counts["dropped_after_reread"] == 2
        assert run.status == RunStatus.COMPLETED

        code, text = list_report(spark, warehouse, "--run-id", run.run_id)
        assert code == 1 and f"\n{kept.ledger_id}\n" in text
        assert f"\n{deleted.ledger_id}\n" not in text
        assert list_report(spark, warehouse, "--run-id", "no-such-run")[0] == 2
        assert list_report(spark, str(tmp_path / "empty"))[0] == 2
