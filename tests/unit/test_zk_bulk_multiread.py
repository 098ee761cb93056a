"""The bulk reader's multiRead replies, parsed (bklib.meta.stores.zookeeper.bulk), and its
fallback to one getData per znode when a server before ZooKeeper 3.6 refuses the request.

A real ZooKeeper 3.9 answers multiRead in tests/integration/test_zk_multiread.py. No server
before 3.6 is served here, so the refusal comes from a socket server that answers as their
``UnimplementedRequestProcessor`` does: UNIMPLEMENTED for the request, then the connection
closed. It speaks only the connect handshake, that refusal and getData."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator

import pytest

from bklib.errors import ZKError
from bklib.meta.stores.zookeeper.bulk import (
    GET_DATA,
    OP_GET_DATA,
    OP_MULTI_READ,
    ZNONODE,
    ZUNIMPLEMENTED,
    BulkReader,
    _multi_results,
)

_STAT = struct.pack(">qqqqiiiqiiq", 1, 2, 3, 4, 5, 6, 7, 0, 9, 0, 11)


def _header(op: int, done: bool, err: int) -> bytes:
    return struct.pack(">i?i", op, done, err)


def _reply(*parts: bytes) -> bytes:
    return struct.pack(">iqi", 9, 0, 0) + b"".join(parts)


def test_a_reply_answers_each_path_with_its_data_or_its_own_error() -> None:
    frame = _reply(
        _header(OP_GET_DATA, False, 0), struct.pack(">i", 3), b"abc", _STAT,
        _header(-1, False, ZNONODE), struct.pack(">i", ZNONODE),
        _header(OP_GET_DATA, False, 0), struct.pack(">i", -1), _STAT,
        _header(-1, True, -1),
    )  # fmt: skip
    got = list(_multi_results(["/a", "/b", "/c"], frame, GET_DATA))
    assert [(g.path, g.err, g.data) for g in got] == [("/a", 0, b"abc"), ("/b", ZNONODE, None),
                                                      ("/c", 0, b"")]  # fmt: skip
    assert got[0].stat is not None and got[0].stat.version == 5 and got[0].stat.ctime == 3


def test_a_reply_short_of_a_path_fails_naming_it() -> None:
    frame = _reply(_header(OP_GET_DATA, False, 0), struct.pack(">i", 1), b"a", _STAT,
                   _header(-1, True, -1))  # fmt: skip
    with pytest.raises(ZKError, match="/b") as caught:
        list(_multi_results(["/a", "/b"], frame, GET_DATA))
    assert caught.value.path == "/b"
    with pytest.raises(ZKError, match="/a"):
        list(_multi_results(["/a"], _reply(), GET_DATA))  # cut off before any answer


class OldServer(threading.Thread):
    """Connect handshakes, UNIMPLEMENTED (then a closed connection) for multiRead, and getData
    answered with the path as the data (``/gone`` is NONODE)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.opcodes: list[int] = []
        self.connections = 0

    @staticmethod
    def _frames(conn: socket.socket) -> Iterator[bytes]:
        buf = b""
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                return
            buf += chunk
            while len(buf) >= 4 and len(buf) >= 4 + struct.unpack_from(">i", buf)[0]:
                n = struct.unpack_from(">i", buf)[0]
                yield buf[4 : 4 + n]
                buf = buf[4 + n :]

    def run(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                self._serve(conn)

    def _serve(self, conn: socket.socket) -> None:
        frames = self._frames(conn)
        next(frames)  # ConnectRequest
        answer = struct.pack(">iiq", 0, 30_000, 77) + struct.pack(">i", 16) + b"\0" * 16
        conn.sendall(struct.pack(">i", len(answer)) + answer)
        for frame in frames:
            xid, op = struct.unpack_from(">ii", frame)
            self.opcodes.append(op)
            if op == OP_MULTI_READ:
                body = struct.pack(">iqi", xid, 0, ZUNIMPLEMENTED)
                conn.sendall(struct.pack(">i", len(body)) + body)
                return  # and the session with it
            if op != OP_GET_DATA:
                return  # closeSession
            n = struct.unpack_from(">i", frame, 8)[0]
            path = frame[12 : 12 + n]
            if path == b"/gone":
                body = struct.pack(">iqi", xid, 0, ZNONODE)
            else:
                body = struct.pack(">iqi", xid, 0, 0) + struct.pack(">i", len(path)) + path + _STAT
            conn.sendall(struct.pack(">i", len(body)) + body)


def test_a_server_without_multiread_is_read_znode_by_znode() -> None:
    server = OldServer()
    server.start()
    try:
        paths = [f"/p{i}" for i in range(120)] + ["/gone", "/last"]
        with BulkReader(f"127.0.0.1:{server.port}") as reader:
            got = list(reader.get_many(paths, max_in_flight=30))
            assert reader.multi_read is False
            again = list(reader.get_many(["/again"]))  # no second probe
    finally:
        server.listener.close()
    assert [g.path for g in got] == paths
    assert [g.data for g in got if g.path != "/gone"] == [p.encode() for p in paths if p != "/gone"]
    assert got[-2].err == ZNONODE
    assert again[0].data == b"/again"
    assert server.opcodes.count(OP_MULTI_READ) == 1
    assert server.opcodes.count(OP_GET_DATA) == len(paths) + 1
    assert server.connections == 2  # the refused session, then one reconnect
