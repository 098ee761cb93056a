"""``bkaudit blastradius --executor spark``: the blast radius of every bookie and rack, computed
per partition of the metadata scan and merged on the driver.

The input is the local path's exactly: every ledger's current metadata (the audit's own
metadata scan, :func:`jobs.spark.extract.scan_ledgers_df`, not the last audit's ``ledgers``
table, which may be stale), the registrations, the rack map, and the latest audit's missing
replicas. Each task runs :func:`bklib.audit.blast_radius.blast_radius` on its ledgers with the full
bookie list (so every partial result has every scope, with the same ``bookies`` counts) and
ships one row per scope; the driver adds them up (:func:`bklib.audit.blast_radius.merge_scopes`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bklib.audit.blast_radius import ScopeImpact, blast_radius, merge_scopes
from bklib.audit.engine import ScanPlan
from bklib.audit.model import LedgerView
from bklib.audit.whatif import COVERAGE_SAMPLE, ScanCoverage
from bklib.meta.stores import MetadataStore
from bklib.meta.stores.zookeeper.security import ZkAuth
from bklib.states import DEFAULT_LEDGERS_ROOT, BookieState
from jobs.spark.extract import bookies_df, scan_ledgers_df
from jobs.spark.schema import spark_schema
from jobs.spark.transform import ledgers_per_directory

__all__ = ["PARTIAL_SCHEMA", "blast_radius_df", "spark_blast_radius"]

log = logging.getLogger(__name__)

_STRINGS = pa.list_(pa.field("element", pa.string(), nullable=False))
PARTIAL_SCHEMA = pa.schema(
    [
        pa.field("scope", pa.string(), False),
        pa.field("name", pa.string(), False),
        pa.field("bookies", pa.int32()),
        *(pa.field(c, pa.int64()) for c in ScopeImpact.COUNTS),
        pa.field("topics", _STRINGS),
        pa.field("topics_lost", _STRINGS),
    ]
)
"""One task's :class:`ScopeImpact` for one scope."""

_COLUMNS = (
    "ledger_id",
    "state",
    "ensemble_size",
    "write_quorum",
    "ack_quorum",
    "segments",
    "topic",
    "component",
    "error",
)

Missing = Mapping[tuple[int, int, str], Sequence[tuple[int, int]] | None]


def _task(
    bookies: list[str],
    racks: dict[str, str],
    gone: frozenset[str],
    missing: Missing,
    writable: frozenset[str],
    min_racks: int,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # Streamed, and ``missing`` unfiltered: an entry whose segment no longer names its
        # bookie (what current_missing drops on the local path) is never looked up, so the
        # rows are the same without holding the partition's views.
        views = (LedgerView.from_row(r) for b in batches for r in b.to_pylist())
        rows = blast_radius(
            views,
            bookies,
            racks=racks,
            gone=gone,
            missing=missing,
            writable=writable,
            min_racks=min_racks,
        )
        out = [{**vars(s), "topics": sorted(s.topics), "topics_lost": sorted(s.topics_lost)}
               for s in rows]  # fmt: skip
        yield pa.RecordBatch.from_pylist(out, schema=PARTIAL_SCHEMA)

    return run


def blast_radius_df(
    ledgers: Any,
    bookies: list[str],
    *,
    racks: dict[str, str],
    gone: frozenset[str],
    missing: Missing,
    writable: frozenset[str],
    min_racks: int,
) -> list[ScopeImpact]:
    """The blast radius over a DataFrame of ledger rows (LEDGER_SCHEMA's columns), one
    :func:`blast_radius` per partition; riskiest first, as the local path orders them.
    ``bookies`` must name every bookie the ledgers name (lost ones included)."""
    task = _task(bookies, racks, gone, missing, writable, min_racks)
    parts = ledgers.select(*_COLUMNS).mapInArrow(task, spark_schema(PARTIAL_SCHEMA)).collect()
    partial = []
    for r in parts:
        d = r.asDict()
        d["topics"], d["topics_lost"] = set(d["topics"] or ()), set(d["topics_lost"] or ())
        partial.append(ScopeImpact(**d))
    return merge_scopes([partial])


def spark_blast_radius(
    spark: SparkSession,
    session: MetadataStore,
    hosts: str,
    *,
    root: str = DEFAULT_LEDGERS_ROOT,
    auth: ZkAuth = None,
    racks: dict[str, str],
    missing: Missing,
    min_racks: int,
    plan: ScanPlan | None = None,
) -> tuple[list[ScopeImpact], ScanCoverage]:
    """Scan the metadata on the executors (each task with a session of its own on ``hosts``)
    and compute every scope's blast radius there; the driver reads over its ``session``.
    ``racks`` and ``missing`` (the latest audit's findings, unfiltered) come from the driver.
    Also returns what the scan could not read or account for: those ledgers may name any
    bookie, so the figures are then a lower bound."""
    ledgers, plan = scan_ledgers_df(spark, session, hosts, root=root, auth=auth, plan=plan)
    ledgers = ledgers.persist(StorageLevel.MEMORY_AND_DISK)  # read thrice: cover, bookies, compute
    try:
        per_dir = ledgers_per_directory(ledgers)
        unaccounted = plan.account(session, per_dir, root).unaccounted
        bad = ledgers.filter(F.col("error").isNotNull()).select("ledger_id")
        sample = [
            int(r.ledger_id) for r in bad.orderBy("ledger_id").limit(COVERAGE_SAMPLE).collect()
        ]
        coverage = ScanCoverage(bad.count(), tuple(sample), unaccounted)
        states: dict[str, set[str]] = {s: set() for s in BookieState.ALL}
        for r in bookies_df(spark, session, ledgers, root=root).collect():
            states[r.state].add(r.bookie_id)
        lost = frozenset(states[BookieState.LOST])
        writable = frozenset(states[BookieState.WRITABLE])
        registered = sorted(writable | states[BookieState.READONLY])
        log.info(
            "blastradius on spark: bookies: %s; %d missing replicas",
            ", ".join(f"{len(states[s])} {s}" for s in BookieState.ALL),
            len(missing),
        )
        scopes = blast_radius_df(
            ledgers,
            registered + sorted(lost),
            racks=racks,
            gone=lost,
            missing=missing,
            writable=writable,
            min_racks=min_racks,
        )
        return scopes, coverage
    finally:
        ledgers.unpersist()
