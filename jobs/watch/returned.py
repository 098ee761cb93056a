"""Whether a bookie the watch is repairing registered again (it flapped): its data is readable
again, so its repair stops before the next ledger starts, as BookKeeper's Auditor forgets a
bookie that is back. Asked before each ledger starts, it reads the registrations at most once
per interval (two requests: :func:`~bklib.meta.registration.registered_ids`)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

from bklib.errors import BKError
from bklib.meta.registration import registered_ids
from bklib.meta.stores import MetadataStore

__all__ = ["ReturnedBookies"]

log = logging.getLogger("jobs.watch")


class _Watcher(Protocol):
    zk: MetadataStore
    root: str


class ReturnedBookies:
    """Called from the repair's threads: True once one of ``lost`` is registered again
    (writable or read-only), and from then on."""

    def __init__(self, watcher: _Watcher, lost: frozenset[str], every: float) -> None:
        self.watcher = watcher
        self.lost = lost
        self.every = every
        self.back: frozenset[str] = frozenset()
        self._next = 0.0
        self._lock = threading.Lock()

    def __call__(self) -> bool:
        if not self.lost:
            return False
        with self._lock:
            now = time.monotonic()
            if self.back or now < self._next:
                return bool(self.back)
            self._next = now + self.every
            try:
                writable, readonly = registered_ids(self.watcher.zk, self.watcher.root)
            except BKError as exc:  # unknown is not back: the leadership check decides
                log.warning("watch: could not read the registrations during a repair: %s", exc)
                return False
            self.back = self.lost & (writable | readonly)
            if self.back:
                log.info(
                    "watch: bookie %s registered again: its repair stops; the marks left are "
                    "checked once no loss is due",
                    ", ".join(sorted(self.back)),
                )
            return bool(self.back)
