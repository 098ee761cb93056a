"""An audit in this process opens one metadata-store session and passes it down: the cluster
check, the racks, the scan, the registrations, the scan's accounting, the bookie client's
address lookups and the re-read of flagged ledgers all use it (on both stores)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bklib.meta.stores.oxia import OxiaStore
from bklib.meta.stores.zookeeper import ZooKeeperStore
from bklib.states import RunStatus
from jobs.commands.audit import run_audit
from jobs.tables import delta
from jobs.tables.schema import FRAGMENTS
from tests.audit_helpers import audit_args, audit_cluster

pytestmark = pytest.mark.integration


def test_a_local_audit_opens_one_store_session(
    tmp_path: Path, store_locator: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with audit_cluster(tmp_path / "sandbox", store_locator, bookies=4) as c:
        b = c.bookie_ids
        ledgers = [
            c.ledger([b[k], b[(k + 1) % 4], b[(k + 2) % 4]], 12, wq=2, aq=2) for k in range(4)
        ]
        c.sandbox.stop_bookie(b[3])
        c.sandbox.wait_unregistered(b[3])

        opened: list[str] = []
        for cls in (ZooKeeperStore, OxiaStore):
            original = cls.__init__

            def counting(self: Any, *args: Any, _orig: Any = original, **kw: Any) -> None:
                opened.append(type(self).__name__)
                _orig(self, *args, **kw)

            monkeypatch.setattr(cls, "__init__", counting)
        wh = str(tmp_path / "wh")
        assert run_audit(audit_args(c.zk, wh, "replicas", "--executor", "local")) == 0
        monkeypatch.undo()

        run = delta.latest_run(wh)
        assert run is not None and run["status"] == RunStatus.COMPLETED
        found = {(r["ledger_id"], r["bookie_id"]) for r in delta.read_rows(wh, FRAGMENTS)}
        assert found == {(md.ledger_id, b[3]) for md in ledgers if b[3] in md.bookies()}
        assert len(opened) == 1, opened
