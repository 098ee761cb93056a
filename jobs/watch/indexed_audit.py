"""The watch's reaction to a lost bookie: a ``lost`` audit of only the ledgers the bookie index
names for it (:class:`~bklib.audit.index_keeper.IndexKeeper`), instead of a full scan.

It is :class:`~jobs.local.audit.LocalAudit` with another scan step: the named ledgers are read
now, over the watch's session, and everything after (check, re-read, the rows) is the full
audit's. The index only chooses which ledgers to read; the findings come from the metadata read
here, and every mark and repair reads its ledger again and writes by compare-and-set. The run is
recorded with :data:`~bklib.states.CountKey.LEDGERS_FROM_INDEX`, so nothing counts it as a
full scan.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace

from bklib.audit.engine import ScanPlan, bookie_rows, read_ledgers
from bklib.audit.model import LedgerView
from bklib.meta.registration import list_bookies
from bklib.meta.stores import MetadataStore
from bklib.states import BookieState, CountKey
from jobs.local.audit import LocalAudit
from jobs.local.scan_summary import ShardScan
from jobs.runs.audit_run import AuditConfig, log_metadata

__all__ = ["IndexedLostAudit"]


class IndexedLostAudit(LocalAudit):
    """A ``lost`` audit of ``ledger_ids`` only (in this process, no helper)."""

    def __init__(
        self,
        config: AuditConfig,
        plan: ScanPlan,
        store: MetadataStore,
        ledger_ids: Sequence[int],
        preread: Mapping[int, LedgerView | None] | None = None,
    ) -> None:
        # No re-read step: these ledgers were read a moment ago, not over a long scan, and
        # the marks merge and the repair re-reads and writes by compare-and-set anyway.
        super().__init__(replace(config, reread=False), plan, store, split=False)
        self.ledger_ids = ledger_ids
        self.preread = dict(preread or {})
        """Views of some of ``ledger_ids`` read already, taken as this audit's read of them:
        the loss's first ledgers, read before their repair began (None: deleted)."""

    def scan(self) -> None:
        """Read the named ledgers (a deleted one is simply gone) and the registrations."""
        cfg, counts = self.config, self.run.counts
        t0 = time.monotonic()
        current = read_ledgers(
            self.store,
            (lid for lid in self.ledger_ids if lid not in self.preread),
            root=cfg.ledgers_root,
            kind=self.plan.kind,
            max_in_flight=cfg.scan_in_flight,
        )
        wanted = set(self.ledger_ids)
        current.update((lid, v) for lid, v in self.preread.items() if lid in wanted)
        self.ledgers = [v for v in current.values() if v is not None]
        registry = list_bookies(self.store, cfg.ledgers_root)
        scanned = ShardScan.of(self.ledgers)
        counts[CountKey.LEDGERS] = scanned.ledgers
        counts[CountKey.LEDGERS_FROM_INDEX] = len(self.ledger_ids)
        counts[CountKey.METADATA_ERRORS] = scanned.metadata_errors
        counts[CountKey.LEDGERS_NOT_CLOSED] = scanned.not_closed
        self.bookies = bookie_rows(registry, scanned.named)
        states = Counter(b.state for b in self.bookies)
        for s in BookieState.ALL:
            counts[CountKey.bookies(s)] = states.get(s, 0)
        log_metadata(counts, time.monotonic() - t0)
