"""Pipelined bulk reads (getData, getChildren), and creates for the scale harness, on a
dedicated ZooKeeper session.

kazoo does everything else in bklib. Its transport, though, costs ~250 µs per request (a fresh
epoll selector per select call, two selects per reply), which caps a metadata scan near 3k
ledgers/s; aiozk measured ~4.5k/s. A scan only needs getData, so this speaks just that part of
the ZooKeeper client protocol (connect, digest auth, SASL, getData, getChildren, ping) over
one blocking socket, TLS-wrapped for a secure port, with many requests in flight, and reaches
several times that rate. See docs/benchmarks.md. Listings of many znodes (the
under-replication marks' hex dirs, one per marked ledger) go the same way with getChildren.
The scale harness seeds a million ledger znodes through the same pipeline (create).

On ZooKeeper 3.6 and later the reads go :data:`READS_PER_MULTI` to a ``multiRead`` request
(``OpCode.multiRead``, ``ZooKeeper.multi`` of ``Op.getData`` or ``Op.getChildren``): one
request instead of fifty costs the server, which shares the cores with everything else, far
less CPU per read (docs/benchmarks.md). A server that does not know the opcode answers
UNIMPLEMENTED and closes the session; the reader then reconnects and reads znode by znode.

The servers and chroot come from :mod:`~bklib.meta.stores.zookeeper.connect_string`, the
parser kazoo's sessions use too (``[::1]:2181`` connects to ``::1``).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import chain, islice
from typing import Generic, TypeVar

from bklib.errors import ZKError
from bklib.meta.stores.zookeeper.budget import request_budget
from bklib.meta.stores.zookeeper.connect_string import format_server, parse_connect_string
from bklib.meta.stores.zookeeper.security import (
    ZkAccess,
    ZkAuth,
    ZkSasl,
    ZkSecurityError,
    probe_tls,
)
from bklib.records import frozen_record

log = logging.getLogger(__name__)

OP_CREATE = 1
OP_GET_DATA = 4
OP_GET_CHILDREN = 8
OP_PING = 11
OP_MULTI_READ = 22
OP_ERROR = -1
OP_AUTH = 100
OP_SASL = 102
XID_PING = -2
XID_AUTH = -4
XID_WATCH = -1

ZOK = 0
ZCONNECTIONLOSS = -4
ZUNIMPLEMENTED = -6
ZNONODE = -101
ZNODEEXISTS = -110
ZNOAUTH = -102
ZSESSIONEXPIRED = -112
ZAUTHFAILED = -115
ZSESSIONCLOSEDREQUIRESASLAUTH = -124
ERROR_NAMES = {
    ZCONNECTIONLOSS: "CONNECTIONLOSS",
    ZUNIMPLEMENTED: "UNIMPLEMENTED",
    ZNONODE: "NONODE",
    ZNODEEXISTS: "NODEEXISTS",
    ZNOAUTH: "NOAUTH",
    ZSESSIONEXPIRED: "SESSIONEXPIRED",
    ZAUTHFAILED: "AUTHFAILED",
    ZSESSIONCLOSEDREQUIRESASLAUTH: "SESSIONCLOSEDREQUIRESASLAUTH",
}
# Errors that end the session, not just one read.
SESSION_ERRORS = frozenset({ZSESSIONEXPIRED, ZCONNECTIONLOSS, ZAUTHFAILED})

REPLY_HEADER = struct.Struct(">iqi")
_STAT = struct.Struct(">qqqqiiiqiiq")
INT32 = struct.Struct(">i")
_MULTI_HEADER = struct.Struct(">i?i")  # MultiHeader: type, done, err

READS_PER_MULTI = 50
"""getData operations per multiRead request. Fifty ledgers' metadata is tens of kilobytes,
far under any server's buffer limits; ten such requests fill the scan's default window."""

K = TypeVar("K")
R = TypeVar("R")


@dataclass(frozen=True)
class Stat:
    """The fields of a znode Stat that callers use."""

    ctime: int
    mtime: int
    version: int
    cversion: int
    ephemeral_owner: int
    num_children: int


@dataclass(frozen=True)
class GetResult:
    path: str
    data: bytes | None
    stat: Stat | None
    err: int  # 0, or a ZooKeeper error code (NONODE = -101, ...)

    @property
    def error_name(self) -> str:
        return ERROR_NAMES.get(self.err, str(self.err))


@dataclass(frozen=True)
class ChildrenResult:
    path: str
    children: list[str] | None
    err: int  # 0, or a ZooKeeper error code (NONODE = -101, ...)

    @property
    def error_name(self) -> str:
        return ERROR_NAMES.get(self.err, str(self.err))


def zk_string(s: str) -> bytes:
    b = s.encode()
    return INT32.pack(len(b)) + b


DEFAULT_SESSION_TIMEOUT = 30.0
"""Seconds a session of ours lives on after its client goes silent, unless told otherwise."""


class BulkReader:
    """A short-lived ZooKeeper session for reading many znodes fast. Not thread-safe."""

    def __init__(
        self,
        hosts: str,
        *,
        auth: ZkAuth = None,
        session_timeout_ms: int = int(DEFAULT_SESSION_TIMEOUT * 1000),
    ) -> None:
        parsed = parse_connect_string(hosts)
        # IPv6 literals without their brackets: socket addresses, not connect-string text.
        self.servers: list[tuple[str, int]] = list(parsed.servers)
        self.chroot = parsed.chroot
        self.hosts = hosts
        self.access = ZkAccess.of(auth)
        self.session_timeout_ms = session_timeout_ms
        self.sock: socket.socket | None = None
        self._buf = bytearray()
        self._xid = 0
        self._last_send = 0.0
        self.session_id = 0
        self.session_password = b""
        """The session's id and password once connected (what another client presents to
        take the session over, or to end it)."""
        self.multi_read: bool | None = None
        """Whether the server takes multiRead requests; None until the first bulk read."""

    def __enter__(self) -> BulkReader:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self, timeout: float = 10.0) -> None:
        last: Exception | None = None
        tls = self.access.tls
        if tls is not None:
            probe_tls(self.hosts, tls, timeout)  # an untrusted certificate is not retried
        for host, port in self.servers:
            try:
                sock = socket.create_connection((host, port), timeout=timeout)
            except OSError as exc:
                last = exc
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if tls is not None:
                try:
                    sock = tls.context().wrap_socket(sock, server_hostname=host)
                except OSError as exc:
                    sock.close()
                    last = exc
                    continue
            self.sock = sock
            req = struct.pack(">iqiq", 0, 0, self.session_timeout_ms, 0) + INT32.pack(16)
            self._send_frame(req + b"\x00" * 16 + b"\x00")
            resp = self._read_frame()
            negotiated = INT32.unpack_from(resp, 4)[0] if len(resp) >= 16 else 0
            if negotiated <= 0:
                self.close()
                last = ZKError(f"ZooKeeper {format_server(host, port)} refused the session")
                continue
            self.session_timeout_ms = negotiated  # the server's bounds may have changed it
            # ConnectResponse: protocolVersion, timeOut, sessionId, passwd.
            self.session_id = struct.unpack_from(">q", resp, 8)[0]
            n = INT32.unpack_from(resp, 16)[0]
            self.session_password = bytes(resp[20 : 20 + max(n, 0)])
            if self.access.sasl is not None:
                self._sasl(self.access.sasl, host)
            if self.access.digest:
                self._authenticate(self.access.digest)
            return
        raise ZKError(f"cannot connect to ZooKeeper at {self.hosts}: {last}")

    def _sasl(self, sasl: ZkSasl, host: str) -> None:
        """The SASL exchange kazoo runs after connecting (opcode 102, one token per
        request); a rejection or a dropped connection raises ZkSecurityError."""
        import puresasl.client  # type: ignore[import-untyped]  # no stubs published

        # ZooKeeper fixes the DIGEST-MD5 server name (SecurityUtils); GSSAPI uses the host.
        sasl_host = "zk-sasl-md5" if sasl.mechanism == "DIGEST-MD5" else host
        client = puresasl.client.SASLClient(sasl_host, **sasl.options())
        challenge: bytes | None = None
        try:
            while not client.complete:
                response = client.process(challenge)
                if client.complete and not response:
                    break
                xid = self._next_xid()
                token = response or b""
                self._send_frame(struct.pack(">ii", xid, OP_SASL) + INT32.pack(len(token)) + token)
                frame = self._read_frame()
                rxid, _, err = REPLY_HEADER.unpack_from(frame)
                if err != ZOK or rxid != xid:
                    raise ZkSecurityError(
                        f"ZooKeeper at {self.hosts} rejected {sasl.describe()} "
                        f"({ERROR_NAMES.get(err, err)})"
                    )
                n = INT32.unpack_from(frame, REPLY_HEADER.size)[0]
                off = REPLY_HEADER.size + 4
                challenge = frame[off : off + n] if n > 0 else b""
        except ZkSecurityError:
            self.close()
            raise
        except ZKError:  # the server drops a connection whose credentials it rejected
            self.close()
            raise ZkSecurityError(f"ZooKeeper at {self.hosts} rejected {sasl.describe()}") from None
        finally:
            client.dispose()

    def _authenticate(self, digest: str) -> None:
        body = INT32.pack(XID_AUTH) + INT32.pack(OP_AUTH) + INT32.pack(0) + zk_string("digest")
        body += INT32.pack(len(digest.encode())) + digest.encode()
        self._send_frame(body)
        while True:
            xid, _, err = REPLY_HEADER.unpack_from(self._read_frame())
            if xid == XID_AUTH:
                if err != ZOK:
                    raise ZKError(f"ZooKeeper digest auth failed ({ERROR_NAMES.get(err, err)})")
                return

    def may_have_expired(self) -> bool:
        """True when the session has been silent for half its timeout or more: ZooKeeper
        may have expired it already, or may before the next reply."""
        idle = time.monotonic() - self._last_send
        return self.sock is not None and idle >= self.session_timeout_ms / 2000.0

    def idle_for(self) -> float:
        """Seconds since this session last sent anything."""
        return time.monotonic() - self._last_send

    def ping(self) -> None:
        """One ping, answered, while nothing else is in flight: keeps an idle session alive
        between scans (ZooKeeper expires a session that sends nothing for its timeout).
        Raises ZKError when the connection is gone."""
        self._send_frame(struct.pack(">ii", XID_PING, OP_PING))
        while True:
            xid, _, err = REPLY_HEADER.unpack_from(self._read_frame())
            if xid == XID_PING:
                if err != ZOK:
                    raise ZKError(
                        f"ZooKeeper {self.hosts} refused a ping ({ERROR_NAMES.get(err, err)})"
                    )
                return

    def close(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self._send_frame(struct.pack(">ii", self._next_xid(), -11))  # closeSession
            self.sock.close()
            self.sock = None

    # ---- framing ---------------------------------------------------------------------------

    def _next_xid(self) -> int:
        self._xid = (self._xid + 1) & 0x7FFFFFFF
        return self._xid

    def _send_frame(self, payload: bytes) -> None:
        assert self.sock is not None
        self.sock.sendall(INT32.pack(len(payload)) + payload)
        self._last_send = time.monotonic()

    def _fill(self, n: int) -> None:
        assert self.sock is not None
        while len(self._buf) < n:
            chunk = self.sock.recv(max(65536, n - len(self._buf)))
            if not chunk:
                raise ZKError(
                    f"ZooKeeper {self.hosts} closed the connection (the session expired, or "
                    "the server went away)"
                )
            self._buf += chunk

    def _read_frame(self) -> bytes:
        self._fill(4)
        n = INT32.unpack_from(self._buf)[0]
        self._fill(4 + n)
        frame = bytes(self._buf[4 : 4 + n])
        del self._buf[: 4 + n]
        return frame

    # ---- reads -------------------------------------------------------------------------------

    def get_many(self, paths: Iterable[str], max_in_flight: int = 500) -> Iterator[GetResult]:
        """getData for every path, in order, with up to ``max_in_flight`` reads outstanding.
        Connection problems raise ZKError; per-znode errors (NONODE...) come back in ``err``."""
        return self._read_many(paths, GET_DATA, max_in_flight)

    def children_many(
        self, paths: Iterable[str], max_in_flight: int = 500
    ) -> Iterator[ChildrenResult]:
        """getChildren for every path, in order, as :meth:`get_many` reads data; the names
        come back unsorted, as the server lists them."""
        return self._read_many(paths, GET_CHILDREN, max_in_flight)

    def _read_many(self, paths: Iterable[str], op: ReadOp[R], max_in_flight: int) -> Iterator[R]:
        if self.multi_read is False:
            yield from self._read_each(paths, op, max_in_flight)
            return
        batches = _batches(paths, READS_PER_MULTI)
        if self.multi_read is None:
            first = next(batches, None)
            if first is None:
                return
            answered = self._probe_multi_read(first, op)
            if answered is None:  # an older server: one read per znode from now on
                yield from self._read_each(
                    chain(first, chain.from_iterable(batches)), op, max_in_flight
                )
                return
            yield from answered
        yield from self._read_batched(batches, op, max_in_flight)

    def _read_each(self, paths: Iterable[str], op: ReadOp[R], max_in_flight: int) -> Iterator[R]:
        requests = (
            (path, op.opcode, zk_string(self.chroot + path) + b"\x00", 1) for path in paths
        )  # getData and getChildren requests alike: the path, then no watch
        for path, err, frame in self._pipeline(requests, max_in_flight):
            if err != ZOK:
                yield op.failed(path, err)
            else:
                yield op.parse(path, frame, REPLY_HEADER.size)[0]

    def _multi_request(self, batch: list[str], op: ReadOp[R]) -> tuple[list[str], int, bytes, int]:
        head = _MULTI_HEADER.pack(op.opcode, False, -1)
        body = b"".join(head + zk_string(self.chroot + p) + b"\x00" for p in batch)
        return batch, OP_MULTI_READ, body + _MULTI_END, len(batch)

    def _read_batched(
        self, batches: Iterable[list[str]], op: ReadOp[R], max_in_flight: int
    ) -> Iterator[R]:
        requests = (self._multi_request(batch, op) for batch in batches)
        for batch, err, frame in self._pipeline(requests, max_in_flight):
            if err != ZOK:  # the request as a whole (NOAUTH on none of them: per read)
                yield from (op.failed(p, err) for p in batch)
            else:
                yield from _multi_results(batch, frame, op)

    def _probe_multi_read(self, batch: list[str], op: ReadOp[R]) -> list[R] | None:
        """Read ``batch`` in one multiRead; None when the server does not take the request
        (it answers UNIMPLEMENTED and closes the session), after reconnecting."""
        try:
            results = list(self._read_batched([batch], op, len(batch)))
        except ZKError as exc:
            log.info("ZooKeeper %s dropped a multiRead (%s); reading znode by znode", self.hosts,
                     exc.reason)  # fmt: skip
            results = []
        if results and op.error_of(results[0]) != ZUNIMPLEMENTED:
            self.multi_read = True
            return results
        if results:
            log.info("ZooKeeper %s has no multiRead (before 3.6); reading znode by znode",
                     self.hosts)  # fmt: skip
        self.multi_read = False
        self.close()
        self.connect()
        return None

    def _pipeline(
        self, requests: Iterable[tuple[K, int, bytes, int]], max_in_flight: int
    ) -> Iterator[tuple[K, int, bytes]]:
        """Send ``(key, opcode, body, operations)`` requests with up to ``max_in_flight``
        operations outstanding (at least one request) and yield ``(key, error code, reply
        frame)`` in order. Each operation draws a token of the request budget: a multiRead of
        fifty reads counts fifty. Session errors raise ZKError."""
        if self.sock is None:
            self.connect()
        pending: deque[tuple[int, K, int]] = deque()
        held: list[tuple[K, int, bytes, int]] = []
        it = iter(requests)
        exhausted = False
        ping_every = self.session_timeout_ms / 3000.0
        # Refill when half the window has drained: one send of many requests, not one send
        # per reply (a send costs about as much as parsing a reply), and still half in flight.
        low_water = max_in_flight // 2
        in_flight = 0
        while True:
            if not exhausted and in_flight <= low_water:
                exhausted, in_flight = self._send_batch(it, held, pending, in_flight, max_in_flight)
            if not pending:
                return
            if time.monotonic() - self._last_send > ping_every:
                self._send_frame(struct.pack(">ii", XID_PING, OP_PING))
            frame = self._read_frame()
            xid, _, err = REPLY_HEADER.unpack_from(frame)
            if xid in (XID_PING, XID_WATCH, XID_AUTH):
                continue
            exp_xid, key, ops = pending.popleft()
            in_flight -= ops
            if xid != exp_xid:
                raise ZKError(f"ZooKeeper reply out of order: xid {xid}, expected {exp_xid}")
            if err in SESSION_ERRORS:
                raise ZKError(f"ZooKeeper session failed: {ERROR_NAMES[err]}", path=str(key))
            yield key, err, frame

    def _send_batch(
        self,
        requests: Iterator[tuple[K, int, bytes, int]],
        held: list[tuple[K, int, bytes, int]],
        pending: deque[tuple[int, K, int]],
        in_flight: int,
        max_in_flight: int,
    ) -> tuple[bool, int]:
        """Pipeline, in one send, as many of the next requests as the budget grants, up to
        ``max_in_flight`` operations pending; returns whether ``requests`` is exhausted and the
        operations now in flight. A request the grant does not cover waits in ``held``."""
        # The budget grants what it holds now; with nothing in flight, wait for the tokens of
        # one request (waiting with replies pending would only delay reading them).
        budget = request_budget()
        room = budget.take_up_to(max(max_in_flight - in_flight, 0))
        batch: list[bytes] = []
        exhausted = False
        while True:
            if held:
                request = held.pop()
            else:
                try:
                    request = next(requests)
                except StopIteration:
                    exhausted = True
                    break
            key, opcode, body, ops = request
            if ops > room:
                if pending or batch:
                    held.append(request)
                    break
                for _ in range(ops - room):
                    budget.acquire()
                room = ops
            room -= ops
            xid = self._next_xid()
            payload = struct.pack(">ii", xid, opcode) + body
            batch.append(INT32.pack(len(payload)) + payload)
            pending.append((xid, key, ops))
            in_flight += ops
        if room > 0:
            budget.refund(room)  # these grants were not used
        if batch:
            assert self.sock is not None
            self.sock.sendall(b"".join(batch))
            self._last_send = time.monotonic()
        return exhausted, in_flight


class BulkWriter(BulkReader):
    """A session that also creates many znodes fast (the scale harness's seeder,
    bklib/testing/scale). The znodes get the open ACL, as the sandbox's are."""

    def __enter__(self) -> BulkWriter:
        self.connect()
        return self

    def create_many(
        self, nodes: Iterable[tuple[str, bytes]], max_in_flight: int = 1000
    ) -> Iterator[tuple[str, int]]:
        """Create every ``(path, data)`` as a persistent znode, in order, and yield each path
        with its error code (``ZOK``, ``ZNODEEXISTS``, ``ZNONODE`` for a missing parent...)."""
        requests = (
            (path, OP_CREATE,
             zk_string(self.chroot + path) + _buffer(data) + _OPEN_ACL + _PERSISTENT, 1)
            for path, data in nodes
        )  # fmt: skip
        for path, err, _frame in self._pipeline(requests, max_in_flight):
            yield path, err


