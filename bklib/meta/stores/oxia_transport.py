"""gRPC channels to Oxia with TLS and a bearer token, for the ``oxia`` client and our scans.

PyPI's ``oxia`` 0.2.1 opens every channel with ``grpc.insecure_channel`` in its
``ConnectionPool`` and has no TLS or authentication option. Rather than fork it, the client
is given a pool of our own (:func:`secure_client`): the same pool, opening
``grpc.secure_channel`` with TLS channel credentials composed with call credentials that add
``authorization: Bearer <token>`` to every call, the metadata Oxia's ``oidc`` provider reads
(``server/auth``: ``MetadataAuthorizationKey``, ``TokenPrefix``). gRPC attaches call
credentials only to secure channels, so a token never travels in plain text.

Before a client is built, :func:`probe` checks the settings against the server, so that a
wrong CA, a plain-text port, a refused or missing token is one line at once
(:class:`OxiaSecurityError`) instead of the client's silent retries until its timeout.
Imported only once the client is (grpc comes with the ``oxia`` extra).
"""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Callable
from typing import Any

import grpc
from oxia.internal import connection_pool

from bklib.errors import ZKError
from bklib.meta.oxia_security import TOKEN_ENV, OxiaAccess, OxiaTls
from bklib.meta.stores.base import StoreUnavailable

__all__ = [
    "ChannelOpener",
    "OxiaSecurityError",
    "channel_opener",
    "probe",
    "secure_client",
]

ChannelOpener = Callable[[str], Any]
"""Opens a gRPC channel to ``HOST:PORT``."""

SHARD_ASSIGNMENTS = "/io.streamnative.oxia.proto.OxiaClient/GetShardAssignments"


class OxiaSecurityError(ZKError):
    """Oxia refused us for a reason retrying cannot fix: an untrusted or mismatching
    certificate, a failed TLS handshake, a refused or missing token."""


class _BearerToken(grpc.AuthMetadataPlugin):  # type: ignore[misc]
    """``authorization: Bearer <token>`` on every call; the token is looked up per call, so
    a rotated token file is followed."""

    def __init__(self, access: OxiaAccess) -> None:
        self._access = access

    def __call__(self, context: Any, callback: Any) -> None:
        token = self._access.current_token()
        callback((("authorization", f"Bearer {token}"),) if token else (), None)


def _credentials(tls: OxiaTls, access: OxiaAccess) -> Any:
    ca, key, chain = tls.read()
    creds = grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=key, certificate_chain=chain
    )
    if access.token is None and access.token_file is None:
        return creds
    return grpc.composite_channel_credentials(
        creds, grpc.metadata_call_credentials(_BearerToken(access), name="oxia-token")
    )


def channel_opener(access: OxiaAccess | None) -> ChannelOpener:
    """How to open a channel with ``access``: plain text without TLS settings."""
    if access is None or access.tls is None:
        return grpc.insecure_channel  # type: ignore[no-any-return]
    tls = access.tls
    creds = _credentials(tls, access)
    options = [("grpc.ssl_target_name_override", tls.server_name)] if tls.server_name else []

    def open_secure(address: str) -> Any:
        return grpc.secure_channel(address, creds, options=options)

    return open_secure


class _Pool(connection_pool.ConnectionPool):  # type: ignore[misc]
    """The client's connection pool, opening its channels with ``opener``."""

    def __init__(self, opener: ChannelOpener) -> None:
        super().__init__()
        self._opener = opener

    def get(self, address: str) -> Any:
        with self._lock:
            entry = self.connections.get(address)
            if entry is None:
                channel = self._opener(address)
                entry = self.connections[address] = (
                    channel,
                    connection_pool.OxiaClientStub(channel),
                )
            return entry[1]


def secure_client(
    oxia: Any,
    address: str,
    access: OxiaAccess,
    *,
    namespace: str,
    session_timeout_ms: int,
    client_identifier: str,
) -> Any:
    """An ``oxia.Client`` whose channels carry ``access``: built as ``Client.__init__``
    builds one (0.2.1), with our pool in place of the plain-text one."""
    import oxia.client as oxia_client

    client = object.__new__(oxia.Client)
    client._closed = False
    client._connections = _Pool(channel_opener(access))
    client._service_discovery = oxia_client.ServiceDiscovery(
        address, client._connections, namespace
    )
    client._session_manager = oxia_client.SessionManager(
        client._service_discovery, session_timeout_ms, client_identifier
    )
    return client


# ---- the probe --------------------------------------------------------------------------------

_PROBED: set[tuple[str, str, OxiaAccess | None]] = set()
_PROBED_LOCK = threading.Lock()


def probe(address: str, namespace: str, access: OxiaAccess | None, timeout: float) -> None:
    """Check ``access`` against the server at ``address`` once per process: a TLS handshake
    (when TLS is asked for), then one shard-assignments call with the token. Raises
    :class:`OxiaSecurityError` with one line, StoreUnavailable when the server does not serve
    ``namespace`` (it says so at once) or no assignments come within ``timeout``; anything
    else (unreachable) is left to the client's own timeout."""
    key = (address, namespace, access)
    with _PROBED_LOCK:
        if key in _PROBED:
            return
    if access is not None and access.tls is not None:
        _handshake(address, access.tls, timeout)
    _call_once(address, namespace, access, timeout)
    with _PROBED_LOCK:
        _PROBED.add(key)


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _tls_context(tls: OxiaTls) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if tls.ca_file:
        ctx.load_verify_locations(tls.ca_file)
    else:
        ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if tls.cert_file:
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
    ctx.set_alpn_protocols(["h2"])  # as gRPC offers: Go's gRPC server insists on it
    return ctx


