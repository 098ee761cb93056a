"""Audit integration (a): stop a bookie; the ``lost`` check reports exactly the segments
that name it, on a real sandbox (ZooKeeper + Python bookie processes) and real Spark."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from bklib.quorum import classify_replicas, stripe_count
from bklib.states import RunStatus
from jobs.commands.audit import run_audit
from jobs.spark import load
from tests.audit_helpers import audit_args, audit_cluster, fragments_of, list_report
from tests.audit_helpers import spark as spark  # the session fixture

pytestmark = pytest.mark.integration


def test_lost_check_reports_exactly_the_segments_naming_the_stopped_bookie(
    spark: SparkSession, tmp_path: Path, zk_chroot: str
) -> None:
    warehouse = str(tmp_path / "warehouse")
    with audit_cluster(tmp_path / "sandbox", zk_chroot, bookies=5) as c:
        b0, b1, b2, b3, b4 = c.bookie_ids
        victim = b2
        ledgers = [
            c.ledger([b0, b1, b2], 12, wq=3, aq=2),  # E=WQ=3
            c.ledger([b0, b1, b2], 10, wq=2, aq=2),
            c.ledger([b2, b3, b4, b0], 9, wq=2, aq=1),  # E=4
            c.ledger([b1, b2], 5, wq=2, aq=1),  # E=WQ=2
            c.ledger([(0, [b0, b1, b3]), (6, [b0, b1, b2])], 10, wq=2, aq=2),  # 2nd segment only
            c.ledger([(0, [b2, b3, b4]), (4, [b0, b3, b4])], 8, wq=3, aq=2),  # 1st segment only
            c.ledger([b0, b1, b3], 6, wq=2, aq=2),  # does not name the victim
            c.ledger([b1, b2, b3], 4, wq=2, aq=2, closed=False),  # open
            c.ledger([b0, b2, b4], 0, wq=2, aq=2),  # empty, closed at -1
        ]
        c.sandbox.stop_bookie(victim)  # a clean stop unregisters at once

        assert run_audit(audit_args(c.zk, warehouse, "lost"), spark) == 0

        run = load.latest_run(spark, warehouse)
        assert run is not None and run["status"] == RunStatus.COMPLETED
        assert run["counts"]["ledgers"] == len(ledgers)
        assert run["counts"]["bookies_lost"] == 1
        rows = fragments_of(spark, warehouse, run["run_id"])

        expected = {}
        for md in ledgers:
            for si, seg in enumerate(md.segments):
                if victim not in seg.ensemble:
                    continue
                idx = seg.ensemble.index(victim)
                if si + 1 < len(md.segments):
                    last = md.segments[si + 1].first_entry_id - 1
                else:
                    last = md.last_entry_id if md.is_closed else None
                missing = (
                    stripe_count(idx, seg.first_entry_id, last, md.ensemble_size, md.write_quorum)
                    if last is not None
                    else None
                )
                # One lost bookie: every entry it holds keeps WQ - 1 replicas.
                sev = classify_replicas(md.write_quorum - 1, md.write_quorum, md.ack_quorum)
                expected[(md.ledger_id, seg.first_entry_id)] = (missing, sev)
        got = {
            (r["ledger_id"], r["segment_first_entry_id"]): (r["missing_entries"], r["severity"])
            for r in rows
        }
        assert got == expected
        assert {r["bookie_id"] for r in rows} == {victim}
        assert {r["reason"] for r in rows} == {"BOOKIE_LOST"}
        assert len(rows) == 8  # every ledger but the one without the victim
        bookie_states = {
            r.bookie_id: r.state
            for r in load.read_table(spark, warehouse, load.BOOKIES)
            .filter(f"run_id = '{run['run_id']}'")
            .collect()
        }
        assert bookie_states[victim] == "lost"
        assert all(bookie_states[b] == "writable" for b in (b0, b1, b3, b4))

        code, text = list_report(spark, warehouse, "--missing-replica", victim)
        assert code == 1
        assert f"MissingReplica : {victim}" in text
        for md in ledgers:
            if any(victim in s.ensemble for s in md.segments):
                assert f"\n{md.ledger_id}\n" in text
        assert list_report(spark, warehouse, "--missing-replica", b4)[0] in (0, 1)
        code, _ = list_report(spark, warehouse, "--missing-replica", "10.9.9.9:3181")
        assert code == 0

        # A second run carries first_detected_at over for the same fragments.
        assert run_audit(audit_args(c.zk, warehouse, "lost"), spark) == 0
        run2 = load.latest_run(spark, warehouse)
        assert run2 is not None and run2["run_id"] != run["run_id"]
        first = {
            (r["ledger_id"], r["segment_first_entry_id"]): r["first_detected_at"] for r in rows
        }
        again = fragments_of(spark, warehouse, run2["run_id"])
        assert {
            (r["ledger_id"], r["segment_first_entry_id"]): r["first_detected_at"] for r in again
        } == first
        assert all(r["detected_at"] > r["first_detected_at"] for r in again)
