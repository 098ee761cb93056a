"""One pipelined v2 ("PreV3" binary) connection to one bookie (asyncio), with BATCH_READ.

The protocol Pulsar's brokers speak (``useV2WireProtocol``), as Java's ``PerChannelBookieClient``
speaks it, on the machinery of :class:`~bklib.client.transport.PipelinedConnection` (reconnect
with back-off, one deadline timer per channel, one send per loop turn):

* READ and ADD replies carry no request id: they are matched on (operation, ledger, entry), and
  several outstanding requests with the same key are completed in issue order. A late reply to
  a timed-out request is dropped;
* BATCH_READ replies carry the requestId we sent; they are matched on it and checked against
  the request: same ledger and first entry, at most ``max_count`` entries, at most ``max_size``
  bytes unless it is a single entry, each entry's stored header naming the expected ledger and
  entry (consecutive, from the first). A reply that breaks any of this, or any undecodable
  frame, closes the connection: every outstanding request fails with
  :class:`~bklib.client.transport.BadResponseError` naming the bookie, an unknown outcome,
  never a missing entry;
* a lost connection fails outstanding requests with ConnectionLostError, as in v3.

Only READ, ADD and BATCH_READ are offered; the other operations exist in v3 only (Java's v2
client sends them as v3 requests too, except READ_LAC and WRITE_LAC, whose v2 forms our bookie
does not serve).

With TLS (``ClientConfig.tls``) a connection is upgraded before its first v2 request by the
same v3 START_TLS exchange as a v3 connection, as Java's v2 client does (its response decoder
reads that one v3 reply, then v2 only).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bklib.client.operations import ClientConfig, ReadResult, bookie_operation
from bklib.client.outcomes import Outcome, Pending, RequestExpired
from bklib.client.responses import BadFrame
from bklib.client.transport import AddressResolver, Channel, PipelinedConnection
from bklib.errors import (
    BKError,
    BKTimeoutError,
    IllegalOpError,
    IncorrectParameterError,
    ReadError,
    WriteError,
)
from bklib.proto import protocol_pb2 as pb
from bklib.proto import v2
from bklib.proto.status import V2_TO_V3
from bklib.records import frozen_record
from bklib.tls import TlsContextSource

log = logging.getLogger(__name__)

V2_OPERATIONS: dict[str, str] = {}
"""The operations of :class:`BookieConnectionV2` by method name, with their default-timeout
:class:`~bklib.client.operations.ClientConfig` field (read and add share v3's signatures, so a
pool can send either protocol; batch_read is v2 only)."""

# The v3 operation whose error mapping (bklib.proto.status) each v2 opcode follows.
_PB_OP = {
    v2.ADD_ENTRY: pb.ADD_ENTRY,
    v2.READ_ENTRY: pb.READ_ENTRY,
    v2.BATCH_READ_ENTRY: pb.BATCH_READ_ENTRY,
}


@dataclass
class _V2Pending(Pending):
    op: int = 0
    # (op, ledger, entry) of READ / ADD, the key its reply is matched on; None for BATCH_READ.
    target: tuple[int, int, int] | None = None
    max_count: int = 0
    max_size: int = 0


class BookieConnectionV2(PipelinedConnection):
    """The v2 client side of one bookie. Errors name the bookie id, ledger and entry."""

    def __init__(
        self,
        bookie_id: str,
        address: tuple[str, int] | AddressResolver,
        config: ClientConfig | None = None,
        *,
        tls: TlsContextSource | None = None,
    ) -> None:
        super().__init__(bookie_id, address, config, tls=tls)
        # Highest token handed out: a batch reply naming a higher requestId was never asked for.
        self._last_token = 0

    # ---- receiving -----------------------------------------------------------------------------

    def _on_frame(self, ch: Channel, frame: bytes) -> None:
        resp = v2.decode_response(frame)  # MalformedV2Frame (a FramingError) closes the channel
        if isinstance(resp, v2.BatchReadResponse):
            self._dispatch_batch(ch, resp)
            return
        target = (resp.op, resp.ledger_id, resp.entry_id)
        queue = ch.queues.get(target)
        if not queue:
            # Timed out or cancelled (Java drops these too); nothing tells it from a stray reply.
            log.debug("bookie %s: dropping unmatched v2 reply %s", self.bookie_id, target)
            return
        token = queue.popleft()
        if not queue:
            del ch.queues[target]
        pending = ch.pending.pop(token, None)
        if pending is not None and not pending.future.done():
            pending.future.set_result(resp)

    def _dispatch_batch(self, ch: Channel, resp: v2.BatchReadResponse) -> None:
        rid = resp.request_id
        pending = ch.pending.get(rid)
        if pending is None:
            if 0 < rid <= self._last_token:
                log.debug("bookie %s: dropping late batch read reply %d", self.bookie_id, rid)
                return
            raise BadFrame(f"BATCH_READ_ENTRY reply with requestId {rid}, never sent")
        assert isinstance(pending, _V2Pending)
        if pending.op != v2.BATCH_READ_ENTRY:
            raise BadFrame(
                f"BATCH_READ_ENTRY reply with requestId {rid} of a {v2.OP_NAMES[pending.op]}"
            )
        _check_batch(resp, pending)
        del ch.pending[rid]
        if not pending.future.done():
            pending.future.set_result(resp)

    # ---- sending -------------------------------------------------------------------------------

    async def _call(
        self,
        op: int,
        frame: bytes,
        token: int,
        *,
        timeout: float,
        ledger_id: int,
        entry_id: int,
        max_count: int = 0,
        max_size: int = 0,
    ) -> v2.Response | v2.BatchReadResponse:
        """Send one request frame and return its reply once its rc is EOK."""
        self._check_frame_size(frame, ledger_id, entry_id)
        ch = await self._ensure_channel(ledger_id, entry_id)
        fut: asyncio.Future[v2.Response | v2.BatchReadResponse]
        fut = asyncio.get_running_loop().create_future()
        target = None if op == v2.BATCH_READ_ENTRY else (op, ledger_id, entry_id)
        pending = _V2Pending(fut, ledger_id, entry_id, op, target, max_count, max_size)
        if target is not None:
            queue = ch.queues.get(target)
            if queue is None:
                queue = ch.queues[target] = deque()
            queue.append(token)
        timer = self._enqueue(ch, token, pending, frame, timeout)
        try:
            if self._must_drain(ch):
                await self._drain(ch)
            resp = await fut
        except RequestExpired:
            raise BKTimeoutError(
                f"{v2.OP_NAMES[op]} timed out after {timeout}s",
                ledger_id=ledger_id,
                entry_id=entry_id,
                bookie=self.bookie_id,
            ) from None
        finally:
            if timer is not None:
                timer.cancel()
            ch.pending.pop(token, None)
            if target is not None:
                _unqueue(ch, target, token)
        if resp.rc != 0:
            raise self._error(resp.rc, op, ledger_id, entry_id)
        return resp

    def _next_token(self) -> int:
        token = self._last_token = next(self._txn_ids)
        return token

    def _error(self, rc: int, op: int, ledger_id: int, entry_id: int) -> BKError:
        status = V2_TO_V3.get(rc)
        if status is None:  # Java's client maps unknown codes to its generic error as well
            cls = WriteError if op == v2.ADD_ENTRY else ReadError
            return cls(
                f"{v2.OP_NAMES[op]} failed: v2 rc {rc}",
                ledger_id=ledger_id,
                entry_id=entry_id,
                bookie=self.bookie_id,
            )
        return self._status_error(status, _PB_OP[op], ledger_id=ledger_id, entry_id=entry_id)

    def _bad_parameter(self, exc: ValueError, ledger_id: int, entry_id: int) -> BKError:
        return IncorrectParameterError(
            str(exc), ledger_id=ledger_id, entry_id=entry_id, bookie=self.bookie_id
        )

    # ---- operations ----------------------------------------------------------------------------

    @bookie_operation("add_timeout", V2_OPERATIONS)
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
        """Store one entry over v2. ``body`` is the digest-framed entry (bklib.digest), which
        starts with the ledger and entry ids; ``master_key`` is the 20-byte key.

        ``write_flags`` exists for v3 compatibility only: v2 has none, and like Java's client any
        flag (DEFERRED_SYNC) fails with IllegalOpError.
        """
        if write_flags:
            raise IllegalOpError(
                f"write flags {write_flags:#x} need the v3 protocol",
                ledger_id=ledger_id,
                entry_id=entry_id,
                bookie=self.bookie_id,
            )
        try:
            frame = v2.encode_add(
                ledger_id,
                entry_id,
                master_key,
                body,
                recovery=recovery,
                high_priority=high_priority,
            )
        except ValueError as exc:
            raise self._bad_parameter(exc, ledger_id, entry_id) from None
        await self._call(
            v2.ADD_ENTRY,
            frame,
            self._next_token(),
            timeout=self.config.timeout_for("add", timeout),
            ledger_id=ledger_id,
            entry_id=entry_id,
        )

    @bookie_operation("read_timeout", V2_OPERATIONS)
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
        """Read one entry over v2; ``entry_id=-1`` returns the highest entry the bookie stores.

        ``fence=True`` fences the ledger on this bookie and needs ``master_key``. v2 replies
        carry no LAC, so ``max_lac`` is always None.
        """
        if fence and master_key is None:
            raise IncorrectParameterError(
                "a fencing read needs the master key",
                ledger_id=ledger_id,
                entry_id=entry_id,
                bookie=self.bookie_id,
            )
        try:
            frame = v2.encode_read(
                ledger_id, entry_id, fence=fence, master_key=master_key, high_priority=high_priority
            )
        except ValueError as exc:
            raise self._bad_parameter(exc, ledger_id, entry_id) from None
        resp = await self._call(
            v2.READ_ENTRY,
            frame,
            self._next_token(),
            timeout=self.config.timeout_for("read", timeout),
            ledger_id=ledger_id,
            entry_id=entry_id,
        )
        assert isinstance(resp, v2.Response)
        return self._read_result(resp, ledger_id, entry_id)

    def _read_result(self, resp: v2.Response, ledger_id: int, entry_id: int) -> ReadResult:
        if not resp.body:
            raise ReadError(
                "READ_ENTRY answered EOK without a body",
                ledger_id=ledger_id,
                entry_id=entry_id,
                bookie=self.bookie_id,
            )
        return frozen_record(ReadResult, {"body": resp.body, "max_lac": None})  # bklib/records.py

    @bookie_operation("read_timeout", V2_OPERATIONS)
    async def read_many(
        self, reads: Sequence[tuple[int, int]], *, timeout: float | None = None
    ) -> list[ReadResult | BKError]:
        """Read several ``(ledger_id, entry_id)`` entries over v2, pipelined, as
        :meth:`BookieConnection.read_many <bklib.client.connection.BookieConnection.read_many>`
        does over v3: each one's :class:`ReadResult` or error, in order."""
        timeout = self.config.timeout_for("read", timeout)
        if not reads:
            return []

        def request(ch: Channel, lid: int, x: int, out: Outcome) -> tuple[Any, Pending, bytes]:
            frame = v2.encode_read(lid, x)
            token = self._next_token()
            target = (v2.READ_ENTRY, lid, x)
            queue = ch.queues.get(target)
            if queue is None:
                queue = ch.queues[target] = deque()
            queue.append(token)
            return token, _V2Pending(out, lid, x, v2.READ_ENTRY, target), frame

        return await self._send_group(
            reads, timeout, "READ_ENTRY", request, self._read_answer, _forget
        )

    def _read_answer(self, resp: v2.Response, ledger_id: int, entry_id: int) -> ReadResult:
        """A READ reply of a group as :meth:`read` reads it, or the error it raises."""
        if resp.rc != 0:
            raise self._error(resp.rc, v2.READ_ENTRY, ledger_id, entry_id)
        return self._read_result(resp, ledger_id, entry_id)

    @bookie_operation("read_timeout", V2_OPERATIONS)
    async def batch_read(
        self,
        ledger_id: int,
        start_entry_id: int,
        max_count: int,
        max_size: int,
        *,
        fence: bool = False,
        master_key: bytes | None = None,
        high_priority: bool = False,
        timeout: float | None = None,
    ) -> list[bytes]:
        """Up to ``max_count`` consecutive entries from ``start_entry_id`` (BATCH_READ_ENTRY),
        as stored (digest not yet verified); always at least the first one.

        The bookie stops before the first entry it lacks and before the reply frame would exceed
        ``max_size`` bytes (the first entry is sent whatever its size). Like Java's
        ``LedgerHandle``, a ``max_size`` of 0 or less, or above the maximum frame size, means
        the maximum frame size; a ``max_count`` of 0 or less means no count limit. If the first
        entry is missing: NoSuchEntryError (NoSuchLedgerError for an unknown ledger).
        """
        if start_entry_id < 0:
            raise IncorrectParameterError(
                "a batch read starts at an entry id >= 0",
                ledger_id=ledger_id,
                entry_id=start_entry_id,
                bookie=self.bookie_id,
            )
        if fence and master_key is None:
            raise IncorrectParameterError(
                "a fencing batch read needs the master key",
                ledger_id=ledger_id,
                entry_id=start_entry_id,
                bookie=self.bookie_id,
            )
        max_frame = self.config.max_frame_size
        if max_size <= 0 or max_size > max_frame:
            max_size = max_frame
        token = self._next_token()
        try:
            frame = v2.encode_batch_read(
                ledger_id,
                start_entry_id,
                token,
                max_count,
                max_size,
                fence=fence,
                master_key=master_key,
                high_priority=high_priority,
            )
        except ValueError as exc:
            raise self._bad_parameter(exc, ledger_id, start_entry_id) from None
        resp = await self._call(
            v2.BATCH_READ_ENTRY,
            frame,
            token,
            timeout=self.config.timeout_for("batch_read", timeout),
            ledger_id=ledger_id,
            entry_id=start_entry_id,
            max_count=max_count,
            max_size=max_size,
        )
        assert isinstance(resp, v2.BatchReadResponse)
        return resp.entries


