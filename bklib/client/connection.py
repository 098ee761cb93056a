"""One pipelined v3 protobuf connection to one bookie (asyncio): the v3 operations.

:class:`BookieConnection` speaks BookKeeper's v3 protocol (``BookkeeperProtocol.proto``) as a
Java ``PerChannelBookieClient`` does: replies are matched on (txnId, operation), and each
operation's status is the one of its sub-response when the top level is EOK.

The connection underneath (reconnect with back-off, deadlines, corked sends, START_TLS, failing
a lost connection's requests with an unknown outcome) is
:class:`~bklib.client.transport.PipelinedConnection`, shared with the v2 client
(:mod:`bklib.client.connection_v2`); the operations' configuration and registry are in
:mod:`bklib.client.operations`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bklib.client.operations import ReadResult, bookie_operation
from bklib.client.outcomes import Outcome, Pending, RequestExpired
from bklib.client.responses import parse_response
from bklib.client.transport import Channel, PipelinedConnection
from bklib.errors import BKError, BKTimeoutError, IncorrectParameterError, ReadError, WriteError
from bklib.proto import protocol_pb2 as pb
from bklib.proto.framing import encode_frame
from bklib.proto.status import is_write_op
from bklib.records import frozen_record

log = logging.getLogger(__name__)

__all__ = [
    "BOOKIE_INFO_ALL",
    "HIGH_PRIORITY",
    "OPERATIONS",
    "WRITE_FLAG_DEFERRED_SYNC",
    "BookieConnection",
    "BookieInfo",
    "ReadLacResult",
]

# BookKeeper marks high-priority v3 requests with this header priority; the bookie only tests
# priority > 0.
HIGH_PRIORITY = 100
# GetBookieInfoRequest.Flags: TOTAL_DISK_CAPACITY | FREE_DISK_SPACE, what the Java client asks.
BOOKIE_INFO_ALL = 0x03
# AddRequest.writeFlags bit for DEFERRED_SYNC (ack before fsync; FORCE_LEDGER makes it durable).
WRITE_FLAG_DEFERRED_SYNC = 0x01

OPERATIONS: dict[str, str] = {}
"""The bookie operations of :class:`BookieConnection` by method name, each with the
:class:`ClientConfig` field holding its default timeout. The pool and the blocking client offer
each of them per bookie id, derived from the method (see :mod:`bklib.client.pool`)."""


@dataclass(frozen=True)
class ReadLacResult:
    """READ_LAC answer: the explicit LAC body (16 + D bytes) if the bookie has one, and its
    highest stored entry if it has any. The LAC is the max of the two."""

    lac_body: bytes | None
    last_entry_body: bytes | None


@dataclass(frozen=True)
class BookieInfo:
    """GET_BOOKIE_INFO answer in bytes; None for a value the bookie did not send."""

    total_disk_capacity: int | None
    free_disk_space: int | None


# Which Response sub-message carries each operation's own status.
_SUB_RESPONSE = {
    pb.READ_ENTRY: "readResponse",
    pb.ADD_ENTRY: "addResponse",
    pb.WRITE_LAC: "writeLacResponse",
    pb.READ_LAC: "readLacResponse",
    pb.GET_BOOKIE_INFO: "getBookieInfoResponse",
    pb.FORCE_LEDGER: "forceLedgerResponse",
    pb.GET_LIST_OF_ENTRIES_OF_LEDGER: "getListOfEntriesOfLedgerResponse",
}


class BookieConnection(PipelinedConnection):
    """The client side of one bookie: a single pipelined v3 connection, re-established on demand.

    ``address`` is a fixed (host, port) or an :data:`AddressResolver`. Every error raised names
    the bookie id and, where it applies, the ledger and entry.
    """

    def _on_frame(self, ch: Channel, frame: bytes) -> None:
        self._dispatch(ch, parse_response(frame))

    # ---- receiving -----------------------------------------------------------------------------

    def _dispatch(self, ch: Channel, resp: pb.Response) -> None:
        key = (resp.header.txnId, resp.header.operation)
        pending = ch.pending.pop(key, None)
        if pending is None:
            # A reply to a request that already timed out or was cancelled; Java drops them too.
            log.debug("bookie %s: dropping unmatched response %s", self.bookie_id, key)
            return
        if not pending.future.done():
            pending.future.set_result(resp)

    # ---- sending -------------------------------------------------------------------------------

    async def _call(
        self,
        op: pb.OperationType,
        fill: Callable[[pb.Request], None],
        *,
        timeout: float,
        ledger_id: int | None,
        entry_id: int | None = None,
        high_priority: bool = False,
    ) -> Any:
        """Send one request and return the operation's sub-response (status already EOK)."""
        req = pb.Request()
        req.header.version = pb.VERSION_THREE
        req.header.operation = op
        if high_priority:
            # Java leaves priority absent for normal requests.
            req.header.priority = HIGH_PRIORITY
        fill(req)
        ch = await self._ensure_channel(ledger_id, entry_id)
        txn = next(self._txn_ids)
        req.header.txnId = txn
        frame = encode_frame(req.SerializeToString())
        self._check_frame_size(frame, ledger_id, entry_id)
        fut: asyncio.Future[pb.Response] = asyncio.get_running_loop().create_future()
        key = (txn, op)
        timer = self._enqueue(ch, key, Pending(fut, ledger_id, entry_id), frame, timeout)
        try:
            if self._must_drain(ch):
                await self._drain(ch)
            resp = await fut
        except RequestExpired:
            raise BKTimeoutError(
                f"{pb.OperationType.Name(op)} timed out after {timeout}s",
                ledger_id=ledger_id,
                entry_id=entry_id,
                bookie=self.bookie_id,
            ) from None
        finally:
            if timer is not None:
                timer.cancel()
            ch.pending.pop(key, None)
        return self._check_status(resp, op, ledger_id=ledger_id, entry_id=entry_id)

    def _check_status(
        self,
        resp: pb.Response,
        op: pb.OperationType,
        *,
        ledger_id: int | None,
        entry_id: int | None,
    ) -> Any:
        name = _SUB_RESPONSE[op]
        # Java uses the sub-response status only when the top level is EOK and the sub-message is
        # present; otherwise the top-level status.
        if resp.status != pb.EOK:
            raise self._status_error(resp.status, op, ledger_id=ledger_id, entry_id=entry_id)
        if not resp.HasField(name):
            cls = WriteError if is_write_op(op) else ReadError
            raise cls(
                f"{pb.OperationType.Name(op)} answered EOK without {name}",
                ledger_id=ledger_id,
                entry_id=entry_id,
                bookie=self.bookie_id,
            )
        sub = getattr(resp, name)
        if sub.status != pb.EOK:
            raise self._status_error(sub.status, op, ledger_id=ledger_id, entry_id=entry_id)
        return sub

    # ---- operations ----------------------------------------------------------------------------

    @bookie_operation("add_timeout", OPERATIONS)
    async def add(
        self,
        ledger_id: int,
        entry_id: int,
        master_key: bytes,
        body: bytes,
        *,
        recovery: bool = False,
        high_priority: bool = False,
        write_flags: int = 0,
        timeout: float | None = None,
    ) -> None:
        """Store one entry. ``body`` is the digest-framed entry (bklib.digest).

        Ledger recovery re-adds with ``recovery=True, high_priority=True``; re-replication uses
        ``recovery=True`` alone. A recovery add is accepted on a fenced ledger.
        """

        def fill(req: pb.Request) -> None:
            a = req.addRequest
            a.ledgerId = ledger_id
            a.entryId = entry_id
            a.masterKey = master_key
            a.body = body
            if recovery:
                a.flag = pb.AddRequest.RECOVERY_ADD
            if write_flags:
                a.writeFlags = write_flags  # Java sets it only when non-empty

        await self._call(
            pb.ADD_ENTRY,
            fill,
            timeout=self.config.timeout_for("add", timeout),
            ledger_id=ledger_id,
            entry_id=entry_id,
            high_priority=high_priority,
        )

    @bookie_operation("read_timeout", OPERATIONS)
    async def read(
        self,
        ledger_id: int,
        entry_id: int,
        *,
        fence: bool = False,
        master_key: bytes | None = None,
        high_priority: bool = False,
        timeout: float | None = None,
    ) -> ReadResult:
        """Read one entry; ``entry_id=-1`` returns the highest entry the bookie stores.

        ``fence=True`` fences the ledger on this bookie and needs ``master_key`` (a fencing
        read-LAC sends no priority; a recovery read is fence + ``high_priority``). The key is sent
        only with fencing reads, as Java does.
        """
        if fence and master_key is None:
            raise IncorrectParameterError(
                "a fencing read needs the master key",
                ledger_id=ledger_id,
                entry_id=entry_id,
                bookie=self.bookie_id,
            )

        def fill(req: pb.Request) -> None:
            r = req.readRequest
            r.ledgerId = ledger_id
            r.entryId = entry_id
            if fence:
                r.flag = pb.ReadRequest.FENCE_LEDGER
                r.masterKey = master_key or b""

        sub: pb.ReadResponse = await self._call(
            pb.READ_ENTRY,
            fill,
            timeout=self.config.timeout_for("read", timeout),
            ledger_id=ledger_id,
            entry_id=entry_id,
            high_priority=high_priority,
        )
        return self._read_result(sub, ledger_id, entry_id)

    def _read_result(self, sub: pb.ReadResponse, ledger_id: int, entry_id: int) -> ReadResult:
        if not sub.HasField("body"):
            # Only long-poll reads (not offered here) may succeed without a body.
            raise ReadError(
                "READ_ENTRY answered EOK without a body",
                ledger_id=ledger_id,
                entry_id=entry_id,
                bookie=self.bookie_id,
            )
        # Without __init__: a sampled check builds one per entry read (bklib/records.py).
        lac = sub.maxLAC if sub.HasField("maxLAC") else None
        return frozen_record(ReadResult, {"body": sub.body, "max_lac": lac})

    @bookie_operation("read_timeout", OPERATIONS)
    async def read_many(
        self, reads: Sequence[tuple[int, int]], *, timeout: float | None = None
    ) -> list[ReadResult | BKError]:
        """Read several ``(ledger_id, entry_id)`` entries, of one ledger or of many, pipelined,
        and return each one's answer in order: its :class:`ReadResult`, or the error
        :meth:`read` would have raised for it (a timeout, a lost connection and NoSuchEntry
        alike). Each read has its own deadline.

        One future for them all (:class:`~bklib.client.outcomes.RequestGroup`): what a probe,
        a sampled check or a digest check saves over as many :meth:`read` calls. Raises only
        when no read could be sent (the bookie is unavailable, or the client closed).
        """
        timeout = self.config.timeout_for("read", timeout)
        if not reads:
            return []
        req = pb.Request()
        req.header.version = pb.VERSION_THREE
        req.header.operation = pb.READ_ENTRY
        read = req.readRequest

        def request(ch: Channel, lid: int, x: int, out: Outcome) -> tuple[Any, Pending, bytes]:
            txn = next(self._txn_ids)
            req.header.txnId = txn
            read.ledgerId = lid
            read.entryId = x
            frame = encode_frame(req.SerializeToString())
            return (txn, pb.READ_ENTRY), Pending(out, lid, x), frame

        return await self._send_group(reads, timeout, "READ_ENTRY", request, self._read_answer)

    def _read_answer(self, resp: pb.Response, ledger_id: int, entry_id: int) -> ReadResult:
        """A READ_ENTRY reply of a group as :meth:`read` reads it, or the error it raises."""
        sub = self._check_status(resp, pb.READ_ENTRY, ledger_id=ledger_id, entry_id=entry_id)
        return self._read_result(sub, ledger_id, entry_id)

    @bookie_operation("read_timeout", OPERATIONS)
    async def read_lac(self, ledger_id: int, *, timeout: float | None = None) -> ReadLacResult:
        """The bookie's explicit LAC body and last entry for ``ledger_id`` (v3 READ_LAC)."""

        def fill(req: pb.Request) -> None:
            req.readLacRequest.ledgerId = ledger_id

        sub: pb.ReadLacResponse = await self._call(
            pb.READ_LAC,
            fill,
            timeout=self.config.timeout_for("read_lac", timeout),
            ledger_id=ledger_id,
        )
        return ReadLacResult(
            sub.lacBody if sub.HasField("lacBody") else None,
            sub.lastEntryBody if sub.HasField("lastEntryBody") else None,
        )

    @bookie_operation("read_timeout", OPERATIONS)
    async def write_lac(
        self,
        ledger_id: int,
        lac: int,
        master_key: bytes,
        body: bytes,
        *,
        timeout: float | None = None,
    ) -> None:
        """Store an explicit LAC. The bookie takes the value from ``body[8:16]``, so ``body`` must
        be the digest-framed LAC body for ``lac``."""

        def fill(req: pb.Request) -> None:
            w = req.writeLacRequest
            w.ledgerId = ledger_id
            w.lac = lac
            w.masterKey = master_key
            w.body = body

        await self._call(
            pb.WRITE_LAC,
            fill,
            timeout=self.config.timeout_for("write_lac", timeout),
            ledger_id=ledger_id,
        )

    @bookie_operation("read_timeout", OPERATIONS)
    async def force_ledger(self, ledger_id: int, *, timeout: float | None = None) -> None:
        """Return once everything the bookie journaled earlier for ``ledger_id`` is fsynced."""

        def fill(req: pb.Request) -> None:
            req.forceLedgerRequest.ledgerId = ledger_id

        await self._call(
            pb.FORCE_LEDGER,
            fill,
            timeout=self.config.timeout_for("force_ledger", timeout),
            ledger_id=ledger_id,
        )

    @bookie_operation("read_timeout", OPERATIONS)
    async def list_entries(self, ledger_id: int, *, timeout: float | None = None) -> bytes:
        """The raw ``availabilityOfEntriesOfLedger`` bytes for ``ledger_id`` (bklib.availability
        decodes them).

        Java bookies on DbLedgerStorage never answer this; expect BKTimeoutError from them.
        """

        def fill(req: pb.Request) -> None:
            req.getListOfEntriesOfLedgerRequest.ledgerId = ledger_id

        sub: pb.GetListOfEntriesOfLedgerResponse = await self._call(
            pb.GET_LIST_OF_ENTRIES_OF_LEDGER,
            fill,
            timeout=self.config.timeout_for("list_entries", timeout),
            ledger_id=ledger_id,
        )
        if not sub.HasField("availabilityOfEntriesOfLedger"):
            raise ReadError(
                "GET_LIST_OF_ENTRIES_OF_LEDGER answered EOK without availability bytes",
                ledger_id=ledger_id,
                bookie=self.bookie_id,
            )
        return sub.availabilityOfEntriesOfLedger

    @bookie_operation("bookie_info_timeout", OPERATIONS)
    async def bookie_info(
        self, requested: int = BOOKIE_INFO_ALL, *, timeout: float | None = None
    ) -> BookieInfo:
        """Disk capacity and free space (``requested`` is the Flags bitmask; Java sends 3)."""

        def fill(req: pb.Request) -> None:
            req.getBookieInfoRequest.requested = requested

        sub: pb.GetBookieInfoResponse = await self._call(
            pb.GET_BOOKIE_INFO,
            fill,
            timeout=self.config.timeout_for("bookie_info", timeout),
            ledger_id=None,
        )
        return BookieInfo(
            sub.totalDiskCapacity if sub.HasField("totalDiskCapacity") else None,
            sub.freeDiskSpace if sub.HasField("freeDiskSpace") else None,
        )
