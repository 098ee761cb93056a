"""An HTTP proxy in front of the real S3-compatible server, for the faults a test needs: a
store that answers differently (:class:`Rewrite`), one that goes away
(:meth:`S3Proxy.go_away`: connections refused) and a request held on its way
(:attr:`S3Proxy.hold`). The requests
that reach the server are the clients' own, signatures and all: only what comes back, or
whether anything does, is changed."""

from __future__ import annotations

import http.client
import http.server
import re
import socketserver
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from bklib.testing.s3server import S3Server

Rewrite = Callable[[str, dict[str, str], int, bytes], tuple[int, bytes]]
"""(method, request headers, status, body) -> the (status, body) the client gets."""

ACCESS_DENIED = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code>'
    b"<Message>Access Denied</Message></Error>"
)


class S3Proxy(socketserver.ThreadingTCPServer):
    """Forwards to ``upstream``. ``down``: every request is closed unanswered. ``hold``:
    a request whose method and path match it waits for :meth:`release` (``held`` is set when
    one arrives), then is forwarded or, with ``release(forward=False)``, dropped."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, upstream: S3Server, rewrite: Rewrite | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.upstream = (upstream.host, upstream.port)
        self.rewrite = rewrite
        self.down = False
        self.hold: tuple[str, re.Pattern[str]] | None = None
        self.held = threading.Event()
        self._released = threading.Event()
        self._forward_held = True
        self.requests: list[tuple[str, str]] = []

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def go_away(self) -> None:
        """Stop listening (new connections are refused, as from a store that is down) and
        close what is held or arrives on an open connection unanswered."""
        self.down = True
        self.shutdown()
        self.server_close()

    def release(self, forward: bool = True) -> None:
        self._forward_held = forward
        self.hold = None
        self._released.set()


class _Handler(http.server.BaseHTTPRequestHandler):
    server: S3Proxy

    def _forward(self) -> None:
        srv = self.server
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        srv.requests.append((self.command, self.path))
        if srv.down:
            self.close_connection = True
            return
        hold = srv.hold
        if hold is not None and self.command == hold[0] and hold[1].search(self.path):
            srv.held.set()
            srv._released.wait(120)
            if not srv._forward_held:
                self.close_connection = True
                return
        headers = dict(self.headers.items())
        conn = http.client.HTTPConnection(*srv.upstream, timeout=30)
        conn.request(self.command, self.path, body=body, headers=headers)
        resp = conn.getresponse()
        status, data = resp.status, resp.read()
        if srv.rewrite is not None:
            status, data = srv.rewrite(self.command, headers, status, data)
        try:
            self.send_response(status)
            # A HEAD's Content-Length is the object's size, not this (empty) body's.
            keep = ("transfer-encoding", "connection")
            if self.command != "HEAD":
                keep += ("content-length",)
            for key, value in resp.getheaders():
                if key.lower() not in keep:
                    self.send_header(key, value)
            if self.command != "HEAD":
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        except OSError:
            pass  # the client is gone (killed while held): the server did the request anyway
        finally:
            conn.close()

    do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = _forward

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def s3_proxy(upstream: S3Server, rewrite: Rewrite | None = None) -> Iterator[S3Proxy]:
    """An :class:`S3Proxy` serving on a free loopback port for the block."""
    proxy = S3Proxy(upstream, rewrite)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy.release(forward=False)
        if not proxy.down:
            proxy.shutdown()
            proxy.server_close()


def ignore_conditions(
    method: str, headers: dict[str, str], status: int, body: bytes
) -> tuple[int, bytes]:
    """A refused conditional create (412) answered 200: a store that ignores
    ``If-None-Match``, as some S3-compatible servers do."""
    if status == 412 and method == "PUT" and any(k.lower() == "if-none-match" for k in headers):
        return 200, b""
    return status, body


def deny_writes(
    method: str, headers: dict[str, str], status: int, body: bytes
) -> tuple[int, bytes]:
    """Every PUT and DELETE answered 403 AccessDenied, as S3 answers credentials a bucket
    policy grants only reads (the request still reached the server: a test's bucket is its
    own, and a denied probe leaves nothing a reader could mistake for a table)."""
    if method in ("PUT", "DELETE"):
        return 403, ACCESS_DENIED
    return status, body
