"""Repair integration: the rereplicate, recover and decommission jobs on a real sandbox
(ZooKeeper + Python bookie processes) and real Spark, each test checking the bytes on the
bookies, not only the statuses the job reports."""

from __future__ import annotations

from pathlib import Path

import pytest
from kazoo.client import KazooClient
from pyspark.sql import SparkSession

from bklib.meta.paths import ur_ledger_path
from bklib.meta.underreplication import UnderReplicationManager
from jobs.commands.repair import MODE_DECOMMISSION, MODE_RECOVER
from tests.audit_helpers import audit_cluster
from tests.audit_helpers import spark as spark  # the session fixture
from tests.repair_helpers import (
    actions_of,
    assert_fully_replicated,
    audit_and_fragments,
    run_repair,
)

pytestmark = pytest.mark.integration


def _znodes(zk: KazooClient, path: str = "/") -> dict[str, tuple[bytes, int]]:
    """Every znode under ``path`` with data and version (ephemeral registrations included)."""
    out: dict[str, tuple[bytes, int]] = {}
    stack = [path]
    while stack:
        p = stack.pop()
        data, stat = zk.get(p)
        out[p] = (data, stat.version)
        for child in zk.get_children(p):
            stack.append(f"{p.rstrip('/')}/{child}")
    return out


def test_a_stop_bookie_audit_rereplicate_reaudit_clean_and_every_replica_readable(
    spark: SparkSession, tmp_path: Path, zk_chroot: str
) -> None:
    warehouse = str(tmp_path / "warehouse")
    with audit_cluster(tmp_path / "sandbox", zk_chroot, bookies=5) as c:
        b0, b1, b2, b3, b4 = c.bookie_ids
        victim = b2
        ledgers = [
            c.ledger([b0, b1, b2], 30, wq=3, aq=2),
            c.ledger([b0, b1, b2], 25, wq=2, aq=2),
            c.ledger([b2, b3, b4, b0], 40, wq=2, aq=1),
            c.ledger([b1, b2], 7, wq=2, aq=1),
            c.ledger([(0, [b0, b1, b3]), (6, [b0, b1, b2])], 20, wq=2, aq=2),
            c.ledger([(0, [b2, b3, b4]), (4, [b0, b3, b4])], 12, wq=3, aq=2),
            c.ledger([b0, b1, b3], 9, wq=2, aq=2),
            c.ledger([b0, b2, b4], 0, wq=2, aq=2),  # empty: only metadata changes
        ]
        c.sandbox.stop_bookie(victim)
        before = audit_and_fragments(spark, c.zk, warehouse)
        assert {r["ledger_id"] for r in before} == {m.ledger_id for m in ledgers} - {
            ledgers[6].ledger_id
        }

        code, out = run_repair(spark, c.zk, warehouse, "--grace-period", "0s")
        assert code == 0, out
        acts = actions_of(spark, warehouse)
        copies = [a for a in acts if a["action"] == "COPY"]
        assert {a["status"] for a in copies} == {"DONE"}
        assert {a["old_bookie"] for a in copies} == {victim}
        assert victim not in {a["new_bookie"] for a in copies}
        # The copied count is exactly the victim's stripes (empty ledger: nothing).
        expected = sum(r["missing_entries"] for r in before)
        assert sum(a["entries_copied"] for a in copies) == expected
        assert {a["ledger_id"] for a in acts if a["action"] == "METADATA_UPDATE"} == {
            r["ledger_id"] for r in before
        }

        assert audit_and_fragments(spark, c.zk, warehouse, "replicas") == []
        for md in ledgers:
            after = assert_fully_replicated(
                c.store, c.client, md.ledger_id, excluded=frozenset({victim})
            )
            # Positions, segments and the closing point are kept: only the victim moved.
            assert [s.first_entry_id for s in after.segments] == [
                s.first_entry_id for s in md.segments
            ]
            assert after.last_entry_id == md.last_entry_id and after.length == md.length
            for old, new in zip(md.segments, after.segments, strict=True):
                for x, y in zip(old.ensemble, new.ensemble, strict=True):
                    assert x in (y, victim)
        # Marks were published and cleared the way BookKeeper does.
        urm = UnderReplicationManager(c.store.zk)
        assert list(urm.list_underreplicated()) == []

        # A second run has nothing left to do.
        code, out = run_repair(spark, c.zk, warehouse, "--grace-period", "0s")
        assert code == 0 and "0 repaired" in out, out


def test_f_dry_run_changes_no_znode_and_no_bookie(
    spark: SparkSession, tmp_path: Path, zk_chroot: str
) -> None:
    warehouse = str(tmp_path / "warehouse")
    with audit_cluster(tmp_path / "sandbox", zk_chroot, bookies=4) as c:
        b0, b1, b2, b3 = c.bookie_ids
        closed = c.ledger([b0, b1, b2], 20, wq=2, aq=2)
        open_ = c.ledger([b1, b2, b3], 6, wq=2, aq=2, closed=False)
        c.sandbox.stop_bookie(b2)
        audit_and_fragments(spark, c.zk, warehouse)
        znodes = _znodes(c.store.zk)
        counts = {b: c.admin(b).status() for b in (b0, b1, b3)}

        code, out = run_repair(spark, c.zk, warehouse, "--grace-period", "0s", "--dry-run")
        assert code == 0, out
        assert _znodes(c.store.zk) == znodes
        assert {b: c.admin(b).status() for b in (b0, b1, b3)} == counts
        plan = actions_of(spark, warehouse)
        assert {a["status"] for a in plan} == {"PLANNED"}
        copy = [a for a in plan if a["action"] == "COPY"]
        assert {(a["ledger_id"], a["old_bookie"]) for a in copy} == {(closed.ledger_id, b2)}
        assert copy[0]["new_bookie"] == b3  # the only writable bookie outside the ensemble
        assert copy[0]["entries_copied"] == 13  # index 2 holds x % 3 in {1, 2} of [0, 19]
        fence = [a for a in plan if a["action"] == "FENCE_AND_CLOSE"]
        assert [a["ledger_id"] for a in fence] == [open_.ledger_id]
        assert not c.store.read_ledger(open_.ledger_id).value.is_closed


