"""The watch's bookie -> ledgers index, kept current from the store's change feed, and the
guards that decide when it may be trusted (docs/watch.md, "The index").

- :meth:`IndexKeeper.start` opens the feed *before* the scan that builds the index
  (:meth:`IndexKeeper.build`), so a change made during the scan is announced and read again.
- A change announces a path; :meth:`IndexKeeper.refresh` re-reads the announced ledgers and
  applies what they hold now (the feed says that something changed, never what).
- Before any decision, :meth:`IndexKeeper.refresh` waits on the feed's barrier: every change
  committed before that moment has then been announced. A barrier that does not come back in
  time, a gap (the feed's session or stream ended) or a never-built index make the index
  stale: it answers nothing until it is rebuilt from a full scan.
- :meth:`IndexKeeper.reconcile` compares the index with a full scan's ledgers; any difference
  is a bug, reported (and the index rebuilt from that scan).

The index decides only which ledgers to look at. Whatever is marked or repaired is read again
and written by compare-and-set, as after a full scan.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator

from bklib.audit.bookie_index import BookieIndex, LedgerDifference
from bklib.audit.engine import read_ledgers
from bklib.audit.model import LedgerView
from bklib.meta.paths import LayoutKind, ledger_id_from_path
from bklib.meta.stores.base import ChangeFeed, MetadataStore

__all__ = ["DEFAULT_BARRIER_TIMEOUT", "ChangeWindow", "IndexKeeper", "IndexStale", "RebuildCause"]

log = logging.getLogger(__name__)

DEFAULT_BARRIER_TIMEOUT = 10.0
"""Seconds a barrier may take before the index is called stale."""


class RebuildCause:
    """Why the index was (re)built: the label of ``bkaudit_index_rebuilds_total``."""

    TAKE_OVER = "take-over"
    GAP = "gap"
    BARRIER = "barrier-timeout"
    RECONCILIATION = "reconciliation"
    ALL = (TAKE_OVER, GAP, BARRIER, RECONCILIATION)


class IndexStale(Exception):
    """The index may not answer: it must be rebuilt from a full scan first."""

    def __init__(self, cause: str, why: str) -> None:
        self.cause, self.why = cause, why
        super().__init__(f"the bookie index is stale ({why})")


class IndexKeeper:
    """One watch term's index of which ledgers name each bookie; see the module docstring.

    ``store`` is the process's session (the ledgers are read over it); ``kind`` the layout of
    the ledgers under ``root``. Thread-safe where it must be: the feed's thread only queues the
    announced ledger ids; everything else runs on the watch's thread."""

    def __init__(
        self,
        store: MetadataStore,
        root: str,
        kind: LayoutKind,
        *,
        barrier_timeout: float = DEFAULT_BARRIER_TIMEOUT,
        max_in_flight: int = 500,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.root = root
        self.kind = kind
        self.barrier_timeout = barrier_timeout
        self.max_in_flight = max_in_flight
        self.clock = clock
        self.index = BookieIndex()
        self.unreadable: set[int] = set()
        """Ledgers whose metadata could not be read: they may name any bookie."""
        self._lock = threading.Lock()
        self._pending: set[int] = set()
        self._windows: list[ChangeWindow] = []
        self._generation = 0
        self._feed: ChangeFeed | None = None
        self._stale: IndexStale | None = IndexStale(RebuildCause.TAKE_OVER, "not built yet")
        self.built_at: float | None = None
        self.last_change_at: float | None = None
        self.changes_read = 0
        """Ledgers re-read after an announcement, over the term."""
        self.rebuilds: Counter[str] = Counter()
        self.differences = 0
        """Differences the reconciliations found, over the term (each one a bug)."""

    # ---- the feed ------------------------------------------------------------------------------

    def start(self) -> None:
        """Open a new change feed on the ledgers root (closing any earlier one). Call it before
        the scan whose ledgers :meth:`build` takes."""
        self.close()
        with self._lock:
            self._pending.clear()
            self._stale = IndexStale(RebuildCause.TAKE_OVER, "not built since its feed opened")
            self._generation += 1
            generation = self._generation

        def gap(why: str) -> None:
            with self._lock:
                if generation == self._generation:  # not a feed closed since
                    self._stale = IndexStale(RebuildCause.GAP, why)

        self._feed = self.store.watch_tree(self.root, self._announced, gap)

    def _announced(self, path: str) -> None:
        ledger_id = ledger_id_from_path(self.root, path)
        if ledger_id is None:
            return  # a directory, the underreplication tree, the layout, ...
        with self._lock:
            self._pending.add(ledger_id)
            for window in self._windows:
                window.ids.add(ledger_id)
            self.last_change_at = self.clock()

    @property
    def feed(self) -> ChangeFeed | None:
        """The change feed of the current build, if one is open."""
        return self._feed

    def close(self) -> None:
        """Close the feed (no gap is reported). Idempotent."""
        if self._feed is not None:
            self._feed.close()
            self._feed = None

    # ---- build and refresh ---------------------------------------------------------------------

    @property
    def stale(self) -> IndexStale | None:
        """Why the index may not answer now, or None."""
        with self._lock:
            return self._stale

    def build(self, ledgers: Iterable[LedgerView], cause: str) -> None:
        """Replace the index with a full scan's ``ledgers`` (read after :meth:`start`). The
        changes announced since are read again at the next :meth:`refresh`."""
        self._install(*_index_of(ledgers), cause)

    def _install(self, index: BookieIndex, unreadable: set[int], cause: str) -> None:
        """Make a full scan's index the one that answers (see :meth:`build`)."""
        if self._feed is None or not self._feed.open:
            raise IndexStale(RebuildCause.GAP, "no change feed is open")
        with self._lock:
            self.index, self.unreadable = index, unreadable
            if self._stale is None or self._stale.cause != RebuildCause.GAP:
                self._stale = None
            stale = self._stale
        if stale is not None:
            raise stale  # the feed broke during the scan: the scan cannot be completed by it
        self.built_at = self.clock()
        self.rebuilds[cause] += 1
        log.info(
            "bookie index built (%s): %d ledgers on %d bookies, %d unreadable",
            cause,
            len(index),
            index.bookie_count,
            len(unreadable),
        )

    def refresh(self) -> None:
        """Make the index current as of now: wait on the feed's barrier, then read again every
        ledger announced since the last refresh. Raises :class:`IndexStale` when it cannot."""
        stale = self.stale
        if stale is not None:
            raise stale
        feed = self._feed
        if feed is None or not feed.barrier(self.barrier_timeout):
            why = f"the change feed did not confirm within {self.barrier_timeout:g}s"
            with self._lock:
                if self._stale is None:
                    self._stale = IndexStale(RebuildCause.BARRIER, why)
                stale = self._stale
            raise stale
        with self._lock:
            ids, self._pending = self._pending, set()
        if not ids:
            return
        try:
            current = read_ledgers(
                self.store, ids, root=self.root, kind=self.kind, max_in_flight=self.max_in_flight
            )
        except BaseException:
            with self._lock:
                self._pending |= ids  # read again next time
            raise
        for ledger_id, view in current.items():
            if view is not None and not view.ok:
                self.unreadable.add(ledger_id)
                self.index.apply(ledger_id, None)
                continue
            self.unreadable.discard(ledger_id)
            self.index.apply(ledger_id, view)
        self.changes_read += len(ids)

    # ---- answers ---------------------------------------------------------------------------

    def ledgers_of_any(self, bookie_ids: Iterable[str]) -> list[int]:
        """After :meth:`refresh`: the ledgers that name any of ``bookie_ids``, and every ledger
        that could not be read (it may name them too), in id order."""
        named = set(self.index.ledgers_of_any(bookie_ids))
        return sorted(named | self.unreadable)

    def age(self) -> float | None:
        """Seconds since the last announcement (or since the build when none came since)."""
        last = self.last_change_at if self.last_change_at is not None else self.built_at
        return None if last is None else self.clock() - last

    def reconcile(
        self, scan: Callable[[], Iterable[LedgerView]], changed_during: set[int]
    ) -> list[LedgerDifference]:
        """Compare the index, made current by :meth:`refresh`, with a full scan's ledgers,
        which each call of ``scan`` yields (each ledger once); ``changed_during`` are the
        ledgers announced since that scan started, up to the refresh (a
        :class:`ChangeWindow`'s live ``ids``: either answer may be the newer, so they are left
        out). Every other difference is returned and logged; the index is then rebuilt from
        the scan (``scan`` is called a second time only then)."""
        self.refresh()
        # Compared as the views stream, into no list and no second index: at a million
        # ledgers a list of them is most of a gigabyte and an index 122 MB, held while the
        # scan's own tables are (docs/benchmarks.md, "The hour under faults at a million").
        unreadable: set[int] = set()

        def readable() -> Iterator[LedgerView]:
            for v in scan():
                if v.ok:
                    yield v
                else:
                    unreadable.add(v.ledger_id)

        diffs = [
            d
            for d in self.index.diff_scan(readable())
            if d.ledger_id not in changed_during
            and d.ledger_id not in unreadable
            and d.ledger_id not in self.unreadable
        ]
        for d in diffs:
            log.error(
                "bookie index differs from the scan for ledger %d: index %s, scan %s",
                d.ledger_id,
                sorted(d.ours) if d.ours is not None else "absent",
                sorted(d.theirs) if d.theirs is not None else "absent",
            )
        self.differences += len(diffs)
        if diffs:
            self._install(*_index_of(scan()), RebuildCause.RECONCILIATION)
            with self._lock:  # the scan may be older than these: read them again
                self._pending |= set(changed_during)
        return diffs

    def announced_since(self) -> ChangeWindow:
        """A window recording the ledgers announced from now on (for :meth:`reconcile`)."""
        return ChangeWindow(self)


def _index_of(ledgers: Iterable[LedgerView]) -> tuple[BookieIndex, set[int]]:
    """A full scan's ``ledgers`` as an index, and the ids of those that could not be read."""
    index, unreadable = BookieIndex(), set()
    for v in ledgers:
        if v.ok:
            index.apply(v.ledger_id, v)
        else:
            unreadable.add(v.ledger_id)
    return index, unreadable


class ChangeWindow:
    """The ledger ids announced while a scan runs: ``with keeper.announced_since() as w``."""

    def __init__(self, keeper: IndexKeeper) -> None:
        self.keeper = keeper
        self.ids: set[int] = set()

    def __enter__(self) -> ChangeWindow:
        with self.keeper._lock:
            self.keeper._windows.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        with self.keeper._lock:
            self.keeper._windows.remove(self)
