"""A cluster laid out by Pulsar's metadata driver, through the real CLI and ZooKeeper.

The tree is what ``PulsarClusterMetadataSetup`` and bookies on ``metadata-store:zk:`` leave:
``INSTANCEID`` and ``available`` but no ``LAYOUT``, ledgers in the hierarchical layout, and no
``underreplication`` tree until an Auditor makes one. It lives under a chroot, and commands
reach it through ``--metadata-uri metadata-store:zk:HOST:PORT/<chroot>`` (ledgers at
``<chroot>/ledgers``). tests/pulsar runs the same on Java bookies and a real broker.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from bklib.meta import paths
from bklib.meta.formats import encode_pulsar_leader
from bklib.meta.underreplication import UnderReplicationManager
from bklib.states import ActionKind, ActionStatus
from bklib.testing.ports import free_port
from bklib.testing.sandbox import MetadataDriver, Sandbox
from bklib.testing.workload import write_ledgers
from bklib.testing.zkclient import connect
from jobs.tables.delta import read_rows
from tests.cli_helpers import bkaudit

pytestmark = pytest.mark.integration


@pytest.fixture
def pulsar_sandbox(tmp_path: Path, zk_chroot: str) -> Iterator[Sandbox]:
    sb = Sandbox(
        tmp_path / "sb",
        num_bookies=4,
        external_zk=zk_chroot,
        metadata_driver=MetadataDriver.PULSAR,
    )
    sb.start()
    try:
        yield sb
    finally:
        sb.stop()


def _uri(zk_chroot: str) -> str:
    hosts, _, chroot = zk_chroot.partition("/")
    return f"metadata-store:zk:{hosts}/{chroot}"


def _ok(*args: str, codes: tuple[int, ...] = (0,)) -> str:
    proc = bkaudit(*args, timeout=300)
    assert proc.returncode in codes, (args, proc.returncode, proc.stdout, proc.stderr[-3000:])
    return proc.stdout


def test_every_command_on_pulsars_layout(
    pulsar_sandbox: Sandbox, zk_chroot: str, tmp_path: Path
) -> None:
    tags = {
        "application": b"pulsar",
        "component": b"managed-ledger",
        "pulsar/managed-ledger": b"public/default/persistent/orders",
    }
    written = asyncio.run(
        write_ledgers(
            zk_chroot,
            16,
            max_entries=20,
            shapes=((3, 2, 2), (2, 2, 2)),
            seed=3,
            custom_metadata=tags,
        )
    )
    zk = connect(zk_chroot)
    try:
        assert zk.exists("/ledgers/LAYOUT") is None and zk.exists("/ledgers/INSTANCEID")
        assert zk.exists("/ledgers/underreplication") is None
        # A Java Auditor on Pulsar's driver leads at the single key underreplication/leader.
        zk.create(
            "/ledgers/underreplication/leader", encode_pulsar_leader("b9:3181"), makepath=True
        )
    finally:
        zk.stop()
        zk.close()
    uri = _uri(zk_chroot)
    meta = ("--metadata-uri", uri)
    wh = str(tmp_path / "wh")

    status = json.loads(_ok("status", *meta, "--format", "json", codes=(0, 1)))
    assert status["metadata_driver"] == "pulsar"
    assert status["java_auditor"] == "b9:3181"
    assert status["java_auditor_key"] == "/ledgers/underreplication/leader"

    victim = pulsar_sandbox.bookie_ids[0]
    on_victim = _ledgers_on(zk_chroot, victim)
    assert on_victim, "the workload put no ledger on the victim"
    whatif = _ok("whatif", *meta, "--bookie", victim)
    assert victim in whatif

    pulsar_sandbox.kill_bookie(victim)
    pulsar_sandbox.wait_unregistered(victim)
    _ok("audit", *meta, "--warehouse", wh, "--check", "lost", "--executor", "local")
    (run,) = read_rows(wh, "audit_runs")
    assert run["status"] == "COMPLETED" and dict(run["counts"])["ledgers"] == len(written)
    found = {r["ledger_id"] for r in read_rows(wh, "underreplicated_fragments")}
    assert found == on_victim
    _ok("listunderreplicated", "--warehouse", wh, codes=(1,))
    _ok("triage", *meta, "--warehouse", wh, codes=(0, 1))
    _ok("recover", victim, *meta, "--warehouse", wh, "--dry-run", codes=(0, 1))

    # The admin API is down: the repair completes, and one line says which topic still
    # needs an unload, with the command.
    dead_admin = f"http://127.0.0.1:{free_port()}"
    out = _ok(
        "rereplicate", *meta, "--warehouse", wh, "--grace-period", "0s", "--executor", "local",
        "--pulsar-admin-url", dead_admin,
    )  # fmt: skip
    assert "pulsar-admin topics unload persistent://public/default/orders" in out, out
    assert sum("unreachable" in line for line in out.splitlines()) == 1, out
    unloads = [
        a for a in read_rows(wh, "replication_actions") if a["action"] == ActionKind.UNLOAD_TOPIC
    ]
    # The repair recorded it as still needed (the recover --dry-run above may have planned
    # one too, when it planned a metadata update).
    assert [(a["topic"], a["status"]) for a in unloads if a["mode"] == "rereplicate"] == [
        ("persistent://public/default/orders", ActionStatus.FAILED)
    ]
    assert {a["status"] for a in unloads if a["mode"] == "recover"} <= {ActionStatus.PLANNED}
    _ok("audit", *meta, "--warehouse", wh, "--check", "replicas", "--executor", "local")
    assert _ledgers_on(zk_chroot, victim) == set()
    assert not [
        r for r in read_rows(wh, "underreplicated_fragments") if r["run_id"] != run["run_id"]
    ]
    listing = _ok("listunderreplicated", "--warehouse", wh)
    assert "pulsar-admin topics unload persistent://public/default/orders" in listing

    zk = connect(zk_chroot)
    try:
        # Nothing wrote BookKeeper's LAYOUT on Pulsar's tree, and any under-replication tree
        # is the one Pulsar's PulsarLedgerUnderreplicationManager accepts (BASIC, version 1).
        assert zk.exists("/ledgers/LAYOUT") is None
        layout = zk.exists("/ledgers/underreplication/LAYOUT")
        if layout is not None:
            UnderReplicationManager(zk).ensure_layout()
    finally:
        zk.stop()
        zk.close()


def _ledgers_on(zk_chroot: str, bookie_id: str) -> set[int]:
    """Ledgers whose metadata names ``bookie_id`` in any segment."""
    from bklib.meta.store import LedgerStore

    zk = connect(zk_chroot)
    try:
        store = LedgerStore(zk)
        out = set()
        for lid in store.list_ledger_ids():
            md = store.read_ledger(lid).value
            if any(bookie_id in seg.ensemble for seg in md.segments):
                out.add(lid)
        return out
    finally:
        zk.stop()
        zk.close()


def test_pulsar_paths_are_bookkeepers() -> None:
    # PulsarLedgerManager.getLedgerPath is StringUtils.getHybridHierarchicalLedgerPath.
    assert paths.ledger_path("/ledgers", 5) == "/ledgers/00/0000/L0005"
    assert paths.ledger_path("/ledgers", 2147483655) == "/ledgers/000/0000/0021/4748/L3655"
