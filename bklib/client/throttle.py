"""Byte-rate throttling for requests sent from one event loop: the repair's copies
(``--rate``) and the audit's reads (``--read-rate``) share this token bucket."""

from __future__ import annotations

import asyncio
import time

__all__ = ["RateLimiter"]


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
