"""The ZooKeeper request budget: at most ``--zk-rate`` requests per second from one process.

ZooKeeper is the part of a BookKeeper cluster every broker and bookie shares, and BookKeeper's
BP-66 was written because re-replication pushed its read latency to minutes. bkaudit sends its
requests through two clients, and both draw from one token bucket per process:

- every kazoo session (:func:`~.client.new_client` makes them :class:`BudgetedKazooClient`):
  marks, locks, compare-and-set, the watch, the listings;
- the pipelined bulk session of :mod:`~.bulk` (the metadata scan), which sends as many
  requests as the bucket holds and waits for tokens only when nothing is in flight.

A Spark run shares its budget among its task slots: each Python worker takes its share from
``$BKAUDIT_ZK_RATE`` (:data:`RATE_ENV`), which the driver sets for the executors
(:func:`jobs.spark.session.spark_conf`). Pings and session set-up are not counted: they are
what keeps a session alive. docs/zookeeper-budget.md has the measurements behind the default.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from kazoo.client import KazooClient

__all__ = [
    "DEFAULT_REQUEST_RATE",
    "RATE_ENV",
    "BudgetedKazooClient",
    "RequestBudget",
    "request_budget",
    "set_request_rate",
    "shared_budget",
]

log = logging.getLogger(__name__)

DEFAULT_REQUEST_RATE = 40_000.0
"""``--zk-rate``'s default, requests/s per run (docs/zookeeper-budget.md has the measurements)."""

RATE_ENV = "BKAUDIT_ZK_RATE"
"""Requests per second for this process when no command line set one (Spark's workers)."""

BURST_SECONDS = 0.1
"""The bucket holds this much of the rate (at least one request): short bursts, no backlog."""


class RequestBudget:
    """A thread-safe token bucket of ``rate`` requests per second; ``None`` is unlimited.

    ``clock`` and ``sleep`` are injectable so that the arithmetic is tested without waiting.
    """

    def __init__(
        self,
        rate: float | None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate is not None and rate <= 0:
            raise ValueError(f"a request rate must be positive, not {rate}")
        self.rate = rate
        self.burst = max(1.0, rate * BURST_SECONDS) if rate is not None else 0.0
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._tokens = self.burst
        self._stamp = clock()
        self.requests = 0
        """Requests granted so far."""
        self.waited = 0.0
        """Seconds callers spent waiting for tokens."""

    def _refill(self) -> None:
        now = self._clock()
        assert self.rate is not None
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    def take_up_to(self, n: int) -> int:
        """Up to ``n`` requests granted now, without waiting (0 when the bucket is empty)."""
        with self._lock:
            if self.rate is None:
                self.requests += n
                return n
            self._refill()
            got = min(n, int(self._tokens))
            self._tokens -= got
            self.requests += got
            return got

    def refund(self, n: int) -> None:
        """Give back ``n`` granted requests that were not sent."""
        with self._lock:
            self.requests -= n
            if self.rate is not None:
                self._tokens = min(self.burst, self._tokens + n)

    def acquire(self) -> None:
        """One request, waiting for its token when the bucket is empty. The token is taken at
        once (the bucket may go into debt) and the caller sleeps off the debt, so that waiting
        callers are served in turn and float rounding cannot make one spin."""
        with self._lock:
            self.requests += 1
            if self.rate is None:
                return
            self._refill()
            self._tokens -= 1.0
            if self._tokens >= 0.0:
                return
            wait = -self._tokens / self.rate
            self.waited += wait
        self._sleep(wait)


def _rate_from_env() -> float | None:
    text = os.environ.get(RATE_ENV, "").strip()
    if not text:
        return None
    try:
        rate = float(text)
    except ValueError:
        log.warning("ignoring $%s=%r: not a number of requests per second", RATE_ENV, text)
        return None
    return rate if rate > 0 else None


_budget = RequestBudget(_rate_from_env())


def request_budget() -> RequestBudget:
    """This process's budget."""
    return _budget


def set_request_rate(rate: float | None) -> RequestBudget:
    """Replace this process's budget with one of ``rate`` requests/s (None: unlimited)."""
    global _budget
    _budget = RequestBudget(rate)
    if rate is not None:
        log.debug("ZooKeeper budget: %g requests/s from this process", rate)
    return _budget


@contextmanager
def shared_budget(parts: int) -> Iterator[float | None]:
    """Inside the block this process keeps ``1/parts`` of its rate, and yields that share for
    each helper process to take (:func:`set_request_rate`): the run's budget holds while
    ``parts`` processes send requests at once. The requests granted count towards the
    whole budget afterwards."""
    global _budget
    whole = _budget
    share = None if whole.rate is None else whole.rate / parts
    _budget = RequestBudget(share)
    try:
        yield share
    finally:
        whole.requests += _budget.requests
        whole.waited += _budget.waited
        _budget = whole


class BudgetedKazooClient(KazooClient):  # type: ignore[misc]
    """A KazooClient whose every request (reads, writes, watches, multi) first takes a token
    from :func:`request_budget`. kazoo funnels them all through ``_call``; its pings and
    connection handshakes do not pass there and are not counted."""

    def _call(self, request: Any, async_object: Any) -> Any:
        _budget.acquire()
        return super()._call(request, async_object)
