"""Pipelined bulk reads (getData), and creates for the scale harness, on a dedicated
ZooKeeper session.

kazoo does everything else in bklib. Its transport, though, costs ~250 µs per request (a fresh
epoll selector per select call, two selects per reply), which caps a metadata scan near 3k
ledgers/s; aiozk measured ~4.5k/s. A scan only needs getData, so this speaks just that part of
the ZooKeeper client protocol (connect, digest auth, SASL, getData, ping) over one blocking
socket, TLS-wrapped for a secure port, with many requests in flight, and reaches several times
that rate. See docs/benchmarks.md. The scale harness seeds a million ledger znodes through the
same pipeline (create).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from bklib.errors import ZKError
from bklib.meta.zkaccess import ZkAccess, ZkAuth, ZkSasl, ZkSecurityError, probe_tls
from bklib.meta.zkbudget import request_budget

log = logging.getLogger(__name__)

OP_CREATE = 1
OP_GET_DATA = 4
OP_PING = 11
OP_AUTH = 100
OP_SASL = 102
XID_PING = -2
XID_AUTH = -4
XID_WATCH = -1

ZOK = 0
ZCONNECTIONLOSS = -4
ZNONODE = -101
ZNODEEXISTS = -110
ZNOAUTH = -102
ZSESSIONEXPIRED = -112
ZAUTHFAILED = -115
ZSESSIONCLOSEDREQUIRESASLAUTH = -124
ERROR_NAMES = {
    ZCONNECTIONLOSS: "CONNECTIONLOSS",
    ZNONODE: "NONODE",
    ZNODEEXISTS: "NODEEXISTS",
    ZNOAUTH: "NOAUTH",
    ZSESSIONEXPIRED: "SESSIONEXPIRED",
    ZAUTHFAILED: "AUTHFAILED",
    ZSESSIONCLOSEDREQUIRESASLAUTH: "SESSIONCLOSEDREQUIRESASLAUTH",
}
# Errors that end the session, not just one read.
SESSION_ERRORS = frozenset({ZSESSIONEXPIRED, ZCONNECTIONLOSS, ZAUTHFAILED})

_REPLY_HEADER = struct.Struct(">iqi")
_STAT = struct.Struct(">qqqqiiiqiiq")
_INT = struct.Struct(">i")


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


def parse_connect_string(hosts: str) -> tuple[list[tuple[str, int]], str]:
    """``h1:2181,h2:2181/chroot`` -> ([(h1, 2181), (h2, 2181)], "/chroot")."""
    servers, _, chroot = hosts.partition("/")
    out = []
    for part in servers.split(","):
        host, _, port = part.strip().rpartition(":")
        out.append((host or part.strip(), int(port) if host else 2181))
    return out, ("/" + chroot.rstrip("/")) if chroot else ""


def _string(s: str) -> bytes:
    b = s.encode()
    return _INT.pack(len(b)) + b


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
        self.servers, self.chroot = parse_connect_string(hosts)
        self.hosts = hosts
        self.access = ZkAccess.of(auth)
        self.session_timeout_ms = session_timeout_ms
        self.sock: socket.socket | None = None
        self._buf = bytearray()
        self._xid = 0
        self._last_send = 0.0

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
            req = struct.pack(">iqiq", 0, 0, self.session_timeout_ms, 0) + _INT.pack(16)
            self._send_frame(req + b"\x00" * 16 + b"\x00")
            resp = self._read_frame()
            negotiated = _INT.unpack_from(resp, 4)[0] if len(resp) >= 16 else 0
            if negotiated <= 0:
                self.close()
                last = ZKError(f"ZooKeeper {host}:{port} refused the session")
                continue
            self.session_timeout_ms = negotiated  # the server's bounds may have changed it
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
                self._send_frame(struct.pack(">ii", xid, OP_SASL) + _INT.pack(len(token)) + token)
                frame = self._read_frame()
                rxid, _, err = _REPLY_HEADER.unpack_from(frame)
                if err != ZOK or rxid != xid:
                    raise ZkSecurityError(
                        f"ZooKeeper at {self.hosts} rejected {sasl.describe()} "
                        f"({ERROR_NAMES.get(err, err)})"
                    )
                n = _INT.unpack_from(frame, _REPLY_HEADER.size)[0]
                off = _REPLY_HEADER.size + 4
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
        body = _INT.pack(XID_AUTH) + _INT.pack(OP_AUTH) + _INT.pack(0) + _string("digest")
        body += _INT.pack(len(digest.encode())) + digest.encode()
        self._send_frame(body)
        while True:
            xid, _, err = _REPLY_HEADER.unpack_from(self._read_frame())
            if xid == XID_AUTH:
                if err != ZOK:
                    raise ZKError(f"ZooKeeper digest auth failed ({ERROR_NAMES.get(err, err)})")
                return

    def may_have_expired(self) -> bool:
        """True when the session has been silent for half its timeout or more: ZooKeeper
        may have expired it already, or may before the next reply."""
        idle = time.monotonic() - self._last_send
        return self.sock is not None and idle >= self.session_timeout_ms / 2000.0

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
        self.sock.sendall(_INT.pack(len(payload)) + payload)
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
        n = _INT.unpack_from(self._buf)[0]
        self._fill(4 + n)
        frame = bytes(self._buf[4 : 4 + n])
        del self._buf[: 4 + n]
        return frame

    # ---- reads -------------------------------------------------------------------------------

    def get_many(self, paths: Iterable[str], max_in_flight: int = 500) -> Iterator[GetResult]:
        """getData for every path, in order, with up to ``max_in_flight`` outstanding.
        Connection problems raise ZKError; per-znode errors (NONODE...) come back in ``err``."""
        requests = ((path, OP_GET_DATA, _string(self.chroot + path) + b"\x00") for path in paths)
        for path, err, frame in self._pipeline(requests, max_in_flight):
            yield GetResult(path, None, None, err) if err != ZOK else _get_result(path, frame)

    def _pipeline(
        self, requests: Iterable[tuple[str, int, bytes]], max_in_flight: int
    ) -> Iterator[tuple[str, int, bytes]]:
        """Send ``(path, opcode, body)`` requests with up to ``max_in_flight`` outstanding and
        yield ``(path, error code, reply frame)`` in order. Session errors raise ZKError."""
        if self.sock is None:
            self.connect()
        pending: deque[tuple[int, str]] = deque()
        it = iter(requests)
        exhausted = False
        ping_every = self.session_timeout_ms / 3000.0
        # Refill when half the window has drained: one send of many requests, not one send
        # per reply (a send costs about as much as parsing a reply), and still half in flight.
        low_water = max_in_flight // 2
        while True:
            if not exhausted and len(pending) <= low_water:
                exhausted = self._send_batch(it, pending, max_in_flight)
            if not pending:
                return
            if time.monotonic() - self._last_send > ping_every:
                self._send_frame(struct.pack(">ii", XID_PING, OP_PING))
            frame = self._read_frame()
            xid, _, err = _REPLY_HEADER.unpack_from(frame)
            if xid in (XID_PING, XID_WATCH, XID_AUTH):
                continue
            exp_xid, path = pending.popleft()
            if xid != exp_xid:
                raise ZKError(f"ZooKeeper reply out of order: xid {xid}, expected {exp_xid}")
            if err in SESSION_ERRORS:
                raise ZKError(f"ZooKeeper session failed: {ERROR_NAMES[err]}", path=path)
            yield path, err, frame

    def _send_batch(
        self,
        requests: Iterator[tuple[str, int, bytes]],
        pending: deque[tuple[int, str]],
        max_in_flight: int,
    ) -> bool:
        """Pipeline, in one send, as many of the next requests as the budget grants, up to
        ``max_in_flight`` pending; True when ``requests`` is exhausted."""
        # The budget grants what it holds now; with nothing in flight, wait for one token
        # (waiting with replies pending would only delay reading them).
        budget = request_budget()
        room = budget.take_up_to(max_in_flight - len(pending))
        if room == 0 and not pending:
            budget.acquire()
            room = 1
        batch = []
        exhausted = False
        while room > 0:
            room -= 1
            try:
                path, opcode, body = next(requests)
            except StopIteration:
                exhausted = True
                room += 1  # this grant was not used
                break
            xid = self._next_xid()
            payload = struct.pack(">ii", xid, opcode) + body
            batch.append(_INT.pack(len(payload)) + payload)
            pending.append((xid, path))
        if room > 0:
            budget.refund(room)
        if batch:
            assert self.sock is not None
            self.sock.sendall(b"".join(batch))
            self._last_send = time.monotonic()
        return exhausted


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
            (path, OP_CREATE, _string(self.chroot + path) + _buffer(data) + _OPEN_ACL + _PERSISTENT)
            for path, data in nodes
        )
        for path, err, _frame in self._pipeline(requests, max_in_flight):
            yield path, err


def _buffer(data: bytes) -> bytes:
    return _INT.pack(len(data)) + data


# One ACL, (perms ALL, world:anyone); then the create flags.
_OPEN_ACL = _INT.pack(1) + _INT.pack(31) + _string("world") + _string("anyone")
_PERSISTENT = _INT.pack(0)


def _get_result(path: str, frame: bytes) -> GetResult:
    """A successful getData reply: the data, then the Stat."""
    off = _REPLY_HEADER.size
    n = _INT.unpack_from(frame, off)[0]
    off += 4
    data = frame[off : off + n] if n >= 0 else b""
    off += max(n, 0)
    _, _, ctime, mtime, version, cversion, _, owner, _, nchild, _ = _STAT.unpack_from(frame, off)
    return GetResult(path, data, Stat(ctime, mtime, version, cversion, owner, nchild), 0)
