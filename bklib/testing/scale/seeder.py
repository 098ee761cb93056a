"""The seeder: writes a scale plan's ledger metadata to ZooKeeper through pipelined creates.

A million znodes one round trip at a time would take most of an hour; with a thousand creates
in flight on one session (bklib.meta.stores.zookeeper.bulk.BulkWriter) it takes minutes
(docs/benchmarks.md).
Parents are created first, level by level, then the ledgers in id order.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from bklib.errors import ZKError
from bklib.meta import paths
from bklib.meta.serde import encode_metadata
from bklib.meta.store import LedgerStore
from bklib.meta.stores import open_store
from bklib.meta.stores.zookeeper.bulk import ERROR_NAMES, ZNODEEXISTS, ZOK, BulkWriter
from bklib.states import DEFAULT_LEDGERS_ROOT
from bklib.testing.scale.plan import ScalePlan

log = logging.getLogger(__name__)


class SeedError(ZKError):
    """A znode could not be created (other than one that is already there)."""


@dataclass(frozen=True)
class SeedReport:
    created: int
    existing: int
    seconds: float


def _parents(path: str, root: str) -> Iterator[str]:
    """The ancestors of ``path`` below ``root``, shallowest first."""
    rel = path[len(root) + 1 :].split("/")
    for depth in range(1, len(rel)):
        yield "/".join([root, *rel[:depth]])


def seed_ledgers(
    zk: str,
    plan: ScalePlan,
    *,
    root: str = DEFAULT_LEDGERS_ROOT,
    max_in_flight: int = 1000,
    progress: Callable[[int], None] | None = None,
) -> SeedReport:
    """Lay the cluster out (as ``initnewcluster``) and create every planned ledger's znode.
    Ledgers already there are counted, not rewritten."""
    t0 = time.monotonic()
    store = open_store(zk, timeout=30)
    try:
        LedgerStore(store, root).init_cluster()
    finally:
        store.close()
    ids = [plan.ledger_id(i) for i in range(plan.ledgers)]
    parents: dict[str, None] = {}
    for lid in ids:
        parents.update(dict.fromkeys(_parents(paths.ledger_path(root, lid), root)))
    by_depth = sorted(parents, key=lambda p: p.count("/"))
    created = existing = 0
    with BulkWriter(zk) as writer:
        for path, err in writer.create_many(((p, b"") for p in by_depth), max_in_flight):
            _check(path, err)
        leaves = (
            (paths.ledger_path(root, lp.ledger_id), encode_metadata(lp.metadata)) for lp in plan
        )
        for path, err in writer.create_many(leaves, max_in_flight):
            _check(path, err)
            if err == ZOK:
                created += 1
            else:
                existing += 1
            done = created + existing
            if progress is not None and done % 10_000 == 0:
                progress(done)
    seconds = time.monotonic() - t0
    log.info("seeded %d ledgers (%d already there) in %.1fs", created, existing, seconds)
    return SeedReport(created, existing, seconds)


def _check(path: str, err: int) -> None:
    if err not in (ZOK, ZNODEEXISTS):
        raise SeedError(f"cannot create {path}: {ERROR_NAMES.get(err, err)}", path=path)
