"""Metadata scans: many ledgers read through a metadata store, fast.

Two shapes. :func:`scan_directories` reads every ledger of some leaf directories (the
audit's scan): on Oxia one range scan per directory returns the keys with their values; on
ZooKeeper a listing plus the pipelined bulk reader. :func:`read_ledgers_by_id` reads chosen
ledgers (re-reads, a Pulsar cross-check) with a bounded number of reads in flight.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bklib.errors import BKError, CorruptMetadataError, ZKError
from bklib.meta import paths
from bklib.meta.model import LedgerMetadata
from bklib.meta.paths import LayoutKind
from bklib.meta.serde import decode_metadata
from bklib.meta.stores import MetadataStore, ValueRead
from bklib.records import frozen_record
from bklib.states import DEFAULT_LEDGERS_ROOT

if TYPE_CHECKING:
    from bklib.meta.store import LeafDir

log = logging.getLogger(__name__)

DEFAULT_MAX_IN_FLIGHT = 500


@dataclass(frozen=True)
class ScanResult:
    """One ledger's outcome: parsed metadata and its version, or the error that names it."""

    ledger_id: int
    path: str
    metadata: LedgerMetadata | None = None
    version: int = -1
    error: BKError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def scan_directories(
    store: MetadataStore, dirs: Iterable[LeafDir], max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
) -> Iterator[ScanResult]:
    """Every ledger whose key is a child of one of ``dirs``, in name order within each.

    Special keys are never ledgers. A ledger deleted mid-scan is skipped (not a finding);
    corrupt data and per-key errors come back as a ScanResult with ``error`` set, and the
    scan goes on. A directory that cannot be read raises StoreUnavailable (a ZKError): an
    audit never shrinks silently.
    """
    for d in dirs:
        leaf = paths.FLAT_LEAF_RE if d.prefix == "" else paths.LEAF_RE
        for got in store.scan_children(d.path, max_in_flight):
            name = got.path.rsplit("/", 1)[1]
            if not leaf.match(name):
                continue
            result = _to_result(int(d.prefix + name[1:]), got)
            if result is not None:
                yield result


def read_ledgers_by_id(
    store: MetadataStore,
    ledger_ids: Iterable[int],
    *,
    root: str = DEFAULT_LEDGERS_ROOT,
    kind: LayoutKind = LayoutKind.HIERARCHICAL,
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
) -> Iterator[ScanResult]:
    """Read and parse each ledger's metadata, at most ``max_in_flight`` reads outstanding;
    results in input order, deleted ledgers skipped, errors as in :func:`scan_directories`."""
    if max_in_flight < 1:
        raise ValueError("max_in_flight must be >= 1")
    ids: list[int] = []

    def paths_of() -> Iterator[str]:
        for lid in ledger_ids:
            ids.append(lid)
            yield paths.ledger_path(root, lid, kind)

    for n, got in enumerate(store.get_many(paths_of(), max_in_flight)):
        result = _to_result(ids[n], got)
        if result is not None:
            yield result


def _to_result(ledger_id: int, got: ValueRead) -> ScanResult | None:
    path = got.path
    if got.missing:
        log.debug("ledger %d deleted during scan", ledger_id)
        return None
    if got.error is not None or got.data is None or got.stat is None:
        log.warning("ledger %d: read of %s failed: %s", ledger_id, path, got.error)
        err: BKError = ZKError(f"read failed: {got.error}", ledger_id=ledger_id, path=path)
        return ScanResult(ledger_id, path, error=err)
    try:
        md = decode_metadata(got.data, ledger_id, znode_ctime_ms=got.stat.ctime_ms)
    except CorruptMetadataError as exc:
        log.warning("ledger %d: corrupt metadata at %s: %s", ledger_id, path, exc.reason)
        err = CorruptMetadataError(exc.reason, ledger_id=ledger_id, path=path)
        return ScanResult(ledger_id, path, error=err)
    return frozen_record(
        ScanResult,
        {"ledger_id": ledger_id, "path": path, "metadata": md, "version": got.stat.version,
         "error": None},
    )  # fmt: skip
