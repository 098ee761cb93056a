"""Why a store's address cannot be reached, said at once: name not found, refused, timed out.

A client library left to itself hides the cause: kazoo retries a refused port or a name that
does not resolve for its whole connection timeout (30 s), logging a warning per try, then says
"Connection time-out"; Oxia's client retries as long. Before handing an address to its client,
a store asks :func:`check_reachable`: each server's name is resolved
(``socket.getaddrinfo``) and each of its addresses is given one TCP connect, with a short
bounded retry for a refusal or a temporary DNS failure (a server that is restarting). The first
server that accepts a connection is enough: the client then connects as it always did. When
none does, :class:`Unreachable` says why, naming each address (docs/operations.md, "Wrong
addresses").
"""

from __future__ import annotations

import errno
import queue
import socket
import threading
import time
from collections.abc import Sequence

from bklib.meta.stores.base import StoreUnavailable

__all__ = [
    "CONNECT_TIMEOUT",
    "RETRY_FOR",
    "Unreachable",
    "check_reachable",
    "diagnose",
]

CONNECT_TIMEOUT = 5.0
"""Longest wait for one TCP connect: an address that neither accepts nor refuses by then
(an unroutable address, a firewall that drops) has timed out."""

RETRY_FOR = 0.5
"""How long a refusal or a temporary DNS failure is retried before it is the answer: a server
restarting under us is back within it, a wrong port or name is not."""

_RETRY_PAUSE = 0.25


class Unreachable(StoreUnavailable):
    """No server of the address accepted a TCP connection; the message names each address
    and its cause."""


def _format(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _resolve(host: str, port: int) -> list[tuple[int, tuple[object, ...]]] | str:
    """The (family, sockaddr) of ``host``, or why there are none."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        if exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
            return "name not found"
        if exc.errno == socket.EAI_AGAIN:
            return "name not resolved (temporary DNS failure)"
        return f"name not resolved ({exc.strerror or exc})"
    except UnicodeError:
        return "name not found (not a valid host name)"
    return [(family, sockaddr) for family, _, _, _, sockaddr in infos] or "name not found"


def _connect(family: int, sockaddr: tuple[object, ...], timeout: float) -> str | None:
    """None when the address accepts a TCP connection, else why not."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(sockaddr)
    except TimeoutError:
        return f"timed out after {timeout:g}s"
    except ConnectionRefusedError:
        return "connection refused"
    except OSError as exc:
        if exc.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
            return f"unreachable ({exc.strerror})"
        return exc.strerror or str(exc) or type(exc).__name__
    finally:
        sock.close()
    return None


def _diagnose_once(host: str, port: int, timeout: float) -> str | None:
    resolved = _resolve(host, port)
    if isinstance(resolved, str):
        return resolved
    causes = [_connect(family, addr, timeout) for family, addr in resolved]
    failed = [c for c in causes if c is not None]
    if len(failed) < len(causes):
        return None
    return next((c for c in failed if c != "connection refused"), "connection refused")


def _retryable(cause: str) -> bool:
    return cause == "connection refused" or "temporary" in cause


def diagnose(host: str, port: int, *, timeout: float = CONNECT_TIMEOUT) -> str | None:
    """None when ``host:port`` accepts a TCP connection (one of its addresses does), else the
    cause: ``name not found``, ``connection refused``, ``timed out after Ns``, ... A refusal
    or a temporary DNS failure is tried again for :data:`RETRY_FOR` seconds."""
    causes = _diagnose_all([(host, port)], timeout)
    return None if causes is None else causes[(host, port)]


def _diagnose_all(
    servers: Sequence[tuple[str, int]], timeout: float
) -> dict[tuple[str, int], str] | None:
    """None as soon as one server accepts; else each server's cause. Every server is tried
    once before any refusal is retried, so that one server down costs the others nothing."""
    deadline = time.monotonic() + RETRY_FOR
    causes: dict[tuple[str, int], str] = {}
    pending = list(servers)
    while True:
        round_causes = _diagnose_round(pending, timeout)
        if round_causes is None:
            return None
        causes.update(round_causes)
        pending = [s for s in pending if _retryable(causes[s])]
        if not pending or time.monotonic() >= deadline:
            return causes
        time.sleep(_RETRY_PAUSE)


def _diagnose_round(
    servers: Sequence[tuple[str, int]], timeout: float
) -> dict[tuple[str, int], str] | None:
    """Each of ``servers`` tried once, all at the same time (three silent servers cost one
    timeout, not three): None as soon as one accepts, else each one's cause. The threads are
    daemons: one still waiting on a silent address never holds up the answer or the exit."""
    if len(servers) == 1:
        cause = _diagnose_once(*servers[0], timeout)
        return None if cause is None else {servers[0]: cause}
    answers: queue.Queue[tuple[tuple[str, int], str | None]] = queue.Queue()

    def ask(server: tuple[str, int]) -> None:
        try:
            answers.put((server, _diagnose_once(*server, timeout)))
        except Exception as exc:  # noqa: BLE001 - a cause for the line, whatever it is
            answers.put((server, f"{type(exc).__name__}: {exc}"))

    for server in servers:
        threading.Thread(target=ask, args=(server,), name="reachability", daemon=True).start()
    causes: dict[tuple[str, int], str] = {}
    while len(causes) < len(servers):
        server, cause = answers.get()
        if cause is None:
            return None
        causes[server] = cause
    return causes


def check_reachable(
    servers: Sequence[tuple[str, int]], what: str, *, timeout: float = CONNECT_TIMEOUT
) -> None:
    """Return once one of ``servers`` accepts a TCP connection; raise :class:`Unreachable`
    otherwise, one line: ``cannot connect to WHAT at HOST:PORT: connection refused`` (each
    address with its cause when there are several). ``what`` names the store
    (``ZooKeeper``, ``Oxia``)."""
    causes = _diagnose_all(servers, timeout)
    if causes is None:
        return
    named = "; ".join(f"{_format(host, port)}: {causes[(host, port)]}" for host, port in servers)
    raise Unreachable(f"cannot connect to {what} at {named}")
