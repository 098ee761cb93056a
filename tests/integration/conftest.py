"""Fixtures for ledger client tests: a small BookKeeper cluster of Python bookie processes.

The cluster (one ZooKeeper chroot, several bookies with fault injection) is started once per
session and shared by the ``test_ledger_*`` modules; every test creates its own ledgers, and an
autouse fixture puts the cluster back in shape afterwards (faults cleared, read-only lifted,
killed bookies restarted). ``--schedules N`` sets how many randomized schedules
``test_ledger_random_schedules.py`` runs; pytest registers the option only when it starts from
``tests/integration`` or a file in it (``pytest tests/integration --schedules 1000``), so
``$BKAUDIT_SCHEDULES`` does the same from anywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kazoo.client import KazooClient

from bklib.bookie.faults import AdminClient
from bklib.client.operations import ClientConfig
from bklib.client.placement import PlacementPolicy
from bklib.client.pool import BookieClientPool
from bklib.client.reader import ClientContext
from bklib.meta.store import LedgerStore
from bklib.testing.zkserver import ZooKeeperServer
from tests.bookie_helpers import BookieProcess, rule_hits, wait_for_znode

T = TypeVar("T")

N_BOOKIES = 6
LEDGERS_ROOT = "/ledgers"


@dataclass
class Cluster:
    """ZooKeeper chroot + bookie processes. Bookie ids are ``127.0.0.1:<port>``."""

    connect: str
    zk: KazooClient
    store: LedgerStore
    bookies: list[BookieProcess] = field(default_factory=list)

    @property
    def bookie_ids(self) -> list[str]:
        return [b.bookie_id for b in self.bookies]

    def proc(self, bookie_id: str) -> BookieProcess:
        return next(b for b in self.bookies if b.bookie_id == bookie_id)

    def admin(self, bookie_id: str) -> AdminClient:
        return self.proc(bookie_id).admin()

    def fault(self, bookie_id: str, action: str, **rule: Any) -> int:
        """Add a fault rule on one bookie (see bklib.bookie.faults)."""
        return self.admin(bookie_id).add_fault(action, **rule)

    def hits(self, bookie_id: str, rule_id: int) -> int:
        """How many requests the rule matched so far."""
        return rule_hits(self.admin(bookie_id), rule_id)

    def registration_path(self, bookie_id: str, readonly: bool = False) -> str:
        ro = "readonly/" if readonly else ""
        return f"{LEDGERS_ROOT}/available/{ro}{bookie_id}"

    def kill(self, bookie_id: str) -> None:
        self.proc(bookie_id).kill9()

    def start(self, bookie_id: str, wait_registered: bool = True) -> None:
        """(Re)start a stopped bookie with the same port and data dir."""
        proc = self.proc(bookie_id)
        if not proc.alive():
            proc.start()
        if wait_registered:
            wait_for_znode(self.zk, self.registration_path(bookie_id))

    def restore(self) -> None:
        """Every bookie up, writable, registered and without fault rules."""
        for b in self.bookies:
            if not b.alive():
                b.start()
        for b in self.bookies:
            admin = b.admin()
            admin.clear_faults()
            if admin.status()["readonly"]:
                admin.set_readonly(False)
        for b in self.bookies:
            wait_for_znode(self.zk, self.registration_path(b.bookie_id))

    @contextlib.asynccontextmanager
    async def client(
        self,
        *,
        add_timeout: float = 3.0,
        read_timeout: float = 3.0,
        speculative: float = 0.5,
        placement: PlacementPolicy | None = None,
        pool_class: type[BookieClientPool] = BookieClientPool,
        store: LedgerStore | None = None,
        **ctx_options: Any,
    ) -> AsyncIterator[ClientContext]:
        """A fresh client (own bookie connections) on the running loop."""
        config = ClientConfig(
            add_timeout=add_timeout,
            read_timeout=read_timeout,
            connect_timeout=2.0,
            reconnect_backoff_initial=0.05,
            reconnect_backoff_max=0.3,
        )
        pool = pool_class(self.zk, ledgers_root=LEDGERS_ROOT, config=config)
        try:
            yield ClientContext(
                store or self.store,
                pool,
                placement or PlacementPolicy(),
                speculative_read_timeout=speculative,
                **ctx_options,
            )
        finally:
            await pool.close()


@pytest.fixture(scope="session")
def ledger_cluster(
    zk_server: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    with zk_server.private_chroot("ledger-tests") as connect:
        yield from _run_cluster(connect, tmp_path_factory.mktemp("ledger-bookies"))


def _run_cluster(connect: str, base: Path) -> Iterator[Cluster]:
    zk = KazooClient(hosts=connect, timeout=10)
    zk.start(timeout=15)
    store = LedgerStore(zk, LEDGERS_ROOT)
    store.init_cluster()
    cluster = Cluster(connect, zk, store)
    try:
        for i in range(N_BOOKIES):
            cluster.bookies.append(BookieProcess(connect, base / f"b{i}"))
        for b in cluster.bookies:
            b.spawn()
        for b in cluster.bookies:
            _wait_serving(b)
        for b in cluster.bookies:
            wait_for_znode(zk, cluster.registration_path(b.bookie_id))
        yield cluster
    finally:
        for b in cluster.bookies:
            b.stop()
        zk.stop()
        zk.close()


def _wait_serving(b: BookieProcess, timeout: float = 30.0) -> None:
    import socket
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert b.proc is not None
        if b.proc.poll() is not None:
            raise RuntimeError(f"bookie exited:\n{b.log_tail()}")
        try:
            socket.create_connection(b.address, timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)  # readiness polling, not an assertion
    raise RuntimeError(f"bookie {b.bookie_id} did not come up:\n{b.log_tail()}")


@pytest.fixture
def cluster(ledger_cluster: Cluster) -> Iterator[Cluster]:
    """The shared cluster, restored to a clean state after the test."""
    yield ledger_cluster
    ledger_cluster.restore()


@pytest.fixture
def schedules(request: pytest.FixtureRequest) -> int:
    """``--schedules N`` (registered when pytest starts from this directory or a file in it),
    else ``$BKAUDIT_SCHEDULES``, else 60 (`make soak` runs 1,000)."""
    value = request.config.getoption("--schedules", default=None)
    if value is None:
        value = os.environ.get("BKAUDIT_SCHEDULES")
    return 60 if value is None else int(value)


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a test coroutine on a fresh event loop."""
    return asyncio.run(coro)


