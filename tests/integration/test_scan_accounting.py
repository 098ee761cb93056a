"""A scan that read fewer ledgers than the directories announced, for no recorded reason, is
not COMPLETED; ledgers created while it ran are a recorded reason. Both executors, real
ZooKeeper, real Delta tables."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bklib.audit.engine import ScanPlan
from bklib.meta.model import LedgerMetadata, Segment
from bklib.meta.store import LedgerStore
from bklib.states import CountKey, Executor, RunStatus
from bklib.testing.zkclient import connect
from jobs.commands.audit import add_audit_arguments, run_audit
from jobs.runtime.exit_status import ExitStatus
from jobs.tables import delta
from tests.audit_helpers import spark as spark  # the session fixture

pytestmark = pytest.mark.integration

BOOKIES = ("127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183")


def _md(ledger_id: int) -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=ledger_id,
        ensemble_size=3,
        write_quorum=2,
        ack_quorum=2,
        segments=(Segment(0, BOOKIES),),
        ctoken=1,
    )


@pytest.fixture
def cluster(zk_chroot: str) -> Iterator[str]:
    """A metadata-only cluster: 12 ledgers in two leaf directories, no bookie registered
    (so `--check lost` flags them all; only the counting matters here)."""
    zk = connect(zk_chroot)
    try:
        store = LedgerStore(zk)
        store.init_cluster()
        for lid in [*range(1, 7), *range(10_001, 10_007)]:
            store.create_ledger(_md(lid))
    finally:
        zk.stop()
        zk.close()
    yield zk_chroot


def _audit(
    zk: str, wh: Path, executor: str, spark: Any, status: int = ExitStatus.OK
) -> tuple[dict[str, Any], str]:
    argv = ["--zk", zk, "--warehouse", str(wh), "--check", "lost", "--executor", executor]
    args = add_audit_arguments(argparse.ArgumentParser()).parse_args(argv)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = run_audit(args, spark if executor == Executor.SPARK else None)
    assert code == status, out.getvalue()
    run = delta.latest_run(str(wh))
    assert run is not None
    return run, out.getvalue()


@pytest.mark.parametrize("executor", [Executor.LOCAL, Executor.SPARK])
def test_every_announced_ledger_is_accounted_for(
    cluster: str, tmp_path: Path, executor: str, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, line = _audit(cluster, tmp_path / "clean", executor, spark)
    counts = run["counts"]
    assert run["status"] == RunStatus.COMPLETED, line
    assert counts[CountKey.LEDGERS_EXPECTED] == counts[CountKey.LEDGERS] == 12
    assert counts[CountKey.LEDGERS_UNACCOUNTED] == 0

    # A scan that loses a ledger: the plan announces one more than the scan will produce in
    # a directory that does not change (what a swallowed error or a lost task would do).
    real_read = ScanPlan.read

    def announces_one_more(*a: Any, **kw: Any) -> ScanPlan:
        plan = real_read(*a, **kw)
        first = dataclasses.replace(plan.dirs[0], count=plan.dirs[0].count + 1)
        return dataclasses.replace(plan, dirs=(first, *plan.dirs[1:]))

    monkeypatch.setattr(
        ScanPlan, "read", classmethod(lambda cls, *a, **kw: announces_one_more(*a, **kw))
    )
    run, line = _audit(cluster, tmp_path / "lost", executor, spark, ExitStatus.INCOMPLETE)
    assert run["status"] == RunStatus.COMPLETED_WITH_ERRORS, line
    assert run["counts"][CountKey.LEDGERS_UNACCOUNTED] == 1
    assert run["counts"][CountKey.LEDGERS_EXPECTED] == 13
    assert "1 ledgers unaccounted for" in line


@pytest.mark.parametrize("executor", [Executor.LOCAL, Executor.SPARK])
def test_ledgers_created_during_the_scan_are_a_recorded_reason(
    cluster: str, tmp_path: Path, executor: str, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_read = ScanPlan.read

    def then_a_writer_creates(*a: Any, **kw: Any) -> ScanPlan:
        plan = real_read(*a, **kw)
        zk = connect(cluster)
        try:
            LedgerStore(zk).create_ledger(_md(7))  # lands in the first directory
        finally:
            zk.stop()
            zk.close()
        return plan

    monkeypatch.setattr(
        ScanPlan, "read", classmethod(lambda cls, *a, **kw: then_a_writer_creates(*a, **kw))
    )
    run, line = _audit(cluster, tmp_path / "wh", executor, spark)
    counts = run["counts"]
    assert run["status"] == RunStatus.COMPLETED, line
    assert (counts[CountKey.LEDGERS_EXPECTED], counts[CountKey.LEDGERS]) == (12, 13)
    assert counts[CountKey.LEDGER_DIRS_CHANGED] == 1
    assert counts[CountKey.LEDGERS_UNACCOUNTED] == 0
