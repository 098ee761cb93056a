"""Prometheus metrics of ``bkaudit watch`` and its ``/metrics``, ``/healthz`` and ``/readyz``
endpoints (one small HTTP server thread; prometheus_client renders the metrics)."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from bklib.states import ActionKind, ActionStatus, BookieState, Check
from jobs.watch.decide import SEVERITY_ORDER

__all__ = ["MetricsServer", "WatchMetrics"]

log = logging.getLogger("jobs.watch")

REPAIR_BUCKETS = (5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 21600, 86400)
"""Seconds from a bookie's loss to no ledger naming it: from seconds (delay 0) to a day."""


class WatchMetrics:
    """Every metric the watch exports, in a registry of its own."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.ur_ledgers = Gauge(
            "bkaudit_underreplicated_ledgers",
            "Under-replicated ledgers in the latest audit of each check, by worst severity",
            ["check", "severity"],
            registry=r,
        )
        self.ur_fragments = Gauge(
            "bkaudit_underreplicated_fragments",
            "Under-replicated fragments in the latest audit of each check, by severity",
            ["check", "severity"],
            registry=r,
        )
        self.marks = Gauge(
            "bkaudit_underreplication_marks",
            "Ledgers with a BookKeeper under-replication mark now",
            registry=r,
        )
        self.bookies = Gauge(
            "bkaudit_bookies",
            "Bookies by state (lost: gone, not yet repaired)",
            ["state"],
            registry=r,
        )
        self.copied_bytes = Counter(
            "bkaudit_copied_bytes", "Bytes copied by finished COPY actions", registry=r
        )
        self.copied_entries = Counter(
            "bkaudit_copied_entries", "Entries copied by finished COPY actions", registry=r
        )
        self.actions = Counter(
            "bkaudit_repair_actions",
            "Repair actions by kind and status",
            ["action", "status"],
            registry=r,
        )
        self.time_to_repair = Histogram(
            "bkaudit_time_to_repair_seconds",
            "From a bookie's loss being seen to no ledger naming it",
            buckets=REPAIR_BUCKETS,
            registry=r,
        )
        self.last_audit = Gauge(
            "bkaudit_last_audit_timestamp_seconds",
            "Unix time the latest audit of each check finished",
            ["check"],
            registry=r,
        )
        self.audits = Counter(
            "bkaudit_audit_runs",
            "Audit runs started by this instance",
            ["check", "status"],
            registry=r,
        )
        self.leader = Gauge(
            "bkaudit_watch_leader", "1 while this instance leads, 0 on standby", registry=r
        )
        self.paused = Gauge(
            "bkaudit_repair_paused", "1 while underreplication/disable exists", registry=r
        )
        self.delay = Gauge(
            "bkaudit_lost_bookie_recovery_delay_seconds",
            "The lostBookieRecoveryDelay in force",
            registry=r,
        )
        self.warehouse_errors = Counter(
            "bkaudit_warehouse_errors", "Failed reads or writes of the Delta tables", registry=r
        )
        self.session_losses = Counter(
            "bkaudit_zk_session_losses", "ZooKeeper sessions lost (expired)", registry=r
        )
        self.spooled_files = Gauge(
            "bkaudit_spooled_files",
            "Failed table appends waiting in the spool (--spool-dir) to be written",
            registry=r,
        )
        self.spooled_rows = Gauge(
            "bkaudit_spooled_rows", "Table rows waiting in the spool to be written", registry=r
        )
        self.cycle_failures = Counter(
            "bkaudit_watch_cycle_failures",
            "Leader cycles that raised (an audit, a repair or a table step failed)",
            registry=r,
        )
        for s in BookieState.ALL:
            self.bookies.labels(s).set(0)
        for c in Check.ALL:
            for sev in SEVERITY_ORDER:
                self.ur_ledgers.labels(c, sev)
                self.ur_fragments.labels(c, sev)

    def set_findings(
        self, check: str, fragments: Mapping[str, int], ledgers: Mapping[str, int]
    ) -> None:
        for sev in SEVERITY_ORDER:
            self.ur_fragments.labels(check, sev).set(fragments.get(sev, 0))
            self.ur_ledgers.labels(check, sev).set(ledgers.get(sev, 0))

    def count_actions(self, rows: Iterable[Mapping[str, Any]]) -> None:
        for r in rows:
            self.actions.labels(r["action"], r["status"]).inc()
            if r["action"] == ActionKind.COPY and r["status"] == ActionStatus.DONE:
                self.copied_bytes.inc(int(r["bytes_copied"] or 0))
                self.copied_entries.inc(int(r["entries_copied"] or 0))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class Health:
    """What ``/healthz`` and ``/readyz`` answer from: the loop's heartbeat and readiness."""

    def __init__(self, stale_after: float, max_failed_cycles: int = 5) -> None:
        self.stale_after = stale_after
        self.max_failed_cycles = max_failed_cycles
        self.beat = time.monotonic()
        self.ready_reason: str | None = "starting"
        self.role = "starting"
        self.failed_cycles = 0
        """Consecutive leader cycles that raised: a loop that beats but fails every cycle
        is alive but useless, and ``/healthz`` says so."""
        self.last_failure: str | None = None

    def heartbeat(self) -> None:
        self.beat = time.monotonic()

    def cycle_failed(self, why: str) -> None:
        self.failed_cycles += 1
        self.last_failure = why

    def cycle_ok(self) -> None:
        self.failed_cycles = 0
        self.last_failure = None

    def healthy(self) -> tuple[bool, str]:
        age = time.monotonic() - self.beat
        if age > self.stale_after:
            return False, f"main loop silent for {age:.0f}s"
        if self.max_failed_cycles > 0 and self.failed_cycles >= self.max_failed_cycles:
            return False, f"{self.failed_cycles} cycles failed in a row: {self.last_failure}"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
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
