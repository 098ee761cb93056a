"""BookieConnectionV2 over real sockets: against the Python bookie in-process, and against a
scripted v2 server for what a bookie must never send (every such reply closes the connection
and fails what is outstanding as unknown, never as missing)."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from bklib.bookie.main import Bookie, BookieConfig
from bklib.client.connection_v2 import BookieConnectionV2
from bklib.client.operations import ClientConfig, ReadResult
from bklib.client.pool import BookieClientPool
from bklib.client.transport import BadResponseError, ConnectionLostError
from bklib.errors import (
    BKTimeoutError,
    IllegalOpError,
    IncorrectParameterError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    ReadError,
)
from bklib.proto import v2
from bklib.testing.frames import read_frame
from tests.bookie_helpers import KEY, WRONG_KEY, entry_body

CFG = ClientConfig(
    add_timeout=3.0,
    read_timeout=3.0,
    connect_timeout=2.0,
    reconnect_backoff_initial=0.01,
    reconnect_backoff_max=0.05,
)


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))  # type: ignore[arg-type]


# ---- against the Python bookie ------------------------------------------------------------------


async def _with_bookie(tmp_path: Path, fn: Callable[[BookieConnectionV2], Awaitable[None]]) -> None:
    bookie = Bookie(BookieConfig(data_dir=tmp_path, port=0))
    await bookie.start()
    conn = BookieConnectionV2(bookie.bookie_id, ("127.0.0.1", bookie.port), CFG)
    try:
        await fn(conn)
    finally:
        await conn.close()
        await bookie.stop()


def test_add_read_batch_read_and_fence_in_process(tmp_path: Path) -> None:
    bodies = [entry_body(11, e, bytes([e]) * (100 + e)) for e in range(20)]

    async def go(conn: BookieConnectionV2) -> None:
        await asyncio.gather(*(conn.add(11, e, KEY, b) for e, b in enumerate(bodies)))
        assert conn.outstanding == 0
        assert (await conn.read(11, 7)).body == bodies[7]
        assert (await conn.read(11, -1)).body == bodies[19]  # the highest entry
        assert await conn.batch_read(11, 0, 0, 0) == bodies  # no count limit, max frame
        assert await conn.batch_read(11, 3, 5, 0) == bodies[3:8]
        # maxSize counts the whole reply frame: 36 bytes of header, then 4 + len per entry.
        size = 36 + sum(4 + len(b) for b in bodies[:4])
        assert await conn.batch_read(11, 0, 100, size) == bodies[:4]
        assert await conn.batch_read(11, 0, 100, size - 1) == bodies[:3]
        assert await conn.batch_read(11, 0, 100, 10) == bodies[:1]  # the first entry always
        assert await conn.batch_read(11, 18, 10, 0) == bodies[18:]  # stops at the last entry
        with pytest.raises(NoSuchEntryError) as ei:
            await conn.batch_read(11, 20, 10, 0)
        assert (ei.value.ledger_id, ei.value.entry_id, ei.value.bookie) == (11, 20, conn.bookie_id)
        with pytest.raises(NoSuchLedgerError):
            await conn.read(999, 0)
        # Many reads of the same entry at once are all answered (matched in issue order).
        same = await asyncio.gather(*(conn.read(11, 5) for _ in range(10)))
        assert [r.body for r in same] == [bodies[5]] * 10
        # Fencing over v2: the wrong key is refused, the right one fences, adds then fail.
        with pytest.raises(Exception) as wrong:
            await conn.read(11, -1, fence=True, master_key=WRONG_KEY)
        assert type(wrong.value).__name__ == "UnauthorizedAccessError"
        assert (await conn.read(11, -1, fence=True, master_key=KEY)).body == bodies[19]
        with pytest.raises(LedgerFencedError):
            await conn.add(11, 20, KEY, entry_body(11, 20, b"late"))
        await conn.add(11, 20, KEY, entry_body(11, 20, b"recovery"), recovery=True)
        assert (await conn.read(11, 20)).body == entry_body(11, 20, b"recovery")

    run(_with_bookie(tmp_path, go))


def test_bad_parameters_fail_before_sending(tmp_path: Path) -> None:
    async def go(conn: BookieConnectionV2) -> None:
        with pytest.raises(IncorrectParameterError, match="entry 1"):
            await conn.add(1, 1, KEY, entry_body(1, 2, b"x"))
        with pytest.raises(IncorrectParameterError, match="master key"):
            await conn.add(1, 2, b"short", entry_body(1, 2, b"x"))
        with pytest.raises(IllegalOpError):
            await conn.add(1, 2, KEY, entry_body(1, 2, b"x"), write_flags=1)
        with pytest.raises(IncorrectParameterError):
            await conn.read(1, 0, fence=True)
        with pytest.raises(IncorrectParameterError):
            await conn.batch_read(1, -1, 10, 0)
        assert not conn.connected

    run(_with_bookie(tmp_path, go))


# ---- against a scripted v2 server ---------------------------------------------------------------

Script = Callable[[bytes, asyncio.StreamWriter], Awaitable[None]]


class Scripted:
    """A v2 server on the test's loop: ``script(request, writer)`` answers each request."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[bytes] = []
        self.server: asyncio.base_events.Server | None = None
        self.port = 0

    async def __aenter__(self) -> Scripted:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                frame = await read_frame(reader)
                self.requests.append(frame)
                await self.script(frame, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    def conn(self, config: ClientConfig = CFG) -> BookieConnectionV2:
        return BookieConnectionV2("scripted-bookie", ("127.0.0.1", self.port), config)


def _batch_request(frame: bytes) -> tuple[int, int, int, int, int]:
    lid, start, rid, count, size = v2.BATCH_READ_REQUEST.unpack_from(frame, 4)
    return lid, start, rid, count, size


def _op(frame: bytes) -> int:
    return v2.parse_header(v2.HEADER.unpack_from(frame, 0)[0])[1]


def _batch_reply(
    mutate: Callable[[int, int, int, int, int], tuple[int, int, int, list[bytes]]],
) -> Script:
    """Answer batch reads with ``mutate(ledger, start, rid, count, size)`` -> (ledger, start,
    rid, bodies); reads of (1, 0) hang, so they are outstanding when the connection fails."""

    async def script(frame: bytes, writer: asyncio.StreamWriter) -> None:
        if _op(frame) == v2.BATCH_READ_ENTRY:
            lid, start, rid, bodies = mutate(*_batch_request(frame))
            writer.write(v2.encode_batch_read_response(2, 0, lid, start, rid, bodies))

    return script


def _bodies(ledger: int, start: int, n: int, size: int = 50) -> list[bytes]:
    return [entry_body(ledger, start + i, b"p" * size) for i in range(n)]


BAD_BATCHES: dict[str, tuple[Callable[[int, int, int, int, int], Any], str]] = {
    "more-than-max-count": (
        lambda lid, s, rid, c, z: (lid, s, rid, _bodies(lid, s, c + 1)),
        "carries 4 entries, maxCount 3",
    ),
    "more-than-max-size": (
        lambda lid, s, rid, c, z: (lid, s, rid, _bodies(lid, s, 3, size=z)),
        "maxSize 1000",
    ),
    "out-of-order": (
        lambda lid, s, rid, c, z: (lid, s, rid, [*_bodies(lid, s, 1), *_bodies(lid, s + 2, 1)]),
        r"entry 1 is \(5, 7\), expected \(ledger, entry\) \(5, 6\)",
    ),
    "entries-of-another-ledger": (
        lambda lid, s, rid, c, z: (lid, s, rid, _bodies(lid + 1, s, 2)),
        r"entry 0 is \(6, 5\)",
    ),
    "reply-for-another-ledger": (
        lambda lid, s, rid, c, z: (lid + 1, s, rid, _bodies(lid + 1, s, 1)),
        "is for ledger 6 from 5",
    ),
    "request-id-never-sent": (
        lambda lid, s, rid, c, z: (lid, s, rid + 1000, _bodies(lid, s, 1)),
        "never sent",
    ),
    "request-id-of-a-read": (
        lambda lid, s, rid, c, z: (lid, s, rid - 1, _bodies(lid, s, 1)),
        "of a READ_ENTRY",
    ),
    "eok-without-entries": (lambda lid, s, rid, c, z: (lid, s, rid, []), "without entries"),
    "stub-entry": (lambda lid, s, rid, c, z: (lid, s, rid, [b"tiny"]), "entry 0 is None"),
}


@pytest.mark.parametrize("case", sorted(BAD_BATCHES))
def test_bad_batch_reply_closes_the_connection_as_unknown(case: str) -> None:
    mutate, reason = BAD_BATCHES[case]

    async def go() -> None:
        async with Scripted(_batch_reply(mutate)) as srv:
            conn = srv.conn()
            try:
                hanging = asyncio.ensure_future(conn.read(1, 0))
                await asyncio.sleep(0.05)
                assert conn.outstanding == 1
                with pytest.raises(BadResponseError, match=reason) as ei:
                    await conn.batch_read(5, 5, 3, 1000)
                assert ei.value.bookie == "scripted-bookie"
                assert (ei.value.ledger_id, ei.value.entry_id) == (5, 5)
                # Not a negative answer: ConnectionLostError is "unknown", retried elsewhere.
                assert isinstance(ei.value, ConnectionLostError)
                assert not isinstance(ei.value, NoSuchEntryError)
                with pytest.raises(BadResponseError):
                    await hanging
                assert not conn.connected
            finally:
                await conn.close()

    run(go())


def test_undecodable_reply_fails_everything_outstanding() -> None:
    async def script(frame: bytes, writer: asyncio.StreamWriter) -> None:
        if len(frame) > 20:  # the add: answer with garbage
            writer.write(struct.pack(">I", 5) + b"\x02\x01\x00\x00\x07")

    async def go() -> None:
        async with Scripted(script) as srv:
            conn = srv.conn()
            try:
                read = asyncio.ensure_future(conn.read(1, 0))
                await asyncio.sleep(0.05)
                with pytest.raises(BadResponseError, match="truncated v2 ADD_ENTRY"):
                    await conn.add(1, 0, KEY, entry_body(1, 0, b"x"))
                with pytest.raises(BadResponseError):
                    await read
            finally:
                await conn.close()

    run(go())


def test_timeout_keeps_the_connection_and_drops_the_late_reply() -> None:
    body = entry_body(3, 0, b"late")

    async def script(frame: bytes, writer: asyncio.StreamWriter) -> None:
        lid, eid = v2.IDS.unpack_from(frame, 4)
        if eid == 0:
            await asyncio.sleep(0.4)
        writer.write(v2.encode_read_response(2, 0, lid, eid, entry_body(lid, eid, b"late")))

    async def go() -> None:
        async with Scripted(script) as srv:
            conn = srv.conn()
            try:
                with pytest.raises(BKTimeoutError) as ei:
                    await conn.read(3, 0, timeout=0.1)
                assert (ei.value.ledger_id, ei.value.entry_id) == (3, 0)
                assert conn.connected and conn.outstanding == 0
                await asyncio.sleep(0.5)  # the late reply arrives and is dropped
                assert (await conn.read(3, 0, timeout=2)).body == body
                assert conn.connected
            finally:
                await conn.close()

    run(go())


def test_same_entry_reads_complete_in_issue_order() -> None:
    answers = iter([b"first", b"second", b"third"])

    async def script(frame: bytes, writer: asyncio.StreamWriter) -> None:
        lid, eid = v2.IDS.unpack_from(frame, 4)
        writer.write(v2.encode_read_response(2, 0, lid, eid, entry_body(lid, eid, next(answers))))

    async def go() -> None:
        async with Scripted(script) as srv:
            conn = srv.conn()
            try:
                got = await asyncio.gather(*(conn.read(4, 1) for _ in range(3)))
                assert [r.body for r in got] == [
                    entry_body(4, 1, p) for p in (b"first", b"second", b"third")
                ]
                assert conn.outstanding == 0
            finally:
                await conn.close()

    run(go())


def test_unknown_rc_is_a_read_error_and_eok_without_body_too() -> None:
    async def script(frame: bytes, writer: asyncio.StreamWriter) -> None:
        lid, eid = v2.IDS.unpack_from(frame, 4)
        writer.write(v2.encode_read_response(2, 55 if eid == 0 else 0, lid, eid))

    async def go() -> None:
        async with Scripted(script) as srv:
            conn = srv.conn()
            try:
                with pytest.raises(ReadError, match="v2 rc 55"):
                    await conn.read(1, 0)
                with pytest.raises(ReadError, match="without a body"):
                    await conn.read(1, 1)
                assert conn.connected
            finally:
                await conn.close()

    run(go())


def test_killed_bookie_fails_outstanding_batch_as_connection_lost(tmp_path: Path) -> None:
    async def script(frame: bytes, writer: asyncio.StreamWriter) -> None:
        writer.transport.abort()  # the bookie dies with the request outstanding

    async def go() -> None:
        async with Scripted(script) as srv:
            conn = srv.conn()
            try:
                with pytest.raises(ConnectionLostError) as ei:
                    await conn.batch_read(2, 0, 10, 0)
                assert not isinstance(ei.value, BadResponseError)
                assert "outcome unknown" in str(ei.value)
            finally:
                await conn.close()

    run(go())


def test_pool_chooses_the_protocol_per_bookie(tmp_path: Path) -> None:
    async def go() -> None:
        bookie = Bookie(BookieConfig(data_dir=tmp_path, port=0))
        await bookie.start()
        bid = bookie.bookie_id
        addresses = {bid: ("127.0.0.1", bookie.port)}
        try:
            async with BookieClientPool(addresses=addresses, config=CFG, protocol="v2") as pool:
                assert pool.protocol_for(bid) == "v2"
                await pool.add(bid, 9, 0, KEY, entry_body(9, 0, b"a"))
                await pool.add(bid, 9, 1, KEY, entry_body(9, 1, b"b"))
                assert pool.connection_v2(bid).connected
                assert bid not in pool._connections  # read and add went over v2 only
                assert (await pool.read(bid, 9, 1)).body == entry_body(9, 1, b"b")
                assert await pool.batch_read(bid, 9, 0, 10, 0) == [
                    entry_body(9, 0, b"a"),
                    entry_body(9, 1, b"b"),
                ]
                # v3-only operations still work, on a v3 connection to the same bookie.
                lac = await pool.read_lac(bid, 9)
                assert lac.last_entry_body == entry_body(9, 1, b"b")
                assert pool.bookie_ids == [bid]
            async with BookieClientPool(
                addresses=addresses, config=CFG, protocols={bid: "v3"}, protocol="v2"
            ) as pool:
                assert (await pool.read(bid, 9, 0)).body == entry_body(9, 0, b"a")
                assert pool.connection(bid).connected
                assert bid not in pool._v2_connections
                # batch_read is v2 whatever the protocol of read and add.
                assert len(await pool.batch_read(bid, 9, 0, 1, 0)) == 1
            with pytest.raises(ValueError, match="wire protocol"):
                BookieClientPool(addresses=addresses, protocol="v4")  # type: ignore[arg-type]
        finally:
            await bookie.stop()

    run(go())


# ---- read_many over v2 --------------------------------------------------------------------------


def test_read_many_in_process_answers_each_read_and_repeats_in_order(tmp_path: Path) -> None:
    bodies = [entry_body(12, e, bytes([e]) * 40) for e in range(6)]

    async def go(conn: BookieConnectionV2) -> None:
        await asyncio.gather(*(conn.add(12, e, KEY, b) for e, b in enumerate(bodies)))
        outs = await conn.read_many([(12, x) for x in [5, 1, 9, 1]])
        assert [o.body if isinstance(o, ReadResult) else type(o) for o in outs] == [
            bodies[5],
            bodies[1],
            NoSuchEntryError,
            bodies[1],  # the same entry twice: both answered, matched in issue order
        ]
        assert (outs[2].ledger_id, outs[2].entry_id, outs[2].bookie) == (12, 9, conn.bookie_id)
        nothing = await conn.read_many([(999, 0)])
        assert isinstance(nothing[0], NoSuchLedgerError)
        assert conn.outstanding == 0

    run(_with_bookie(tmp_path, go))


def test_read_many_in_process_spans_ledgers_and_matches_each_reply_to_its_read(
    tmp_path: Path,
) -> None:
    # v2 replies carry no request id: they are matched by (operation, ledger, entry).
    a, b = entry_body(21, 0, b"a" * 40), entry_body(22, 0, b"b" * 40)

    async def go(conn: BookieConnectionV2) -> None:
        await asyncio.gather(conn.add(21, 0, KEY, a), conn.add(22, 0, KEY, b))
        outs = await conn.read_many([(22, 0), (21, 0), (21, 1), (22, 0)])
        assert [o.body if isinstance(o, ReadResult) else type(o) for o in outs] == [
            b,
            a,
            NoSuchEntryError,
            b,
        ]
        assert (outs[2].ledger_id, outs[2].entry_id) == (21, 1)
        assert conn.outstanding == 0

    run(_with_bookie(tmp_path, go))


def test_read_many_times_out_the_silent_read_and_keeps_the_rest() -> None:
    async def script(frame: bytes, writer: asyncio.StreamWriter) -> None:
        lid, eid = v2.IDS.unpack_from(frame, 4)
        if eid == 1:
            return  # never answered
        rc = 55 if eid == 2 else 0
        writer.write(v2.encode_read_response(2, rc, lid, eid, entry_body(lid, eid, b"ok")))

    async def go() -> None:
        async with Scripted(script) as srv:
            conn = srv.conn()
            try:
                outs = await conn.read_many([(3, x) for x in [0, 1, 2]], timeout=0.3)
                assert outs[0] == ReadResult(entry_body(3, 0, b"ok"))
                assert isinstance(outs[1], BKTimeoutError) and outs[1].entry_id == 1
                assert isinstance(outs[2], ReadError) and "v2 rc 55" in str(outs[2])
                assert conn.connected and conn.outstanding == 0
            finally:
                await conn.close()

    run(go())


def test_read_many_on_a_dying_bookie_is_unknown_never_missing() -> None:
    async def script(frame: bytes, writer: asyncio.StreamWriter) -> None:
        writer.transport.abort()

    async def go() -> None:
        async with Scripted(script) as srv:
            conn = srv.conn()
            try:
                outs = await conn.read_many([(2, x) for x in [0, 1]])
                for x, out in enumerate(outs):
                    assert isinstance(out, ConnectionLostError), out
                    assert not isinstance(out, (NoSuchEntryError, NoSuchLedgerError))
                    assert out.entry_id == x
                assert conn.outstanding == 0
            finally:
                await conn.close()

    run(go())


def test_read_many_cancelled_leaves_no_request_nor_queued_token() -> None:
    async def script(frame: bytes, writer: asyncio.StreamWriter) -> None:
        return  # never answers

    async def go() -> None:
        async with Scripted(script) as srv:
            conn = srv.conn()
            try:
                task = asyncio.ensure_future(conn.read_many([(5, x) for x in [1, 1, 2]]))
                while conn.outstanding < 3:
                    await asyncio.sleep(0.01)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                ch = conn._channel
                assert ch is not None and conn.connected and conn.outstanding == 0
                assert ch.queues == {}
                # The deadline queue may drop the abandoned reads at once.
                assert all(out.done() for _, out in ch.deadlines)
            finally:
                await conn.close()

    run(go())
