"""Parallel metadata scan: many ledgers read with a bounded number of async reads in flight."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from bklib.errors import BKError, CorruptMetadataError, ZKError
from bklib.meta import paths
from bklib.meta.model import LedgerMetadata
from bklib.meta.paths import LayoutKind
from bklib.meta.serde import decode_metadata
from bklib.meta.zkaccess import ZkAuth
from bklib.meta.zkbulk import ZNONODE, BulkReader, GetResult
from bklib.states import DEFAULT_LEDGERS_ROOT

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


def scan_ledgers(
    hosts: str,
    ledger_ids: Iterable[int],
    *,
    root: str = DEFAULT_LEDGERS_ROOT,
    kind: LayoutKind = LayoutKind.HIERARCHICAL,
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    auth: ZkAuth = None,
) -> Iterator[ScanResult]:
    """Read and parse each ledger's metadata over its own ZooKeeper session (``hosts`` may
    carry a chroot), with at most ``max_in_flight`` reads outstanding; results in input order.

    A ledger deleted mid-scan is skipped silently (it is not a finding). Corrupt data and
    per-znode errors come back as a ScanResult with ``error`` set and the scan goes on. A lost
    session raises ZKError: the caller retries the remaining range.
    """
    if max_in_flight < 1:
        raise ValueError("max_in_flight must be >= 1")
    ids: list[int] = []

    def paths_of() -> Iterator[str]:
        for lid in ledger_ids:
            ids.append(lid)
            yield paths.ledger_path(root, lid, kind)

    with BulkReader(hosts, auth=auth) as reader:
        for n, got in enumerate(reader.get_many(paths_of(), max_in_flight)):
            result = _to_result(ids[n], got)
            if result is not None:
                yield result


def _to_result(ledger_id: int, got: GetResult) -> ScanResult | None:
    path = got.path
    if got.err == ZNONODE:
        log.debug("ledger %d deleted during scan", ledger_id)
        return None
    if got.err != 0 or got.data is None or got.stat is None:
        log.warning("ledger %d: read of %s failed: %s", ledger_id, path, got.error_name)
        err: BKError = ZKError(f"read failed: {got.error_name}", ledger_id=ledger_id, path=path)
        return ScanResult(ledger_id, path, error=err)
    try:
        md = decode_metadata(got.data, ledger_id, znode_ctime_ms=got.stat.ctime)
    except CorruptMetadataError as exc:
        log.warning("ledger %d: corrupt metadata at %s: %s", ledger_id, path, exc.reason)
        err = CorruptMetadataError(exc.reason, ledger_id=ledger_id, path=path)
        return ScanResult(ledger_id, path, error=err)
    return ScanResult(ledger_id, path, md, got.stat.version)
