"""One pipelined TCP connection to one bookie (asyncio): what the v3 and v2 clients share.

What a Java ``PerChannelBookieClient`` does underneath its protocol, for a Python client:

* one TCP connection per bookie; requests are written as soon as they are issued (frames of one
  loop turn corked into one send) and replies, which a bookie sends in any order, are matched
  to their :class:`~bklib.client.outcomes.Pending` requests by the protocol
  (:mod:`bklib.client.connection` for v3, :mod:`bklib.client.connection_v2` for v2);
* every request has its own deadline (5 s by default, like ``addEntryTimeoutSec`` and
  ``readEntryTimeoutSec``), served by one timer per connection; an expired request fails with
  :class:`~bklib.client.outcomes.RequestExpired`, which the protocol raises as
  :class:`~bklib.errors.BKTimeoutError`. A timeout does not close the connection and a late
  reply is dropped;
* when the connection drops, or the bookie sends a frame we refuse (too large, or
  :class:`~bklib.client.responses.BadFrame`), every outstanding request fails with
  :class:`ConnectionLostError`. That is an *unknown* outcome (the bookie may or may not have
  applied the request), never a negative answer such as NoSuchEntry;
* the next request reconnects; consecutive connect failures back off exponentially, and requests
  issued inside the back-off window fail fast with BookieHandleNotAvailableError instead of
  hammering a dead host;
* with ``ClientConfig.tls`` a fresh connection is upgraded by a v3 START_TLS exchange before
  its first request, whatever the protocol (:mod:`bklib.client.start_tls`).

Connecting is bounded by ``connect_timeout`` (BookKeeper's clientConnectTimeoutMillis), the
request itself by the operation timeout. All coroutines must run on one event loop (the one the
connection is first used on).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
import ssl
import struct
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from bklib.client.operations import ClientConfig
from bklib.client.outcomes import Outcome, Pending, RequestExpired, RequestGroup
from bklib.client.responses import BadFrame
from bklib.client.start_tls import dial, start_tls
from bklib.errors import (
    BKError,
    BKTimeoutError,
    BookieHandleNotAvailableError,
    ClientClosedError,
    IncorrectParameterError,
    UnauthorizedAccessError,
)
from bklib.proto import protocol_pb2 as pb
from bklib.proto.framing import FramingError, check_length
from bklib.proto.status import error_for_status
from bklib.tls import (
    BookieTlsError,
    TlsContextSource,
    describe_ssl_error,
)

log = logging.getLogger(__name__)

R = TypeVar("R")

__all__ = [
    "AddressResolver",
    "BadResponseError",
    "Channel",
    "ConnectionLostError",
    "PipelinedConnection",
    "TlsConnectionLostError",
]

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


@dataclass
class Channel:
    """One live TCP connection and the requests outstanding on it."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    address: tuple[str, int]
    # v3: by (txnId, operation); v2 (bklib.client.connection_v2): by a per-connection token.
    pending: dict[Any, Pending] = field(default_factory=dict)
    closed: bool = False
    heard: bool = False  # any byte from the bookie yet (see _read_failure)
    reader_task: asyncio.Task[None] | None = None
    drain_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Frames issued during this loop iteration, written together by _flush (see _enqueue).
    out: list[bytes] = field(default_factory=list)
    out_bytes: int = 0
    flush_scheduled: bool = False
    # (deadline, future) of the requests in issue order, and the one timer expiring them.
    deadlines: deque[tuple[float, Outcome]] = field(default_factory=deque)
    timer: asyncio.TimerHandle | None = None
    # v2 only: the tokens of requests that share an (operation, ledger, entry), in issue order,
    # since v2 replies carry no request id (Java queues them per key the same way).
    queues: dict[tuple[int, int, int], deque[int]] = field(default_factory=dict)


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
        self._channel: Channel | None = None
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

    async def _ensure_channel(self, ledger_id: int | None, entry_id: int | None) -> Channel:
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

    async def _connect(self, ledger_id: int | None, entry_id: int | None) -> Channel:
        refresh, self._refresh_next = self._refresh_next, False
        host, port = await self._resolve(refresh)
        try:
            if self._tls is None:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(host, port), self.config.connect_timeout
                )
            else:
                sock = await asyncio.wait_for(dial(host, port), self.config.connect_timeout)
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
        ch = Channel(reader, writer, (host, port))
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
        """Upgrade a fresh connection with a v3 START_TLS exchange
        (:func:`bklib.client.start_tls.start_tls`); raises a BookieTlsError subclass naming the
        bookie."""
        assert self._tls is not None
        return await start_tls(
            sock,
            host,
            port,
            self._tls,
            txn_id=next(self._txn_ids),
            max_frame=self.config.max_frame_size,
            bookie_id=self.bookie_id,
        )

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

    async def _read_loop(self, ch: Channel) -> None:
        """The reader task of ``ch``: hand every reply frame to :meth:`_on_frame` until the
        connection ends, then fail every request outstanding on it."""
        try:
            await self._read_frames(ch)
        except asyncio.CancelledError:
            self._fail_channel(ch, "connection closed by client", bad=False)
            raise
        except Exception as exc:  # noqa: BLE001 - fails every outstanding request (a bug logs)
            reason, bad, tls = self._read_failure(ch, exc)
            if bad:
                log.warning("bookie %s: %s; closing the connection", self.bookie_id, reason)
            self._fail_channel(ch, reason, bad=bad, tls=tls)

    async def _read_frames(self, ch: Channel) -> None:
        """Read ``ch`` until it fails; never returns normally (a closed stream raises
        IncompleteReadError)."""
        # Bytes are read in chunks and every complete frame in them is handled in one go: two
        # readexactly awaits per frame cost a bulk copy a good share of the loop's CPU. Each
        # length prefix is still checked before its body is buffered (at most one chunk more).
        buf = bytearray()
        max_frame = self.config.max_frame_size
        unpack_len = _LEN.unpack_from
        on_frame = self._on_frame
        while True:
            data = await ch.reader.read(_READ_CHUNK)
            if not data:
                raise asyncio.IncompleteReadError(bytes(buf), None)
            ch.heard = True
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

    def _read_failure(self, ch: Channel, exc: Exception) -> tuple[str, bool, bool]:
        """``(reason, bad, tls)`` for the exception that ended ``ch``'s reader: ``bad`` when the
        bookie sent something we refuse (BadResponseError), ``tls`` when the TLS session failed
        (TlsConnectionLostError). Called in the ``except`` clause, so a bug's traceback logs."""
        # A bookie refusing our client certificate under TLS 1.3 does so after our side of the
        # handshake is done: bklib's bookie then closes without an alert, or resets the
        # connection when the close races our request.
        refused_cert = self._tls is not None and not ch.heard
        if isinstance(exc, asyncio.IncompleteReadError):
            if refused_cert:
                return (
                    "the bookie closed the TLS connection before answering anything: it "
                    "probably refused our client certificate (tlsClientAuthentication)",
                    False,
                    True,
                )
            partial = f" mid-frame ({len(exc.partial)} bytes read)" if exc.partial else ""
            return "connection closed by bookie" + partial, False, False
        if isinstance(exc, FramingError):
            return f"response refused: {exc.reason}", True, False
        if isinstance(exc, BadFrame):
            return f"response refused: {exc}", True, False
        if isinstance(exc, ssl.SSLError):
            return f"TLS session failed: {describe_ssl_error(exc)}", False, True
        if isinstance(exc, OSError):
            if refused_cert:
                return (
                    f"the bookie dropped the TLS connection ({exc.strerror or exc}) before "
                    "answering anything: it probably refused our client certificate "
                    "(tlsClientAuthentication)",
                    False,
                    True,
                )
            return f"connection error: {exc.strerror or exc}", False, False
        # A bug must not leave requests waiting for their timeouts.
        log.exception("bookie %s: reader failed", self.bookie_id)
        return f"client reader failed: {exc!r}", True, False

    def _on_frame(self, ch: Channel, frame: bytes) -> None:
        """Handle one reply frame (without its length prefix). Raise :class:`BadFrame` or a
        FramingError for a frame that must close the connection."""
        raise NotImplementedError

    def _fail_channel(
        self, ch: Channel, reason: str, *, bad: bool = False, tls: bool = False
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

    async def _stop_reader(self, ch: Channel) -> None:
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

    async def _send_group(
        self,
        targets: Sequence[tuple[int, int]],
        timeout: float,
        op_name: str,
        request: Callable[[Channel, int, int, Outcome], tuple[Any, Pending, bytes]],
        answer: Callable[[Any, int, int], R],
        forget: Callable[[Channel, Any, Pending], None] | None = None,
    ) -> list[R | BKError]:
        """Send one request per ``(ledger_id, entry_id)`` of ``targets`` (of one ledger or of
        many) as one :class:`~bklib.client.outcomes.RequestGroup` and return how each ended, in
        order: ``answer(reply, ledger_id, entry_id)`` for a reply (or the BKError it raises),
        else the error the request's own call would have raised (a timeout, a lost connection).
        ``request(ch, ledger_id, entry_id, outcome)`` builds one request's ``(key, pending,
        frame)``; ``forget(ch, key, pending)`` clears what the protocol kept of it besides
        ``ch.pending``. Raises only when nothing could be sent."""
        ch = await self._ensure_channel(*targets[0])
        group = RequestGroup(len(targets))
        sent: list[tuple[Any, Pending]] = []
        timers: list[asyncio.TimerHandle] = []
        try:
            for i, (lid, x) in enumerate(targets):
                key, pending, frame = request(ch, lid, x, group.slot(i))
                sent.append((key, pending))
                timer = self._enqueue(ch, key, pending, frame, timeout)
                if timer is not None:
                    timers.append(timer)
            if self._must_drain(ch):
                await self._drain(ch)
            await group.future
        finally:
            group.abandon()  # a no-op once every slot is settled
            for timer in timers:
                timer.cancel()
            for key, pending in sent:
                ch.pending.pop(key, None)
                if forget is not None:
                    forget(ch, key, pending)
        ended: list[R | BKError] = []
        for out, (ledger_id, x) in zip(group.outcomes, targets, strict=True):
            if isinstance(out, RequestExpired):
                ended.append(
                    BKTimeoutError(
                        f"{op_name} timed out after {timeout}s",
                        ledger_id=ledger_id,
                        entry_id=x,
                        bookie=self.bookie_id,
                    )
                )
            elif isinstance(out, BKError):
                ended.append(out)
            elif isinstance(out, BaseException):  # none is set today; unknown, never missing
                ended.append(
                    BKError(
                        f"{op_name} failed: {out!r}",
                        ledger_id=ledger_id,
                        entry_id=x,
                        bookie=self.bookie_id,
                    )
                )
            else:
                try:
                    ended.append(answer(out, ledger_id, x))
                except BKError as exc:
                    ended.append(exc)
        return ended

    @staticmethod
    def _enqueue(
        ch: Channel, key: Any, pending: Pending, frame: bytes, timeout: float
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
    def _must_drain(ch: Channel) -> bool:
        """True when so much is queued that the sender should wait for the socket (_drain)."""
        return ch.out_bytes + ch.writer.transport.get_write_buffer_size() > _DRAIN_ABOVE

    @staticmethod
    async def _drain(ch: Channel) -> None:
        _flush(ch)
        async with ch.drain_lock:
            # On a write error the reader task sees the same failure and fails the requests.
            with contextlib.suppress(OSError):
                await ch.writer.drain()


_DRAIN_ABOVE = 1 << 20  # bytes queued in the transport before a sender waits for the socket


def _stop_timer(ch: Channel) -> None:
    """A closed channel's requests have all failed: its deadline queue has nothing to expire."""
    if ch.timer is not None:
        ch.timer.cancel()
        ch.timer = None
    ch.deadlines.clear()


def _close_writer(ch: Channel) -> None:
    """Close the channel's socket. A TLS one is aborted: a graceful TLS close waits for the
    peer's close_notify (up to 30 s), and the bookie protocol has nothing left to say."""
    with contextlib.suppress(Exception):
        if ch.writer.get_extra_info("ssl_object") is not None:
            ch.writer.transport.abort()
        else:
            ch.writer.close()


def _flush(ch: Channel) -> None:
    """Write the frames corked on ``ch`` in one go. A write error surfaces in the reader task,
    which fails every outstanding request, as before corking."""
    ch.flush_scheduled = False
    if not ch.out:
        return
    out, ch.out, ch.out_bytes = ch.out, [], 0
    if ch.closed:
        return
    ch.writer.write(out[0] if len(out) == 1 else b"".join(out))


def _expire_due(ch: Channel, when: float) -> None:
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


def _expire(fut: Outcome) -> None:
    if not fut.done():
        fut.set_exception(RequestExpired())


_LEN = struct.Struct(">i")
_READ_CHUNK = 1 << 18  # bytes asked of the stream per read; many replies arrive together
