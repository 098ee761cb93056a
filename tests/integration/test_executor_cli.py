"""``--executor`` through the real CLI: the local limit and tables delta-rs cannot honour are
one-line errors with exit 2, and nothing is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bklib.meta.model import LedgerMetadata, LedgerState, Segment
from bklib.meta.store import LedgerStore
from bklib.testing.zkclient import connect
from jobs.tables import delta
from jobs.tables.schema import AUDIT_RUNS, TABLES
from tests.cli_helpers import bkaudit, error_lines

pytestmark = pytest.mark.integration

DEAD = ("10.255.0.1:3181", "10.255.0.2:3181", "10.255.0.3:3181")


def _metadata_only_cluster(zk_chroot: str, ledgers: int) -> None:
    """A cluster whose ledgers name bookies that never registered: the lost check needs no
    bookie process, and every ledger is a finding."""
    zk = connect(zk_chroot)
    try:
        store = LedgerStore(zk)
        store.init_cluster()
        for _ in range(ledgers):
            lid = store.generate_ledger_id()
            store.create_ledger(
                LedgerMetadata(
                    ledger_id=lid,
                    ensemble_size=3,
                    write_quorum=2,
                    ack_quorum=2,
                    state=LedgerState.CLOSED,
                    last_entry_id=9,
                    length=100,
                    segments=(Segment(0, DEAD),),
                )
            )
    finally:
        zk.stop()
        zk.close()


def _log_files(warehouse: Path) -> dict[str, int]:
    return {
        t: len(list((warehouse / t / "_delta_log").glob("*.json")))
        for t in TABLES
        if (warehouse / t).exists()
    }


def test_local_above_its_memory_limit_is_one_line_suggesting_spark(
    tmp_path: Path, zk_chroot: str
) -> None:
    _metadata_only_cluster(zk_chroot, 40)
    wh = tmp_path / "wh"
    proc = bkaudit(
        "audit", "--zk", zk_chroot, "--warehouse", str(wh), "--check", "lost",
        "--executor", "local", "--local-memory-limit", "100KB",
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    (line,) = error_lines(proc)
    assert "40 ledgers" in line and "use --executor spark" in line
    assert "Traceback" not in proc.stderr
    assert not wh.exists()


def test_a_table_with_a_newer_protocol_is_refused_and_left_alone(
    tmp_path: Path, zk_chroot: str
) -> None:
    _metadata_only_cluster(zk_chroot, 5)
    wh = tmp_path / "wh"
    audit = ["audit", "--zk", zk_chroot, "--warehouse", str(wh), "--check", "lost"]
    proc = bkaudit(*audit, "--executor", "local")
    assert proc.returncode == 0, proc.stderr
    assert "5 ledgers, 5 under-replicated" in proc.stdout
    assert delta.latest_run(str(wh)) is not None

    # A writer from the future upgraded the table to a feature this delta-rs does not know.
    log_dir = wh / AUDIT_RUNS / "_delta_log"
    version = len(list(log_dir.glob("*.json")))
    feature = {
        "readerFeatures": ["bkauditFutureFeature"],
        "writerFeatures": ["bkauditFutureFeature"],
    }
    protocol = {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7, **feature}}
    (log_dir / f"{version:020d}.json").write_text(json.dumps(protocol) + "\n")
    before = _log_files(wh)

    for args in (
        (*audit, "--executor", "local"),
        ("listunderreplicated", "--warehouse", str(wh)),
    ):
        proc = bkaudit(*args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        (line,) = error_lines(proc)
        assert f"{wh / AUDIT_RUNS}" in line and "bkauditFutureFeature" in line, line
        assert "Traceback" not in proc.stderr
    assert _log_files(wh) == before
