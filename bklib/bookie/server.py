"""The bookie's asyncio TCP server: v3 protobuf and v2 binary requests over one framing.

Each connection is a :class:`~bklib.bookie.connection.Connection` (an
:class:`asyncio.Protocol`): bytes are split into frames in bulk, each frame is classified by
its first byte (below 0x08: v2, otherwise a v3 ``Request``) and handled inline; replies are
corked per connection and written once per loop iteration, so a pipelining client costs one
``send`` per batch rather than per response. Adds are answered from the journal's durability
callback, i.e. after the fsync of their group-commit batch.
Replies can therefore leave in a different order than requests came in; v3 replies carry the
request's txnId and operation, v2 replies the ids the client matches on.

A frame that cannot be a request (bad protobuf, missing required fields, truncated v2 fields,
an unsupported v2 opcode, a length prefix over the limit) closes only its connection, with the
reason logged; nothing a peer sends can stop the server.

TLS (``tls``: :class:`~bklib.tls.TlsSettings`) follows ``processStartTLSRequestV3``: a v3
START_TLS request is answered EOK in plaintext, then the connection's transport is upgraded
with a server-side handshake (client certificate required with ``client_authentication``). A
bookie without TLS answers START_TLS with EBADREQ. Stricter than a Java bookie, which serves
plaintext clients too: a TLS bookie of ours refuses every request before START_TLS with EUA
(what Java answers an unauthenticated client), so a client that forgot TLS fails visibly.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

from google.protobuf.message import DecodeError

from bklib.availability import encode as encode_availability
from bklib.availability import from_entry_ids
from bklib.bookie.connection import Connection, RateLimitedLog
from bklib.bookie.faults import FaultInjector, FaultRule, FaultyConnection
from bklib.bookie.journal import JournalError
from bklib.bookie.storage import LedgerState, Storage, StorageError
from bklib.bookie.v2 import AUTH_DISABLED_PLUGIN, V2Handlers
from bklib.errors import NoSuchEntryError, NoSuchLedgerError, UnauthorizedAccessError
from bklib.proto import protocol_pb2 as pb
from bklib.proto.framing import MAX_FRAME_SIZE, is_v2_frame
from bklib.proto.status import status_code
from bklib.tls import TlsContextSource, TlsSettings

log = logging.getLogger(__name__)

_LEN = struct.Struct(">I")
_IDS = struct.Struct(">qq")

EOK, EIO, EBADREQ, EUA = pb.EOK, pb.EIO, pb.EBADREQ, pb.EUA
ENOENTRY, ENOLEDGER, EFENCED, EREADONLY = pb.ENOENTRY, pb.ENOLEDGER, pb.EFENCED, pb.EREADONLY
VERSION_THREE = pb.VERSION_THREE
FENCE_LEDGER = pb.ReadRequest.FENCE_LEDGER
ENTRY_PIGGYBACK = pb.ReadRequest.ENTRY_PIGGYBACK
DEFERRED_SYNC = 1
MAX_LONG_POLL_S = 60.0


class BookieServer(V2Handlers):
    """Protocol handling over a :class:`Storage`. ``name`` is the bookie id used in logs."""

    def __init__(
        self,
        storage: Storage,
        *,
        name: str,
        max_frame: int = MAX_FRAME_SIZE,
        faults: FaultInjector | None = None,
        tls: TlsSettings | None = None,
    ) -> None:
        self.storage = storage
        self.tls = TlsContextSource(tls, "server") if tls is not None else None
        if self.tls is not None:
            self.tls.get()  # a bad certificate or key refuses the start, not each handshake
        self.journal = storage.journal
        self.name = name
        self.max_frame = max_frame
        self.faults = faults
        self.forced_readonly = False
        self.disk_readonly = False
        self.connections: set[Connection] = set()
        self.conn_log = RateLimitedLog()
        self._server: asyncio.Server | None = None
        # Constructed on the loop that runs it: replies are scheduled with call_soon.
        self.loop = asyncio.get_running_loop()
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0
        self._v3: dict[int, Callable[[Any, pb.Request], None]] = {
            pb.ADD_ENTRY: self._v3_add,
            pb.READ_ENTRY: self._v3_read,
            pb.READ_LAC: self._v3_read_lac,
            pb.WRITE_LAC: self._v3_write_lac,
            pb.FORCE_LEDGER: self._v3_force_ledger,
            pb.GET_LIST_OF_ENTRIES_OF_LEDGER: self._v3_list_entries,
            pb.GET_BOOKIE_INFO: self._v3_bookie_info,
            pb.AUTH: self._v3_auth,
            pb.START_TLS: self._v3_start_tls,
        }

    def keep(self, task: asyncio.Task[None]) -> None:
        """Hold a reference to ``task`` until it is done (a loop keeps only weak ones); the
        server cancels what is left when it stops."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @property
    def readonly(self) -> bool:
        """Read-only when forced, when the disk is (nearly) full or the journal failed."""
        return self.forced_readonly or self.disk_readonly or self.journal.failed is not None

    async def start(self, sock: socket.socket) -> None:
        """Serve on an already bound socket (bound early so the bookie id is known)."""
        self._server = await self.loop.create_server(
            lambda: Connection(self), sock=sock, backlog=1024
        )
        host, self.port = sock.getsockname()[:2]
        log.info("bookie %s: listening on %s:%d", self.name, host, self.port)

    async def stop(self) -> None:
        """Stop accepting and drop every connection."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.abort()
        self.connections.clear()
        for task in list(self._tasks):
            task.cancel()

    # -- frame dispatch --------------------------------------------------------------------

    def handle_frame(self, conn: Connection, frame: bytes) -> None:
        if not is_v2_frame(frame):
            try:
                req = pb.Request.FromString(frame)
            except (DecodeError, ValueError, RuntimeError) as exc:
                conn.abort(f"undecodable v3 request ({len(frame)} bytes): {exc}")
                return
            # upb does not enforce proto2 `required` on parse; Java's parser does.
            if not req.IsInitialized():
                conn.abort(f"v3 request missing required fields: {req.FindInitializationErrors()}")
                return
            if self.tls is not None and not conn.encrypted and not _tls_free(req.header.operation):
                self._refuse_plaintext(conn, pb.OperationType.Name(req.header.operation))
                conn.send(self._v3_error(req, EUA))
                return
            self.handle_v3(conn, req)
        else:
            try:
                if self.tls is not None and not conn.encrypted and self.refuse_v2(conn, frame):
                    self._refuse_plaintext(conn, "v2 request")
                    return
                self.handle_v2(conn, frame)
            except struct.error as exc:
                conn.abort(f"truncated v2 request: {exc}")

    def _refuse_plaintext(self, conn: Connection, what: str) -> None:
        self.conn_log(
            "bookie %s: %s from %s refused with EUA: TLS is required (START_TLS first)",
            self.name,
            what,
            conn.peer,
        )

    # -- v3 --------------------------------------------------------------------------------

    def handle_v3(self, conn: Any, req: pb.Request) -> None:
        """Dispatch one parsed v3 request (fault rules first, when enabled)."""
        if self.faults is not None and self.faults.rules:
            op = req.header.operation
            ledger, entry, fence = _v3_target(req)
            rule = self.faults.match(pb.OperationType.Name(op), ledger, entry, fence)
            if rule is not None:
                self._apply_fault_v3(conn, req, rule)
                return
        self._dispatch_v3(conn, req)

    def _dispatch_v3(self, conn: Any, req: pb.Request) -> None:
        hdr = req.header
        handler = self._v3.get(hdr.operation)
        if handler is None:
            # RANGE_*, START_TLS (no TLS here), BATCH_READ_ENTRY (v2 only): header copied.
            resp = pb.Response(status=EBADREQ)
            resp.header.CopyFrom(hdr)
            conn.send(resp.SerializeToString())
            return
        if hdr.version != VERSION_THREE:
            conn.send(self._v3_error(req, pb.EBADVERSION))
            return
        try:
            handler(conn, req)
        except Exception:
            log.exception(
                "bookie %s: unexpected error in %s (txn %d)",
                self.name,
                pb.OperationType.Name(hdr.operation),
                hdr.txnId,
            )
            conn.send(self._v3_error(req, EBADREQ))

    def _apply_fault_v3(self, conn: Any, req: pb.Request, rule: FaultRule) -> None:
        if rule.after:
            faulty = FaultyConnection(
                conn, rule, lambda st: self._v3_error(req, status_code(st)), v2=False
            )
            self._dispatch_v3(faulty, req)
        elif rule.action == "delay":
            self.loop.call_later(rule.delay_ms / 1000, self._dispatch_v3, conn, req)
        elif rule.action == "fail":
            conn.send(self._v3_error(req, status_code(rule.status)))
        # "drop": neither processed nor answered

    @staticmethod
    def _response(req: pb.Request, status: pb.StatusCode) -> pb.Response:
        resp = pb.Response(status=status)
        h = resp.header
        h.version = VERSION_THREE
        h.operation = req.header.operation
        h.txnId = req.header.txnId
        return resp

    def _v3_error(self, req: pb.Request, status: pb.StatusCode) -> bytes:
        """A complete error reply for ``req``: every required field of the sub-response set."""
        resp = self._response(req, status)
        op = req.header.operation
        if op == pb.READ_ENTRY:
            sub = resp.readResponse
            sub.status = status
            sub.ledgerId = req.readRequest.ledgerId
            sub.entryId = req.readRequest.entryId
        elif op == pb.ADD_ENTRY:
            sub2 = resp.addResponse
            sub2.status = status
            sub2.ledgerId = req.addRequest.ledgerId
            sub2.entryId = req.addRequest.entryId
        elif op == pb.WRITE_LAC:
            resp.writeLacResponse.status = status
            resp.writeLacResponse.ledgerId = req.writeLacRequest.ledgerId
        elif op == pb.READ_LAC:
            resp.readLacResponse.status = status
            resp.readLacResponse.ledgerId = req.readLacRequest.ledgerId
        elif op == pb.FORCE_LEDGER:
            resp.forceLedgerResponse.status = status
            resp.forceLedgerResponse.ledgerId = req.forceLedgerRequest.ledgerId
        elif op == pb.GET_BOOKIE_INFO:
            resp.getBookieInfoResponse.status = status
        elif op == pb.GET_LIST_OF_ENTRIES_OF_LEDGER:
            sub3 = resp.getListOfEntriesOfLedgerResponse
            sub3.status = status
            sub3.ledgerId = req.getListOfEntriesOfLedgerRequest.ledgerId
        else:
            resp.header.CopyFrom(req.header)
        data: bytes = resp.SerializeToString()
        return data

    def _reply_when_durable(self, conn: Any, req: pb.Request, seq: int, data: bytes) -> None:
        def done(exc: BaseException | None) -> None:
            if exc is None:
                conn.send(data)
            else:
                conn.send(self._v3_error(req, EIO))

        if self.journal.is_durable(seq):
            conn.send(data)
        else:
            self.journal.when_durable(seq, done)

    # add

    def _add(
        self, body: bytes, key: bytes, recovery: bool, high_priority: bool
    ) -> tuple[pb.StatusCode, int]:
        """Common add path; returns (status, journal batch to wait for)."""
        # High-priority (recovery) adds pass while the disk still has room, as on a Java bookie
        # (``isAvailableForHighPriorityWrites``).
        if self.disk_readonly or (self.forced_readonly and not high_priority):
            return EREADONLY, 0
        if len(body) < 16:
            return EBADREQ, 0
        ledger_id, entry_id = _IDS.unpack_from(body, 0)
        storage = self.storage
        state = storage.ledgers.get(ledger_id)
        try:
            if state is None or state.master_key != key:
                state = storage.handle(ledger_id, key)
            if state.fenced and not recovery:
                log.debug(
                    "bookie %s: add to fenced ledger %d entry %d", self.name, ledger_id, entry_id
                )
                return EFENCED, 0
            return EOK, storage.add_entry(state, entry_id, body)
        except UnauthorizedAccessError:
            log.info("bookie %s: wrong master key for ledger %d (add)", self.name, ledger_id)
            return EUA, 0
        except JournalError as exc:
            log.error(
                "bookie %s: ledger %d entry %d not stored: %s", self.name, ledger_id, entry_id, exc
            )
            return EIO, 0

    def _v3_add(self, conn: Any, req: pb.Request) -> None:
        if not req.HasField("addRequest"):
            conn.send(self._v3_error(req, EBADREQ))
            return
        add = req.addRequest
        recovery = add.HasField("flag") and add.flag == pb.AddRequest.RECOVERY_ADD
        status, seq = self._add(add.body, add.masterKey, recovery, req.header.priority > 0)
        resp = self._response(req, status)
        sub = resp.addResponse
        sub.status = status
        sub.ledgerId = add.ledgerId
        sub.entryId = add.entryId
        data = resp.SerializeToString()
        if status != EOK or add.writeFlags & DEFERRED_SYNC:
            conn.send(data)
        else:
            self._reply_when_durable(conn, req, seq, data)

    # read

    def _fence(self, ledger_id: int, key: bytes) -> tuple[pb.StatusCode, LedgerState | None, int]:
        """Create-or-check and fence; returns (status, state, journal batch)."""
        try:
            state = self.storage.handle(ledger_id, key)
            return EOK, state, self.storage.fence(state)
        except UnauthorizedAccessError:
            log.info("bookie %s: wrong master key for ledger %d (fence)", self.name, ledger_id)
            return EUA, None, 0
        except JournalError as exc:
            log.error("bookie %s: ledger %d not fenced: %s", self.name, ledger_id, exc)
            return EIO, None, 0

    def _read(
        self, ledger_id: int, entry_id: int
    ) -> tuple[pb.StatusCode, bytes | None, LedgerState | None]:
        state = self.storage.ledgers.get(ledger_id)
        if state is None:
            return ENOLEDGER, None, None
        try:
            return EOK, self.storage.read_from(state, entry_id), state
        except NoSuchEntryError:
            return ENOENTRY, None, state
        except StorageError:
            return EIO, None, state

    def _v3_read(self, conn: Any, req: pb.Request) -> None:
        if not req.HasField("readRequest"):
            conn.send(self._v3_error(req, EBADREQ))
            return
        rr = req.readRequest
        flag = rr.flag if rr.HasField("flag") else 0
        if flag == FENCE_LEDGER:
            self._v3_fence_read(conn, req)
            return
        if rr.HasField("previousLAC"):
            self.keep(self.loop.create_task(self._v3_long_poll(conn, req)))
            return
        if flag == ENTRY_PIGGYBACK:
            conn.send(self._v3_error(req, EBADREQ))
            return
        status, body, state = self._read(rr.ledgerId, rr.entryId)
        resp = self._response(req, status)
        sub = resp.readResponse
        sub.status = status
        sub.ledgerId = rr.ledgerId
        sub.entryId = rr.entryId
        if body is not None and state is not None:
            sub.body = body
            sub.maxLAC = state.lac
        conn.send(resp.SerializeToString())

    def _v3_fence_read(self, conn: Any, req: pb.Request) -> None:
        rr = req.readRequest
        if not rr.HasField("masterKey"):
            conn.send(self._v3_error(req, EUA))
            return
        status, state, seq = self._fence(rr.ledgerId, rr.masterKey)
        if state is None:
            conn.send(self._v3_error(req, status))
            return
        try:
            body = self.storage.read_from(state, rr.entryId)
        except NoSuchEntryError:
            # Answered at once; the ledger is fenced all the same (as Java's ReadEntryProcessorV3).
            conn.send(self._v3_error(req, ENOENTRY))
            return
        except StorageError:
            conn.send(self._v3_error(req, EIO))
            return
        resp = self._response(req, EOK)
        sub = resp.readResponse
        sub.status = EOK
        sub.ledgerId = rr.ledgerId
        sub.entryId = rr.entryId
        sub.body = body
        # The reply waits until the fence is on disk: after it the writer can no longer win.
        self._reply_when_durable(conn, req, seq, resp.SerializeToString())

    async def _v3_long_poll(self, conn: Any, req: pb.Request) -> None:
        rr = req.readRequest
        piggyback = rr.HasField("flag") and rr.flag == ENTRY_PIGGYBACK
        if piggyback and rr.entryId != -1:
            conn.send(self._v3_error(req, EBADREQ))
            return
        state = self.storage.ledgers.get(rr.ledgerId)
        if state is None:
            conn.send(self._v3_error(req, ENOLEDGER))
            return
        prev = rr.previousLAC
        updated = False
        deadline = self.loop.time() + min(max(rr.timeOut, 0) / 1000, MAX_LONG_POLL_S)
        # Wait until the known LAC passes previousLAC (any smaller raise wakes us too).
        while state.lac <= prev and (remaining := deadline - self.loop.time()) > 0:
            fut: asyncio.Future[None] = self.loop.create_future()
            state.lac_waiters.append(fut)
            try:
                await asyncio.wait_for(fut, remaining)
            except asyncio.TimeoutError:
                break
            finally:
                if fut in state.lac_waiters:
                    state.lac_waiters.remove(fut)
            updated = state.lac > prev
        resp = self._response(req, EOK)
        sub = resp.readResponse
        sub.status = EOK
        sub.ledgerId = rr.ledgerId
        sub.entryId = rr.entryId
        sub.maxLAC = state.lac
        if updated:
            sub.lacUpdateTimestamp = int(time.time() * 1000)
        if piggyback and state.lac > prev:
            try:
                sub.body = self.storage.read_from(state, prev + 1)
                sub.entryId = prev + 1
            except NoSuchEntryError:
                pass  # EOK without a body, as the Java bookie answers
            except StorageError:
                conn.send(self._v3_error(req, EIO))
                return
        elif not piggyback:
            status, body, _ = self._read(rr.ledgerId, rr.entryId)
            if status != EOK:
                conn.send(self._v3_error(req, status))
                return
            assert body is not None
            sub.body = body
        conn.send(resp.SerializeToString())

    # LAC

    def _v3_read_lac(self, conn: Any, req: pb.Request) -> None:
        lid = req.readLacRequest.ledgerId
        state = self.storage.ledgers.get(lid)
        if state is None:
            conn.send(self._v3_error(req, ENOLEDGER))
            return
        last: bytes | None = None
        status = EOK
        try:
            last = self.storage.read_from(state, -1)
        except NoSuchEntryError:
            # As Java's ReadLacProcessorV3: nothing at all is ENOENTRY; an explicit LAC without
            # entries is EIO.
            status = ENOENTRY if state.explicit_lac is None else EIO
        except StorageError:
            status = EIO
        resp = self._response(req, status)
        sub = resp.readLacResponse
        sub.status = status
        sub.ledgerId = lid
        if state.explicit_lac is not None:
            sub.lacBody = state.explicit_lac
        if last is not None:
            sub.lastEntryBody = last
        conn.send(resp.SerializeToString())

    def _v3_write_lac(self, conn: Any, req: pb.Request) -> None:
        if self.readonly:
            conn.send(self._v3_error(req, EREADONLY))
            return
        w = req.writeLacRequest
        if len(w.body) < 16:
            conn.send(self._v3_error(req, EBADREQ))
            return
        try:
            state = self.storage.handle(w.ledgerId, w.masterKey)
            seq = self.storage.set_explicit_lac(state, w.body)
        except UnauthorizedAccessError:
            log.info("bookie %s: wrong master key for ledger %d (write LAC)", self.name, w.ledgerId)
            conn.send(self._v3_error(req, EUA))
            return
        except JournalError as exc:
            log.error("bookie %s: ledger %d LAC not stored: %s", self.name, w.ledgerId, exc)
            conn.send(self._v3_error(req, EIO))
            return
        resp = self._response(req, EOK)
        resp.writeLacResponse.status = EOK
        resp.writeLacResponse.ledgerId = w.ledgerId
        self._reply_when_durable(conn, req, seq, resp.SerializeToString())

    def _v3_force_ledger(self, conn: Any, req: pb.Request) -> None:
        lid = req.forceLedgerRequest.ledgerId
        if self.journal.failed is not None:
            conn.send(self._v3_error(req, EIO))
            return
        resp = self._response(req, EOK)
        resp.forceLedgerResponse.status = EOK
        resp.forceLedgerResponse.ledgerId = lid
        self._reply_when_durable(conn, req, self.journal.request_sync(), resp.SerializeToString())

    # info

    def _v3_list_entries(self, conn: Any, req: pb.Request) -> None:
        lid = req.getListOfEntriesOfLedgerRequest.ledgerId
        try:
            ids = self.storage.entry_ids(lid)
        except NoSuchLedgerError:
            conn.send(self._v3_error(req, ENOLEDGER))
            return
        resp = self._response(req, EOK)
        sub = resp.getListOfEntriesOfLedgerResponse
        sub.status = EOK
        sub.ledgerId = lid
        sub.availabilityOfEntriesOfLedger = encode_availability(from_entry_ids(ids))
        conn.send(resp.SerializeToString())

    def _v3_bookie_info(self, conn: Any, req: pb.Request) -> None:
        requested = req.getBookieInfoRequest.requested
        try:
            st = os.statvfs(self.storage.data_dir)
        except OSError as exc:
            log.error("bookie %s: statvfs failed: %s", self.name, exc)
            conn.send(self._v3_error(req, EIO))
            return
        resp = self._response(req, EOK)
        sub = resp.getBookieInfoResponse
        sub.status = EOK
        if requested & pb.GetBookieInfoRequest.TOTAL_DISK_CAPACITY:
            sub.totalDiskCapacity = st.f_blocks * st.f_frsize
        if requested & pb.GetBookieInfoRequest.FREE_DISK_SPACE:
            sub.freeDiskSpace = st.f_bavail * st.f_frsize
        conn.send(resp.SerializeToString())

    def _v3_start_tls(self, conn: Any, req: pb.Request) -> None:
        if self.tls is None or not isinstance(conn, Connection) or conn.secure or conn.upgrading:
            if self.tls is None:
                log.info(
                    "bookie %s: START_TLS from %s but TLS is not configured",
                    self.name,
                    getattr(conn, "peer", "?"),
                )
            conn.send(self._v3_error(req, EBADREQ))
            return
        resp = self._response(req, EOK)
        resp.startTLSResponse.SetInParent()
        conn.start_tls(resp.SerializeToString(), self.tls)

    def _v3_auth(self, conn: Any, req: pb.Request) -> None:
        # Authentication is disabled: answer as the Java bookie's AuthDisabledPlugin does.
        resp = pb.Response(status=EOK)
        resp.header.CopyFrom(req.header)
        resp.authResponse.authPluginName = AUTH_DISABLED_PLUGIN
        resp.authResponse.payload = b""
        conn.send(resp.SerializeToString())


def _tls_free(op: int) -> bool:
    """Requests a TLS bookie serves before START_TLS: START_TLS itself and the auth
    negotiation (answered as auth-disabled)."""
    return op in (pb.START_TLS, pb.AUTH)


def _v3_target(req: pb.Request) -> tuple[int | None, int | None, bool]:
    """(ledger, entry, fence) a v3 request is about, for fault matching."""
    op = req.header.operation
    if op == pb.READ_ENTRY:
        rr = req.readRequest
        fence = rr.HasField("flag") and rr.flag == FENCE_LEDGER
        return rr.ledgerId, rr.entryId, fence
    if op == pb.ADD_ENTRY:
        return req.addRequest.ledgerId, req.addRequest.entryId, False
    if op == pb.READ_LAC:
        return req.readLacRequest.ledgerId, None, False
    if op == pb.WRITE_LAC:
        return req.writeLacRequest.ledgerId, None, False
    if op == pb.FORCE_LEDGER:
        return req.forceLedgerRequest.ledgerId, None, False
    if op == pb.GET_LIST_OF_ENTRIES_OF_LEDGER:
        return req.getListOfEntriesOfLedgerRequest.ledgerId, None, False
    return None, None, False
