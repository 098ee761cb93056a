"""The placement check and fix on a real sandbox (ZooKeeper + Python bookie processes), with
the bookies registered in racks through Pulsar's ``/bookies`` document (docs/placement.md).

Each test checks the bytes on the bookies after the fix, not only the statuses reported."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from pyspark.sql import SparkSession

from bklib.audit.placement import ENSEMBLE_PLACEMENT_POLICY_CONFIG, ISOLATED_POLICY_CLASS
from bklib.meta.model import LedgerMetadata
from bklib.states import ActionKind, ActionStatus, CountKey, Reason
from jobs.commands.audit import run_audit
from jobs.tables import delta
from jobs.tables.schema import ACTIONS
from tests.audit_helpers import AuditCluster, audit_args, audit_cluster, metadata, write_ledger
from tests.audit_helpers import spark as spark  # the session fixture
from tests.repair_helpers import assert_fully_replicated, run_repair

pytestmark = pytest.mark.integration

RACKS_ZNODE = "/bookies"


def _write_racks(zk: KazooClient, groups: dict[str, dict[str, str]]) -> None:
    """Pulsar's rack document: {group: {bookie: {"rack": r, "hostname": h}}}."""
    doc = {
        g: {b: {"rack": r, "hostname": b.split(":")[0]} for b, r in members.items()}
        for g, members in groups.items()
    }
    data = json.dumps(doc).encode()
    if zk.exists(RACKS_ZNODE):
        zk.set(RACKS_ZNODE, data)
    else:
        zk.create(RACKS_ZNODE, data, makepath=True)


