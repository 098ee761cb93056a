"""One store session per process, handed down (docs/metadata-stores.md, "Sessions"): counted
by ZooKeeper itself. A standalone ZooKeeper numbers its sessions from one counter, so the ids
of two probe sessions bound how many sessions every client created in between, the brief ones
included (:meth:`ZooKeeperServer.next_session_id`); the Spark driver's own are told apart by
the client ports of ZooKeeper's ``cons`` list.

- a local audit (lost, sample): at most 2, its session and the store's bulk reader;
- ``rereplicate`` with N worker processes: at most 2 + N, its session, the bulk reader that
  lists the marks, and one per worker;
- a Spark audit: at most 2 from the driver (each task opens its own);
- a watch that has run three more audits and a repair: not one session more than after its
  first cycle (a session another process re-creates meanwhile, a bookie's that expired on a
  loaded machine, is told apart by its client port and not charged to the watch).

On Oxia the server counts its clients' shard-assignment streams: the same bounds per store,
and a Spark driver's one store is counted where it is made.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from bklib.meta.stores import open_store
from bklib.testing.oxiaserver import OxiaServer
from bklib.testing.zkserver import ZooKeeperServer
from jobs.commands.audit import run_audit
from tests.audit_helpers import AuditCluster, audit_args, audit_cluster
from tests.audit_helpers import spark as spark  # the session fixture
from tests.cli_helpers import REPO, bkaudit
from tests.conftest import wipe_oxia
from tests.integration.test_watch import Watch, ledgers, repaired, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    """A ZooKeeper of this module's own: nothing else creates sessions on it meanwhile."""
    with ZooKeeperServer(tmp_path_factory.mktemp("zk-sessions")) as zk:
        yield zk


@pytest.fixture
def cluster(server: ZooKeeperServer, tmp_path: Path) -> Iterator[AuditCluster]:
    with (
        server.private_chroot("sessions") as chroot,
        audit_cluster(tmp_path / "sandbox", chroot, bookies=4) as c,
    ):
        yield c


def sessions_created(server: ZooKeeperServer, work: Callable[[], Any]) -> int:
    """How many sessions ZooKeeper gave out while ``work`` ran (its probes excluded)."""
    before = server.next_session_id()
    work()
    return server.next_session_id() - before - 1


def _audit(c: AuditCluster, wh: Path, check: str) -> None:
    out = bkaudit("audit", "--zk", c.zk, "--warehouse", str(wh), "--check", check,
                  "--executor", "local", "--read-timeout", "3s")  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]


@pytest.mark.parametrize("check", ["lost", "sample"])
def test_a_local_audit_opens_at_most_two_sessions(
    server: ZooKeeperServer, cluster: AuditCluster, tmp_path: Path, check: str
) -> None:
    b = cluster.bookie_ids
    for i in range(8):
        cluster.ledger([b[i % 4], b[(i + 1) % 4], b[(i + 2) % 4]], 10, wq=2, aq=2)
    n = sessions_created(server, lambda: _audit(cluster, tmp_path / "wh", check))
    assert 1 <= n <= 2, n


def test_rereplicate_opens_one_session_and_one_per_worker(
    server: ZooKeeperServer, cluster: AuditCluster, tmp_path: Path
) -> None:
    victim = cluster.bookie_ids[3]
    ledgers(cluster, victim, n=6, entries=10)
    cluster.sandbox.stop_bookie(victim)
    wh = tmp_path / "wh"
    out = bkaudit("audit", "--zk", cluster.zk, "--warehouse", str(wh), "--check", "lost",
                  "--executor", "local")  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    workers = 2

    def repair() -> None:
        done = bkaudit(
            "rereplicate", "--zk", cluster.zk, "--warehouse", str(wh), "--executor", "local",
            "--local-processes", str(workers), "--grace-period", "0s",
        )  # fmt: skip
        assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
        assert f"in {workers} processes" in done.stderr, done.stderr[-2000:]

    # The command's session and, for the marks' listing, its store's pipelined reader; one
    # per worker process.
    n = sessions_created(server, repair)
    assert 1 + 1 <= n <= 2 + workers, n


class DriverSessions:
    """The sessions ZooKeeper holds for this process's client ports, polled while a Spark
    audit runs in this process (its tasks are Python workers of their own)."""

    def __init__(self, server: ZooKeeperServer) -> None:
        self.server = server
        self.me = psutil.Process(os.getpid())
        self.seen: set[str] = set()
        self.before = self._mine()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _mine(self) -> set[str]:
        ports = {
            f"{c.laddr.ip}:{c.laddr.port}"
            for c in self.me.net_connections(kind="tcp")
            if c.raddr and c.raddr.port == self.server.port
        }
        return {c["sid"] for c in self.server.connections() if c["address"] in ports and c["sid"]}

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.seen |= self._mine()
            time.sleep(0.02)

    def __enter__(self) -> DriverSessions:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    @property
    def new(self) -> set[str]:
        return self.seen - self.before


