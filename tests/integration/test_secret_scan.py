"""No secret leaks: the ZooKeeper auth and the ledger password given to bkaudit (by file and
by environment variable) appear in none of its outputs.

A real sandbox (ZooKeeper, four Python bookies) loses a bookie; the real CLI audits it on both
executors with DEBUG logs, repairs it, lists the findings and writes the HTML report. Then
every byte bkaudit produced is searched for the secrets: stdout and stderr, every file of the
warehouse (Delta logs and Parquet) and every value of every table row, the HTML report, and
the bookies' logs.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bklib.states import ActionStatus
from jobs.tables import delta
from jobs.tables.schema import ACTIONS, TABLES
from tests.audit_helpers import audit_cluster, metadata, write_ledger
from tests.cli_helpers import bkaudit, failure

pytestmark = pytest.mark.integration

ZK_SECRET = "zk-Pa55-7f3a9c"
LEDGER_SECRET = "ledger-Pa55-b41e2d"
SECRETS = (ZK_SECRET, LEDGER_SECRET)


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return bkaudit(*args, env=env, timeout=300)


def _leaks(where: str, data: bytes | str) -> list[str]:
    raw = data.encode("utf-8", "replace") if isinstance(data, str) else data
    return [f"{s!r} in {where}" for s in SECRETS if s.encode() in raw]


def test_no_secret_in_outputs_tables_report_or_logs(tmp_path: Path, zk_chroot: str) -> None:
    wh = tmp_path / "wh"
    auth_file = tmp_path / "zk-auth"
    auth_file.write_text(f"operator:{ZK_SECRET}\n")
    pw_file = tmp_path / "ledger-password"
    pw_file.write_text(LEDGER_SECRET + "\n")
    leaks: list[str] = []
    outputs: list[tuple[str, subprocess.CompletedProcess[str]]] = []
    with audit_cluster(tmp_path / "sandbox", zk_chroot, bookies=4) as c:
        b = c.bookie_ids
        for k in range(4):
            lid = c.store.generate_ledger_id()
            md = metadata(lid, [(0, [b[k], b[(k + 1) % 4], b[(k + 2) % 4]])], wq=2, aq=2)
            md = md.replace(password=LEDGER_SECRET.encode())
            write_ledger(c.store, c.client, md.closed(9, 100), 10)
        c.sandbox.stop_bookie(b[3])
        c.sandbox.wait_unregistered(b[3])
        zk = ["--zk", c.zk, "--warehouse", str(wh)]
        by_file = ["--zk-auth-file", str(auth_file)]

        audit = ["-v", "audit", *zk, "--check", "replicas", *by_file]
        outputs.append(("audit local", _cli(*audit, "--executor", "local")))
        outputs.append(("audit spark", _cli(*audit, "--executor", "spark")))
        repair = ["-v", "rereplicate", *zk, *by_file, "--password-file", str(pw_file)]
        outputs.append(
            ("rereplicate", _cli(*repair, "--grace-period", "0s", "--executor", "local"))
        )
        # The same secrets through the environment, for the re-audit.
        env = {"BKAUDIT_ZK_AUTH": f"operator:{ZK_SECRET}", "BKAUDIT_PASSWORD": LEDGER_SECRET}
        outputs.append(("re-audit (env)", _cli("-v", "audit", *zk, "--check", "replicas", env=env)))
        outputs.append(("listunderreplicated", _cli("listunderreplicated", "--warehouse", str(wh))))
        html = tmp_path / "report.html"
        outputs.append(("report", _cli("report", "--warehouse", str(wh), "--out", str(html))))

        for name, proc in outputs:
            assert proc.returncode == 0, failure(proc, name)
            leaks += _leaks(f"{name} stdout", proc.stdout)
            leaks += _leaks(f"{name} stderr", proc.stderr)
        # The run did what it should, so the scan below covers real rows.
        final = delta.latest_run(str(wh))
        assert final is not None and final["status"] == "COMPLETED", final
        done = [a for a in delta.read_rows(str(wh), ACTIONS) if a["status"] == ActionStatus.DONE]
        assert done, "the repair wrote no DONE action rows"
        for lid in c.store.list_ledger_ids():
            assert b[3] not in c.store.read_ledger(lid).value.bookies(), lid
        for log in (tmp_path / "sandbox").rglob("*.log"):
            leaks += _leaks(str(log), log.read_bytes())

    assert "<html" in html.read_text().lower()
    leaks += _leaks("report.html", html.read_bytes())
    files = [p for p in wh.rglob("*") if p.is_file()]
    assert any(p.suffix == ".parquet" for p in files) and any(p.suffix == ".json" for p in files)
    for p in files:
        leaks += _leaks(str(p.relative_to(wh)), p.read_bytes())
    for table in TABLES:
        if delta.table_exists(str(wh), table):
            for row in delta.read_rows(str(wh), table):
                leaks += _leaks(f"table {table}", repr(row))
    assert not leaks, leaks
