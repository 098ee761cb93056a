"""What a run needs of a scan's views once they are gone: the bookies they name, the ledgers
per directory, the counts, the first unreadable znodes (:class:`ShardScan`). A helper process
answers with one for its half (:mod:`jobs.local.scan_shard`), and a scan kept as columns makes
one chunk by chunk (:mod:`jobs.local.ledger_columns`)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from bklib.audit.accounting import scanned_per_directory
from bklib.audit.capabilities import ProbeCandidates
from bklib.audit.model import LedgerView, named_bookies

__all__ = ["UNREADABLE_SHOWN", "ShardScan"]

UNREADABLE_SHOWN = 20
"""Unreadable znodes the run logs by name (as the single process does)."""


@dataclass(frozen=True)
class ShardScan:
    """What a run needs of a scanned half's views: the first round's answer, and this
    process's own half, merged with :meth:`plus`."""

    named: set[str]
    per_directory: Counter[str]
    ledgers: int
    metadata_errors: int
    not_closed: int
    unreadable: list[tuple[int, str | None]] = field(default_factory=list)
    probe: ProbeCandidates | None = None
    """The ledgers the capability probe may ask each bookie about (when the run asks)."""

    @classmethod
    def of(cls, views: list[LedgerView], *, probe: bool = False) -> ShardScan:
        """The summary of ``views`` (with their probe candidates if ``probe``)."""
        return cls(
            named=named_bookies(views),
            per_directory=scanned_per_directory(v.znode_path for v in views),
            ledgers=len(views),
            metadata_errors=sum(1 for v in views if not v.ok),
            not_closed=sum(1 for v in views if v.ok and not v.is_closed),
            unreadable=[(v.ledger_id, v.error) for v in views if not v.ok][:UNREADABLE_SHOWN],
            probe=ProbeCandidates.of(views) if probe else None,
        )

    def plus(self, other: ShardScan) -> ShardScan:
        """Both halves, this one first (the scan's order)."""
        return ShardScan(
            named=self.named | other.named,
            per_directory=self.per_directory + other.per_directory,
            ledgers=self.ledgers + other.ledgers,
            metadata_errors=self.metadata_errors + other.metadata_errors,
            not_closed=self.not_closed + other.not_closed,
            unreadable=(self.unreadable + other.unreadable)[:UNREADABLE_SHOWN],
            probe=other.probe
            if self.probe is None
            else (self.probe if other.probe is None else self.probe.plus(other.probe)),
        )