def test_a_spark_audit_driver_opens_at_most_two_sessions(
    server: ZooKeeperServer, cluster: AuditCluster, tmp_path: Path, spark: Any
) -> None:
    b = cluster.bookie_ids
    for i in range(8):
        cluster.ledger([b[i % 4], b[(i + 1) % 4], b[(i + 2) % 4]], 10, wq=2, aq=2)
    cluster.sandbox.stop_bookie(b[3])
    args: argparse.Namespace = audit_args(cluster.zk, str(tmp_path / "wh"), "lost")
    args.executor = "spark"
    with DriverSessions(server) as driver:
        total = sessions_created(server, lambda: run_audit(args, spark))
    assert 1 <= len(driver.new) <= 2, driver.new
    assert total >= len(driver.new)  # the tasks' sessions are their own


class OtherSessions:
    """The sessions ZooKeeper gives out to processes other than ``pid`` while polled: each
    connection's client port, from ZooKeeper's ``cons`` list, mapped to its process. A session
    too brief to be seen by a poll, or whose process cannot be told, is not counted here (so
    it stays charged to ``pid`` by whoever subtracts these)."""

    def __init__(self, server: ZooKeeperServer, pid: int) -> None:
        self.server = server
        self.pid = pid
        self.others: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _owners(self) -> dict[str, int]:
        return {
            f"{c.laddr.ip}:{c.laddr.port}": c.pid
            for c in psutil.net_connections(kind="tcp")
            if c.raddr and c.raddr.port == self.server.port and c.pid is not None
        }

    def _look(self) -> None:
        owners = self._owners()
        for c in self.server.connections():
            pid = owners.get(c["address"])
            if c["sid"] and pid not in (None, self.pid):
                self.others.add(int(c["sid"], 16))

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._look()
            time.sleep(0.1)

    def __enter__(self) -> OtherSessions:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        # A last look: a session opened after the last poll (the test's own helper reading
        # the marks at the end of the work) is still open, and is told apart here.
        self._look()


SessionCount = Callable[["Watch", Callable[[], Any]], int]


def _watch_opens_after_first_cycle(c: AuditCluster, tmp_path: Path, created: SessionCount) -> int:
    """Start a watch (lost audits every 2 s), wait for its first audit, then count what
    ``created`` counts while a bookie is lost and repaired and three more audits run, less
    one for each session the watch reports it lost meanwhile (ZooKeeper needs a new one)."""
    victim = c.bookie_ids[3]
    ids = [md.ledger_id for md in ledgers(c, victim, n=4, entries=10)]
    w = Watch(c.zk, str(tmp_path / "wh"), tmp_path / "w.log", "--every", "lost=2s",
              "--lost-bookie-recovery-delay", "0s")  # fmt: skip

    def audits() -> float:
        m = w.metrics()
        return sum(v for k, v in m.items() if k.startswith("bkaudit_audit_runs_total"))

    def losses() -> float:
        return sum(v for k, v in w.metrics().items() if k.startswith("bkaudit_zk_session_losses"))

    def lose_repair_and_audit() -> None:
        first = audits()
        c.sandbox.kill_bookie(victim)
        wait_for(lambda: repaired(c, ids, victim), 90, "the repair", w)
        wait_for(lambda: audits() >= first + 3, 90, "three more audits", w)

    try:
        w.wait_role("leader")
        wait_for(lambda: audits() >= 1, 60, "the first audit", w)
        lost_before = losses()
        n = created(w, lose_repair_and_audit)
        lost = int(losses() - lost_before)
    finally:
        w.stop()
    assert w.proc.returncode == 0, w.tail()
    return n - lost


def test_a_watch_opens_no_session_after_its_first_cycle(
    server: ZooKeeperServer, cluster: AuditCluster, tmp_path: Path
) -> None:
    def created(w: Watch, work: Callable[[], Any]) -> int:
        with OtherSessions(server, w.proc.pid) as others:
            before = server.next_session_id()
            work()
            after = server.next_session_id()
        theirs = {sid for sid in others.others if before < sid < after}  # not the probes
        return after - before - 1 - len(theirs)

    n = _watch_opens_after_first_cycle(cluster, tmp_path, created)
    assert n == 0, n


def test_a_store_idle_between_scans_keeps_its_pipelined_session(
    server: ZooKeeperServer,
) -> None:
    """The watch's case: scans further apart than half the session timeout (where a silent
    pipelined session would be reopened as possibly expired) still share one session, kept
    alive by pings in between. Idle gaps at several phases of the pings' schedule."""
    with server.private_chroot("idle") as chroot:
        store = open_store(chroot, timeout=15, session_timeout=3.0)
        try:
            for i in range(6):
                store.create(f"/d/l{i}", b"x", parents=True)
            assert len(list(store.scan_children("/d"))) == 6  # opens the pipelined session

            def idle_scans() -> None:
                for gap in (1.6, 1.7, 1.8, 1.9, 2.0, 1.6, 1.75, 1.95):
                    time.sleep(gap)
                    assert len(list(store.scan_children("/d"))) == 6

            n = sessions_created(server, idle_scans)
        finally:
            store.close()
    assert n == 0, n


