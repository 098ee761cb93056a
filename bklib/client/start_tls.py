"""START_TLS: dialling a bookie and upgrading the fresh connection to TLS before its first
request, whatever the protocol after it (``PerChannelBookieClient.initiateTLS``). Used by
:class:`~bklib.client.transport.PipelinedConnection` when ``ClientConfig.tls`` is set."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import struct

from bklib.client.responses import BadFrame, parse_response
from bklib.proto import protocol_pb2 as pb
from bklib.proto.framing import FramingError, check_length, encode_frame
from bklib.proto.status import status_name
from bklib.tls import (
    BookieTlsError,
    TlsContextSource,
    TlsHandshakeError,
    TlsNotConfiguredError,
    describe_ssl_error,
)

log = logging.getLogger(__name__)

__all__ = ["dial", "start_tls"]

_LEN = struct.Struct(">i")


async def start_tls(
    sock: socket.socket,
    host: str,
    port: int,
    tls: TlsContextSource,
    *,
    txn_id: int,
    max_frame: int,
    bookie_id: str,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Upgrade a fresh connection as ``PerChannelBookieClient.initiateTLS`` does: a v3
    START_TLS request (also on v2 connections, before any v2 request), the bookie's EOK in
    plaintext, then the TLS handshake on the same socket; the streams over TLS. Raises a
    BookieTlsError subclass naming the bookie; nothing else was sent on the connection."""
    ctx = tls.get()
    timeout = tls.settings.handshake_timeout
    where = f"{host}:{port}"
    req = pb.Request()
    req.header.version = pb.VERSION_THREE
    req.header.operation = pb.START_TLS
    req.header.txnId = txn_id
    req.startTLSRequest.SetInParent()
    try:
        frame = await asyncio.wait_for(
            _exchange(sock, encode_frame(req.SerializeToString()), max_frame),
            timeout,
        )
    except asyncio.TimeoutError:
        raise BookieTlsError(
            f"no answer to START_TLS from {where} within {timeout}s", bookie=bookie_id
        ) from None
    except EOFError:
        raise BookieTlsError(
            f"{where} closed the connection on START_TLS (not a BookKeeper bookie, or one "
            "that does not speak START_TLS)",
            bookie=bookie_id,
        ) from None
    except (OSError, FramingError) as exc:
        raise BookieTlsError(
            f"START_TLS to {where} failed: {getattr(exc, 'reason', None) or exc}",
            bookie=bookie_id,
        ) from exc
    try:
        resp = parse_response(frame)
    except BadFrame as exc:
        raise BookieTlsError(
            f"{where} answered START_TLS with something else ({exc})", bookie=bookie_id
        ) from None
    if resp.header.operation != pb.START_TLS:
        op = pb.OperationType.Name(resp.header.operation)
        raise BookieTlsError(f"{where} answered START_TLS with a {op} response", bookie=bookie_id)
    if resp.status == pb.EBADREQ:
        raise TlsNotConfiguredError(
            f"TLS requested but {where} has no TLS configured (START_TLS answered EBADREQ)",
            bookie=bookie_id,
        )
    if resp.status != pb.EOK:
        raise BookieTlsError(
            f"{where} refused START_TLS: {status_name(resp.status)}", bookie=bookie_id
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
            bookie=bookie_id,
        ) from None
    log.debug("bookie %s: TLS with %s (%s)", bookie_id, where, _cipher(writer))
    return reader, writer


def _cipher(writer: asyncio.StreamWriter) -> str:
    cipher = writer.get_extra_info("cipher")
    return f"{cipher[1]} {cipher[0]}" if cipher else "?"


async def dial(host: str, port: int) -> socket.socket:
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
