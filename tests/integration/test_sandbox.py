"""The sandbox: a real ZooKeeper and Python bookie processes, from the library and the CLI."""

from __future__ import annotations

import subprocess
import sys

from bklib.meta.registration import list_bookies, registered_ids
from bklib.meta.store import LedgerStore
from bklib.testing.sandbox import Sandbox
from bklib.testing.zkclient import connect


def test_sandbox_in_a_chroot_registers_bookies_and_survives_restart(tmp_path, zk_chroot):
    with Sandbox(tmp_path, num_bookies=3, external_zk=zk_chroot) as sb:
        zk = connect(zk_chroot)
        try:
            reg = list_bookies(zk)
            assert sorted(reg.writable) == sorted(sb.bookie_ids)
            for bid in sb.bookie_ids:
                assert reg.writable[bid].info.rpc_address() == ("127.0.0.1", int(bid.split(":")[1]))
            assert zk.get("/ledgers/LAYOUT")[0].startswith(b"2\n")
            assert LedgerStore(zk).instance_id() is not None
            victim = sb.bookie_ids[1]
            sb.stop_bookie(victim)
            assert victim not in list_bookies(zk).writable
            # The names alone, as the watch reads them every cycle: the same set.
            others = frozenset(b for b in sb.bookie_ids if b != victim)
            assert registered_ids(zk) == (others, frozenset())
            zk.ensure_path("/ledgers/available/readonly/" + victim)
            assert registered_ids(zk) == (others, frozenset({victim}))
            assert set(list_bookies(zk).readonly) == {victim}
            zk.delete("/ledgers/available/readonly/" + victim)
            sb.restart_bookie(victim)
            assert victim in list_bookies(zk).writable
            assert registered_ids(zk) == (frozenset(sb.bookie_ids), frozenset())
        finally:
            zk.stop()
            zk.close()


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jobs.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_cli_sandbox_up_status_down(tmp_path):
    d = str(tmp_path / "sb")
    up = run_cli("sandbox", "up", "--dir", d, "--bookies", "2")
    try:
        assert up.returncode == 0, up.stderr
        assert up.stdout.count("bookie ") == 2
        status = run_cli("sandbox", "status", "--dir", d)
        assert status.returncode == 0, status.stderr
        assert "serving" in status.stdout
        assert status.stdout.count("registered: writable") == 2
        again = run_cli("sandbox", "up", "--dir", d)
        assert again.returncode == 2
    finally:
        down = run_cli("sandbox", "down", "--dir", d)
    assert down.returncode == 0, down.stderr
    assert "zookeeper" in down.stdout
    gone = run_cli("sandbox", "status", "--dir", d)
    assert gone.returncode == 2 and "no sandbox" in gone.stderr


def test_cli_sandbox_on_oxia_runs_the_audit_story(tmp_path):
    # A Pulsar-on-Oxia cluster: no ZooKeeper at all. The bookies register in Oxia, the
    # writer draws ledger ids from Oxia, and the audit reads it through Pulsar's URI form.
    import asyncio
    import json

    from bklib.testing.workload import write_ledgers

    d = tmp_path / "sb"
    up = run_cli("sandbox", "up", "--metadata", "oxia", "--dir", str(d), "--bookies", "3")
    try:
        assert up.returncode == 0, up.stderr
        assert up.stdout.startswith("Oxia ") and "ZooKeeper" not in up.stdout
        uri = up.stdout.rsplit("use: --metadata-uri ", 1)[1].split()[0]
        assert uri.startswith("metadata-store:oxia://127.0.0.1:")
        state = json.loads((d / "sandbox.json").read_text())
        written = asyncio.run(write_ledgers(state["zk"], 6, max_entries=10, shapes=((3, 2, 2),)))
        assert len(written) == 6
        audit = run_cli(
            "audit", "--metadata-uri", uri, "--warehouse", str(tmp_path / "wh"),
            "--check", "lost", "--executor", "local",
        )  # fmt: skip
        assert audit.returncode == 0, audit.stderr
        assert "COMPLETED: 6 ledgers, 0 under-replicated" in audit.stdout
        status = run_cli("status", "--metadata-uri", uri)
        assert status.returncode == 0, status.stderr
        assert "/ledgers/underreplication/leader" in status.stdout  # Pulsar's Auditor key
        assert "3 writable" in status.stdout
    finally:
        down = run_cli("sandbox", "down", "--dir", str(d))
    assert down.returncode == 0, down.stderr
    assert "oxia" in down.stdout
