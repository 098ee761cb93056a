"""The ZooKeeper request budget against a real server: every request of a kazoo session and of
the pipelined scan draws a token, and an audit run under ``--zk-rate`` cannot send faster than
its budget while still finding everything."""

from __future__ import annotations

import time

import pytest

from bklib.meta.stores.zookeeper import ZooKeeperStore
from bklib.meta.stores.zookeeper.budget import BudgetedKazooClient, set_request_rate
from bklib.meta.stores.zookeeper.client import new_client
from tests.cli_helpers import bkaudit
from tests.integration.test_executor_cli import _metadata_only_cluster

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("restore_zk_budget")]


def test_every_request_of_a_session_and_of_the_scan_is_counted(zk_chroot: str) -> None:
    client = new_client(zk_chroot, timeout=10)
    assert isinstance(client, BudgetedKazooClient)
    client.start(timeout=15)
    store = ZooKeeperStore(client, zk_chroot)
    try:
        budget = set_request_rate(None)  # unlimited, but counting
        store.create("/b", b"x")  # 1
        store.get("/b")  # 2
        store.set("/b", b"y")  # 3
        assert store.exists("/b") is not None  # 4
        for i in range(40):  # 44
            store.create(f"/b/c{i:02d}", b"z")
        assert len(store.children("/b")) == 40  # 45
        paths = [f"/b/c{i:02d}" for i in range(40)] + ["/b/missing"]
        got = list(store.get_many(paths, max_in_flight=8))  # 86, on the bulk session
        assert [g.data for g in got[:40]] == [b"z"] * 40 and got[40].missing
        assert budget.requests == 86, budget.requests
    finally:
        store.close()


def test_a_limited_scan_sends_no_faster_than_its_budget(zk_chroot: str) -> None:
    budget = set_request_rate(200)
    client = new_client(zk_chroot, timeout=10)
    client.start(timeout=15)
    store = ZooKeeperStore(client, zk_chroot)
    try:
        for i in range(20):  # the burst (20 at 200/s), then 1 per 5 ms
            store.create(f"/n{i:03d}", b"")
        paths = [f"/n{i % 20:03d}" for i in range(400)]
        before = budget.requests
        start = time.monotonic()
        assert sum(1 for g in store.get_many(paths, max_in_flight=500) if g.data == b"") == 400
        elapsed = time.monotonic() - start
        assert budget.requests - before == 400 and budget.waited > 0
    finally:
        store.close()
    # 400 reads with at most one burst (20) of credit: never under 380 / 200 s.
    assert elapsed >= 380 / 200, elapsed


def test_an_audit_under_zk_rate_finds_everything_and_takes_its_time(
    tmp_path: pytest.TempPathFactory, zk_chroot: str
) -> None:
    _metadata_only_cluster(zk_chroot, 300)
    wh = str(tmp_path / "wh")  # type: ignore[operator]
    start = time.monotonic()
    proc = bkaudit(
        "-v", "audit", "--zk", zk_chroot, "--warehouse", wh, "--check", "lost",
        "--executor", "local", "--zk-rate", "150",
    )  # fmt: skip
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr
    assert "300 ledgers, 300 under-replicated" in proc.stdout
    assert "ZooKeeper budget: 150 requests/s from this process" in proc.stderr  # -v: DEBUG
    # At least the 300 ledger reads drew from a 150/s budget holding 15 at the start.
    assert elapsed >= (300 - 15) / 150, elapsed
