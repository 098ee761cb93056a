"""Test helpers for the Python bookie: a bookie subprocess and a raw v3/v2 socket client.

The raw client builds ``Request`` protobufs by hand, frames them and matches replies by txnId;
it deliberately does not use bklib.client, so bookie tests check the wire, not our client.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import struct
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from bklib.bookie.faults import AdminClient
from bklib.digest import digest_manager, master_key
from bklib.meta.model import DigestType
from bklib.proto import protocol_pb2 as pb
from bklib.proto.framing import encode_frame
from bklib.testing import sandbox

REPO = Path(__file__).resolve().parents[1]
PASSWORD = b"secret"
KEY = master_key(PASSWORD)
WRONG_KEY = master_key(b"not-the-password")


def entry_body(
    ledger_id: int, entry_id: int, payload: bytes = b"", lac: int | None = None
) -> bytes:
    """A real CRC32C entry body (LAC defaults to entry_id - 1, length = cumulative 1 KiB)."""
    lac = entry_id - 1 if lac is None else lac
    dm = digest_manager(ledger_id, DigestType.CRC32C, PASSWORD)
    return dm.package_entry(entry_id, lac, (entry_id + 1) * max(len(payload), 1), payload)


def lac_body(ledger_id: int, lac: int) -> bytes:
    return digest_manager(ledger_id, DigestType.CRC32C, PASSWORD).package_lac(lac)


class BookieProcess(sandbox.BookieProcess):
    """The sandbox's bookie process, with fault injection on by default for tests."""

    def __init__(self, *args: object, fault_injection: bool = True, **kw: object) -> None:
        super().__init__(*args, fault_injection=fault_injection, **kw)  # type: ignore[arg-type]


