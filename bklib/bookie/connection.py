"""One client connection of the bookie's server (:class:`Connection`, an
:class:`asyncio.Protocol`): bytes split into frames in bulk and handed to the server, replies
corked and written once per loop iteration, the server side of START_TLS, and closing a
connection whose peer sent what cannot be a request (:class:`RateLimitedLog` keeps a client
spraying garbage from flooding the log). What each request does is
:class:`~bklib.bookie.server.BookieServer`'s."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import struct
import time
from typing import Any, Protocol

from bklib.bookie.journal import Journal
from bklib.errors import BKError
from bklib.proto.framing import FrameTooLarge, split_frames
from bklib.tls import TlsContextSource, describe_ssl_error

log = logging.getLogger(__name__)

__all__ = ["Connection", "ConnectionOwner", "RateLimitedLog"]

_LEN = struct.Struct(">I")


class RateLimitedLog:
    """Logs the first few events per window at WARNING and the rest at DEBUG, so a client
    spraying garbage cannot flood the log."""

    def __init__(self, per_window: int = 20, window_s: float = 10.0) -> None:
        self.per_window = per_window
        self.window_s = window_s
        self._start = 0.0
        self._count = 0

    def __call__(self, msg: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self._start > self.window_s:
            if self._count > self.per_window:
                log.warning("(%d similar messages suppressed)", self._count - self.per_window)
            self._start, self._count = now, 0
        self._count += 1
        level = logging.WARNING if self._count <= self.per_window else logging.DEBUG
        log.log(level, msg, *args)


class ConnectionOwner(Protocol):
    """What a connection needs of its server (:class:`~bklib.bookie.server.BookieServer`):
    a protocol, so this module does not import the server that imports it."""

    name: str
    max_frame: int
    journal: Journal
    loop: asyncio.AbstractEventLoop
    connections: set[Connection]
    conn_log: RateLimitedLog

    def handle_frame(self, conn: Connection, frame: bytes) -> None:
        """Answer one request frame (without its length prefix) of ``conn``."""

    def keep(self, task: asyncio.Task[None]) -> None:
        """Hold ``task`` until it is done."""


class Connection(asyncio.Protocol):
    """One client connection."""

    def __init__(self, server: ConnectionOwner) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self._buf = bytearray()
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self.closed = False
        self.secure = False  # START_TLS done: the transport is the TLS one
        self.upgrading = False  # START_TLS answered, handshake under way
        # The TLS layer is in place: bytes now arrive decrypted, even before start_tls()
        # returns (a client that finished its side of the handshake sends requests at once).
        self.tls_layer = False

    # asyncio callbacks ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        buf = self._buf
        buf += data
        try:
            frames = split_frames(buf, self.server.max_frame)
        except FrameTooLarge as exc:
            self.abort(str(exc))
            return
        handle = self.server.handle_frame
        for i, frame in enumerate(frames):
            if self.closed:
                return
            handle(self, frame)
            if self.upgrading and not self.tls_layer and (i + 1 < len(frames) or buf):
                # A client sends nothing in plaintext between START_TLS and its ClientHello.
                self.abort("data after START_TLS before its answer")
                return

    def eof_received(self) -> bool | None:
        if self._buf:
            self.server.conn_log(
                "bookie %s: connection %s closed mid-frame (%d bytes pending)",
                self.server.name,
                self.peer,
                len(self._buf),
            )
        # The client half-closed: answer what it sent, then close. Every add it sent is in
        # the journal already, so once everything appended so far is durable (callbacks run
        # in order) its replies are queued.
        journal = self.server.journal
        if journal.failed is None:
            journal.when_durable(journal.request_sync(), self._close_after_replies)
        else:
            self.server.loop.call_soon(self._close_after_replies, None)
        return True  # keep our side open until then

    def _close_after_replies(self, _exc: BaseException | None) -> None:
        if self.closed or self.transport is None:
            return
        self._flush()
        self.transport.close()  # flushes the transport's buffer, then closes

    def pause_writing(self) -> None:
        # The client is not reading its replies: stop reading its requests.
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    # sending ------------------------------------------------------------------------------

    def send(self, message: bytes) -> None:
        """Queue one framed reply; written with the others at the end of this loop turn."""
        if self.closed:
            return
        self._out.append(_LEN.pack(len(message)))
        self._out.append(message)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.server.loop.call_soon(self._flush)

    def send_raw(self, framed: bytes) -> None:
        """Queue bytes that already carry their length prefix (v2 replies)."""
        if self.closed:
            return
        self._out.append(framed)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.server.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self.upgrading and not self.closed:
            # Requests may arrive through the new TLS layer before start_tls() has returned
            # its transport: their replies wait for it (see _handshake).
            return
        if self.closed or self.transport is None or not self._out:
            self._out.clear()
            return
        out, self._out = self._out, []
        self.transport.write(b"".join(out))

    @property
    def encrypted(self) -> bool:
        """True once START_TLS is answered: every later byte comes through TLS (plaintext
        after START_TLS aborts the connection), even before start_tls() returns."""
        return self.secure or self.upgrading

    def start_tls(self, answer: bytes, source: TlsContextSource) -> None:
        """Send ``answer`` (START_TLS's EOK) in plaintext, then upgrade the transport to TLS
        as the server side of the handshake."""
        if self.transport is None or self.closed:
            return
        self._flush()
        self.upgrading = True
        self.transport.write(_LEN.pack(len(answer)) + answer)
        self.server.keep(self.server.loop.create_task(self._handshake(source)))

    async def _handshake(self, source: TlsContextSource) -> None:
        assert self.transport is not None
        loop = self.server.loop
        transport = self.transport
        try:
            ctx = source.get()
            # start_tls() swaps in its TLS protocol before its first await: from here on,
            # data_received sees only decrypted bytes.
            self.tls_layer = True
            new = await loop.start_tls(
                transport,
                self,
                ctx,
                server_side=True,
                ssl_handshake_timeout=source.settings.handshake_timeout,
            )
        except (ssl.SSLError, OSError, asyncio.TimeoutError, BKError) as exc:
            why = describe_ssl_error(exc, role="server") if not isinstance(exc, BKError) else exc
            self.server.conn_log(
                "bookie %s: TLS handshake with %s failed: %s", self.server.name, self.peer, why
            )
            self.closed = True
            self.server.connections.discard(self)
            transport.abort()
            return
        if new is None or self.closed:
            transport.abort()
            return
        self.transport = new
        self.secure = True
        self.upgrading = False
        self._flush()
        cert = new.get_extra_info("peercert")
        log.debug(
            "bookie %s: TLS with %s (%s)%s",
            self.server.name,
            self.peer,
            (new.get_extra_info("cipher") or ("?",))[0],
            f", client {dict(x[0] for x in cert.get('subject', ()))}" if cert else "",
        )

    def abort(self, reason: str) -> None:
        """Close this connection because of what the peer sent."""
        if self.closed:
            return
        self.server.conn_log("bookie %s: closing %s: %s", self.server.name, self.peer, reason)
        self.closed = True
        self._out.clear()
        if self.transport is not None:
            self.transport.abort()