def _buffer(data: bytes) -> bytes:
    return INT32.pack(len(data)) + data


# One ACL, (perms ALL, world:anyone); then the create flags.
_OPEN_ACL = INT32.pack(1) + INT32.pack(31) + zk_string("world") + zk_string("anyone")
_PERSISTENT = INT32.pack(0)


# A multiRead's end marker (MultiHeader: none, done, no error).
_MULTI_END = _MULTI_HEADER.pack(-1, True, -1)


def _batches(paths: Iterable[str], n: int) -> Iterator[list[str]]:
    it = iter(paths)
    while batch := list(islice(it, n)):
        yield batch


def _get_data_at(path: str, frame: bytes, off: int) -> tuple[GetResult, int]:
    """The GetDataResponse at ``off`` of ``frame`` (data, then Stat), and the offset after it."""
    n = INT32.unpack_from(frame, off)[0]
    off += 4
    data = frame[off : off + n] if n >= 0 else b""
    off += max(n, 0)
    _, _, ctime, mtime, version, cversion, _, owner, _, nchild, _ = _STAT.unpack_from(frame, off)
    # Built without __init__, as a scan reads a million (bklib/records.py).
    stat = frozen_record(
        Stat,
        {"ctime": ctime, "mtime": mtime, "version": version, "cversion": cversion,
         "ephemeral_owner": owner, "num_children": nchild},
    )  # fmt: skip
    got = frozen_record(GetResult, {"path": path, "data": data, "stat": stat, "err": 0})
    return got, off + _STAT.size


