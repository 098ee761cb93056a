"""BookieClientPool, BookieAddressResolver and SyncBookieClient against mock bookies.

Resolution through registration znodes uses the real ZooKeeper fixture (marked integration);
everything else needs no ZooKeeper.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import inspect
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from kazoo.client import KazooClient

from bklib.client.connection import OPERATIONS, BookieConnection
from bklib.client.operations import ClientConfig, ReadResult
from bklib.client.pool import BookieClientPool, SyncBookieClient
from bklib.client.resolver import BookieAddressResolver, parse_legacy_bookie_id
from bklib.errors import (
    BKTimeoutError,
    BookieHandleNotAvailableError,
    ClientClosedError,
    NoSuchEntryError,
    ZKError,
)
from bklib.meta.formats import encode_service_info, service_info_for
from bklib.proto import protocol_pb2 as pb
from tests.unit.test_client_connection import KEY, MockBookie, MockConn, fast_config, response_for

ROOT = "/ledgers"


@pytest.fixture
def bookie() -> Iterator[MockBookie]:
    mock = MockBookie().start()
    try:
        yield mock
    finally:
        mock.shutdown()


@pytest.fixture
def bookie2() -> Iterator[MockBookie]:
    mock = MockBookie().start()
    try:
        yield mock
    finally:
        mock.shutdown()


def register(
    zk: KazooClient, bookie_id: str, data: bytes, *, readonly: bool = False, root: str = ROOT
) -> str:
    parent = f"{root}/available/readonly" if readonly else f"{root}/available"
    zk.ensure_path(parent)
    path = f"{parent}/{bookie_id}"
    zk.create(path, data, ephemeral=True)
    return path


def client_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("bookie-client-")]


# ---- legacy ids and the resolver without ZooKeeper ---------------------------------------------


@pytest.mark.parametrize(
    ("bookie_id", "want"),
    [
        ("10.0.0.1:3181", ("10.0.0.1", 3181)),
        ("bk-1.example.com:3181", ("bk-1.example.com", 3181)),
        ("host:3181:extra", ("host", 3181)),  # Java reads the first two parts only
        ("host:0", ("host", 0)),
        ("custom-bookie-id", None),
        ("host:port", None),
        (":3181", None),
        ("host:70000", None),
    ],
)
def test_parse_legacy_bookie_id(bookie_id: str, want: tuple[str, int] | None) -> None:
    assert parse_legacy_bookie_id(bookie_id) == want


def test_resolver_without_zookeeper() -> None:
    r = BookieAddressResolver(addresses={"pinned": ("127.0.0.9", 4000)})
    assert not r.uses_zookeeper
    assert r.resolve("127.0.0.1:3181") == ("127.0.0.1", 3181)
    assert r.resolve("pinned") == ("127.0.0.9", 4000)
    with pytest.raises(BookieHandleNotAvailableError) as ei:
        r.resolve("custom-id")
    assert ei.value.bookie == "custom-id" and "not resolvable" in str(ei.value)
    r.close()
    with pytest.raises(ClientClosedError):
        r.resolve("127.0.0.1:3181")


# ---- resolution through registration znodes (real ZooKeeper) -----------------------------------


@pytest.mark.integration
def test_resolver_reads_registrations(zk: KazooClient) -> None:
    register(zk, "bk-custom", encode_service_info(service_info_for("127.0.0.5", 4181)))
    register(zk, "bk-ro", encode_service_info(service_info_for("127.0.0.6", 5181)), readonly=True)
    register(zk, "127.0.0.7:6181", b"")  # legacy registration: empty data
    register(zk, "legacy-custom", b"")  # empty data and an id that is not host:port
    register(zk, "bk-corrupt", b"\xff\xff\xff")
    r = BookieAddressResolver(zk, ledgers_root=ROOT, legacy_fallback=False)
    assert r.uses_zookeeper
    assert r.resolve("bk-custom") == ("127.0.0.5", 4181)
    assert r.resolve("bk-ro") == ("127.0.0.6", 5181)
    assert r.resolve("127.0.0.7:6181") == ("127.0.0.7", 6181)
    for bad in ("legacy-custom", "bk-corrupt"):
        with pytest.raises(BookieHandleNotAvailableError) as ei:
            r.resolve(bad)
        assert ei.value.bookie == bad and ei.value.path == f"{ROOT}/available/{bad}"
    # Unregistered: only ids ending in ":0" fall back to parsing, as in Java...
    with pytest.raises(BookieHandleNotAvailableError, match="not registered"):
        r.resolve("127.0.0.8:3181")
    assert r.resolve("127.0.0.8:0") == ("127.0.0.8", 0)
    # ...unless legacy_fallback is on (the default).
    lenient = BookieAddressResolver(zk, ledgers_root=ROOT)
    assert lenient.resolve("127.0.0.8:3181") == ("127.0.0.8", 3181)
    with pytest.raises(BookieHandleNotAvailableError):
        lenient.resolve("nobody")
    r.close()
    assert zk.connected  # a client passed in is not ours to stop


@pytest.mark.integration
def test_resolver_cache_refresh_and_zookeeper_outage(zk_chroot: str, zk: KazooClient) -> None:
    path = register(zk, "bk-a", encode_service_info(service_info_for("127.0.0.5", 4181)))
    own = KazooClient(hosts=zk_chroot, timeout=10)
    own.start(timeout=15)
    r = BookieAddressResolver(own, ledgers_root=ROOT, zk_timeout=2.0)
    assert r.resolve("bk-a") == ("127.0.0.5", 4181)
    zk.set(path, encode_service_info(service_info_for("127.0.0.5", 4999)))
    assert r.resolve("bk-a") == ("127.0.0.5", 4181)  # cached
    assert r.resolve("bk-a", refresh=True) == ("127.0.0.5", 4999)
    r.invalidate("bk-a")
    assert r.resolve("bk-a") == ("127.0.0.5", 4999)
    # The bookie re-registers read-only elsewhere: a refresh finds it there.
    zk.delete(path)
    register(zk, "bk-a", encode_service_info(service_info_for("127.0.0.5", 5000)), readonly=True)
    assert r.resolve("bk-a", refresh=True) == ("127.0.0.5", 5000)
    # ZooKeeper unreachable: a cached address is still served, an unknown id is a ZKError.
    own.stop()
    assert r.resolve("bk-a", refresh=True) == ("127.0.0.5", 5000)
    with pytest.raises(ZKError) as ei:
        r.resolve("bk-unknown")
    assert ei.value.bookie == "bk-unknown"
    own.close()


@pytest.mark.integration
def test_resolver_from_connect_string_owns_its_client(zk_chroot: str, zk: KazooClient) -> None:
    register(zk, "bk-s", encode_service_info(service_info_for("127.0.0.5", 4181)))
    r = BookieAddressResolver(zk_chroot, ledgers_root=ROOT)
    assert r.connect_string == zk_chroot
    assert r.resolve("bk-s") == ("127.0.0.5", 4181)
    owned = r._zk
    assert owned is not None and owned.connected
    r.close()
    assert not owned.connected


@pytest.mark.integration
def test_pool_resolves_through_zookeeper_and_follows_a_moved_bookie(
    zk_chroot: str, zk: KazooClient, bookie: MockBookie, bookie2: MockBookie
) -> None:
    path_a = register(zk, "bookie-a", encode_service_info(service_info_for(*bookie.address)))
    register(zk, "bookie-b", encode_service_info(service_info_for(*bookie2.address)))

    async def scenario() -> None:
        async with BookieClientPool(zk_chroot, ledgers_root=ROOT, config=fast_config()) as pool:
            await pool.add("bookie-a", 1, 0, KEY, b"on-a")
            await pool.add("bookie-b", 1, 0, KEY, b"on-b")
            assert (await pool.read("bookie-a", 1, 0)).body == b"on-a"
            assert (await pool.read("bookie-b", 1, 0)).body == b"on-b"
            assert pool.connection("bookie-a") is pool.connection("bookie-a")
            assert sorted(pool.bookie_ids) == ["bookie-a", "bookie-b"]
            # bookie-a restarts on another port and re-registers.
            bookie.stop()
            bookie.start(0)
            zk.delete(path_a)
            register(zk, "bookie-a", encode_service_info(service_info_for(*bookie.address)))
            conn_a = pool.connection("bookie-a")
            deadline = time.monotonic() + 5
            while conn_a.connected and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            # The idle connection dropped; the next request re-resolves and dials the new port.
            assert (await pool.read("bookie-a", 1, 0)).body == b"on-a"
            assert pool.connection("bookie-a").connected

    run(scenario())
    assert bookie.connections == 2


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_pool_without_zookeeper(bookie: MockBookie) -> None:
    bid = f"127.0.0.1:{bookie.port}"

    async def scenario() -> None:
        pool = BookieClientPool(config=fast_config())
        await pool.add(bid, 4, 0, KEY, b"legacy")
        assert await pool.read(bid, 4, 0) == ReadResult(b"legacy", -1)
        with pytest.raises(NoSuchEntryError) as ei:
            await pool.read(bid, 4, 1)
        assert ei.value.bookie == bid
        with pytest.raises(BookieHandleNotAvailableError, match="not resolvable"):
            await pool.read("custom-id", 4, 0)
        await pool.disconnect(bid)
        assert not pool.connection(bid).connected
        await pool.close()
        with pytest.raises(ClientClosedError):
            await pool.read(bid, 4, 0)

    run(scenario())


def test_pool_with_pinned_addresses(bookie: MockBookie) -> None:
    async def scenario() -> None:
        pool = BookieClientPool(addresses={"pinned": bookie.address}, config=fast_config())
        await pool.add("pinned", 4, 0, KEY, b"p")
        assert (await pool.read("pinned", 4, 0)).body == b"p"
        assert (await pool.bookie_info("pinned")).free_disk_space is None
        await pool.close()

    run(scenario())


# ---- the synchronous facade --------------------------------------------------------------------


def test_sync_client_basic_operations(bookie: MockBookie) -> None:
    async def handler(req: pb.Request, conn: MockConn) -> None:
        op = req.header.operation
        if op in (pb.ADD_ENTRY, pb.READ_ENTRY):
            await bookie.store_handler(req, conn)
            return
        resp = response_for(req)
        if op == pb.READ_LAC:
            resp.readLacResponse.lacBody = b"lac"
        elif op == pb.GET_LIST_OF_ENTRIES_OF_LEDGER:
            resp.getListOfEntriesOfLedgerResponse.availabilityOfEntriesOfLedger = b"\0" * 64
        elif op == pb.GET_BOOKIE_INFO:
            resp.getBookieInfoResponse.freeDiskSpace = 7
        await conn.reply(resp)

    bookie.handler = handler
    with SyncBookieClient(addresses={"b": bookie.address}, config=fast_config()) as client:
        assert client_threads() == []  # the loop thread starts lazily
        client.add("b", 1, 0, KEY, b"zero")
        assert client.read("b", 1, 0).body == b"zero"
        with pytest.raises(NoSuchEntryError):
            client.read("b", 1, 1)
        assert client.read_lac("b", 1).lac_body == b"lac"
        assert client.list_entries("b", 1) == b"\0" * 64
        assert client.bookie_info("b").free_disk_space == 7
        client.write_lac("b", 1, 0, KEY, b"lacbody")
        client.force_ledger("b", 1)
        futs = [client.submit(lambda p: p.read("b", 1, 0)) for _ in range(10)]
        assert all(f.result(5).body == b"zero" for f in futs)
        assert client.run(lambda p: p.read("b", 1, 0)).body == b"zero"
        client.disconnect("b")
        assert client.read("b", 1, 0).body == b"zero"
        assert len(client_threads()) == 1
    assert client.closed
    assert client_threads() == []
    with pytest.raises(ClientClosedError):
        client.read("b", 1, 0)
    client.close()  # idempotent


def test_sync_client_from_many_threads_shares_one_connection(bookie: MockBookie) -> None:
    with SyncBookieClient(addresses={"b": bookie.address}, config=fast_config()) as client:
        for e in range(50):
            client.add("b", 2, e, KEY, f"entry-{e}".encode())

        def work(e: int) -> bytes:
            return client.read("b", 2, e).body

        with ThreadPoolExecutor(8) as ex:
            bodies = list(ex.map(work, [e % 50 for e in range(400)]))
    assert bodies == [f"entry-{e % 50}".encode() for e in range(400)]
    assert bookie.connections == 1


def test_sync_client_submit_many_settles_each_call_and_cancels_the_cancelled(
    bookie: MockBookie,
) -> None:
    with SyncBookieClient(addresses={"b": bookie.address}, config=fast_config()) as client:
        client.add("b", 3, 0, KEY, b"zero")
        started = threading.Event()
        release = threading.Event()
        cancelled: list[bool] = []

        async def stuck(_: BookieClientPool) -> None:
            started.set()
            try:
                await asyncio.get_running_loop().run_in_executor(None, release.wait, 10)
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                cancelled.append(True)
                raise

        futs = client.submit_many(
            [
                lambda p: p.read("b", 3, 0),
                lambda p: p.read("b", 3, 1),  # the bookie has no entry 1
                stuck,
            ]
        )
        assert futs[0].result(5).body == b"zero"
        with pytest.raises(NoSuchEntryError):
            futs[1].result(5)
        assert started.wait(5)
        assert futs[2].cancel()  # still pending: the cancel takes, and reaches the call
        release.set()
        deadline = time.monotonic() + 5
        while not cancelled and time.monotonic() < deadline:
            time.sleep(0.01)
        assert cancelled == [True]
        assert client.submit_many([]) == []

        # Cancelled before the loop got to start it: never runs, and counts as done for wait().
        loop_free = threading.Event()
        ran: list[int] = []

        async def mark(_: BookieClientPool) -> None:
            ran.append(1)

        client.run(lambda _: asyncio.sleep(0))  # the loop is up
        assert client._rt is not None
        client._rt.loop.call_soon_threadsafe(loop_free.wait, 5)  # hold the loop thread
        later = client.submit_many([mark, mark])
        assert later[0].cancel()
        loop_free.set()
        _, not_done = concurrent.futures.wait(later, 5)
        assert not not_done and later[0].cancelled() and later[1].result() is None
        assert ran == [1]

        # A call that cannot start fails its own future with the error; the others run.
        loop = client._rt.loop
        refused = [True]

        def factory(lp: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> asyncio.Task[Any]:
            if refused:
                refused.clear()
                coro.close()
                raise RuntimeError("no task for this call")
            return asyncio.Task(coro, loop=lp, **kw)

        client.run(lambda _: asyncio.sleep(0, loop.set_task_factory(factory)))
        failed, fine = client.submit_many([mark, mark])
        with pytest.raises(RuntimeError, match="no task for this call"):
            failed.result(5)
        assert fine.result(5) is None and ran == [1, 1]
        client.run(lambda _: asyncio.sleep(0, loop.set_task_factory(None)))


def test_sync_client_close_cancels_calls_still_outstanding(bookie: MockBookie) -> None:
    client = SyncBookieClient(addresses={"b": bookie.address}, config=fast_config())

    async def forever(_: BookieClientPool) -> None:
        await asyncio.Event().wait()

    waiting = client.submit(forever)
    client.run(lambda _: asyncio.sleep(0.05))  # the call has started
    assert not waiting.done()
    client.close()
    assert waiting.cancelled()
    with pytest.raises(concurrent.futures.CancelledError):
        waiting.result(0)


def test_sync_client_timeout(bookie: MockBookie) -> None:
    async def handler(req: pb.Request, conn: MockConn) -> None:
        return

    bookie.handler = handler
    with SyncBookieClient(addresses={"b": bookie.address}, config=fast_config()) as client:
        t0 = time.monotonic()
        with pytest.raises(BKTimeoutError) as ei:
            client.read("b", 3, 3, timeout=0.2)
        assert time.monotonic() - t0 < 2.0
        assert (ei.value.ledger_id, ei.value.entry_id, ei.value.bookie) == (3, 3, "b")


def test_pool_and_sync_client_derive_every_operation_from_the_connection() -> None:
    assert set(OPERATIONS) == {
        "add",
        "read",
        "read_many",
        "read_lac",
        "write_lac",
        "force_ledger",
        "list_entries",
        "bookie_info",
    }
    for name in OPERATIONS:
        conn_op = getattr(BookieConnection, name)
        _, *want = inspect.signature(conn_op).parameters.values()
        for cls in (BookieClientPool, SyncBookieClient):
            op = getattr(cls, name)
            _, bookie_id, *got = inspect.signature(op).parameters.values()
            assert (bookie_id.name, bookie_id.kind) == ("bookie_id", bookie_id.POSITIONAL_ONLY)
            assert got == want, (cls.__name__, name)
            assert inspect.getdoc(conn_op) in (op.__doc__ or "")
        assert inspect.iscoroutinefunction(BookieClientPool.__dict__[name])
        assert not inspect.iscoroutinefunction(SyncBookieClient.__dict__[name])


def test_sync_client_guards_each_operation_with_its_own_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = ClientConfig(
        add_timeout=1.0, read_timeout=2.0, bookie_info_timeout=3.0, connect_timeout=0.5
    )
    client = SyncBookieClient(config=cfg)
    guards: list[float | None] = []
    monkeypatch.setattr(client, "_wait", lambda fn, guard: guards.append(guard))
    client.add("b", 1, 0, KEY, b"x")
    client.read("b", 1, 0, fence=True, master_key=KEY)
    client.read_lac("b", 1, timeout=7.0)
    client.write_lac("b", 1, 0, KEY, b"lac")
    client.force_ledger("b", 1)
    client.list_entries("b", 1, timeout=0.25)
    client.bookie_info("b")
    client.call("read", "b", 1, 0)
    assert guards == [t + 3 * 0.5 + 5.0 for t in (1.0, 2.0, 7.0, 2.0, 2.0, 0.25, 3.0, 2.0)]
    assert client.guard(4.0) == 4.0 + 3 * 0.5 + 5.0
    with pytest.raises(AttributeError, match="no bookie operation"):
        client.call("close", "b")
    with pytest.raises(TypeError, match="timeout"):
        client.read("b", 1, 0, timeout="soon")  # type: ignore[arg-type]
    client.close()


def test_sync_client_call_runs_an_operation_by_name(bookie: MockBookie) -> None:
    with SyncBookieClient(addresses={"b": bookie.address}, config=fast_config()) as client:
        client.call("add", "b", 4, 0, KEY, b"by name", recovery=True)
        assert client.call("read", "b", 4, 0).body == b"by name"

        async def silent(req: pb.Request, conn: MockConn) -> None:
            return

        bookie.handler = silent
        with pytest.raises(BKTimeoutError):
            client.call("read_lac", "b", 4, timeout=0.2)


def test_sync_client_is_not_picklable() -> None:
    client = SyncBookieClient("127.0.0.1:2181")
    with pytest.raises(TypeError, match="create one client per executor"):
        pickle.dumps(client)
    # A config is what gets shipped instead.
    cfg = pickle.loads(pickle.dumps(ClientConfig(read_timeout=1.5)))
    assert cfg.read_timeout == 1.5
    client.close()


def test_sync_client_stops_its_thread_when_garbage_collected(bookie: MockBookie) -> None:
    client = SyncBookieClient(addresses={"b": bookie.address}, config=fast_config())
    client.add("b", 1, 0, KEY, b"x")
    threads = client_threads()
    assert len(threads) == 1
    del client
    gc.collect()
    threads[0].join(5)
    assert not threads[0].is_alive()


def in_child(fn: Callable[[], str]) -> tuple[int, str]:
    """Run ``fn`` in a forked child; return its exit code and what it returned or raised."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        os.close(r)
        signal.alarm(60)  # never leave a hung child behind
        code = 0
        try:
            msg = fn()
        except BaseException as exc:
            msg, code = f"{type(exc).__name__}: {exc}", 1
        os.write(w, msg.encode())
        os._exit(code)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), b"".join(chunks).decode()