def test_the_counter_counts_a_session_made_and_closed_in_between(
    server: ZooKeeperServer,
) -> None:
    # The measure itself: a client that connects and leaves at once is counted.
    def brief() -> None:
        subprocess.run(
            [sys.executable, "-c", "from bklib.testing.zkclient import connect; "
             f"c = connect({server.connect_string!r}); c.stop(); c.close()"],
            cwd=REPO, check=True, timeout=60,
        )  # fmt: skip

    assert sessions_created(server, brief) == 1


# ---- the same counts on Oxia ---------------------------------------------------------------
# Oxia has no session per client connection; each client opens a shard-assignments stream when
# it connects, and the server counts the streams it started (its gRPC metrics). PyPI's client
# starts one or two per store (it may restart the first once), so a process is bounded by 2.

OXIA_STREAMS_PER_STORE = 2


@pytest.fixture(scope="module")
def oxia(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OxiaServer]:
    """An Oxia of this module's own: nothing else connects to it meanwhile."""
    with OxiaServer(tmp_path_factory.mktemp("oxia-sessions"), shards=2) as server:
        yield server


def oxia_clients_created(server: OxiaServer, work: Callable[[], Any]) -> int:
    """How many clients connected to the Oxia server while ``work`` ran."""

    def started() -> float:
        url = f"http://{server.host}:{server.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("grpc_server_started_total{") and "GetShardAssignments" in line
        )

    before = started()
    work()
    return int(started() - before)


@pytest.fixture
def oxia_cluster(oxia: OxiaServer, tmp_path: Path) -> Iterator[AuditCluster]:
    wipe_oxia(oxia.locator())
    with audit_cluster(tmp_path / "sandbox", oxia.locator(), bookies=4) as c:
        yield c


def test_on_oxia_a_command_opens_one_store_and_each_worker_one(
    oxia: OxiaServer, oxia_cluster: AuditCluster, tmp_path: Path
) -> None:
    c = oxia_cluster
    per_store = OXIA_STREAMS_PER_STORE
    victim = c.bookie_ids[3]
    ledgers(c, victim, n=6, entries=10)
    for check in ("lost", "sample"):
        # One store: on Oxia the range scans share its channels.
        n = oxia_clients_created(oxia, lambda check=check: _audit(c, tmp_path / check, check))
        assert 1 <= n <= per_store, (check, n)
    c.sandbox.stop_bookie(victim)
    wh = tmp_path / "wh"
    _audit(c, wh, "lost")
    workers = 2

    def repair() -> None:
        done = bkaudit(
            "rereplicate", "--zk", c.zk, "--warehouse", str(wh), "--executor", "local",
            "--local-processes", str(workers), "--grace-period", "0s",
        )  # fmt: skip
        assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])

    n = oxia_clients_created(oxia, repair)
    assert 1 + workers <= n <= per_store * (1 + workers), n


def test_on_oxia_a_spark_audit_driver_opens_one_store(
    oxia: OxiaServer,
    oxia_cluster: AuditCluster,
    tmp_path: Path,
    spark: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The driver's stores, counted where they are made (gRPC shares one TCP connection
    among a process's channels to one server, so the driver's cannot be told apart by port as
    ZooKeeper's are); the server's count bounds every process's, the tasks' included."""
    from bklib.meta.stores.oxia import OxiaStore

    made: list[OxiaStore] = []
    init = OxiaStore.__init__

    def counted(self: OxiaStore, *args: Any, **kwargs: Any) -> None:
        made.append(self)
        init(self, *args, **kwargs)

    c = oxia_cluster
    b = c.bookie_ids
    for i in range(8):
        c.ledger([b[i % 4], b[(i + 1) % 4], b[(i + 2) % 4]], 10, wq=2, aq=2)
    c.sandbox.stop_bookie(b[3])
    args: argparse.Namespace = audit_args(c.zk, str(tmp_path / "wh"), "lost")
    args.executor = "spark"
    monkeypatch.setattr(OxiaStore, "__init__", counted)
    total = oxia_clients_created(oxia, lambda: run_audit(args, spark))
    assert len(made) == 1, made
    # A lost audit's tasks that read the store: the scan's and the re-read's (one store each
    # when its partition is not empty), ``defaultParallelism`` of each.
    tasks = 2 * spark.sparkContext.defaultParallelism
    assert 1 <= total <= OXIA_STREAMS_PER_STORE * (1 + tasks), total


def test_on_oxia_a_watch_opens_no_client_after_its_first_cycle(
    oxia: OxiaServer, oxia_cluster: AuditCluster, tmp_path: Path
) -> None:
    n = _watch_opens_after_first_cycle(
        oxia_cluster, tmp_path, lambda _w, work: oxia_clients_created(oxia, work)
    )
    assert n == 0, n