def test_g_entry_on_no_bookie_ends_as_no_replica_with_its_id(
    spark: SparkSession, tmp_path: Path, zk_chroot: str
) -> None:
    warehouse = str(tmp_path / "warehouse")
    with audit_cluster(tmp_path / "sandbox", zk_chroot, bookies=4) as c:
        b0, b1, b2, _ = c.bookie_ids
        md = c.ledger([b0, b1, b2], 12, wq=2, aq=2)
        healthy = c.ledger([b0, b1, b2], 12, wq=2, aq=2)
        # Entry 4's write set is [1, 2]: lose it on b1, then lose b2 entirely.
        c.admin(b1).delete_entries(md.ledger_id, [4])
        c.sandbox.stop_bookie(b2)
        audit_and_fragments(spark, c.zk, warehouse)

        code, out = run_repair(spark, c.zk, warehouse, "--grace-period", "0s")
        assert code == 1, out
        assert f"NO_REPLICA ledger {md.ledger_id} segment 0: entries 4" in out
        acts = actions_of(spark, warehouse)
        lost = [a for a in acts if a["status"] == "NO_REPLICA"]
        assert [(a["ledger_id"], a["no_replica_entries"]) for a in lost] == [(md.ledger_id, [4])]
        # The metadata keeps naming b2 for the broken ledger; the healthy one is repaired.
        assert b2 in c.store.read_ledger(md.ledger_id).value.bookies()
        assert_fully_replicated(c.store, c.client, healthy.ledger_id, excluded=frozenset({b2}))
        urm = UnderReplicationManager(c.store.zk)
        assert [m.ledger_id for m in urm.list_underreplicated()] == [md.ledger_id]

        # The next run reports it again without copying again (terminal, not retried).
        audit_and_fragments(spark, c.zk, warehouse)
        code, out = run_repair(spark, c.zk, warehouse, "--grace-period", "0s")
        assert code == 1
        latest = [a for a in actions_of(spark, warehouse) if a["ledger_id"] == md.ledger_id]
        second = max(a["run_id"] for a in latest)
        again = [a for a in latest if a["run_id"] == second]
        assert [(a["status"], a["entries_copied"]) for a in again] == [("NO_REPLICA", 0)]


def test_h_recover_and_decommission_leave_the_bookie_in_no_ensemble(
    spark: SparkSession, tmp_path: Path, zk_chroot: str
) -> None:
    warehouse = str(tmp_path / "warehouse")
    with audit_cluster(tmp_path / "sandbox", zk_chroot, bookies=5) as c:
        b0, b1, b2, b3, b4 = c.bookie_ids
        mds = [
            c.ledger([b0, b1, b2], 15, wq=2, aq=2),
            c.ledger([b1, b3, b4], 15, wq=3, aq=2),
            c.ledger([(0, [b3, b4, b0]), (5, [b1, b3, b4])], 15, wq=2, aq=2),
            c.ledger([b0, b1, b3], 6, wq=2, aq=2, closed=False),  # open: fenced at once
        ]
        # recover a live bookie onto a chosen target (dry run first changes nothing)
        code, out = run_repair(spark, c.zk, warehouse, b3, "--dry-run", mode=MODE_RECOVER)
        assert code == 0 and "3 ledgers" in out, out
        assert b3 in c.store.read_ledger(mds[1].ledger_id).value.bookies()
        code, out = run_repair(spark, c.zk, warehouse, b3, "--target", b2, mode=MODE_RECOVER)
        assert code == 0, out
        for md in mds[1:]:
            after = assert_fully_replicated(
                c.store, c.client, md.ledger_id, excluded=frozenset({b3})
            )
            assert b2 in after.bookies()
        assert c.store.read_ledger(mds[3].ledger_id).value.last_entry_id == 5

        # decommission refuses a running bookie, then works once it is stopped
        code, _ = run_repair(spark, c.zk, warehouse, b0, mode=MODE_DECOMMISSION)
        assert code == 2
        c.sandbox.stop_bookie(b0)
        code, out = run_repair(spark, c.zk, warehouse, b0, mode=MODE_DECOMMISSION)
        assert code == 0 and "no ledger names it" in out, out
        for md in mds:
            # b3 is alive and writable again as far as placement knows: it may be a target.
            assert_fully_replicated(c.store, c.client, md.ledger_id, excluded=frozenset({b0}))
        assert c.store.zk.exists(f"/ledgers/cookies/{b0}") is None
        assert c.store.zk.exists(ur_ledger_path("/ledgers", mds[0].ledger_id)) is None