def test_sync_client_survives_fork(bookie: MockBookie) -> None:
    client = SyncBookieClient(addresses={"b": bookie.address}, config=fast_config())
    client.add("b", 5, 0, KEY, b"parent")
    parent_thread = client_threads()[0]

    def child() -> str:
        # The parent's loop thread does not exist here; the client starts its own.
        client.add("b", 5, 1, KEY, b"child")
        body = client.read("b", 5, 0).body
        client.close()
        return body.decode()

    code, out = in_child(child)
    assert (code, out) == (0, "parent")
    # The parent's client is unaffected by the child's use and close.
    assert parent_thread.is_alive()
    assert client.read("b", 5, 1).body == b"child"
    assert bookie.connections == 2
    client.close()


def test_sync_client_created_inside_a_forked_child(bookie: MockBookie) -> None:
    address = bookie.address

    def child() -> str:
        with SyncBookieClient(addresses={"b": address}, config=fast_config()) as c:
            c.add("b", 6, 0, KEY, b"made-in-child")
            return c.read("b", 6, 0).body.decode()

    assert in_child(child) == (0, "made-in-child")


@pytest.mark.integration
def test_sync_client_resolves_through_zookeeper_across_fork(
    zk_chroot: str, zk: KazooClient, bookie: MockBookie
) -> None:
    register(zk, "bk-zk", encode_service_info(service_info_for(*bookie.address)))
    client = SyncBookieClient(zk_chroot, ledgers_root=ROOT, config=fast_config())
    client.add("bk-zk", 8, 0, KEY, b"via-zk")

    def child() -> str:
        # kazoo's threads did not survive the fork; the child starts its own ZooKeeper client.
        out = client.read("bk-zk", 8, 0).body.decode()
        client.close()
        return out

    assert in_child(child) == (0, "via-zk")
    assert client.read("bk-zk", 8, 0).body == b"via-zk"
    client.close()


@pytest.mark.integration
def test_sync_client_on_a_kazoo_client_refuses_fork(zk: KazooClient, bookie: MockBookie) -> None:
    register(zk, "bk-k", encode_service_info(service_info_for(*bookie.address)))
    client = SyncBookieClient(zk, ledgers_root=ROOT, config=fast_config())
    client.add("bk-k", 9, 0, KEY, b"k")

    def child() -> str:
        return client.read("bk-k", 9, 0).body.decode()

    code, out = in_child(child)
    assert code == 1 and "ClientClosedError" in out and "store locator" in out
    client.close()
    assert zk.connected