class RawClient:
    """A minimal blocking v3 client: send framed Requests, match Responses by txnId."""

    _txn = itertools.count(1)

    def __init__(self, address: tuple[str, int], timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(address, timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = bytearray()
        self._pending: dict[int, pb.Response] = {}

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # framing

    def send_request(self, req: pb.Request) -> int:
        self.sock.sendall(encode_frame(req.SerializeToString()))
        return req.header.txnId

    def send_many(self, reqs: list[pb.Request]) -> list[int]:
        self.sock.sendall(b"".join(encode_frame(r.SerializeToString()) for r in reqs))
        return [r.header.txnId for r in reqs]

    def read_frame(self) -> bytes:
        while True:
            if len(self._buf) >= 4:
                (n,) = struct.unpack_from(">I", self._buf, 0)
                if len(self._buf) >= 4 + n:
                    frame = bytes(self._buf[4 : 4 + n])
                    del self._buf[: 4 + n]
                    return frame
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("bookie closed the connection")
            self._buf += data

    def response(self, txn: int) -> pb.Response:
        """The reply to ``txn`` (other replies arriving first are kept)."""
        while txn not in self._pending:
            resp = pb.Response.FromString(self.read_frame())
            assert resp.IsInitialized(), resp.FindInitializationErrors()
            self._pending[resp.header.txnId] = resp
        return self._pending.pop(txn)

    def call(self, req: pb.Request) -> pb.Response:
        return self.response(self.send_request(req))

    # request builders

    @classmethod
    def request(cls, op: int, priority: int | None = None) -> pb.Request:
        req = pb.Request()
        req.header.version = pb.VERSION_THREE
        req.header.operation = op
        req.header.txnId = next(cls._txn)
        if priority is not None:
            req.header.priority = priority
        return req

    @classmethod
    def add_req(
        cls,
        ledger_id: int,
        entry_id: int,
        body: bytes | None = None,
        *,
        key: bytes = KEY,
        recovery: bool = False,
        priority: int | None = None,
        write_flags: int | None = None,
    ) -> pb.Request:
        req = cls.request(pb.ADD_ENTRY, priority)
        a = req.addRequest
        a.ledgerId = ledger_id
        a.entryId = entry_id
        a.masterKey = key
        a.body = body if body is not None else entry_body(ledger_id, entry_id, b"x" * 16)
        if recovery:
            a.flag = pb.AddRequest.RECOVERY_ADD
        if write_flags is not None:
            a.writeFlags = write_flags
        return req

    @classmethod
    def read_req(
        cls, ledger_id: int, entry_id: int, *, fence_key: bytes | None = None, fence: bool = False
    ) -> pb.Request:
        req = cls.request(pb.READ_ENTRY)
        r = req.readRequest
        r.ledgerId = ledger_id
        r.entryId = entry_id
        if fence or fence_key is not None:
            r.flag = pb.ReadRequest.FENCE_LEDGER
        if fence_key is not None:
            r.masterKey = fence_key
        return req

    def add(
        self,
        ledger_id: int,
        entry_id: int,
        body: bytes | None = None,
        *,
        key: bytes = KEY,
        recovery: bool = False,
        priority: int | None = None,
    ) -> int:
        """One add; returns the status (after checking the reply echoes the ids)."""
        req = self.add_req(ledger_id, entry_id, body, key=key, recovery=recovery, priority=priority)
        resp = self.call(req)
        assert resp.addResponse.ledgerId == ledger_id
        assert resp.addResponse.entryId == entry_id
        assert resp.status == resp.addResponse.status
        return resp.status

    def read(
        self,
        ledger_id: int,
        entry_id: int,
        *,
        fence_key: bytes | None = None,
        fence: bool = False,
    ) -> pb.Response:
        resp = self.call(self.read_req(ledger_id, entry_id, fence_key=fence_key, fence=fence))
        assert resp.status == resp.readResponse.status
        return resp

    def read_lac(self, ledger_id: int) -> pb.Response:
        req = self.request(pb.READ_LAC)
        req.readLacRequest.ledgerId = ledger_id
        return self.call(req)

    def write_lac(self, ledger_id: int, lac: int, *, key: bytes = KEY) -> pb.Response:
        req = self.request(pb.WRITE_LAC)
        w = req.writeLacRequest
        w.ledgerId = ledger_id
        w.lac = lac
        w.masterKey = key
        w.body = lac_body(ledger_id, lac)
        return self.call(req)

    def force(self, ledger_id: int) -> pb.Response:
        req = self.request(pb.FORCE_LEDGER)
        req.forceLedgerRequest.ledgerId = ledger_id
        return self.call(req)

    def list_entries(self, ledger_id: int) -> pb.Response:
        req = self.request(pb.GET_LIST_OF_ENTRIES_OF_LEDGER)
        req.getListOfEntriesOfLedgerRequest.ledgerId = ledger_id
        return self.call(req)

    def bookie_info(self, requested: int = 3) -> pb.Response:
        req = self.request(pb.GET_BOOKIE_INFO)
        req.getBookieInfoRequest.requested = requested
        return self.call(req)

    def add_many(self, ledger_id: int, entry_ids: Iterable[int], payload: bytes) -> list[int]:
        """Pipelined adds; returns the statuses in entry order."""
        reqs = [self.add_req(ledger_id, e, entry_body(ledger_id, e, payload)) for e in entry_ids]
        txns = self.send_many(reqs)
        return [self.response(t).status for t in txns]

    # v2

    def v2_call(self, frame: bytes) -> bytes:
        """Send one raw v2 message (unframed) and return the next reply frame."""
        self.sock.sendall(encode_frame(frame))
        return self.read_frame()


def v2_add(ledger_id: int, entry_id: int, payload: bytes = b"v2", flags: int = 0) -> bytes:
    return (
        struct.pack(">i", (2 << 24) | (1 << 16) | flags)
        + KEY
        + entry_body(ledger_id, entry_id, payload)
    )


def v2_read(ledger_id: int, entry_id: int, flags: int = 0, key: bytes | None = None) -> bytes:
    msg = struct.pack(">iqq", (2 << 24) | (2 << 16) | flags, ledger_id, entry_id)
    return msg + (key or b"")


def wait_for_znode(zk: KazooClient, path: str, timeout: float = 30.0) -> bytes:
    """Wait (with a watch, not a sleep) until ``path`` exists; returns its data."""
    deadline = time.monotonic() + timeout
    while True:
        event = threading.Event()
        stat = zk.exists(path, watch=lambda _e, ev=event: ev.set())
        if stat is not None:
            try:
                return zk.get(path)[0]
            except NoNodeError:
                # Gone between exists and get: a restarted bookie's old ephemeral registration
                # expiring, or a readonly switch re-registering. Wait for the next one.
                if time.monotonic() < deadline:
                    continue
                raise TimeoutError(f"znode {path} vanished, not back in {timeout}s") from None
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not event.wait(remaining):
            raise TimeoutError(f"znode {path} did not appear within {timeout}s")


def rule_hits(admin: AdminClient, rule_id: int) -> int:
    """How many requests the bookie's fault rule ``rule_id`` matched so far."""
    return next(int(r["hits"]) for r in admin.faults() if r["id"] == rule_id)


def wait_rule_hits(admin: AdminClient, rule_id: int, hits: int, timeout: float = 10.0) -> None:
    """Wait until the bookie's fault rule ``rule_id`` has applied to ``hits`` requests: the
    requests it holds have reached the bookie (a fixed sleep may be too short under load)."""
    deadline = time.monotonic() + timeout
    while True:
        got = rule_hits(admin, rule_id)
        if got >= hits:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"fault rule {rule_id}: {got} of {hits} requests in {timeout}s")
        time.sleep(0.02)


def wait_for_no_znode(zk: KazooClient, path: str, timeout: float = 30.0) -> None:
    """Wait until ``path`` does not exist."""
    deadline = time.monotonic() + timeout
    while True:
        event = threading.Event()
        if zk.exists(path, watch=lambda _e, ev=event: ev.set()) is None:
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not event.wait(remaining):
            raise TimeoutError(f"znode {path} still exists after {timeout}s")