def _forget(ch: Channel, token: Any, pending: Pending) -> None:
    """Forget a finished read of a request group (``PipelinedConnection._send_group``)."""
    assert isinstance(pending, _V2Pending) and pending.target is not None
    _unqueue(ch, pending.target, token)


def _unqueue(ch: Channel, target: tuple[int, int, int], token: int) -> None:
    """Forget a finished request's place in its key's queue (a reply already took it, unless the
    request timed out or the connection failed)."""
    queue = ch.queues.get(target)
    if queue is None:
        return
    if token in queue:
        queue.remove(token)
    if not queue:
        del ch.queues[target]


def _check_batch(resp: v2.BatchReadResponse, req: _V2Pending) -> None:
    """Raise BadFrame if a batch reply does not answer the request it names (see the module
    docstring); an error rc needs only the ids to match."""
    assert req.ledger_id is not None and req.entry_id is not None
    what = f"BATCH_READ_ENTRY reply {resp.request_id} (ledger {req.ledger_id} from {req.entry_id})"
    if (resp.ledger_id, resp.start_entry_id) != (req.ledger_id, req.entry_id):
        raise BadFrame(f"{what} is for ledger {resp.ledger_id} from {resp.start_entry_id}")
    if resp.rc != 0:
        return
    entries = resp.entries
    if not entries:
        raise BadFrame(f"{what} answered EOK without entries")
    if 0 < req.max_count < len(entries):
        raise BadFrame(f"{what} carries {len(entries)} entries, maxCount {req.max_count}")
    if len(entries) > 1 and resp.total_size > req.max_size:
        raise BadFrame(f"{what} is {resp.total_size} bytes, maxSize {req.max_size}")
    unpack = v2.IDS.unpack_from
    for i, body in enumerate(entries):
        want = (req.ledger_id, req.entry_id + i)
        got = unpack(body, 0) if len(body) >= v2.IDS.size else None
        if got != want:
            raise BadFrame(f"{what}: entry {i} is {got}, expected (ledger, entry) {want}")
