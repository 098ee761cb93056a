"""Bounds on requests sent from one event loop: a byte-rate token bucket, which the repair's
copies (``--rate``) and the audit's reads (``--read-rate``) share, and the gate on the reads a
bookie may have outstanding (``--reads-in-flight``)."""

from __future__ import annotations

import asyncio
import collections
import time

__all__ = ["RateLimiter", "ReadGate"]


class RateLimiter:
    """A token bucket in bytes per second for one event loop (None or <= 0: unlimited).

    The bucket holds at most one second of budget, so an idle spell cannot be followed by an
    unbounded burst.
    """

    def __init__(self, rate: float | None) -> None:
        self.rate = rate if rate and rate > 0 else None
        self._tokens = self.rate or 0.0
        self._stamp = time.monotonic()

    async def acquire(self, nbytes: int) -> None:
        """Wait until ``nbytes`` may be sent."""
        if self.rate is None:
            return
        now = time.monotonic()
        self._tokens = min(self.rate, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now
        self._tokens -= nbytes
        if self._tokens < 0:
            await asyncio.sleep(-self._tokens / self.rate)


class ReadGate:
    """Entry reads a bookie may have outstanding, shared by every reader of it (all on one
    event loop).

    A reader only waits here with nothing of its own outstanding, or with what it has
    outstanding answered by other tasks, so the holders of permits are never the ones
    waiting: no deadlock.
    """

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self._free = self.limit
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    def try_take(self, n: int) -> bool:
        """Take ``n`` permits (at most the limit) if they are free and nobody waits."""
        n = min(n, self.limit)
        if self._waiters or self._free < n:
            return False
        self._free -= n
        return True

    async def take(self, n: int) -> None:
        """Take ``n`` permits (at most the limit), waiting in line for them."""
        n = min(n, self.limit)
        if self.try_take(n):
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((n, fut))
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.give(n)  # granted as it was cancelled: hand the permits on
            raise

    def give(self, n: int) -> None:
        """Give back ``n`` permits (answered, or given up on), waking who they let through."""
        self._free += min(n, self.limit)
        while self._waiters:
            need, fut = self._waiters[0]
            if fut.done():  # cancelled while waiting: it must not hold up those behind it
                self._waiters.popleft()
            elif need <= self._free:
                self._waiters.popleft()
                self._free -= need
                fut.set_result(None)
            else:
                break
