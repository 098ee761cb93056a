"""A metadata scan kept as the ``ledgers`` table's Arrow rows, not as a view per ledger.

A run writes every ledger's row anyway. The ``lost`` check needs the ledgers' ensembles only,
and it can find something only on a ledger that names a lost bookie
(:func:`bklib.audit.classify.classify_ledger`). So a scan for it turns each chunk of
:data:`CHUNK` views into rows as they come and keeps nothing else: at a million ledgers the
views were most of the run's memory (docs/benchmarks.md, "The full scan's memory"). The check
then rebuilds views for the ledgers that name a lost bookie (:func:`views_naming`), and the
watch's bookie index reads the ensembles from the columns (:func:`scanned_ledgers`).
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from bklib.audit.model import LedgerView
from jobs.local.scan_summary import ShardScan
from jobs.tables.ledgers_arrow import ledgers_table
from jobs.tables.schema import LEDGERS, TABLE_SCHEMAS

__all__ = [
    "CHUNK",
    "LedgerColumns",
    "ScannedLedger",
    "ensemble_members",
    "scanned_ledgers",
    "views_naming",
]

CHUNK = 20_000
"""Views turned into rows at a time: the most a columnar scan holds as objects."""


class LedgerColumns:
    """The ``ledgers`` rows of one run's scan (or its helper's half), built chunk by chunk."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self._tables: list[pa.Table] = []

    def take(self, views: Iterable[LedgerView]) -> ShardScan:
        """Consume ``views`` (the scan's order), keeping their rows; the summary of them all."""
        summary = ShardScan.of([])
        it = iter(views)
        while part := list(itertools.islice(it, CHUNK)):
            summary = summary.plus(ShardScan.of(part))
            self._tables.append(ledgers_table(self.run_id, part))
        return summary

    def table(self) -> pa.Table:
        """Every row taken, in order (the chunks as they are: no copy)."""
        if not self._tables:
            return TABLE_SCHEMAS[LEDGERS].empty_table()
        return pa.concat_tables(self._tables)


def ensemble_members(batch: pa.RecordBatch) -> tuple[pa.Array, pa.Array]:
    """Every bookie id any segment of ``batch``'s rows names, flattened, with the row each
    came from (ascending): the ensembles read without a Python object per segment."""
    segments = batch.column("segments")
    seg_rows = pc.list_parent_indices(segments)
    ensembles = segments.flatten().field("ensemble")
    rows = pc.take(seg_rows, pc.list_parent_indices(ensembles))
    return rows, ensembles.flatten()


def views_naming(table: pa.Table, bookies: Collection[str]) -> list[LedgerView]:
    """The readable ledgers among ``table``'s rows that name any of ``bookies``, as views in
    row order. The rows hold no password: these views serve the metadata-only check."""
    if not bookies:
        return []
    wanted = pa.array(sorted(bookies), pa.string())
    out: list[LedgerView] = []
    for batch in table.to_batches():  # a chunk at a time: no copy of the whole table
        rows, members = ensemble_members(batch)
        picked = pc.unique(pc.filter(rows, pc.is_in(members, value_set=wanted)))
        out.extend(
            LedgerView.from_row(r) for r in batch.take(picked).to_pylist() if r["error"] is None
        )
    return out


@dataclass(frozen=True)
class ScannedLedger:
    """A ledger of a scan kept as columns, as the bookie index reads it."""

    ledger_id: int
    names: frozenset[str]
    ok: bool

    def bookies(self) -> Iterable[str]:
        return self.names


def scanned_ledgers(table: pa.Table) -> Iterator[ScannedLedger]:
    """``table``'s ledgers with the bookies each names, a chunk at a time, without a dict per
    segment."""
    for batch in table.to_batches():
        ids = batch.column("ledger_id").to_pylist()
        errors = batch.column("error").to_pylist()
        rows, members = ensemble_members(batch)
        names: list[set[str]] = [set() for _ in ids]
        for row, name in zip(rows.to_pylist(), members.to_pylist(), strict=True):
            names[row].add(name)
        for i, ledger_id in enumerate(ids):
            yield ScannedLedger(ledger_id, frozenset(names[i]), errors[i] is None)