# ---- helpers shared by the ledger tests ---------------------------------------------------------


class OrderedPlacement(PlacementPolicy):
    """Deterministic placement: always the first eligible bookies in sorted order."""

    def _start(self, n: int) -> int:
        return 0


class GatedPool(BookieClientPool):
    """A pool whose adds of chosen (bookie, entry) pairs wait until the test opens the gate:
    a network delay under the test's control."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gates: dict[tuple[str, int], asyncio.Event] = {}
        self.held: dict[tuple[str, int], asyncio.Event] = {}

    def hold(self, bookie_id: str, entry_id: int) -> None:
        self.gates[(bookie_id, entry_id)] = asyncio.Event()
        self.held[(bookie_id, entry_id)] = asyncio.Event()

    def release(self, bookie_id: str, entry_id: int) -> None:
        self.gates[(bookie_id, entry_id)].set()

    async def add(self, bookie_id: str, ledger_id: int, entry_id: int, *a: Any, **kw: Any) -> None:
        gate = self.gates.get((bookie_id, entry_id))
        if gate is not None:
            self.held[(bookie_id, entry_id)].set()
            await gate.wait()
        await super().add(bookie_id, ledger_id, entry_id, *a, **kw)


class BlockingStore(LedgerStore):
    """A LedgerStore whose next ``update_ledger`` waits (in its executor thread) until the
    test releases it, after signalling that it was entered."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.armed = False
        self.entered = threading.Event()
        self.release = threading.Event()

    def update_ledger(self, *args: Any, **kwargs: Any) -> Any:
        if self.armed:
            self.armed = False
            self.entered.set()
            self.release.wait(60)
        return super().update_ledger(*args, **kwargs)


async def wait_until(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Poll ``predicate`` on the loop (readiness polling, not a timing assertion)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def stored_on(
    ctx: ClientContext,
    bookie_id: str,
    ledger_id: int,
    entry_id: int,
    *,
    raise_unknown: bool = False,
) -> bool:
    """True if the bookie returns the entry with a valid digest (plain read, no fencing).

    With ``raise_unknown`` only an answer about the entry (no such entry or ledger, a bad
    digest) gives False; a timeout or a lost connection is raised, since it says nothing.
    """
    from bklib.digest import digest_manager
    from bklib.errors import BKError, DigestMatchError, NoSuchEntryError, NoSuchLedgerError
    from bklib.meta.model import DigestType

    md = (await ctx.read_metadata(ledger_id)).value
    dm = digest_manager(ledger_id, md.digest_type or DigestType.CRC32C, md.password or b"")
    try:
        res = await ctx.pool.read(bookie_id, ledger_id, entry_id)
        dm.verify_entry(res.body, entry_id)
    except (NoSuchEntryError, NoSuchLedgerError, DigestMatchError):
        return False
    except BKError:
        if raise_unknown:
            raise
        return False
    return True
