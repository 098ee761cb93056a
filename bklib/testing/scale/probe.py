"""A ZooKeeper latency probe: what another client of the ensemble (a Pulsar broker) sees while
bkaudit runs.

It reads one znode every ``interval`` seconds on a session of its own, a plain kazoo client
outside bkaudit's request budget, and keeps every latency. ``bench/scale.py`` runs one through
each measured command and reports its p50, p99 and maximum (docs/zookeeper-budget.md).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException

__all__ = ["LatencyProbe", "LatencySummary", "summarize"]


@dataclass(frozen=True)
class LatencySummary:
    """Read latencies in milliseconds."""

    reads: int
    errors: int
    p50_ms: float
    p99_ms: float
    max_ms: float


def summarize(latencies_s: list[float], errors: int = 0) -> LatencySummary:
    """The nearest-rank p50, p99 and maximum of ``latencies_s`` (seconds), in ms."""
    if not latencies_s:
        return LatencySummary(0, errors, 0.0, 0.0, 0.0)
    ordered = sorted(latencies_s)

    def rank(q: float) -> float:
        i = max(0, min(len(ordered) - 1, int(q * len(ordered) + 0.999999) - 1))
        return round(ordered[i] * 1000, 2)

    return LatencySummary(len(ordered), errors, rank(0.50), rank(0.99), rank(1.0))


class LatencyProbe(threading.Thread):
    """Reads ``path`` on ``hosts`` every ``interval`` s until :meth:`stop`; a failed read is
    counted as an error, not a latency."""

    def __init__(self, hosts: str, path: str, interval: float = 0.01) -> None:
        super().__init__(daemon=True, name="zk-latency-probe")
        self.client = KazooClient(hosts=hosts, timeout=30)
        self.path = path
        self.interval = interval
        self.latencies: list[float] = []
        self.errors = 0
        self._stop_event = threading.Event()

    def __enter__(self) -> LatencyProbe:
        self.client.start(timeout=30)
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def run(self) -> None:
        while not self._stop_event.is_set():
            t0 = time.perf_counter()
            try:
                self.client.get(self.path)
                self.latencies.append(time.perf_counter() - t0)
            except KazooException:
                self.errors += 1
            self._stop_event.wait(self.interval)

    def stop(self) -> LatencySummary:
        """Stop probing, close the session and summarize."""
        self._stop_event.set()
        if self.is_alive():
            self.join()
        self.client.stop()
        self.client.close()
        return self.summary()

    def summary(self) -> LatencySummary:
        return summarize(list(self.latencies), self.errors)
