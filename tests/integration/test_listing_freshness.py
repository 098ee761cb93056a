"""``listunderreplicated`` never shows a stale report as current: findings a later repair fixed
are shown as repaired and the exit code follows what is still unrepaired; ``--live`` shows
BookKeeper's marks exactly as they are in ZooKeeper."""

from __future__ import annotations

import argparse
import contextlib
import io
from pathlib import Path

import pytest

from bklib.meta.underreplication import UnderReplicationManager
from jobs.commands.audit import add_audit_arguments, run_audit
from jobs.commands.listing import add_list_arguments, run_listunderreplicated
from jobs.commands.repair import add_repair_arguments, run_rereplicate
from tests.audit_helpers import audit_cluster

pytestmark = pytest.mark.integration


def _run(fn, args: argparse.Namespace) -> tuple[int, str]:  # type: ignore[no-untyped-def]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = fn(args)
    return code, out.getvalue()


def listing(*argv: str) -> tuple[int, str]:
    return _run(
        run_listunderreplicated,
        add_list_arguments(argparse.ArgumentParser()).parse_args(list(argv)),
    )


def test_repaired_findings_are_shown_as_repaired_and_live_matches_zookeeper(
    tmp_path: Path, zk_chroot: str
) -> None:
    wh = str(tmp_path / "wh")
    with audit_cluster(tmp_path / "sandbox", zk_chroot, bookies=5) as c:
        b0, b1, b2, b3, b4 = c.bookie_ids
        closed = [c.ledger([b0, b1, b2], 20, wq=2, aq=2) for _ in range(3)]
        untouched = c.ledger([b1, b3, b4], 20, wq=2, aq=2)
        still_open = c.ledger([b2, b3, b4], 15, wq=2, aq=2, closed=False)
        c.sandbox.stop_bookie(b2)
        c.sandbox.wait_unregistered(b2)

        audit = ["--zk", c.zk, "--warehouse", wh, "--check", "lost", "--executor", "local"]
        assert (
            _run(run_audit, add_audit_arguments(argparse.ArgumentParser()).parse_args(audit))[0]
            == 0
        )
        code, before = listing("--warehouse", wh)
        assert code == 1 and "repair since" not in before
        flagged = {m.ledger_id for m in closed} | {still_open.ledger_id}
        assert {int(x) for x in before.splitlines() if x.isdigit()} == flagged
        assert untouched.ledger_id not in {int(x) for x in before.splitlines() if x.isdigit()}

        # Repair: the closed ledgers are fixed; the open one waits out its grace period and
        # keeps BookKeeper's mark.
        repair = ["--zk", c.zk, "--warehouse", wh, "--executor", "local", "--grace-period", "1h"]
        args = add_repair_arguments(argparse.ArgumentParser()).parse_args(repair)
        assert _run(run_rereplicate, args)[0] == 1

        code, after = listing("--warehouse", wh)
        assert code == 1, after  # the open ledger still needs work
        lines = after.splitlines()
        for md in closed:
            detail = lines[lines.index(str(md.ledger_id)) + 1]
            assert "repair since: REPAIRED (rereplicate" in detail, detail
        detail = lines[lines.index(str(still_open.ledger_id)) + 1]
        assert "repair since: WAITING_GRACE" in detail, detail
        assert "3 of these ledgers were repaired after this audit and 1 still need work" in after

        # --live is BookKeeper's view: exactly the marks in ZooKeeper.
        marks = {
            m.ledger_id: m.missing_replicas
            for m in UnderReplicationManager(c.store.zk).list_underreplicated()
        }
        assert marks == {still_open.ledger_id: (b2,)}
        code, live = listing("--live", "--zk", c.zk)
        assert code == 1
        assert live.splitlines()[:2] == [str(still_open.ledger_id), f"\tMissingReplica : {b2}"]
        assert listing("--live", "--zk", c.zk, "--count-only") == (1, "1\n")
        assert listing("--live", "--zk", c.zk, "--missing-replica", b0, "--count-only") == (
            0,
            "0\n",
        )

        # Once everything is repaired the same report exits 0, and no mark is left.
        repair[-1] = "0s"
        args = add_repair_arguments(argparse.ArgumentParser()).parse_args(repair)
        assert _run(run_rereplicate, args)[0] == 0
        code, done = listing("--warehouse", wh)
        assert code == 0, done
        assert "4 of these ledgers were repaired after this audit and 0 still need work" in done
        assert listing("--live", "--zk", c.zk, "--count-only") == (0, "0\n")
