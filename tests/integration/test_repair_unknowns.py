"""Unknown is never a verdict, through the real CLI: an entry whose every replica sits on a
bookie that is merely unregistered is retried, never NO_REPLICA; and an under-replication
mark whose bookie came back is checked and cleared, never left behind (both found by the
chaos soak, tests/soak)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bklib.meta.underreplication import UnderReplicationManager
from bklib.states import ActionKind, ActionStatus
from jobs.tables import delta
from jobs.tables.schema import ACTIONS
from tests.audit_helpers import AuditCluster, audit_cluster, metadata, write_ledger
from tests.cli_helpers import bkaudit
from tests.repair_helpers import assert_fully_replicated

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(tmp_path: Path, zk_chroot: str) -> Iterator[AuditCluster]:
    with audit_cluster(tmp_path / "sb", zk_chroot, bookies=5) as c:
        yield c


def _run(c: AuditCluster, wh: Path, *extra: str) -> None:
    common = ["--zk", c.zk, "--warehouse", str(wh), "--executor", "local"]
    audit = bkaudit("audit", *common, "--check", "lost")
    assert audit.returncode == 0, audit.stderr
    repair = bkaudit("rereplicate", *common, "--read-timeout", "2", *extra)
    assert repair.returncode in (0, 1), repair.stderr


def _actions(wh: Path) -> list[dict[str, Any]]:
    return sorted(delta.read_rows(str(wh), ACTIONS), key=lambda r: r["started_at"])


def test_replicas_on_unregistered_bookies_are_unknown_not_lost(
    cluster: AuditCluster, tmp_path: Path
) -> None:
    c = cluster
    a, b, cc = c.bookie_ids[:3]
    md = write_ledger(
        c.store, c.client, metadata(c.store.generate_ledger_id(), [(0, [a, b, cc])], last=29), 30
    )
    c.sandbox.kill_bookie(a)  # lost for good
    c.sandbox.kill_bookie(b)  # down for a while: its replicas are unknown, not gone
    c.sandbox.wait_unregistered(a)
    c.sandbox.wait_unregistered(b)
    wh = tmp_path / "wh"
    _run(c, wh, "--grace-period", "0s")
    first = _actions(wh)
    assert not [r for r in first if r["status"] == ActionStatus.NO_REPLICA], first
    assert any(r["status"] == ActionStatus.FAILED for r in first), first
    assert any("no registered bookie holds a replica" in (r["error"] or "") for r in first)

    c.sandbox.bookie(b).start()  # back with all its data
    c.sandbox.wait_registered([b])
    _run(c, wh, "--grace-period", "0s")
    assert not [r for r in _actions(wh) if r["status"] == ActionStatus.NO_REPLICA]
    assert_fully_replicated(c.store, c.client, md.ledger_id, excluded=frozenset({a}))


def test_a_mark_left_while_a_bookie_was_down_is_cleared_once_it_is_back(
    cluster: AuditCluster, tmp_path: Path
) -> None:
    c = cluster
    a, b, cc = c.bookie_ids[:3]
    # An open ledger (its writer is gone): the repair waits out the grace period and marks it.
    md = write_ledger(
        c.store, c.client, metadata(c.store.generate_ledger_id(), [(0, [a, b, cc])]), 30
    )
    urm = UnderReplicationManager(c.store.zk, c.store.root)
    c.sandbox.kill_bookie(b)
    c.sandbox.wait_unregistered(b)
    wh = tmp_path / "wh"
    _run(c, wh, "--grace-period", "1h")  # WAITING_GRACE, and the mark is published
    assert [r["status"] for r in _actions(wh)] == [ActionStatus.WAITING_GRACE]
    assert urm.get(md.ledger_id) is not None

    c.sandbox.bookie(b).start()  # back before the grace ran out
    c.sandbox.wait_registered([b])
    _run(c, wh)  # the audit is clean now; the marked ledger is checked and its mark cleared
    last = _actions(wh)[-1]
    assert (last["action"], last["status"]) == (ActionKind.CLEAR_MARK, ActionStatus.DONE)
    assert urm.get(md.ledger_id) is None
    live = bkaudit("listunderreplicated", "--live", "--zk", c.zk)
    assert live.returncode == 0 and "0 ledgers marked under-replicated" in live.stdout
