"""BookieConnection against an in-process mock bookie that speaks v3 with scripted replies.

The mock (a plain asyncio server on its own loop in a background thread) decodes real v3
requests and lets each test decide what to answer, when, in which order, or to misbehave: drop the
connection, send garbage, send oversized frames. Used only in unit tests; the real bookie is
covered by tests/integration/test_client_bookie.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import pytest

from bklib.client.connection import BookieConnection, BookieInfo, ReadLacResult
from bklib.client.operations import ClientConfig, ReadResult
from bklib.client.transport import BadResponseError, ConnectionLostError
from bklib.errors import (
    BKError,
    BKTimeoutError,
    BookieHandleNotAvailableError,
    ClientClosedError,
    DataUnknownError,
    IncorrectParameterError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    ProtocolVersionError,
    ReadError,
    TooManyRequestsError,
    UnauthorizedAccessError,
    WriteError,
    WriteOnReadOnlyBookieError,
)
from bklib.proto import protocol_pb2 as pb
from bklib.proto.framing import encode_frame
from bklib.testing.frames import read_frame

T = TypeVar("T")

KEY = bytes(range(20))
BOOKIE = "mock-bookie-1"


# ---- the mock bookie ---------------------------------------------------------------------------


def response_for(
    req: pb.Request,
    status: int = pb.EOK,
    *,
    top_status: int | None = None,
    sub: bool = True,
    body: bytes | None = None,
    max_lac: int | None = None,
    txn_id: int | None = None,
    operation: int | None = None,
) -> pb.Response:
    """A v3 Response to ``req`` as a bookie builds it: header echoed, status in both places."""
    op = req.header.operation if operation is None else operation
    resp = pb.Response()
    resp.header.version = pb.VERSION_THREE
    resp.header.operation = op
    resp.header.txnId = req.header.txnId if txn_id is None else txn_id
    resp.status = status if top_status is None else top_status
    if not sub:
        return resp
    if op == pb.READ_ENTRY:
        r = resp.readResponse
        r.status = status
        r.ledgerId = req.readRequest.ledgerId
        r.entryId = req.readRequest.entryId
        if body is not None:
            r.body = body
        if max_lac is not None:
            r.maxLAC = max_lac
    elif op == pb.ADD_ENTRY:
        a = resp.addResponse
        a.status = status
        a.ledgerId = req.addRequest.ledgerId
        a.entryId = req.addRequest.entryId
    elif op == pb.READ_LAC:
        rl = resp.readLacResponse
        rl.status = status
        rl.ledgerId = req.readLacRequest.ledgerId
    elif op == pb.WRITE_LAC:
        resp.writeLacResponse.status = status
        resp.writeLacResponse.ledgerId = req.writeLacRequest.ledgerId
    elif op == pb.FORCE_LEDGER:
        resp.forceLedgerResponse.status = status
        resp.forceLedgerResponse.ledgerId = req.forceLedgerRequest.ledgerId
    elif op == pb.GET_LIST_OF_ENTRIES_OF_LEDGER:
        g = resp.getListOfEntriesOfLedgerResponse
        g.status = status
        g.ledgerId = req.getListOfEntriesOfLedgerRequest.ledgerId
    elif op == pb.GET_BOOKIE_INFO:
        resp.getBookieInfoResponse.status = status
    return resp


class MockConn:
    """The server side of one client connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def reply(self, resp: pb.Response) -> None:
        self.writer.write(encode_frame(resp.SerializeToString()))
        await self.writer.drain()

    async def send_raw(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    def close(self) -> None:
        self.writer.close()


Handler = Callable[[pb.Request, MockConn], Awaitable[None]]


class MockBookie:
    """A scripted v3 bookie on 127.0.0.1 (own loop, own thread). By default it is a tiny
    in-memory bookie; tests replace ``handler`` to script replies."""

    def __init__(self, handler: Handler | None = None) -> None:
        self.handler: Handler = handler or self.store_handler
        self.requests: list[pb.Request] = []
        self.connections = 0
        self.port = 0
        self.entries: dict[tuple[int, int], bytes] = {}
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[MockConn] = set()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    # -- lifecycle

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def start(self, port: int | None = None) -> MockBookie:
        async def go() -> None:
            self._server = await asyncio.start_server(
                self._serve, "127.0.0.1", self.port if port is None else port
            )
            self.port = self._server.sockets[0].getsockname()[1]

        self.call(go())
        return self

    def stop(self) -> None:
        """Stop listening and drop every connection (port then refuses connections)."""

        async def go() -> None:
            if self._server is not None:
                self._server.close()
                for c in list(self._conns):
                    c.close()
                await self._server.wait_closed()
                self._server = None

        self.call(go())

    def shutdown(self) -> None:
        self.stop()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def drop_connections(self) -> None:
        async def go() -> None:
            for c in list(self._conns):
                c.close()

        self.call(go())

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = MockConn(reader, writer)
        self.connections += 1
        self._conns.add(conn)
        try:
            while True:
                frame = await read_frame(reader)
                req = pb.Request()
                req.ParseFromString(frame)
                self.requests.append(req)
                # Each request is handled in its own task so handlers may hold replies back.
                asyncio.get_running_loop().create_task(self.handler(req, conn))
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            self._conns.discard(conn)
            writer.close()

    # -- a default, minimal in-memory bookie

    async def store_handler(self, req: pb.Request, conn: MockConn) -> None:
        op = req.header.operation
        if op == pb.ADD_ENTRY:
            a = req.addRequest
            self.entries[(a.ledgerId, a.entryId)] = a.body
            await conn.reply(response_for(req))
        elif op == pb.READ_ENTRY:
            r = req.readRequest
            if not any(lid == r.ledgerId for lid, _ in self.entries):
                await conn.reply(response_for(req, pb.ENOLEDGER))
            elif (r.ledgerId, r.entryId) not in self.entries:
                await conn.reply(response_for(req, pb.ENOENTRY))
            else:
                body = self.entries[(r.ledgerId, r.entryId)]
                await conn.reply(response_for(req, body=body, max_lac=r.entryId - 1))
        else:
            await conn.reply(response_for(req))


@pytest.fixture
def bookie() -> Any:
    mock = MockBookie().start()
    try:
        yield mock
    finally:
        mock.shutdown()


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def fast_config(**kw: Any) -> ClientConfig:
    base: dict[str, Any] = {
        "add_timeout": 2.0,
        "read_timeout": 2.0,
        "bookie_info_timeout": 2.0,
        "connect_timeout": 2.0,
        "reconnect_backoff_initial": 0.05,
        "reconnect_backoff_max": 0.2,
    }
    base.update(kw)
    return ClientConfig(**base)


def answer_all_but(bookie: MockBookie, entry_id: int) -> list[tuple[pb.Request, MockConn]]:
    """Script ``bookie`` to answer every read with ``b"ok"`` except those of ``entry_id``, kept
    unanswered in the list returned (to be answered late, or never)."""
    silent: list[tuple[pb.Request, MockConn]] = []

    async def handler(req: pb.Request, conn: MockConn) -> None:
        if req.readRequest.entryId == entry_id:
            silent.append((req, conn))
            return
        await conn.reply(response_for(req, body=b"ok"))

    bookie.handler = handler
    return silent


async def wait_until(pred: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.01)


# ---- basic requests ----------------------------------------------------------------------------


def test_defaults_follow_bookkeeper() -> None:
    cfg = ClientConfig()
    assert (cfg.add_timeout, cfg.read_timeout, cfg.bookie_info_timeout) == (5.0, 5.0, 5.0)
    assert cfg.connect_timeout == 10.0
    assert cfg.max_frame_size == 5 * 1024 * 1024


def test_add_and_read_roundtrip_with_java_request_fields(bookie: MockBookie) -> None:
    async def scenario() -> None:
        conn = BookieConnection(BOOKIE, bookie.address, fast_config())
        await conn.add(7, 0, KEY, b"entry-0-body")
        result = await conn.read(7, 0)
        assert result == ReadResult(b"entry-0-body", -1)
        with pytest.raises(NoSuchEntryError) as ei:
            await conn.read(7, 1)
        assert (ei.value.ledger_id, ei.value.entry_id, ei.value.bookie) == (7, 1, BOOKIE)
        with pytest.raises(NoSuchLedgerError):
            await conn.read(8, 0)
        await conn.close()

    run(scenario())
    add, read = bookie.requests[0], bookie.requests[1]
    assert add.header.version == pb.VERSION_THREE
    assert add.header.operation == pb.ADD_ENTRY
    assert not add.header.HasField("priority")
    assert not add.addRequest.HasField("flag")
    assert not add.addRequest.HasField("writeFlags")
    assert (add.addRequest.ledgerId, add.addRequest.entryId) == (7, 0)
    assert add.addRequest.masterKey == KEY
    assert read.header.operation == pb.READ_ENTRY
    assert not read.readRequest.HasField("flag")
    assert not read.readRequest.HasField("masterKey")
    assert not read.header.HasField("priority")
    txns = [r.header.txnId for r in bookie.requests]
    assert txns == sorted(set(txns)) and txns[0] == 1


def test_flags_and_priority_per_request_kind(bookie: MockBookie) -> None:
    """As the Java client sends them: recovery add = RECOVERY_ADD + priority 100;
    re-replication = RECOVERY_ADD only; fencing read-LAC = FENCE_LEDGER + key, no priority;
    recovery read = fence + priority."""

    async def scenario() -> None:
        conn = BookieConnection(BOOKIE, bookie.address, fast_config())
        await conn.add(1, 0, KEY, b"x", recovery=True, high_priority=True)
        await conn.add(1, 1, KEY, b"y", recovery=True)
        await conn.add(1, 2, KEY, b"z", write_flags=1)
        with pytest.raises(NoSuchEntryError):
            await conn.read(1, -1, fence=True, master_key=KEY)
        with pytest.raises(NoSuchEntryError):
            await conn.read(1, 5, fence=True, master_key=KEY, high_priority=True)
        await conn.bookie_info()
        await conn.close()

    run(scenario())
    rec_add, rerep_add, ds_add, fence_lac, rec_read, info = bookie.requests
    assert rec_add.addRequest.flag == pb.AddRequest.RECOVERY_ADD
    assert rec_add.header.priority == 100
    assert rerep_add.addRequest.flag == pb.AddRequest.RECOVERY_ADD
    assert not rerep_add.header.HasField("priority")
    assert ds_add.addRequest.writeFlags == 1 and not ds_add.addRequest.HasField("flag")
    assert fence_lac.readRequest.flag == pb.ReadRequest.FENCE_LEDGER
    assert fence_lac.readRequest.masterKey == KEY
    assert fence_lac.readRequest.entryId == -1
    assert not fence_lac.header.HasField("priority")
    assert rec_read.readRequest.flag == pb.ReadRequest.FENCE_LEDGER
    assert rec_read.header.priority == 100
    assert info.getBookieInfoRequest.requested == 3


def test_fencing_read_without_key_is_refused_locally(bookie: MockBookie) -> None:
    async def scenario() -> None:
        conn = BookieConnection(BOOKIE, bookie.address, fast_config())
        with pytest.raises(IncorrectParameterError) as ei:
            await conn.read(3, -1, fence=True)
        assert ei.value.bookie == BOOKIE and ei.value.ledger_id == 3
        await conn.close()

    run(scenario())
    assert bookie.requests == []


def test_other_operations_decode_their_answers(bookie: MockBookie) -> None:
    async def handler(req: pb.Request, conn: MockConn) -> None:
        resp = response_for(req)
        op = req.header.operation
        if op == pb.READ_LAC:
            resp.readLacResponse.lacBody = b"lac-body"
            resp.readLacResponse.lastEntryBody = b"last-entry"
        elif op == pb.GET_BOOKIE_INFO:
            resp.getBookieInfoResponse.totalDiskCapacity = 1000
            resp.getBookieInfoResponse.freeDiskSpace = 400
        elif op == pb.GET_LIST_OF_ENTRIES_OF_LEDGER:
            resp.getListOfEntriesOfLedgerResponse.availabilityOfEntriesOfLedger = b"\0" * 64
        await conn.reply(resp)

    bookie.handler = handler

    async def scenario() -> None:
        conn = BookieConnection(BOOKIE, bookie.address, fast_config())
        assert await conn.read_lac(4) == ReadLacResult(b"lac-body", b"last-entry")
        assert await conn.bookie_info() == BookieInfo(1000, 400)
        assert await conn.list_entries(4) == b"\0" * 64
        await conn.write_lac(4, 9, KEY, b"lacbody")
        await conn.force_ledger(4)
        await conn.close()

    run(scenario())
    ops = [r.header.operation for r in bookie.requests]
    assert ops == [
        pb.READ_LAC,
        pb.GET_BOOKIE_INFO,
        pb.GET_LIST_OF_ENTRIES_OF_LEDGER,
        pb.WRITE_LAC,
        pb.FORCE_LEDGER,
    ]
    wl = bookie.requests[3].writeLacRequest
    assert (wl.ledgerId, wl.lac, wl.masterKey, wl.body) == (4, 9, KEY, b"lacbody")


def test_absent_optional_answers_are_none(bookie: MockBookie) -> None:
    async def scenario() -> None:
        conn = BookieConnection(BOOKIE, bookie.address, fast_config())
        assert await conn.read_lac(4) == ReadLacResult(None, None)
        assert await conn.bookie_info(2) == BookieInfo(None, None)
        with pytest.raises(ReadError, match="without availability"):
            await conn.list_entries(4)
        with pytest.raises(ReadError, match="without a body") as ei:
            await conn.read(4, 0)
        assert ei.value.entry_id == 0
        await conn.close()

    async def handler(req: pb.Request, conn: MockConn) -> None:
        await conn.reply(response_for(req))

    bookie.handler = handler
    run(scenario())


# ---- pipelining and matching -------------------------------------------------------------------


def test_pipelined_requests_answered_out_of_order(bookie: MockBookie) -> None:
    n = 25
    held: list[tuple[pb.Request, MockConn]] = []

    async def handler(req: pb.Request, conn: MockConn) -> None:
        held.append((req, conn))
        if len(held) == n:
            # Every request arrived before any answer: the client pipelines. Answer backwards.
            for r, c in reversed(held):
                body = f"L{r.readRequest.ledgerId}E{r.readRequest.entryId}".encode()
                await c.reply(response_for(r, body=body))

    bookie.handler = handler

    async def scenario() -> list[ReadResult]:
        conn = BookieConnection(BOOKIE, bookie.address, fast_config())
        try:
            return await asyncio.gather(*(conn.read(9, e) for e in range(n)))
        finally:
            await conn.close()

    results = run(scenario())
    assert [r.body for r in results] == [f"L9E{e}".encode() for e in range(n)]
    assert bookie.connections == 1
    assert len({r.header.txnId for r in bookie.requests}) == n


def test_matching_uses_txn_id_and_operation(bookie: MockBookie) -> None:
    held: list[tuple[pb.Request, MockConn]] = []

    async def handler(req: pb.Request, conn: MockConn) -> None:
        held.append((req, conn))
        if len(held) < 2:
            return
        (read, c), (add, _) = sorted(held, key=lambda h: h[0].header.operation != pb.READ_ENTRY)
        assert read.header.operation == pb.READ_ENTRY and add.header.operation == pb.ADD_ENTRY
        # Same txnId, wrong operation: must match nothing.
        await c.reply(response_for(add, operation=pb.ADD_ENTRY, txn_id=read.header.txnId))
        await c.reply(response_for(read, body=b"WRONG", txn_id=add.header.txnId))
        # A txnId nobody used.
        await c.reply(response_for(read, body=b"WRONG", txn_id=987654321))
        await asyncio.sleep(0.05)
        await c.reply(response_for(add))
        await c.reply(response_for(read, body=b"right"))

    bookie.handler = handler

    async def scenario() -> None:
        conn = BookieConnection(BOOKIE, bookie.address, fast_config())
        read_res, add_res = await asyncio.gather(conn.read(5, 0), conn.add(5, 1, KEY, b"b"))
        assert read_res.body == b"right"
        assert add_res is None
        assert conn.outstanding == 0 and conn.connected
        await conn.close()

    run(scenario())


# ---- timeouts ----------------------------------------------------------------------------------


def test_timeout_raises_and_keeps_the_connection(bookie: MockBookie) -> None:
    silent = answer_all_but(bookie, 7)

    async def scenario() -> None:
        # The configured timeout is well apart from the per-call one below, so a loaded
        # machine's scheduling delay cannot blur which of the two fired.
        conn = BookieConnection(BOOKIE, bookie.address, fast_config(read_timeout=1.0))
        t0 = time.monotonic()
        with pytest.raises(BKTimeoutError) as ei:
            await conn.read(2, 7)
        elapsed = time.monotonic() - t0
        assert 0.98 <= elapsed < 3.0
        err = ei.value
        assert (err.ledger_id, err.entry_id, err.bookie) == (2, 7, BOOKIE)
        assert err.code == -23
        assert conn.outstanding == 0 and conn.connected
        # The late reply is dropped; the same connection keeps serving.
        req, c = silent[0]
        bookie.call(c.reply(response_for(req, body=b"late")))
        assert (await conn.read(2, 8)).body == b"ok"
        # A per-call timeout overrides the configured one.
        t0 = time.monotonic()
        with pytest.raises(BKTimeoutError):
            await conn.read(2, 7, timeout=0.1)
        assert time.monotonic() - t0 < 0.9
        await conn.close()

    run(scenario())
    assert bookie.connections == 1


def test_add_uses_add_timeout(bookie: MockBookie) -> None:
    async def handler(req: pb.Request, conn: MockConn) -> None:
        return  # never answers

    bookie.handler = handler

    async def scenario() -> None:
        conn = BookieConnection(BOOKIE, bookie.address, fast_config(add_timeout=0.2))
        t0 = time.monotonic()
        with pytest.raises(BKTimeoutError) as ei:
            await conn.add(3, 4, KEY, b"b")
        assert time.monotonic() - t0 < 1.5
        assert (ei.value.ledger_id, ei.value.entry_id) == (3, 4)
        await conn.close()

    run(scenario())


# ---- connection loss and reconnect -------------------------------------------------------------


def test_drop_fails_every_outstanding_request_as_unknown(bookie: MockBookie) -> None:
    seen: list[pb.Request] = []

    async def handler(req: pb.Request, conn: MockConn) -> None:
        seen.append(req)
        if len(seen) == 3:
            conn.close()  # bookie crashes with three requests in flight

    bookie.handler = handler

    async def scenario() -> None:
        conn = BookieConnection(BOOKIE, bookie.address, fast_config())
        results = await asyncio.gather(
            conn.read(6, 0), conn.add(6, 1, KEY, b"x"), conn.read_lac(6), return_exceptions=True
        )
        for res in results:
            assert isinstance(res, ConnectionLostError), res
            # Unknown outcome: a handle-not-available error, never a negative answer.
            assert isinstance(res, BookieHandleNotAvailableError)
            assert not isinstance(res, (NoSuchEntryError, NoSuchLedgerError, BadResponseError))
            assert res.bookie == BOOKIE and res.ledger_id == 6
            assert "outcome unknown" in str(res)
        assert [r.entry_id for r in results] == [0, 1, None]
        assert not conn.connected and conn.outstanding == 0
        # The next request reconnects at once (a drop is not a connect failure).
        bookie.handler = bookie.store_handler
        await conn.add(6, 0, KEY, b"again")
        assert (await conn.read(6, 0)).body == b"again"
        await conn.close()

    run(scenario())
    assert bookie.connections == 2


def test_reconnect_backs_off_and_recovers(bookie: MockBookie) -> None:
    port = bookie.port
    refreshes: list[bool] = []

    async def resolve(refresh: bool) -> tuple[str, int]:
        refreshes.append(refresh)
        return ("127.0.0.1", port)

    async def scenario() -> None:
        cfg = fast_config(reconnect_backoff_initial=0.2, reconnect_backoff_max=0.8)
        conn = BookieConnection(BOOKIE, resolve, cfg)
        await conn.add(1, 0, KEY, b"first")
        bookie.stop()
        await wait_until(lambda: not conn.connected)
        loop = asyncio.get_running_loop()
        delays = []  # (the delay left, the time since before the failed dial)
        for attempt in range(4):
            before = loop.time()
            with pytest.raises(BookieHandleNotAvailableError) as ei:
                await conn.read(1, 0)
            err = ei.value
            assert type(err) is BookieHandleNotAvailableError
            assert err.bookie == BOOKIE and BOOKIE in str(err)
            assert "cannot connect to 127.0.0.1" in err.reason
            delays.append((conn.retry_delay(), loop.time() - before))
            # Inside the back-off window requests fail fast without dialling.
            t0 = time.monotonic()
            with pytest.raises(BookieHandleNotAvailableError, match="next connect attempt"):
                await conn.read(1, 0)
            assert time.monotonic() - t0 < 0.5  # (and no dial: see the resolver count)
            if attempt < 3:
                await asyncio.sleep(conn.retry_delay() + 0.01)
        # Exponential back-off, capped: 0.2, 0.4, 0.8, 0.8 from the failed dial (what is left
        # of it is less by the time since, however long a loaded machine took).
        for (got, elapsed), want in zip(delays, [0.2, 0.4, 0.8, 0.8], strict=True):
            assert want - elapsed - 0.001 <= got <= want + 0.001
        bookie.start(port)
        await asyncio.sleep(conn.retry_delay() + 0.01)
        assert (await conn.read(1, 0)).body == b"first"
        assert conn.retry_delay() == 0.0 and conn.connected
        await conn.close()

    run(scenario())
    # The first dial used the cache; every dial after a failure asked for a fresh address.
    assert refreshes[0] is False
    assert all(refreshes[1:]) and len(refreshes) == 6


def test_connect_refused_names_the_bookie() -> None:
    mock = MockBookie().start()
    addr = mock.address
    mock.shutdown()  # nothing listens there any more

    async def scenario() -> None:
        conn = BookieConnection("bk-dead:3181", addr, fast_config())
        with pytest.raises(BookieHandleNotAvailableError) as ei:
            await conn.add(11, 2, KEY, b"x")
        assert ei.value.bookie == "bk-dead:3181"
        assert (ei.value.ledger_id, ei.value.entry_id) == (11, 2)
        assert "bk-dead:3181" in str(ei.value)
        await conn.close()

    run(scenario())


def test_resolver_failure_is_reported_and_backed_off() -> None:
    calls = 0

    async def resolve(refresh: bool) -> tuple[str, int]:
        nonlocal calls
        calls += 1
        raise BookieHandleNotAvailableError("bookie id not resolvable", bookie="custom-id")

    async def scenario() -> None:
        conn = BookieConnection("custom-id", resolve, fast_config(reconnect_backoff_initial=1.0))
        with pytest.raises(BookieHandleNotAvailableError, match="not resolvable"):
            await conn.read(1, 1)
        with pytest.raises(BookieHandleNotAvailableError, match="next connect attempt"):
            await conn.read(1, 1)
        await conn.close()

    run(scenario())
    assert calls == 1


# ---- bad frames --------------------------------------------------------------------------------


def test_oversized_response_frame_closes_the_connection(bookie: MockBookie) -> None:
    max_frame = 1024

    async def handler(req: pb.Request, conn: MockConn) -> None:
        # Pad the body so the whole frame (4 + N) is exactly max_frame, or one byte more.
        target = max_frame + (1 if req.readRequest.entryId == 1 else 0)
        size = target
        while len(encode_frame(response_for(req, body=b"b" * size).SerializeToString())) > target:
            size -= 1
        resp = response_for(req, body=b"b" * size)
        assert len(encode_frame(resp.SerializeToString())) == target
        await conn.reply(resp)

    bookie.handler = handler

    async def scenario() -> None:
        conn = BookieConnection(BOOKIE, bookie.address, fast_config(max_frame_size=max_frame))
        ok = await conn.read(1, 0)
        assert len(ok.body) > 900
        with pytest.raises(BadResponseError) as ei:
            await conn.read(1, 1)
        err = ei.value
        assert isinstance(err, ConnectionLostError)  # unknown outcome
        assert "response refused" in err.reason and "frame length 1021" in err.reason
        assert (err.ledger_id, err.entry_id, err.bookie) == (1, 1, BOOKIE)
        assert not conn.connected
        assert len((await conn.read(1, 0)).body) == len(ok.body)
        await conn.close()

    run(scenario())
    assert bookie.connections == 2


def test_huge_length_prefix_is_refused_before_buffering(bookie: MockBookie) -> None:
    async def handler(req: pb.Request, conn: MockConn) -> None:
        await conn.send_raw(struct.pack(">i", 0x7FFFFFF0))

    bookie.handler = handler

    async def scenario() -> None:
        conn = BookieConnection(BOOKIE, bookie.address, fast_config())
        t0 = time.monotonic()
        with pytest.raises(BadResponseError, match="frame length 2147483632"):
            await conn.read(1, 0)
        assert time.monotonic() - t0 < 1.0
        await conn.close()

    run(scenario())


@pytest.mark.parametrize(
    ("payload", "needle"),
    [
        (b"\xff\xff\xff\xff\xff", "undecodable response frame"),
        (b"", "missing required fields"),
        # A header but no status: e.g. a StatusCode this client does not know.
        (
            pb.Response(
                header=pb.BKPacketHeader(version=3, operation=1, txnId=1)
            ).SerializePartialToString(),
            "missing required fields: status",
        ),
    ],
)
def test_garbage_response_closes_the_connection(
    bookie: MockBookie, payload: bytes, needle: str
) -> None:
    async def handler(req: pb.Request, conn: MockConn) -> None:
        await conn.send_raw(encode_frame(payload))

    bookie.handler = handler

    async def scenario() -> None:
        conn = BookieConnection(BOOKIE, bookie.address, fast_config())
        with pytest.raises(BadResponseError, match=needle) as ei:
            await conn.read(12, 3)
        assert ei.value.bookie == BOOKIE and ei.value.entry_id == 3
        assert not conn.connected
        await conn.close()

    run(scenario())


def test_request_over_max_frame_is_refused_locally(bookie: MockBookie) -> None:
    async def scenario() -> None:
        conn = BookieConnection(BOOKIE, bookie.address, fast_config(max_frame_size=1024))
        await conn.add(1, 0, KEY, b"small")
        with pytest.raises(IncorrectParameterError, match="exceeds") as ei:
            await conn.add(1, 1, KEY, b"x" * 2000)
        assert (ei.value.ledger_id, ei.value.entry_id) == (1, 1)
        # The connection was not sacrificed.
        assert (await conn.read(1, 0)).body == b"small"
        await conn.close()

    run(scenario())
    assert len(bookie.requests) == 2 and bookie.connections == 1


# ---- status codes ------------------------------------------------------------------------------

READ_MAP: list[tuple[int, type[BKError]]] = [
    (pb.ENOLEDGER, NoSuchLedgerError),
    (pb.ENOENTRY, NoSuchEntryError),
    (pb.EBADREQ, ReadError),
    (pb.EIO, ReadError),
    (pb.EUA, UnauthorizedAccessError),
    (pb.EBADVERSION, ProtocolVersionError),
    (pb.EFENCED, LedgerFencedError),
    (pb.EREADONLY, WriteOnReadOnlyBookieError),
    (pb.ETOOMANYREQUESTS, TooManyRequestsError),
    (pb.EUNKNOWNLEDGERSTATE, DataUnknownError),
]
WRITE_GENERIC = {pb.EBADREQ: WriteError, pb.EIO: WriteError}


def _call_op(conn: BookieConnection, op: int) -> Awaitable[Any]:
    return {
        pb.READ_ENTRY: lambda: conn.read(21, 4),
        pb.ADD_ENTRY: lambda: conn.add(21, 4, KEY, b"b"),
        pb.READ_LAC: lambda: conn.read_lac(21),
        pb.WRITE_LAC: lambda: conn.write_lac(21, 3, KEY, b"l"),
        pb.FORCE_LEDGER: lambda: conn.force_ledger(21),
        pb.GET_LIST_OF_ENTRIES_OF_LEDGER: lambda: conn.list_entries(21),
        pb.GET_BOOKIE_INFO: lambda: conn.bookie_info(),
    }[op]()


OPS = [
    pb.READ_ENTRY,
    pb.ADD_ENTRY,
    pb.READ_LAC,
    pb.WRITE_LAC,
    pb.FORCE_LEDGER,
    pb.GET_LIST_OF_ENTRIES_OF_LEDGER,
    pb.GET_BOOKIE_INFO,
]


@pytest.mark.parametrize("op", OPS, ids=[pb.OperationType.Name(o) for o in OPS])
def test_every_status_maps_to_its_error(bookie: MockBookie, op: int) -> None:
    """Each non-EOK status, for each operation, in the three places a bookie may put it."""
    placements = ["both", "top_only", "sub_only"]
    cases = [(s, cls, where) for s, cls in READ_MAP for where in placements]
    script: list[tuple[int, str]] = [(s, where) for s, _, where in cases]

    async def handler(req: pb.Request, conn: MockConn) -> None:
        status, where = script.pop(0)
        if where == "both":
            resp = response_for(req, status)
        elif where == "top_only":  # e.g. EBADREQ for an unsupported request: no sub-message
            resp = response_for(req, status, sub=False)
        else:  # Java uses the sub-status when the top level says EOK
            resp = response_for(req, status, top_status=pb.EOK)
        await conn.reply(resp)

    bookie.handler = handler
    write_op = op in (pb.ADD_ENTRY, pb.WRITE_LAC, pb.FORCE_LEDGER)

    async def scenario() -> None:
        conn = BookieConnection(BOOKIE, bookie.address, fast_config())
        for status, cls, where in cases:
            want = WRITE_GENERIC.get(status, cls) if write_op else cls
            with pytest.raises(BKError) as ei:
                await _call_op(conn, op)
            err = ei.value
            assert type(err) is want, (pb.StatusCode.Name(status), where, err)
            assert pb.StatusCode.Name(status) in str(err)
            assert err.bookie == BOOKIE
            if op != pb.GET_BOOKIE_INFO:
                assert err.ledger_id == 21
            if op in (pb.READ_ENTRY, pb.ADD_ENTRY):
                assert err.entry_id == 4
        assert conn.connected and bookie.connections == 1
        await conn.close()

    run(scenario())


def test_eok_without_sub_response_is_the_generic_error(bookie: MockBookie) -> None:
    async def handler(req: pb.Request, conn: MockConn) -> None:
        await conn.reply(response_for(req, sub=False))

    bookie.handler = handler

    async def scenario() -> None:
        conn = BookieConnection(BOOKIE, bookie.address, fast_config())
        with pytest.raises(ReadError, match="without readResponse"):
            await conn.read(1, 1)
        with pytest.raises(WriteError, match="without addResponse"):
            await conn.add(1, 1, KEY, b"b")
        await conn.close()

    run(scenario())


# ---- close -------------------------------------------------------------------------------------


def test_close_fails_outstanding_and_later_requests(bookie: MockBookie) -> None:
    async def handler(req: pb.Request, conn: MockConn) -> None:
        return

    bookie.handler = handler

    async def scenario() -> None:
        conn = BookieConnection(BOOKIE, bookie.address, fast_config())
        pending = asyncio.ensure_future(conn.read(30, 1))
        await wait_until(lambda: conn.outstanding == 1)
        await conn.close()
        with pytest.raises(ClientClosedError) as ei:
            await pending
        assert (ei.value.ledger_id, ei.value.entry_id, ei.value.bookie) == (30, 1, BOOKIE)
        with pytest.raises(ClientClosedError):
            await conn.read(30, 2)
        assert conn.closed and not conn.connected
        await conn.close()  # idempotent

    run(scenario())


def test_disconnect_then_reconnect(bookie: MockBookie) -> None:
    async def scenario() -> None:
        conn = BookieConnection(BOOKIE, bookie.address, fast_config())
        await conn.add(2, 0, KEY, b"v")
        await conn.disconnect()
        assert not conn.connected
        assert (await conn.read(2, 0)).body == b"v"
        await conn.close()

    run(scenario())
    assert bookie.connections == 2


@pytest.mark.parametrize("ids", [[1], [1, 2, 3]], ids=["read", "read_many"])
def test_cancelled_caller_leaves_nothing_outstanding(bookie: MockBookie, ids: list[int]) -> None:
    async def handler(req: pb.Request, conn: MockConn) -> None:
        return

    bookie.handler = handler

    async def scenario() -> None:
        conn = BookieConnection(BOOKIE, bookie.address, fast_config())
        call = conn.read(1, ids[0]) if len(ids) == 1 else conn.read_many([(1, x) for x in ids])
        task = asyncio.ensure_future(call)
        await wait_until(lambda: conn.outstanding == len(ids))
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert conn.outstanding == 0 and conn.connected
        await conn.close()

    run(scenario())


# ---- read_many: one request group, each read its own answer ------------------------------------


def test_read_many_answers_each_read_in_order(bookie: MockBookie) -> None:
    bookie.entries.update({(4, 0): b"e0", (4, 2): b"e2"})
    held_back: list[tuple[pb.Request, MockConn]] = []

    async def handler(req: pb.Request, conn: MockConn) -> None:
        r = req.readRequest
        if r.entryId == 0:
            held_back.append((req, conn))  # answered last: replies come in any order
            return
        if r.entryId == 3:
            await conn.reply(response_for(req, pb.EFENCED))
            return
        await bookie.store_handler(req, conn)
        if len(bookie.requests) == 4:
            old, c = held_back[0]
            await c.reply(response_for(old, body=b"e0", max_lac=5))

    bookie.handler = handler

    async def scenario() -> None:
        conn = BookieConnection(BOOKIE, bookie.address, fast_config())
        outs = await conn.read_many([(4, x) for x in [0, 1, 2, 3]])
        assert outs[0] == ReadResult(b"e0", 5)
        assert isinstance(outs[1], NoSuchEntryError)
        assert (outs[1].ledger_id, outs[1].entry_id, outs[1].bookie) == (4, 1, BOOKIE)
        assert outs[2] == ReadResult(b"e2", 1)
        # A status is the error read() would raise for it, naming its own entry.
        assert isinstance(outs[3], LedgerFencedError) and outs[3].entry_id == 3
        assert conn.outstanding == 0
        assert await conn.read_many([]) == []
        await conn.close()

    run(scenario())
    # One read request per id, each with its own txnId, as read() sends it.
    reads = [r for r in bookie.requests if r.header.operation == pb.READ_ENTRY]
    assert [r.readRequest.entryId for r in reads] == [0, 1, 2, 3]
    assert len({r.header.txnId for r in reads}) == 4
    assert not any(r.readRequest.HasField("flag") for r in reads)


def test_read_many_spans_ledgers_each_answer_naming_its_own(bookie: MockBookie) -> None:
    bookie.entries.update({(4, 0): b"a", (5, 0): b"b", (6, 3): b"c"})

    async def scenario() -> None:
        conn = BookieConnection(BOOKIE, bookie.address, fast_config())
        outs = await conn.read_many([(4, 0), (5, 0), (5, 7), (6, 3)])
        assert [o.body if isinstance(o, ReadResult) else None for o in outs] == [
            b"a",
            b"b",
            None,
            b"c",
        ]
        assert isinstance(outs[2], NoSuchEntryError)
        assert (outs[2].ledger_id, outs[2].entry_id, outs[2].bookie) == (5, 7, BOOKIE)
        await conn.close()

    run(scenario())
    reads = [r.readRequest for r in bookie.requests if r.header.operation == pb.READ_ENTRY]
    assert [(r.ledgerId, r.entryId) for r in reads] == [(4, 0), (5, 0), (5, 7), (6, 3)]


def test_read_many_times_out_only_the_reads_left_unanswered(bookie: MockBookie) -> None:
    silent = answer_all_but(bookie, 1)

    async def scenario() -> None:
        conn = BookieConnection(BOOKIE, bookie.address, fast_config(read_timeout=1.0))
        t0 = time.monotonic()
        outs = await conn.read_many([(2, x) for x in [0, 1, 2]], timeout=0.3)
        assert 0.28 <= time.monotonic() - t0 < 0.9  # the per-call timeout, not the configured
        assert outs[0] == ReadResult(b"ok") and outs[2] == ReadResult(b"ok")
        late = outs[1]
        assert isinstance(late, BKTimeoutError) and late.code == -23
        assert (late.ledger_id, late.entry_id, late.bookie) == (2, 1, BOOKIE)
        assert conn.outstanding == 0 and conn.connected
        # Its late reply is dropped; the connection keeps serving.
        req, c = silent[0]
        bookie.call(c.reply(response_for(req, body=b"late")))
        assert await conn.read_many([(2, 5)]) == [ReadResult(b"ok")]
        await conn.close()

    run(scenario())
    assert bookie.connections == 1


def test_read_many_keeps_the_answers_read_before_the_connection_dropped(
    bookie: MockBookie,
) -> None:
    async def handler(req: pb.Request, conn: MockConn) -> None:
        if req.readRequest.entryId == 0:
            await conn.reply(response_for(req, body=b"first"))
        elif req.readRequest.entryId == 2:
            await asyncio.sleep(0.2)  # the first answer is read before the crash
            conn.close()

    bookie.handler = handler

    async def scenario() -> None:
        conn = BookieConnection(BOOKIE, bookie.address, fast_config())
        outs = await conn.read_many([(6, x) for x in [0, 1, 2]])
        assert outs[0] == ReadResult(b"first")
        for x, out in zip([1, 2], outs[1:], strict=True):
            # Unknown, never missing: the bookie may hold them.
            assert isinstance(out, ConnectionLostError), out
            assert not isinstance(out, (NoSuchEntryError, NoSuchLedgerError))
            assert (out.ledger_id, out.entry_id, out.bookie) == (6, x, BOOKIE)
        assert conn.outstanding == 0 and not conn.connected
        await conn.close()

    run(scenario())


def test_read_many_raises_when_nothing_could_be_sent() -> None:
    async def scenario() -> None:
        conn = BookieConnection(BOOKIE, ("127.0.0.1", 1), fast_config(connect_timeout=0.5))
        with pytest.raises(BookieHandleNotAvailableError) as ei:
            await conn.read_many([(8, x) for x in [3, 4]])
        assert (ei.value.ledger_id, ei.value.entry_id, ei.value.bookie) == (8, 3, BOOKIE)
        await conn.close()

    run(scenario())