def _children_at(path: str, frame: bytes, off: int) -> tuple[ChildrenResult, int]:
    """The GetChildrenResponse at ``off`` of ``frame`` (a vector of names), and the offset
    after it."""
    count = INT32.unpack_from(frame, off)[0]
    off += 4
    names: list[str] = []
    for _ in range(max(count, 0)):
        n = INT32.unpack_from(frame, off)[0]
        off += 4
        names.append(frame[off : off + n].decode())
        off += n
    return ChildrenResult(path, names, 0), off


@dataclass(frozen=True)
class ReadOp(Generic[R]):
    """One kind of read the reader pipelines: its opcode (alone, or inside a multiRead), how
    its answer is parsed, and what a znode's error reads as."""

    opcode: int
    parse: Callable[[str, bytes, int], tuple[R, int]]
    failed: Callable[[str, int], R]
    error_of: Callable[[R], int]


GET_DATA: ReadOp[GetResult] = ReadOp(
    OP_GET_DATA, _get_data_at, lambda p, err: GetResult(p, None, None, err), lambda r: r.err
)
GET_CHILDREN: ReadOp[ChildrenResult] = ReadOp(
    OP_GET_CHILDREN, _children_at, lambda p, err: ChildrenResult(p, None, err), lambda r: r.err
)


def _multi_results(batch: list[str], frame: bytes, op: ReadOp[R]) -> Iterator[R]:
    """A multiRead reply (MultiResponse): for each read, a header and then its answer
    (GetDataResponse, GetChildrenResponse), or an error code for that znode alone; a done
    header ends it. A reply that does not answer every path of ``batch`` raises ZKError: no
    read is taken as missing."""
    off = REPLY_HEADER.size
    for path in batch:
        if len(frame) < off + _MULTI_HEADER.size:
            raise ZKError(f"ZooKeeper multiRead reply ended before {path}", path=path)
        kind, done, err = _MULTI_HEADER.unpack_from(frame, off)
        off += _MULTI_HEADER.size
        if done:
            raise ZKError(f"ZooKeeper multiRead reply ended before {path}", path=path)
        if kind == op.opcode:
            got, off = op.parse(path, frame, off)
            yield got
        elif kind == OP_ERROR:
            code = INT32.unpack_from(frame, off)[0]
            off += 4
            yield op.failed(path, code or err)
        else:
            raise ZKError(f"ZooKeeper multiRead answered {path} with opcode {kind}", path=path)