def _audit(zk: str, warehouse: str, *extra: str, spark: Any = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    executor = () if spark is not None else ("--executor", "local")
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run_audit(audit_args(zk, warehouse, "lost", *executor, *extra), spark)
    return code, out.getvalue(), err.getvalue()


def _latest(warehouse: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    run = delta.latest_run(warehouse)
    assert run is not None
    return run, delta.run_fragments(warehouse, run["run_id"])


def _placement(frags: list[dict[str, Any]]) -> dict[int, set[int]]:
    out: dict[int, set[int]] = {}
    for f in frags:
        if f["reason"] == Reason.PLACEMENT_VIOLATION:
            out.setdefault(f["ledger_id"], set()).add(f["segment_first_entry_id"])
    return out


def _ledger_znodes(c: AuditCluster, ids: list[int]) -> dict[int, tuple[LedgerMetadata, int]]:
    out = {}
    for lid in ids:
        v = c.store.read_ledger(lid)
        out[lid] = (v.value, v.version)
    return out


def _racks_of(md: LedgerMetadata, racks: dict[str, str]) -> list[list[str]]:
    return [[racks[b] for b in s.ensemble] for s in md.segments]


def test_placement_violation_found_fixed_by_copy_and_cas_and_reaudit_clean(
    spark: SparkSession, tmp_path: Path, zk_chroot: str
) -> None:
    warehouse = str(tmp_path / "warehouse")
    with audit_cluster(tmp_path / "sandbox", zk_chroot, bookies=6) as c:
        b0, b1, b2, b3, b4, b5 = c.bookie_ids
        racks = {b0: "/rack-a", b1: "/rack-a", b2: "/rack-a", b3: "/rack-a"}
        racks |= {b4: "/rack-b", b5: "/rack-b"}
        # b5 is alone in the isolation group "iso"; the others are Pulsar's default group.
        _write_racks(
            c.store.zk,
            {"default": {b: racks[b] for b in (b0, b1, b2, b3, b4)}, "iso": {b5: racks[b5]}},
        )
        one_move = c.ledger([b0, b1, b2], 20, wq=3, aq=2)  # every write set on rack-a
        two_moves = c.ledger([b0, b1, b2, b3], 30, wq=2, aq=2)
        fine = c.ledger([b0, b4], 10, wq=2, aq=2)
        lid = c.store.generate_ledger_id()
        custom = {
            ENSEMBLE_PLACEMENT_POLICY_CONFIG: json.dumps(
                {
                    "policyClass": ISOLATED_POLICY_CLASS,
                    "properties": {"isolationBookieGroups": "iso"},
                }
            ).encode()
        }
        isolated = write_ledger(
            c.store,
            c.client,
            metadata(lid, [(0, [b1, b2, b3])], wq=3, aq=2, last=14).replace(custom_metadata=custom),
            15,
        )
        violating = [one_move, two_moves, isolated]
        every = [*violating, fine]

        # 1. The audit finds them (metadata only), as PLACEMENT_VIOLATION, not as
        #    under-replication.
        code, out, err = _audit(c.zk, warehouse)
        assert code == 0, err
        run, frags = _latest(warehouse)
        assert _placement(frags) == {md.ledger_id: {0} for md in violating}
        assert {f["reason"] for f in frags} == {Reason.PLACEMENT_VIOLATION}
        assert run["counts"][CountKey.PLACEMENT_VIOLATIONS] == 3
        assert run["counts"][CountKey.UNDERREPLICATED_LEDGERS] == 0
        assert run["counts"][CountKey.PLACEMENT_RACKS] == 2
        assert "0 under-replicated" in out and "3 placement violations" in out
        assert all("write sets" in (f["error"] or "") for f in frags)

        # 2. Plain rereplicate leaves them alone.
        before = _ledger_znodes(c, [md.ledger_id for md in every])
        code, out = run_repair(spark, c.zk, warehouse, "--executor", "local")
        assert code == 0, out
        assert "3 placement violations" in out and "--fix-placement" in out
        assert _ledger_znodes(c, list(before)) == before

        # 3. The dry run plans moves and changes nothing.
        code, out = run_repair(
            spark, c.zk, warehouse, "--fix-placement", "--dry-run", "--executor", "local"
        )
        assert code == 0, out
        planned = [
            a for a in delta.read_rows(warehouse, ACTIONS) if a["status"] == ActionStatus.PLANNED
        ]
        assert {a["ledger_id"] for a in planned} == {md.ledger_id for md in violating}
        assert sum(1 for a in planned if a["ledger_id"] == two_moves.ledger_id) == 2
        assert {a["new_bookie"] for a in planned if a["ledger_id"] == isolated.ledger_id} == {b5}
        assert _ledger_znodes(c, list(before)) == before

        # 4. The fix: one replica at a time, copy then compare-and-set.
        code, out = run_repair(spark, c.zk, warehouse, "--fix-placement", "--executor", "local")
        assert code == 0, out
        done = [
            a
            for a in delta.read_rows(warehouse, ACTIONS)
            if a["status"] == ActionStatus.DONE and a["action"] == ActionKind.COPY
        ]
        assert len(done) == 4  # 1 + 2 + 1 moves
        for a in done:
            assert a["entries_copied"] > 0 and racks[a["new_bookie"]] == "/rack-b"
        after = _ledger_znodes(c, list(before))
        assert after[fine.ledger_id] == before[fine.ledger_id]
        assert b5 in after[isolated.ledger_id][0].bookies()  # the isolation group's bookie
        assert b4 not in after[isolated.ledger_id][0].bookies()
        assert sorted(_racks_of(after[two_moves.ledger_id][0], racks)[0]) == [
            "/rack-a",
            "/rack-a",
            "/rack-b",
            "/rack-b",
        ]

        # 5. The re-audit is clean, and every entry reads back from its new write sets with
        #    valid digests.
        code, out, err = _audit(c.zk, warehouse)
        assert code == 0, err
        _, frags = _latest(warehouse)
        assert frags == []
        for md in every:
            assert_fully_replicated(c.store, c.client, md.ledger_id)


def test_unknown_rack_stated_broken_document_refused_and_spark_agrees(
    spark: SparkSession, tmp_path: Path, zk_chroot: str
) -> None:
    warehouse = str(tmp_path / "warehouse")
    with audit_cluster(tmp_path / "sandbox", zk_chroot, bookies=3) as c:
        b0, b1, b2 = c.bookie_ids
        bad = c.ledger([b0, b1], 5, wq=2, aq=2)
        c.ledger([b0, b2], 5, wq=2, aq=2)  # b2 has no rack: the unknown rack, a rack of its own

        # No /bookies znode: not checked under auto, an error under --placement on.
        code, out, err = _audit(c.zk, warehouse)
        assert code == 0 and "placement" not in out
        code, out, err = _audit(c.zk, warehouse, "--placement", "on")
        assert code == 2 and "/bookies" in err

        # A document that does not parse stops the audit with one line naming the znode.
        c.store.zk.create(RACKS_ZNODE, b'{"default": ["not", "a", "map"]}', makepath=True)
        code, out, err = _audit(c.zk, warehouse)
        assert code == 2 and "rack document /bookies" in err, err
        code, out, err = _audit(c.zk, warehouse, "--placement", "off")
        assert code == 0, err

        _write_racks(c.store.zk, {"default": {b0: "rack-a", b1: "rack-a"}})
        code, out, err = _audit(c.zk, warehouse)
        assert code == 0, err
        assert "1 placement violations" in out
        assert "1 bookies with no rack count as one rack, 'unknown'" in out
        run, local_frags = _latest(warehouse)
        assert _placement(local_frags) == {bad.ledger_id: {0}}
        assert run["counts"][CountKey.PLACEMENT_UNKNOWN_RACK_BOOKIES] == 1

        # The Spark executor finds the same rows.
        code, out, err = _audit(c.zk, warehouse, spark=spark)
        assert code == 0, err
        run, spark_frags = _latest(warehouse)
        assert run["executor"] == "spark"
        key = ("ledger_id", "segment_first_entry_id", "bookie_id", "reason", "error")
        assert sorted(tuple(f[k] for k in key) for f in spark_frags) == sorted(
            tuple(f[k] for k in key) for f in local_frags
        )
        assert "1 placement violations" in out
