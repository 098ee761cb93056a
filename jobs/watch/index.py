"""The watch's bookie index (docs/watch.md, "The index"): the
:class:`~bklib.audit.index_keeper.IndexKeeper` opened at each take-over, asked which ledgers a
lost bookie's reaction reads, cross-checked by every full ``lost`` audit, and its metrics.

The rules, one place each:

- the feed opens before the take-over's full scan, and the index is built from that scan;
- a loss asks the index (after its barrier); a stale index answers nothing, and the loss is
  answered by a full scan instead, which rebuilds the index (the rebuild counted by cause);
- a full ``lost`` audit (the schedule's) reconciles: any ledger the index holds otherwise than
  the scan, outside the ledgers that changed meanwhile, is a difference, logged and counted,
  and the index is rebuilt from the scan.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any

from bklib.audit.index_keeper import ChangeWindow, IndexKeeper, IndexStale, RebuildCause
from bklib.meta.paths import LayoutKind
from bklib.meta.stores import MetadataStore, StoreUnavailable
from jobs.local import ledger_columns
from jobs.runtime.messages import one_line
from jobs.watch.metrics import WatchMetrics

__all__ = ["WatchIndex", "scanned_ledgers"]

log = logging.getLogger("jobs.watch")


def scanned_ledgers(job: Any) -> Iterator[Any]:
    """Every ledger a full local audit read: its views, then what it kept as rows only (its
    own half after a columnar scan, then its helper's)."""
    yield from job.ledgers
    for table in job.column_halves():
        yield from ledger_columns.scanned_ledgers(table)


REBUILD_EVERY = 300.0
"""Seconds between two rebuilds of a stale index that no loss asked for."""


class WatchIndex:
    """One watch instance's index over its terms (see the module docstring)."""

    def __init__(
        self,
        store: MetadataStore,
        ledgers_root: str,
        metrics: WatchMetrics,
        *,
        barrier_timeout: float,
    ) -> None:
        self.keeper = IndexKeeper(
            store, ledgers_root, LayoutKind.HIERARCHICAL, barrier_timeout=barrier_timeout
        )
        self.metrics = metrics

    @property
    def kind(self) -> LayoutKind:
        return self.keeper.kind

    def open(self) -> None:
        """Open a new change feed (before the scan the index will be built from). A store
        that refuses one leaves the index stale: losses are answered by full scans."""
        try:
            self.keeper.start()
        except StoreUnavailable as exc:
            log.warning(
                "watch: no change feed on %s (%s): every loss is answered by a full scan",
                self.keeper.root,
                one_line(exc),
            )
        self.publish()

    def build(self, job: Any, cause: str) -> None:
        """Build the index from a full audit ``job`` (opened before it by :meth:`open`)."""
        self.keeper.kind = job.plan.kind
        try:
            self.keeper.build(scanned_ledgers(job), cause)
            self.metrics.index_rebuilds.labels(cause).inc()
        except IndexStale as exc:
            log.warning("watch: bookie index not built: %s", exc.why)
        self.publish()

    def ledgers_for(self, bookies: Iterable[str]) -> list[int] | IndexStale:
        """The ledgers a reaction to the loss of ``bookies`` reads, from the index made
        current now; or why the index may not answer (the caller scans everything)."""
        try:
            self.keeper.refresh()
        except IndexStale as exc:
            log.warning("watch: bookie index stale (%s): a full scan answers", exc.why)
            self.publish()
            return exc
        except StoreUnavailable as exc:  # the announced ledgers could not be read again
            stale = IndexStale(RebuildCause.GAP, one_line(exc))
            log.warning("watch: bookie index not refreshed (%s): a full scan answers", stale.why)
            return stale
        ids = self.keeper.ledgers_of_any(bookies)
        self.publish()
        return ids

    def window(self) -> ChangeWindow:
        """The ledgers announced from now on (while a full audit runs)."""
        return self.keeper.announced_since()

    def reconcile(self, job: Any, window: ChangeWindow) -> None:
        """Cross-check the index with a full ``lost`` audit ``job`` that ran in ``window``;
        a stale index is rebuilt from it instead."""
        stale = self.keeper.stale
        if stale is not None:
            self.build(job, stale.cause)
            return
        self.keeper.kind = job.plan.kind
        try:
            diffs = self.keeper.reconcile(lambda: scanned_ledgers(job), window.ids)
        except IndexStale as exc:
            log.warning("watch: reconciliation not done (%s); rebuilding", exc.why)
            self.open()
            return
        if diffs:
            self.metrics.index_differences.inc(len(diffs))
            self.metrics.index_rebuilds.labels(RebuildCause.RECONCILIATION).inc()
            log.error(
                "watch: reconciliation: the bookie index was wrong on %d ledgers (rebuilt "
                "from the scan; docs/watch.md says what to do)",
                len(diffs),
            )
        else:
            log.info("watch: reconciliation: the bookie index matches the scan")
        self.publish()

    def rebuild_due(self, now: float) -> bool:
        """Whether to rebuild a stale index now, before any loss asks: after a gap or an
        unconfirmed barrier (not while no feed can be opened at all), at most once every
        :data:`REBUILD_EVERY` seconds, so a feed that keeps breaking costs one scan a while."""
        stale = self.keeper.stale
        if stale is None or stale.cause not in (RebuildCause.GAP, RebuildCause.BARRIER):
            return False
        if self._rebuild_tried is not None and now - self._rebuild_tried < REBUILD_EVERY:
            return False
        self._rebuild_tried = now
        return True

    _rebuild_tried: float | None = None

    def publish(self) -> None:
        """The index's gauges, as of now."""
        m, k = self.metrics, self.keeper
        m.index_ledgers.set(len(k.index))
        m.index_bookies.set(k.index.bookie_count)
        m.index_stale.set(0 if k.stale is None else 1)
        age = k.age()
        if age is not None:
            m.index_age.set(age)
        m.index_changes.inc(k.changes_read - self._counted)
        self._counted = k.changes_read

    _counted = 0

    def close(self) -> None:
        self.keeper.close()