def _handshake(address: str, tls: OxiaTls, timeout: float) -> None:
    host, port = _host_port(address)
    where = f"Oxia TLS handshake with {address} failed"
    try:
        ctx = _tls_context(tls)
    except (OSError, ValueError) as exc:
        raise OxiaSecurityError(f"Oxia TLS settings unusable: {_ssl_reason(exc)}") from None
    try:
        raw = socket.create_connection((host, port), timeout=timeout)
    except OSError:
        return  # unreachable: the client's connect reports it
    try:
        with ctx.wrap_socket(raw, server_hostname=tls.server_name or host) as conn:
            _await_verdict(conn, min(timeout, 2.0), where)
            return
    except ssl.SSLCertVerificationError as exc:
        raise OxiaSecurityError(f"{where}: certificate not trusted: {exc.verify_message}") from None
    except ssl.SSLError as exc:
        raise OxiaSecurityError(f"{where}: {_ssl_reason(exc)}") from None
    except TimeoutError:
        raise OxiaSecurityError(f"{where}: no TLS answer in {timeout:g}s") from None
    except OSError as exc:  # closed during the handshake: a plain-text port
        raise OxiaSecurityError(
            f"{where}: the server closed the connection ({exc.strerror or exc}); is its port TLS?"
        ) from None
    finally:
        raw.close()


def _await_verdict(conn: ssl.SSLSocket, wait: float, where: str) -> None:
    """Under TLS 1.3 the server judges our certificate (or its absence) after the client's
    handshake is done: read until gRPC's server speaks first (its SETTINGS frame) or an alert
    arrives (:class:`OxiaSecurityError`); silence for ``wait`` seconds counts as accepted."""
    conn.settimeout(wait)
    try:
        conn.recv(1)
    except TimeoutError:
        return
    except ssl.SSLError as exc:
        reason = _ssl_reason(exc)
        if "CERTIFICATE_REQUIRED" in reason:
            reason = "the server requires a client certificate (--oxia-tls-cert, --oxia-tls-key)"
        raise OxiaSecurityError(f"{where}: {reason}") from None


def _ssl_reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"certificate not trusted: {exc.verify_message}"
    reason = getattr(exc, "reason", None)
    if reason == "WRONG_VERSION_NUMBER":
        return "the server did not answer TLS (is its port plain text?)"
    return str(reason or exc).strip() or type(exc).__name__


def _namespace_request(namespace: str) -> bytes:
    # ShardAssignmentsRequest{namespace = 1}: a length-delimited field, encoded by hand so the
    # probe needs no generated message.
    data = namespace.encode()
    size, length = len(data), bytearray()
    while True:
        byte, size = size & 0x7F, size >> 7
        length.append(byte | (0x80 if size else 0))
        if not size:
            break
    return b"\x0a" + bytes(length) + data


def _call_once(address: str, namespace: str, access: OxiaAccess | None, timeout: float) -> None:
    channel = channel_opener(access)(address)
    try:
        call = channel.unary_stream(SHARD_ASSIGNMENTS)(
            _namespace_request(namespace), timeout=timeout
        )
        try:
            next(iter(call))
        finally:
            call.cancel()
    except grpc.RpcError as exc:
        code, details = exc.code(), (exc.details() or "").strip()
        if code == grpc.StatusCode.UNAUTHENTICATED:
            token = access is not None and access.current_token() is not None
            if token:
                raise OxiaSecurityError(f"Oxia at {address} refused the token: {details}") from None
            raise OxiaSecurityError(
                f"Oxia at {address} requires a token ({details}): give --oxia-tls with "
                f"--oxia-token-file or ${TOKEN_ENV}"
            ) from None
        if "namespace not found" in details:  # Oxia's ErrNamespaceNotFound, sent at once
            raise StoreUnavailable(
                f"cannot connect to Oxia at oxia://{address}/{namespace}: the server does not "
                f"serve namespace {namespace!r} ({details})"
            ) from None
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:  # the client would wait as long again
            raise StoreUnavailable(
                f"cannot connect to Oxia at oxia://{address}/{namespace}: no shard assignments "
                f"in {timeout:g}s"
            ) from None
        secure = access is not None and access.tls is not None
        if not secure and code == grpc.StatusCode.UNAVAILABLE and _speaks_tls(address, timeout):
            raise OxiaSecurityError(
                f"Oxia at {address} serves TLS: give --oxia-tls (and --oxia-tls-ca)"
            ) from None
        if secure and _tls_failure(details):
            raise OxiaSecurityError(
                f"Oxia TLS handshake with {address} failed: {details}"
            ) from None
    except StopIteration:
        pass
    finally:
        channel.close()


def _speaks_tls(address: str, timeout: float) -> bool:
    """Whether the port completes a TLS handshake (certificate unchecked: only to name the
    mistake of a plain-text client; nothing is sent after the handshake)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    try:
        with (
            socket.create_connection(_host_port(address), timeout=min(timeout, 5.0)) as raw,
            ctx.wrap_socket(raw),
        ):
            return True
    except (OSError, ValueError):
        return False


def _tls_failure(details: str) -> bool:
    text = details.lower()
    return any(word in text for word in ("handshake", "ssl", "certificate", "tls"))
