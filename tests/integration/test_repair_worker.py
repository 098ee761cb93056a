"""The per-ledger repair worker (no Spark) on a real sandbox: the disable flag, a re-mark made
during repair surviving, and a concurrent metadata change kept by the compare-and-set."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bklib.meta.model import LedgerMetadata
from bklib.meta.underreplication import UnderReplicationManager
from bklib.repair.worker import LedgerRepairer, LedgerRequest, RepairSettings
from tests.audit_helpers import AuditCluster, audit_cluster
from tests.repair_helpers import assert_fully_replicated

pytestmark = pytest.mark.integration


def _repairer(c: AuditCluster) -> LedgerRepairer:
    return LedgerRepairer(c.store, c.client, RepairSettings(grace_period=0, rate=None))


def test_disable_flag_stops_repair_until_enabled(tmp_path: Path, zk_chroot: str) -> None:
    with audit_cluster(tmp_path / "sb", zk_chroot, bookies=4) as c:
        b0, b1, b2, _ = c.bookie_ids
        md = c.ledger([b0, b1, b2], 9, wq=2, aq=2)
        c.sandbox.stop_bookie(b2)
        urm = UnderReplicationManager(c.store.zk)
        urm.ensure_layout()
        urm.disable_replication()
        req = LedgerRequest(md.ledger_id, frozenset({b2}))
        before = c.store.read_ledger(md.ledger_id)
        acts = _repairer(c).repair(req)
        assert [(a.action, a.status) for a in acts] == [("SKIP", "DISABLED")]
        assert c.store.read_ledger(md.ledger_id) == before
        assert urm.get(md.ledger_id) is None  # nothing published while disabled
        urm.enable_replication()
        acts = _repairer(c).repair(req)
        assert {a.status for a in acts} == {"DONE"}
        assert_fully_replicated(c.store, c.client, md.ledger_id, excluded=frozenset({b2}))


def test_re_mark_during_repair_survives_and_concurrent_change_is_kept(
    tmp_path: Path, zk_chroot: str
) -> None:
    with audit_cluster(tmp_path / "sb", zk_chroot, bookies=6) as c:
        b0, b1, b2, b3, b4, b5 = c.bookie_ids
        md = c.ledger([(0, [b0, b1, b2]), (10, [b0, b1, b3])], 20, wq=2, aq=2)
        c.sandbox.stop_bookie(b2)
        urm = UnderReplicationManager(c.store.zk)
        urm.ensure_layout()
        repairer = _repairer(c)
        repairer.chooser.assigned = {b3: 100, b5: 100}  # make b4 the replacement
        real_copy = repairer.copy_entries

        def copy_then_interfere(*args: Any, **kwargs: Any) -> Any:
            result = real_copy(*args, **kwargs)
            # Meanwhile a Java Auditor re-marks the ledger (another bookie) and another
            # repairer replaces b3 in the second segment.
            urm.mark_underreplicated(md.ledger_id, ["10.9.9.9:3181"])

            def other(m: LedgerMetadata) -> LedgerMetadata:
                return m.with_bookies_replaced(10, {b3: b5})

            c.store.update_ledger(md.ledger_id, other)
            return result

        repairer.copy_entries = copy_then_interfere  # type: ignore[method-assign]
        acts = repairer.repair(LedgerRequest(md.ledger_id, frozenset({b2})))
        assert {(a.action, a.status) for a in acts} == {
            ("COPY", "DONE"),
            ("METADATA_UPDATE", "DONE"),
        }
        after = c.store.read_ledger(md.ledger_id).value
        assert [s.ensemble for s in after.segments] == [(b0, b1, b4), (b0, b1, b5)]
        mark = urm.get(md.ledger_id)
        assert mark is not None and "10.9.9.9:3181" in mark.missing_replicas
        assert urm.lock_holder(md.ledger_id) is None


def test_live_bookie_missing_entries_is_repaired_in_place_beside_a_lost_one(
    tmp_path: Path, zk_chroot: str
) -> None:
    # The demo's case: a 4-bookie ensemble on a 5-bookie cluster loses one bookie while
    # another ensemble member misses entries; only one bookie is left outside the ensemble.
    with audit_cluster(tmp_path / "sb", zk_chroot, bookies=5) as c:
        b0, b1, b2, b3, b4 = c.bookie_ids
        md = c.ledger([b0, b1, b2, b3], 24, wq=3, aq=2)
        c.admin(b1).delete_entries(md.ledger_id, [1, 5, 9])  # b1 (index 1) holds x % 4 != 2
        c.sandbox.stop_bookie(b2)
        req = LedgerRequest(md.ledger_id, frozenset({b2}), segment_bookies={0: frozenset({b1})})
        acts = _repairer(c).repair(req)
        moves = {(a.action, a.old_bookie, a.new_bookie, a.status) for a in acts}
        assert moves == {
            ("COPY", b2, b4, "DONE"),
            ("COPY", b1, b1, "DONE"),  # written back to the live bookie
            ("METADATA_UPDATE", b2, b4, "DONE"),
        }
        after = assert_fully_replicated(c.store, c.client, md.ledger_id, excluded=frozenset({b2}))
        assert after.segments[0].ensemble == (b0, b1, b4, b3)
