"""kazoo's threading handler with a cheaper ``select``: one ``poll(2)`` per wait.

kazoo's :class:`~kazoo.handlers.threading.SequentialThreadingHandler` waits through
``kazoo.handlers.utils.selector_select``, which builds, registers and closes a new epoll
selector on every call. Its connection thread waits about five times per request (the wake-up,
the write, the reply's header and body), so those system calls and objects were a quarter to
a third of the client's CPU per request: 341-519 µs against 249-372 µs with one ``poll``
(docs/benchmarks.md, "kazoo's waits"). The repair's marks, locks and compare-and-sets and the
watch's reads all go through kazoo; the scan's reads do not (:mod:`~.bulk`).
"""

from __future__ import annotations

import math
import select
from typing import Any

from kazoo.handlers.threading import SequentialThreadingHandler

__all__ = ["PollingHandler"]

_READ_READY = select.POLLIN | select.POLLHUP | select.POLLERR
_WRITE_READY = select.POLLOUT | select.POLLHUP | select.POLLERR


def _fd(obj: Any) -> int:
    return obj if isinstance(obj, int) else int(obj.fileno())


class PollingHandler(SequentialThreadingHandler):  # type: ignore[misc]
    """:class:`SequentialThreadingHandler` whose ``select`` is one ``poll`` call, with the
    contract of kazoo's: readable and writable objects are returned as given, a hang-up or an
    error counts as ready (the next recv or send raises it), a closed descriptor or a
    negative timeout is a ``ValueError``. kazoo passes no exceptional list."""

    def select(
        self,
        rlist: list[Any],
        wlist: list[Any],
        xlist: list[Any],
        timeout: float | None = None,
    ) -> tuple[list[Any], list[Any], list[Any]]:
        if timeout is not None:
            if not isinstance(timeout, int | float):
                raise TypeError("timeout must be a number")
            if timeout < 0:
                raise ValueError("timeout must be non-negative")
        masks: dict[int, int] = {}
        for obj in rlist:
            fd = _fd(obj)
            masks[fd] = masks.get(fd, 0) | select.POLLIN
        for obj in wlist:
            fd = _fd(obj)
            masks[fd] = masks.get(fd, 0) | select.POLLOUT
        poller = select.poll()
        for fd, mask in masks.items():
            poller.register(fd, mask)
        # Whole milliseconds, rounded up: a wait never ends before its timeout.
        ready = dict(poller.poll(None if timeout is None else math.ceil(timeout * 1000)))
        if any(events & select.POLLNVAL for events in ready.values()):
            raise ValueError("Invalid event mask or fd")
        readable = [o for o in rlist if ready.get(_fd(o), 0) & _READ_READY]
        writable = [o for o in wlist if ready.get(_fd(o), 0) & _WRITE_READY]
        return readable, writable, []
