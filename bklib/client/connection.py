"""One pipelined v3 protobuf connection to one bookie (asyncio).

What a Java ``PerChannelBookieClient`` does, for a Python client:

* one TCP connection per bookie; requests are written as soon as they are issued and responses,
  which a bookie sends in any order, are matched on (txnId, operation);
* every operation has its own timeout (5 s by default, like ``addEntryTimeoutSec`` and
  ``readEntryTimeoutSec``) raising :class:`~bklib.errors.BKTimeoutError`; a timeout does not
  close the connection and a late reply is dropped;
* when the connection drops, or the bookie sends a frame we refuse (too large, not a Response),
  every outstanding request fails with :class:`ConnectionLostError`. That is an *unknown* outcome
  (the bookie may or may not have applied the request), never a negative answer such as
  NoSuchEntry;
* the next request reconnects; consecutive connect failures back off exponentially, and requests
  issued inside the back-off window fail fast with BookieHandleNotAvailableError instead of
  hammering a dead host.

:class:`PipelinedConnection` holds what the v2 client (:mod:`bklib.client.connection_v2`) shares:
connecting, back-off, deadlines, corked sends and failing a lost connection's requests.

Connecting is bounded by ``connect_timeout`` (BookKeeper's clientConnectTimeoutMillis), the
request itself by the operation timeout. All coroutines must run on one event loop (the one the
connection is first used on).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import itertools
import logging
import socket
import ssl
import struct
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from bklib.errors import (
    BKError,
    BKTimeoutError,
    BookieHandleNotAvailableError,
    ClientClosedError,
    IncorrectParameterError,
    ReadError,
    UnauthorizedAccessError,
    WriteError,
)
from bklib.proto import protocol_pb2 as pb
from bklib.proto.framing import MAX_FRAME_SIZE, FramingError, check_length, encode_frame
from bklib.proto.status import error_for_status, is_write_op, status_name
from bklib.tls import (
    BookieTlsError,
    TlsContextSource,
    TlsHandshakeError,
    TlsNotConfiguredError,
    TlsSettings,
    describe_ssl_error,
)

log = logging.getLogger(__name__)

# BookKeeper marks high-priority v3 requests with this header priority; the bookie only tests
# priority > 0.
HIGH_PRIORITY = 100
# GetBookieInfoRequest.Flags: TOTAL_DISK_CAPACITY | FREE_DISK_SPACE, what the Java client asks.
BOOKIE_INFO_ALL = 0x03
# AddRequest.writeFlags bit for DEFERRED_SYNC (ack before fsync; FORCE_LEDGER makes it durable).
WRITE_FLAG_DEFERRED_SYNC = 0x01

AddressResolver = Callable[[bool], Awaitable[tuple[str, int]]]
"""``await resolve(refresh)`` gives the (host, port) to dial; ``refresh`` asks it to bypass
caches because the previous address failed or the connection dropped."""


class ConnectionLostError(BookieHandleNotAvailableError):
    """The connection closed while this request was outstanding.

    The outcome is unknown: the bookie may have applied the request. Callers must treat it like a
    missing reply (retry, or count the bookie as unavailable), never as a negative answer.
    """


class BadResponseError(ConnectionLostError):
    """The bookie sent a frame we refuse (over the maximum size, or not a valid v3 Response), so
    the connection was closed. Outcome unknown, like every ConnectionLostError."""


class TlsConnectionLostError(ConnectionLostError, BookieTlsError):
    """The TLS session failed after the handshake, e.g. the bookie sent an alert refusing our
    client certificate (TLS 1.3 checks it after the client's side of the handshake is done).
    Outcome unknown, like every ConnectionLostError; code is BookKeeper's SecurityException."""


@dataclass(frozen=True)
class ClientConfig:
    """Timeouts and limits of a bookie client; picklable, so it can be shipped to executors.

    Defaults follow BookKeeper's ``ClientConfiguration``.
    """

    add_timeout: float = 5.0  # addEntryTimeoutSec
    read_timeout: float = 5.0  # readEntryTimeoutSec: read, read LAC, write LAC, force, list
    bookie_info_timeout: float = 5.0  # getBookieInfoTimeoutSecs
    connect_timeout: float = 10.0  # clientConnectTimeoutMillis
    max_frame_size: int = MAX_FRAME_SIZE  # nettyMaxFrameSizeBytes, both directions
    reconnect_backoff_initial: float = 0.1  # first delay after a failed connect
    reconnect_backoff_max: float = 10.0  # cap of the doubling delay
    tls: TlsSettings | None = None  # tlsProviderFactoryClass set: START_TLS on every connection

    def timeout_for(self, operation: str, timeout: float | None = None) -> float:
        """``timeout`` if given, else the configured default of the bookie operation named
        ``operation`` (a key of :data:`TIMEOUTS`)."""
        if timeout is not None:
            return timeout
        default: float = getattr(self, TIMEOUTS[operation])
        return default


OPERATIONS: dict[str, str] = {}
"""The bookie operations of :class:`BookieConnection` by method name, each with the
:class:`ClientConfig` field holding its default timeout. The pool and the blocking client offer
each of them per bookie id, derived from the method (see :mod:`bklib.client.pool`)."""

TIMEOUTS: dict[str, str] = {}
"""Every registered bookie operation, of this connection and of the v2 one
(:data:`bklib.client.connection_v2.V2_OPERATIONS`), with its default-timeout field."""

_Op = TypeVar("_Op", bound=Callable[..., Awaitable[Any]])


def bookie_operation(
    timeout_field: str, registry: dict[str, str] = OPERATIONS
) -> Callable[[_Op], _Op]:
    """Register a bookie coroutine method in ``registry`` (:data:`OPERATIONS` for
    :class:`BookieConnection`) and :data:`TIMEOUTS`; its keyword-only ``timeout=None`` stands for
    ``ClientConfig.<timeout_field>``. One name has one timeout field in every registry."""
    if timeout_field not in {f.name for f in dataclasses.fields(ClientConfig)}:
        raise TypeError(f"ClientConfig has no field {timeout_field!r}")

    def register(fn: _Op) -> _Op:
        # The blocking client finds the timeout among the keyword arguments to size its guard.
        param = inspect.signature(fn).parameters.get("timeout")
        if param is None or param.kind is not inspect.Parameter.KEYWORD_ONLY:
            raise TypeError(f"bookie operation {fn.__name__} needs a keyword-only timeout")
        if TIMEOUTS.setdefault(fn.__name__, timeout_field) != timeout_field:
            raise TypeError(f"bookie operation {fn.__name__} registered with another timeout")
        registry[fn.__name__] = timeout_field
        return fn

    return register


@dataclass(frozen=True)
class ReadResult:
    """A successful read: the stored entry bytes (bklib.digest layout, digest not yet verified) and
    the bookie's known LAC when it reported one (``ReadResponse.maxLAC``; fence reads omit it)."""

    body: bytes
    max_lac: int | None = None


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


@dataclass
class _Pending:
    future: asyncio.Future[Any]
    ledger_id: int | None
    entry_id: int | None


@dataclass
class _Channel:
    """One live TCP connection and the requests outstanding on it."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    address: tuple[str, int]
    # v3: by (txnId, operation); v2 (bklib.client.connection_v2): by a per-connection token.
    pending: dict[Any, _Pending] = field(default_factory=dict)
    closed: bool = False
    reader_task: asyncio.Task[None] | None = None
    drain_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Frames issued during this loop iteration, written together by _flush (see _enqueue).
    out: list[bytes] = field(default_factory=list)
    out_bytes: int = 0
    flush_scheduled: bool = False
    # (deadline, future) of the requests in issue order, and the one timer expiring them.
    deadlines: deque[tuple[float, asyncio.Future[Any]]] = field(default_factory=deque)
    timer: asyncio.TimerHandle | None = None
    # v2 only: the tokens of requests that share an (operation, ledger, entry), in issue order,
    # since v2 replies carry no request id (Java queues them per key the same way).
    queues: dict[tuple[int, int, int], deque[int]] = field(default_factory=dict)


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


class PipelinedConnection:
    """What the v3 and v2 bookie clients share: one pipelined TCP connection to a bookie,
    (re)connected on demand with back-off, per-request deadlines on one timer, corked sends and
    failing every outstanding request when the connection is lost. Subclasses encode requests,
    decode replies (:meth:`_on_frame`) and match them to pending requests.

    ``address`` is a fixed (host, port) or an :data:`AddressResolver`. Every error raised names
    the bookie id and, where it applies, the ledger and entry.
    """

    def __init__(
        self,
        bookie_id: str,
        address: tuple[str, int] | AddressResolver,
        config: ClientConfig | None = None,
        *,
        tls: TlsContextSource | None = None,
    ) -> None:
        self.bookie_id = bookie_id
        self.config = config or ClientConfig()
        # A pool shares one context source among its connections; else one per connection.
        if tls is None and self.config.tls is not None:
            tls = TlsContextSource(self.config.tls, "client")
        self._tls = tls
        if isinstance(address, tuple):
            fixed = address

            async def _fixed(refresh: bool) -> tuple[str, int]:
                return fixed

            self._resolve: AddressResolver = _fixed
        else:
            self._resolve = address
        # Per-connection counter: matching is per connection, so ids need only be unique here.
        # It survives reconnects so a reply can never be mistaken for a newer request's.
        self._txn_ids = itertools.count(1)
        self._channel: _Channel | None = None
        self._connect_lock = asyncio.Lock()
        self._closed = False
        self._failures = 0  # consecutive failed connect attempts
        self._retry_at = 0.0  # loop time before which no new connect is attempted
        self._last_error: BKError | None = None
        self._refresh_next = False  # bypass the resolver's cache on the next connect

    # ---- state ---------------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """True while a TCP connection is open."""
        return self._channel is not None and not self._channel.closed

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called; every later request raises ClientClosedError."""
        return self._closed

    @property
    def outstanding(self) -> int:
        """Requests written and not yet answered, timed out or failed."""
        return len(self._channel.pending) if self._channel is not None else 0

    def retry_delay(self) -> float:
        """Seconds until the next connect attempt is allowed (0 if one may be made now)."""
        if self._failures == 0:
            return 0.0
        return max(0.0, self._retry_at - asyncio.get_running_loop().time())

    # ---- connecting ----------------------------------------------------------------------------

    def _backoff_delay(self) -> float:
        cfg = self.config
        delay = cfg.reconnect_backoff_initial * 2.0 ** (self._failures - 1)
        return min(delay, cfg.reconnect_backoff_max)

    async def _ensure_channel(self, ledger_id: int | None, entry_id: int | None) -> _Channel:
        if self._closed:
            raise ClientClosedError(
                "bookie client closed",
                ledger_id=ledger_id,
                entry_id=entry_id,
                bookie=self.bookie_id,
            )
        ch = self._channel
        if ch is not None and not ch.closed:
            return ch
        async with self._connect_lock:
            # Another request may have connected (or failed) while we waited for the lock.
            ch = self._channel
            if ch is not None and not ch.closed:
                return ch
            if self._closed:
                raise ClientClosedError("bookie client closed", bookie=self.bookie_id)
            loop = asyncio.get_running_loop()
            if self._failures and loop.time() < self._retry_at:
                last = self._last_error.reason if self._last_error else "connect failed"
                raise BookieHandleNotAvailableError(
                    f"bookie unavailable ({last}); next connect attempt in "
                    f"{self._retry_at - loop.time():.2f}s",
                    ledger_id=ledger_id,
                    entry_id=entry_id,
                    bookie=self.bookie_id,
                )
            try:
                ch = await self._connect(ledger_id, entry_id)
            except BKError as exc:
                self._failures += 1
                self._retry_at = loop.time() + self._backoff_delay()
                self._last_error = exc
                self._refresh_next = True
                raise
            self._failures = 0
            self._last_error = None
            self._channel = ch
            return ch

    async def _connect(self, ledger_id: int | None, entry_id: int | None) -> _Channel:
        refresh, self._refresh_next = self._refresh_next, False
        host, port = await self._resolve(refresh)
        try:
            if self._tls is None:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(host, port), self.config.connect_timeout
                )
            else:
                sock = await asyncio.wait_for(_dial(host, port), self.config.connect_timeout)
        except asyncio.TimeoutError:
            raise BookieHandleNotAvailableError(
                f"connect to {host}:{port} timed out after {self.config.connect_timeout}s",
                ledger_id=ledger_id,
                entry_id=entry_id,
                bookie=self.bookie_id,
            ) from None
        except OSError as exc:
            raise BookieHandleNotAvailableError(
                f"cannot connect to {host}:{port}: {exc.strerror or exc}",
                ledger_id=ledger_id,
                entry_id=entry_id,
                bookie=self.bookie_id,
            ) from exc
        if self._tls is not None:
            try:
                reader, writer = await self._start_tls(sock, host, port)
            except BaseException:
                sock.close()
                raise
        sock = writer.get_extra_info("socket")
        if sock is not None:
            # Java's clientSockKeepalive defaults to true; asyncio already sets TCP_NODELAY.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        ch = _Channel(reader, writer, (host, port))
        ch.reader_task = asyncio.get_running_loop().create_task(
            self._read_loop(ch), name=f"bookie-reader-{self.bookie_id}"
        )
        log.debug("connected to bookie %s at %s:%d", self.bookie_id, host, port)
        return ch

    @property
    def tls(self) -> bool:
        """True when connections to this bookie are upgraded with START_TLS."""
        return self._tls is not None

    async def _start_tls(
        self, sock: socket.socket, host: str, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Upgrade a fresh connection as ``PerChannelBookieClient.initiateTLS`` does: a v3
        START_TLS request (also on v2 connections, before any v2 request), the bookie's EOK in
        plaintext, then the TLS handshake on the same socket; the streams over TLS. Raises a
        BookieTlsError subclass naming the bookie; nothing else was sent on the connection."""
        assert self._tls is not None
        ctx = self._tls.get()
        timeout = self._tls.settings.handshake_timeout
        where = f"{host}:{port}"
        req = pb.Request()
        req.header.version = pb.VERSION_THREE
        req.header.operation = pb.START_TLS
        req.header.txnId = next(self._txn_ids)
        req.startTLSRequest.SetInParent()
        try:
            frame = await asyncio.wait_for(
                _exchange(sock, encode_frame(req.SerializeToString()), self.config.max_frame_size),
                timeout,
            )
        except asyncio.TimeoutError:
            raise BookieTlsError(
                f"no answer to START_TLS from {where} within {timeout}s", bookie=self.bookie_id
            ) from None
        except EOFError:
            raise BookieTlsError(
                f"{where} closed the connection on START_TLS (not a BookKeeper bookie, or one "
                "that does not speak START_TLS)",
                bookie=self.bookie_id,
            ) from None
        except (OSError, FramingError) as exc:
            raise BookieTlsError(
                f"START_TLS to {where} failed: {getattr(exc, 'reason', None) or exc}",
                bookie=self.bookie_id,
            ) from exc
        try:
            resp = _parse_response(frame)
        except _Garbage as exc:
            raise BookieTlsError(
                f"{where} answered START_TLS with something else ({exc})", bookie=self.bookie_id
            ) from None
        if resp.header.operation != pb.START_TLS:
            op = pb.OperationType.Name(resp.header.operation)
            raise BookieTlsError(
                f"{where} answered START_TLS with a {op} response", bookie=self.bookie_id
            )
        if resp.status == pb.EBADREQ:
            raise TlsNotConfiguredError(
                f"TLS requested but {where} has no TLS configured (START_TLS answered EBADREQ)",
                bookie=self.bookie_id,
            )
        if resp.status != pb.EOK:
            raise BookieTlsError(
                f"{where} refused START_TLS: {status_name(resp.status)}", bookie=self.bookie_id
            )
        try:
            # The handshake runs on the connected socket: what asyncio offers on Python 3.10
            # (StreamWriter.start_tls is 3.11+).
            reader, writer = await asyncio.open_connection(
                sock=sock, ssl=ctx, server_hostname=host, ssl_handshake_timeout=timeout
            )
        except (ssl.SSLError, OSError, asyncio.TimeoutError) as exc:
            raise TlsHandshakeError(
                f"TLS handshake with {where} failed: {describe_ssl_error(exc)}",
                bookie=self.bookie_id,
            ) from None
        log.debug("bookie %s: TLS with %s (%s)", self.bookie_id, where, _cipher(writer))
        return reader, writer

    def _status_error(
        self, status: int, op: int, *, ledger_id: int | None, entry_id: int | None
    ) -> BKError:
        """The exception for a non-EOK status; on a plaintext connection EUA also says the
        bookie may require TLS (a TLS bookie of bklib refuses plaintext requests with EUA)."""
        if status == pb.EUA and self._tls is None:
            return UnauthorizedAccessError(
                f"{pb.OperationType.Name(op)} refused as unauthorized (EUA): the bookie requires "
                "TLS or authentication this plaintext client did not do, or the ledger password"
                " is wrong",
                ledger_id=ledger_id,
                entry_id=entry_id,
                bookie=self.bookie_id,
            )
        return error_for_status(
            status, op, ledger_id=ledger_id, entry_id=entry_id, bookie=self.bookie_id
        )

    # ---- receiving -----------------------------------------------------------------------------

    async def _read_loop(self, ch: _Channel) -> None:
        reason: str
        bad = False
        # Bytes are read in chunks and every complete frame in them is handled in one go: two
        # readexactly awaits per frame cost a bulk copy a good share of the loop's CPU. Each
        # length prefix is still checked before its body is buffered (at most one chunk more).
        buf = bytearray()
        max_frame = self.config.max_frame_size
        unpack_len = _LEN.unpack_from
        on_frame = self._on_frame
        heard = False  # any byte from the bookie yet
        try:
            while True:
                data = await ch.reader.read(_READ_CHUNK)
                if not data:
                    raise asyncio.IncompleteReadError(bytes(buf), None)
                heard = True
                buf += data
                pos, end = 0, len(buf)
                while end - pos >= 4:
                    (length,) = unpack_len(buf, pos)
                    check_length(length, max_frame)
                    if end - pos - 4 < length:
                        break
                    frame = bytes(buf[pos + 4 : pos + 4 + length])
                    pos += 4 + length
                    on_frame(ch, frame)
                del buf[:pos]
        except asyncio.IncompleteReadError as exc:
            if self._tls is not None and not heard:
                # A bookie refusing our client certificate under TLS 1.3 does so after our side
                # of the handshake is done; bklib's bookie then closes without an alert.
                self._fail_channel(
                    ch,
                    "the bookie closed the TLS connection before answering anything: it "
                    "probably refused our client certificate (tlsClientAuthentication)",
                    tls=True,
                )
                return
            reason = "connection closed by bookie" + (
                f" mid-frame ({len(exc.partial)} bytes read)" if exc.partial else ""
            )
        except FramingError as exc:
            reason, bad = f"response refused: {exc.reason}", True
        except _Garbage as exc:
            reason, bad = f"response refused: {exc}", True
        except asyncio.CancelledError:
            reason = "connection closed by client"
            self._fail_channel(ch, reason, bad=False)
            raise
        except ssl.SSLError as exc:
            self._fail_channel(ch, f"TLS session failed: {describe_ssl_error(exc)}", tls=True)
            return
        except OSError as exc:
            if self._tls is not None and not heard:
                # The same refusal, seen as a reset when the bookie's close races our request.
                self._fail_channel(
                    ch,
                    f"the bookie dropped the TLS connection ({exc.strerror or exc}) before "
                    "answering anything: it probably refused our client certificate "
                    "(tlsClientAuthentication)",
                    tls=True,
                )
                return
            reason = f"connection error: {exc.strerror or exc}"
        except Exception as exc:  # a bug must not leave requests waiting for their timeouts
            log.exception("bookie %s: reader failed", self.bookie_id)
            reason, bad = f"client reader failed: {exc!r}", True
        if bad:
            log.warning("bookie %s: %s; closing the connection", self.bookie_id, reason)
        self._fail_channel(ch, reason, bad=bad)

    def _on_frame(self, ch: _Channel, frame: bytes) -> None:
        """Handle one reply frame (without its length prefix). Raise ``_Garbage`` or a
        FramingError for a frame that must close the connection."""
        raise NotImplementedError

    def _fail_channel(
        self, ch: _Channel, reason: str, *, bad: bool = False, tls: bool = False
    ) -> None:
        """Close ``ch`` and fail everything outstanding on it (synchronously: no request can
        register on a channel between the check of ``closed`` and this)."""
        if ch.closed:
            return
        ch.closed = True
        _stop_timer(ch)
        self._refresh_next = True  # the bookie may have moved; ask the registry again
        if tls:
            log.warning("bookie %s: %s", self.bookie_id, reason)
        _close_writer(ch)
        cls: type[ConnectionLostError] = (
            TlsConnectionLostError if tls else BadResponseError if bad else ConnectionLostError
        )
        pending, ch.pending = ch.pending, {}
        for p in pending.values():
            if not p.future.done():
                p.future.set_exception(
                    cls(
                        f"{reason}; request outcome unknown",
                        ledger_id=p.ledger_id,
                        entry_id=p.entry_id,
                        bookie=self.bookie_id,
                    )
                )

    # ---- shutdown ------------------------------------------------------------------------------

    async def disconnect(self) -> None:
        """Drop the current TCP connection (outstanding requests fail with ConnectionLostError);
        the next request reconnects."""
        ch = self._channel
        if ch is None:
            return
        self._fail_channel(ch, "connection closed by client", bad=False)
        await self._stop_reader(ch)

    async def close(self) -> None:
        """Close for good: outstanding requests fail, later ones raise ClientClosedError."""
        self._closed = True
        ch = self._channel
        if ch is None:
            return
        if not ch.closed:
            ch.closed = True
            _stop_timer(ch)
            _close_writer(ch)
            pending, ch.pending = ch.pending, {}
            for p in pending.values():
                if not p.future.done():
                    p.future.set_exception(
                        ClientClosedError(
                            "bookie client closed with the request outstanding; outcome unknown",
                            ledger_id=p.ledger_id,
                            entry_id=p.entry_id,
                            bookie=self.bookie_id,
                        )
                    )
        await self._stop_reader(ch)

    async def _stop_reader(self, ch: _Channel) -> None:
        task = ch.reader_task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        with contextlib.suppress(Exception):
            await ch.writer.wait_closed()

    # ---- sending (see subclasses) -------------------------------------------------------------

    def _check_frame_size(self, frame: bytes, ledger_id: int | None, entry_id: int | None) -> None:
        if len(frame) > self.config.max_frame_size:
            # The bookie would drop the connection, failing every other request on it.
            raise IncorrectParameterError(
                f"request frame of {len(frame)} bytes exceeds the {self.config.max_frame_size}-byte"
                " maximum",
                ledger_id=ledger_id,
                entry_id=entry_id,
                bookie=self.bookie_id,
            )

    @staticmethod
    def _enqueue(
        ch: _Channel, key: Any, pending: _Pending, frame: bytes, timeout: float
    ) -> asyncio.TimerHandle | None:
        """Register ``pending`` under ``key``, arm its deadline and cork ``frame``; return the
        request's own timer if it needed one (the caller cancels it when done).

        Synchronous, and the caller awaits the future itself: one more coroutine layer per
        request is a measurable share of a bulk copy's client CPU.
        """
        loop = asyncio.get_running_loop()
        fut = pending.future
        ch.pending[key] = pending
        # Not asyncio.wait_for: it wraps every call in a task, which dominated the client's cost
        # at tens of thousands of requests per second. Nor a timer per request: creating and
        # cancelling one was still a noticeable share of a bulk copy. Requests sharing a
        # timeout expire in issue order, so they join a per-connection queue served by a
        # single timer; a request that would expire before the queue's tail (a shorter
        # timeout) gets a timer of its own. Either way it expires at the same instant.
        deadline = loop.time() + timeout
        timer: asyncio.TimerHandle | None = None
        queue = ch.deadlines
        while queue and queue[0][1].done():
            queue.popleft()  # answered: drop, so the queue holds little beyond what is in flight
        if not queue or deadline >= queue[-1][0]:
            queue.append((deadline, fut))
            # The timer may be set for a longer deadline than this one if the queue was empty.
            if ch.timer is None or ch.timer.when() > deadline:
                if ch.timer is not None:
                    ch.timer.cancel()
                ch.timer = loop.call_at(deadline, _expire_due, ch, deadline)
        else:
            timer = loop.call_at(deadline, _expire, fut)
        # Corked: frames issued in one loop iteration leave in one ``send`` (the bookie corks
        # its replies the same way). One syscall per request cost the copy path about a
        # sixth of the client loop's CPU, and the loop thread is what limits a bulk copy.
        ch.out.append(frame)
        ch.out_bytes += len(frame)
        if not ch.flush_scheduled:
            ch.flush_scheduled = True
            loop.call_soon(_flush, ch)
        return timer

    @staticmethod
    def _must_drain(ch: _Channel) -> bool:
        """True when so much is queued that the sender should wait for the socket (_drain)."""
        return ch.out_bytes + ch.writer.transport.get_write_buffer_size() > _DRAIN_ABOVE

    @staticmethod
    async def _drain(ch: _Channel) -> None:
        _flush(ch)
        async with ch.drain_lock:
            # On a write error the reader task sees the same failure and fails the requests.
            with contextlib.suppress(OSError):
                await ch.writer.drain()


class BookieConnection(PipelinedConnection):
    """The client side of one bookie: a single pipelined v3 connection, re-established on demand.

    ``address`` is a fixed (host, port) or an :data:`AddressResolver`. Every error raised names
    the bookie id and, where it applies, the ledger and entry.
    """

    def _on_frame(self, ch: _Channel, frame: bytes) -> None:
        self._dispatch(ch, _parse_response(frame))

    # ---- receiving -----------------------------------------------------------------------------

    def _dispatch(self, ch: _Channel, resp: pb.Response) -> None:
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
        timer = self._enqueue(ch, key, _Pending(fut, ledger_id, entry_id), frame, timeout)
        try:
            if self._must_drain(ch):
                await self._drain(ch)
            resp = await fut
        except _Expired:
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

    @bookie_operation("add_timeout")
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

    @bookie_operation("read_timeout")
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
        if not sub.HasField("body"):
            # Only long-poll reads (not offered here) may succeed without a body.
            raise ReadError(
                "READ_ENTRY answered EOK without a body",
                ledger_id=ledger_id,
                entry_id=entry_id,
                bookie=self.bookie_id,
            )
        return ReadResult(sub.body, sub.maxLAC if sub.HasField("maxLAC") else None)

    @bookie_operation("read_timeout")
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

    @bookie_operation("read_timeout")
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

    @bookie_operation("read_timeout")
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

    @bookie_operation("read_timeout")
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

    @bookie_operation("bookie_info_timeout")
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


class _Expired(Exception):
    """A request's own timer fired before its response arrived."""


_DRAIN_ABOVE = 1 << 20  # bytes queued in the transport before a sender waits for the socket


def _stop_timer(ch: _Channel) -> None:
    """A closed channel's requests have all failed: its deadline queue has nothing to expire."""
    if ch.timer is not None:
        ch.timer.cancel()
        ch.timer = None
    ch.deadlines.clear()


def _close_writer(ch: _Channel) -> None:
    """Close the channel's socket. A TLS one is aborted: a graceful TLS close waits for the
    peer's close_notify (up to 30 s), and the bookie protocol has nothing left to say."""
    with contextlib.suppress(Exception):
        if ch.writer.get_extra_info("ssl_object") is not None:
            ch.writer.transport.abort()
        else:
            ch.writer.close()


def _flush(ch: _Channel) -> None:
    """Write the frames corked on ``ch`` in one go. A write error surfaces in the reader task,
    which fails every outstanding request, as before corking."""
    ch.flush_scheduled = False
    if not ch.out:
        return
    out, ch.out, ch.out_bytes = ch.out, [], 0
    if ch.closed:
        return
    ch.writer.write(out[0] if len(out) == 1 else b"".join(out))


def _expire_due(ch: _Channel, when: float) -> None:
    """The timer of ``ch``'s deadline queue, set for ``when``: expire every request due by now,
    then re-arm for the first one still outstanding."""
    ch.timer = None
    queue = ch.deadlines
    now = max(when, asyncio.get_running_loop().time())
    while queue and (queue[0][0] <= now or queue[0][1].done()):
        _expire(queue.popleft()[1])
    if queue and not ch.closed:
        first = queue[0][0]
        ch.timer = asyncio.get_running_loop().call_at(first, _expire_due, ch, first)


def _expire(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_exception(_Expired())


class _Garbage(Exception):
    """Internal: a frame that is not a usable response (v3, or v2 in connection_v2)."""


_LEN = struct.Struct(">i")
_READ_CHUNK = 1 << 18  # bytes asked of the stream per read; many replies arrive together


def _cipher(writer: asyncio.StreamWriter) -> str:
    cipher = writer.get_extra_info("cipher")
    return f"{cipher[1]} {cipher[0]}" if cipher else "?"


async def _dial(host: str, port: int) -> socket.socket:
    """A connected non-blocking TCP socket (what open_connection does, keeping the socket so
    START_TLS can run on it before the streams exist)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    error: OSError = OSError(f"no address for {host}")
    for family, kind, proto, _, addr in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await loop.sock_connect(sock, addr)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
        except BaseException:
            sock.close()
            raise
    raise error


async def _exchange(sock: socket.socket, request: bytes, max_frame: int) -> bytes:
    """Send ``request`` and read exactly one reply frame (without its length), nothing more:
    the bytes after it belong to the TLS handshake. EOFError if the peer closes first."""
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(sock, request)

    async def exactly(n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = await loop.sock_recv(sock, n - len(buf))
            if not chunk:
                raise EOFError
            buf += chunk
        return bytes(buf)

    (length,) = _LEN.unpack(await exactly(4))
    check_length(length, max_frame)
    return await exactly(length)


def _parse_response(frame: bytes) -> pb.Response:
    try:
        resp: pb.Response = pb.Response.FromString(frame)
    except Exception as exc:  # DecodeError; any parse failure is equally fatal
        raise _Garbage(f"undecodable response frame of {len(frame)} bytes: {exc}") from exc
    # upb does not enforce proto2 required fields (Java does, and drops the connection); an
    # unknown StatusCode also lands here, as a missing status.
    if not resp.IsInitialized():
        missing = ", ".join(resp.FindInitializationErrors())
        raise _Garbage(f"response missing required fields: {missing}")
    return resp
