"""The watch's HTTP endpoints on one port, served by one small server thread: ``/metrics``
(:class:`~jobs.watch.metrics.WatchMetrics`), ``/healthz`` (the main loop is alive and its
cycles do not keep failing) and ``/readyz`` (connected, leading or standing by, the warehouse
writable), answered from :class:`Health`."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from jobs.watch.metrics import WatchMetrics

__all__ = ["Health", "MetricsServer"]

log = logging.getLogger("jobs.watch")


class Health:
    """What ``/healthz`` and ``/readyz`` answer from: the loop's heartbeat and readiness."""

    def __init__(self, stale_after: float, max_failed_cycles: int = 5) -> None:
        self.stale_after = stale_after
        self.max_failed_cycles = max_failed_cycles
        self.beat = time.monotonic()
        self.ready_reason: str | None = "starting"
        self.role = "starting"
        self.failed_cycles = 0
        """Consecutive leader cycles that failed (raised, or their audit did not complete): a
        loop that beats but fails every cycle is alive but useless, and ``/healthz`` says
        so."""
        self.last_failure: str | None = None

    def heartbeat(self) -> None:
        """The main loop is alive (each cycle, and each step of long work)."""
        self.beat = time.monotonic()

    def cycle_failed(self, why: str) -> None:
        """One more leader cycle failed in a row, ``why`` (the one rule: see
        :meth:`jobs.watch.cycle.Cycle.run`)."""
        self.failed_cycles += 1
        self.last_failure = why

    def cycle_ok(self) -> None:
        """A leader cycle succeeded: the count of failures in a row starts again."""
        self.failed_cycles = 0
        self.last_failure = None

    def healthy(self) -> tuple[bool, str]:
        """``/healthz``: (ok, why). Not ok when the loop is silent, or after
        ``max_failed_cycles`` failed cycles in a row (0: never)."""
        age = time.monotonic() - self.beat
        if age > self.stale_after:
            return False, f"main loop silent for {age:.0f}s"
        if self.max_failed_cycles > 0 and self.failed_cycles >= self.max_failed_cycles:
            return False, f"{self.failed_cycles} cycles failed in a row: {self.last_failure}"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        """``/readyz``: (ok, the reason it is not, or the role)."""
        if self.ready_reason is not None:
            return False, self.ready_reason
        return True, self.role


class MetricsServer:
    """``/metrics``, ``/healthz`` (the loop is alive) and ``/readyz`` (connected, elected or
    standing by, and the warehouse writable) on one port."""

    def __init__(
        self,
        metrics: WatchMetrics,
        health: Health,
        host: str,
        port: int,
        info: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, outer.metrics.render(), CONTENT_TYPE_LATEST)
                elif path in ("/healthz", "/readyz"):
                    ok, why = (outer.health.healthy if path == "/healthz" else outer.health.ready)()
                    body = {"status": "ok" if ok else "unavailable", "detail": why}
                    if outer.info is not None:
                        body.update(outer.info())
                    self._send(200 if ok else 503, json.dumps(body).encode(), "application/json")
                else:
                    self._send(404, b"not found\n", "text/plain")

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, fmt: str, *args: Any) -> None:
                log.debug("http: " + fmt, *args)

        self.metrics, self.health, self.info = metrics, health, info
        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(
            target=self.server.serve_forever, name="metrics-http", daemon=True
        )

    def start(self) -> MetricsServer:
        self.thread.start()
        log.info("watch: metrics on http://%s:%d/metrics", *self.server.server_address[:2])
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
