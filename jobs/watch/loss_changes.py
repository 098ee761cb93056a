"""Asked before each ledger of a watch repair starts: did the lost bookies change since the
repair began? A bookie it repairs may have registered again (it flapped: its data is readable
again, so copying it is waste), or another may have become due (lost with a delay of 0, or
its delay ran out). Either way no more ledgers start, and the next cycle decides afresh with
every due bookie, as BookKeeper's Auditor acts on each change of the bookie set without
waiting for its ReplicationWorkers.

It reads the registrations at most once per interval (two requests:
:func:`~bklib.meta.registration.registered_ids`) and feeds them to the cycle's
:class:`~jobs.watch.decide.LossTracker`, under the cycle's lock: the repair's threads ask it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

from bklib.errors import BKError
from bklib.meta.registration import registered_ids
from bklib.meta.stores import MetadataStore
from jobs.watch.decide import LossTracker

__all__ = ["LossChanges"]

log = logging.getLogger("jobs.watch")


class _Watcher(Protocol):
    zk: MetadataStore
    root: str


class LossChanges:
    """True once one of ``repairing`` is registered again or another bookie became due, and
    from then on (:attr:`changed` says which)."""

    def __init__(
        self,
        watcher: _Watcher,
        tracker: LossTracker,
        lock: threading.Lock,
        *,
        repairing: frozenset[str],
        delay: float,
        every: float,
    ) -> None:
        self.watcher = watcher
        self.tracker = tracker
        self.lock = lock
        self.repairing = repairing
        self.delay = delay
        self.every = every
        self.back: frozenset[str] = frozenset()
        self.became: list[str] = []
        self._next = 0.0
        self._asking = threading.Lock()

    @property
    def changed(self) -> bool:
        return bool(self.back or self.became)

    def __call__(self) -> bool:
        with self._asking:
            now = time.monotonic()
            if self.changed or now < self._next:
                return self.changed
            self._next = now + self.every
            try:
                writable, readonly = registered_ids(self.watcher.zk, self.watcher.root)
            except BKError as exc:  # unknown is no change: the leadership check decides
                log.warning("watch: could not read the registrations during a repair: %s", exc)
                return False
            with self.lock:
                self.became = self.tracker.observe(writable | readonly, now, self.delay)
                self.back = self.repairing - set(self.tracker.due)
            if self.back:
                log.info(
                    "watch: bookie %s registered again: its repair stops; the marks left are "
                    "checked once no loss is due",
                    ", ".join(sorted(self.back)),
                )
            if self.became:
                log.info(
                    "watch: lost bookies due for repair: %s (during a repair, which stops: the "
                    "next cycle covers every due bookie)",
                    self.became,
                )
            return self.changed
