"""A loss's marks published while its repair starts (docs/watch.md, "Reacting to a loss").

The watch publishes BookKeeper's under-replication marks for every ledger it is about to
repair, as the Auditor does, so ``listunderreplicated``, Java ReplicationWorkers and the next
leader see the work. For a lost bookie of a million-ledger cluster that is some 44,000 marks,
seconds of ZooKeeper requests; the repair need not wait for all of them. A thread of its own
publishes them a chunk at a time, in the order the repair takes the ledgers, and the repair of
each ledger first waits until that ledger's mark is out (:meth:`MarksInFlight.wait_for`).

The wait is what keeps it safe: a mark published after its ledger's repair had cleared it
would stand for a ledger already whole. The repair marks its ledger again before it acts
(:class:`~bklib.repair.worker.LedgerRepairer`), so the marks published here are the
announcement, never what a repair depends on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence

from bklib.meta.underreplication import UnderReplicationManager

__all__ = ["MARKS_PER_CHUNK", "MarksFailed", "MarksInFlight"]

log = logging.getLogger("jobs.watch")

MARKS_PER_CHUNK = 2000
"""Marks published before the next chunk's ledgers may start: small enough that the first
ledger starts a fraction of a second after the check, large enough to keep ZooKeeper's
pipeline full (forty requests of fifty marks)."""


class MarksFailed(Exception):
    """Publishing the marks failed; the ledgers whose marks were not out were not started."""


class MarksInFlight:
    """``marks`` (ledger -> the bookies it misses) published by a thread, in ``order``, a chunk
    at a time. ``known``: the marks the cycle read (:meth:`UnderReplicationManager.mark_many`).
    ``on_done`` is called from the thread once every mark is out."""

    def __init__(
        self,
        urm: UnderReplicationManager,
        marks: Mapping[int, Sequence[str]],
        order: Sequence[int],
        known: Mapping[int, Sequence[str]] | None = None,
        on_done: Callable[[int], None] | None = None,
        per_chunk: int = MARKS_PER_CHUNK,
    ) -> None:
        ordered = [lid for lid in dict.fromkeys(order) if lid in marks]
        ordered += sorted(set(marks) - set(ordered))  # none left out, whatever the order says
        self._chunks = [ordered[i : i + per_chunk] for i in range(0, len(ordered), per_chunk)]
        self._chunk_of = {lid: i // per_chunk for i, lid in enumerate(ordered)}
        self._urm, self._marks, self._known, self._on_done = urm, marks, known or {}, on_done
        self._published = 0
        """Chunks whose marks are out."""
        self._ended = False
        self._cond = threading.Condition()
        self.error: BaseException | None = None
        self.written = 0
        """Marks written (not those already there)."""
        self._thread = threading.Thread(target=self._publish, name="marks", daemon=True)
        self._thread.start()

    def _publish(self) -> None:
        try:
            for k, chunk in enumerate(self._chunks):
                part = {lid: self._marks[lid] for lid in chunk}
                self.written += self._urm.mark_many(part, known=self._known)
                with self._cond:
                    self._published = k + 1
                    self._cond.notify_all()
        except BaseException as exc:  # noqa: BLE001 - handed to the repair's thread by join()
            self.error = exc
            log.error("watch: publishing the marks failed after %d of %d ledgers: %s",
                      sum(len(c) for c in self._chunks[: self._published]),
                      len(self._chunk_of), exc)  # fmt: skip
        finally:
            with self._cond:
                self._ended = True
                self._cond.notify_all()
        if self.error is None:
            log.info("watch: %d ledgers marked under-replicated (%d marks new)",
                     len(self._chunk_of), self.written)  # fmt: skip
            if self._on_done is not None:
                self._on_done(len(self._chunk_of))

    def wait_for(self, ledger_id: int) -> bool:
        """Wait until ``ledger_id``'s mark is out: True, or False when publishing failed
        before it. A ledger not among the marks is not waited for."""
        k = self._chunk_of.get(ledger_id)
        if k is None:
            return True
        with self._cond:
            self._cond.wait_for(lambda: self._published > k or self._ended)
            return self._published > k

    @property
    def failed(self) -> bool:
        """Publishing stopped on an error."""
        return self.error is not None

    def wait_all(self) -> bool:
        """Wait until publishing ended: True if every mark is out."""
        self._thread.join()
        return self.error is None

    def join(self) -> None:
        """Wait for every mark; raise :class:`MarksFailed` if publishing failed."""
        if not self.wait_all():
            assert self.error is not None
            raise MarksFailed(f"publishing the marks failed: {self.error}") from self.error
