"""Change feeds on Oxia (:meth:`~bklib.meta.stores.oxia.OxiaStore.watch_tree`), from the
store's one notifications stream.

Oxia announces every change of a namespace on one stream per shard, each in its commit order
(the client resumes a broken stream from its last offset). A barrier writes one ephemeral
marker key into every shard and waits for the markers' own notifications: once a shard's marker
has come back, every change committed to that shard before it has been delivered. A range
deletion (which names no single key) is a gap, as are the end of the stream and a lost session.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from bklib.errors import BKError
from bklib.meta.stores.base import ChangeFeed, ChangeListener, GapListener

log = logging.getLogger(__name__)

__all__ = ["BARRIER_ROOT", "OxiaChangeFeed", "under"]

BARRIER_ROOT = "/bkaudit-feed-barriers"
"""Where barrier markers live: ephemeral keys of the session that writes them."""


def under(path: str, key: str) -> bool:
    """Whether ``key`` is ``path`` or below it."""
    base = path.rstrip("/")
    return key == (base or "/") or key.startswith(base + "/")


class OxiaChangeFeed(ChangeFeed):
    """One tree's share of the store's notifications. ``markers`` returns new marker keys, one
    in every shard; ``put_markers`` writes them (ephemeral) and ``drop_markers`` deletes them;
    ``detach`` removes the feed from the store."""

    def __init__(
        self,
        path: str,
        on_change: ChangeListener,
        on_gap: GapListener,
        *,
        markers: Callable[[], Sequence[str]],
        put_markers: Callable[[Sequence[str]], None],
        drop_markers: Callable[[Sequence[str]], None],
        detach: Callable[[OxiaChangeFeed], None],
    ) -> None:
        self.path = path
        self._on_change = on_change
        self._on_gap = on_gap
        self._markers = markers
        self._put_markers = put_markers
        self._drop_markers = drop_markers
        self._detach = detach
        self._cond = threading.Condition()
        self._waiting: set[str] = set()
        self._open = True

    @property
    def open(self) -> bool:
        return self._open

    def deliver(self, key: str) -> None:
        """A notification for ``key`` (from the store's stream thread)."""
        if not self._open:
            return
        if key.startswith(BARRIER_ROOT + "/"):
            with self._cond:
                if key in self._waiting:
                    self._waiting.discard(key)
                    self._cond.notify_all()
            return
        if under(self.path, key):
            self._on_change(key)

    def gap(self, why: str) -> None:
        """Announcements may have been missed: tell the listener once, and end."""
        if not self._open:
            return
        self._open = False
        with self._cond:
            self._cond.notify_all()
        self._detach(self)
        self._on_gap(why)

    def barrier(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        if not self._open:
            return False
        keys = list(self._markers())
        with self._cond:
            self._waiting |= set(keys)
        try:
            self._put_markers(keys)
        except BKError as exc:  # unreachable store, lost session: no barrier, so stale
            log.warning("change feed on %s: barrier markers not written: %s", self.path, exc)
            with self._cond:
                self._waiting -= set(keys)
            return False
        try:
            with self._cond:
                while self._waiting & set(keys) and self._open:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._cond.wait(left)
                return self._open
        finally:
            with self._cond:
                self._waiting -= set(keys)
            self._drop_markers(keys)

    def close(self) -> None:
        if self._open:
            self._open = False
            self._detach(self)
            with self._cond:
                self._cond.notify_all()
