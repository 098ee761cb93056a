"""Extract: ledger metadata, bookie registrations and bookie answers into DataFrames.

Thin glue around :mod:`bklib.audit.engine`. The heavy parts run on the executors: each
metadata-scan task reads its own share of the ledger tree over its own ZooKeeper session
(:func:`bklib.audit.engine.scan_dirs`), and each check task runs a
:class:`bklib.audit.checker.ReplicaChecker` with its own bookie client. The driver only plans
the scan and reads the bookie registrations.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bklib.audit.checker import CheckSettings
from bklib.audit.engine import (
    BookieRow,
    ScanPlan,
    bookie_rows,
    check_ledgers,
    learn_bookies,
    plan_scan,
    read_ledgers,
    scan_dirs,
)
from bklib.audit.model import LedgerView
from bklib.meta.model import LedgerState
from bklib.meta.paths import LayoutKind
from bklib.meta.registration import list_bookies
from bklib.meta.scan import DEFAULT_MAX_IN_FLIGHT
from bklib.meta.store import LeafDir
from bklib.meta.stores import MetadataStore, open_store
from bklib.meta.stores.zookeeper.security import ZkAuth
from bklib.states import DEFAULT_LEDGERS_ROOT
from bklib.tls import TlsSettings
from jobs.spark.schema import BOOKIE_ENTRIES_SCHEMA, BOOKIE_SCHEMA, LEDGER_SCHEMA
from jobs.spark.transform import healthy_ledgers
from jobs.tables.schema import BOOKIE_ENTRIES_SCHEMA as BOOKIE_ENTRIES_ARROW

log = logging.getLogger(__name__)

DEFAULT_LEDGERS_PER_TASK = 50_000
"""Target ledgers per metadata-scan task: big enough to amortise a ZooKeeper session."""

_OUT_BATCH = 2_000


def _scan_task(
    hosts: str, auth: ZkAuth, max_in_flight: int
) -> Callable[[Iterable[list[LeafDir]]], Iterator[dict[str, Any]]]:
    def run(groups: Iterable[list[LeafDir]]) -> Iterator[dict[str, Any]]:
        dirs = [d for g in groups for d in g]
        if not dirs:
            return
        with open_store(hosts, auth=auth) as store:  # the task's one session
            for view in scan_dirs(store, dirs, max_in_flight=max_in_flight):
                yield view.as_row()

    return run


def scan_ledgers_df(
    spark: SparkSession,
    session: MetadataStore,
    hosts: str,
    *,
    root: str = DEFAULT_LEDGERS_ROOT,
    auth: ZkAuth = None,
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    ledgers_per_task: int = DEFAULT_LEDGERS_PER_TASK,
    plan: ScanPlan | None = None,
) -> tuple[DataFrame, ScanPlan]:
    """Every ledger's metadata (LEDGER_SCHEMA), read on the executors, and the scan plan.

    The driver lists only the directories of the ledger tree (one per 10,000 ids in the
    hierarchical layout), over its ``session``; each task lists and reads its own directories,
    over a session of its own on ``hosts``. A corrupt or
    unreadable znode becomes a row with ``error`` naming it; a ledger deleted meanwhile is
    skipped. The DataFrame is lazy: persist it before using it twice.
    """
    plan = plan or ScanPlan.read(session, root)
    total = plan.expected
    tasks = max(spark.sparkContext.defaultParallelism, -(-total // max(1, ledgers_per_task)))
    groups = plan_scan(plan.dirs, tasks)
    log.info(
        "metadata scan: about %d ledgers in %d directories, %d tasks, %s layout",
        total,
        len(plan.dirs),
        len(groups),
        plan.kind.value,
    )
    rdd = spark.sparkContext.parallelize(groups, max(1, len(groups))).mapPartitions(
        _scan_task(hosts, auth, max_in_flight)
    )
    return spark.createDataFrame(rdd, LEDGER_SCHEMA), plan


def reread_ledgers(
    spark: SparkSession,
    ledger_ids: DataFrame,
    hosts: str,
    *,
    root: str = DEFAULT_LEDGERS_ROOT,
    kind: LayoutKind = LayoutKind.HIERARCHICAL,
    auth: ZkAuth = None,
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
) -> DataFrame:
    """Re-read the given ledgers' metadata now: (ledger_id, first_entry_id, bookie_id,
    error), one row per segment and bookie, or one error row. Deleted ledgers yield nothing."""

    def run(rows: Iterable[Any]) -> Iterator[tuple[Any, ...]]:
        ids = [r.ledger_id for r in rows]
        if not ids:
            return
        with open_store(hosts, auth=auth) as store:  # the task's one session
            views = read_ledgers(store, ids, root=root, kind=kind, max_in_flight=max_in_flight)
        for lid, view in sorted(views.items()):
            if view is None:
                continue
            if not view.ok:
                yield (lid, None, None, view.error)
                continue
            for s in view.segments or ():
                for b in s.ensemble:
                    yield (lid, s.first_entry_id, b, None)

    schema = "ledger_id long, first_entry_id long, bookie_id string, error string"
    parts = max(1, spark.sparkContext.defaultParallelism)
    rdd = ledger_ids.select("ledger_id").repartition(parts).rdd.mapPartitions(run)
    return spark.createDataFrame(rdd, schema)


def bookies_df(
    spark: SparkSession,
    session: MetadataStore,
    ledgers: DataFrame,
    *,
    root: str = DEFAULT_LEDGERS_ROOT,
) -> DataFrame:
    """Registered bookies (writable / readonly), read over the driver's ``session``, and lost
    ones: named in some ensemble of a readable ledger but not registered (BOOKIE_SCHEMA)."""
    registry = list_bookies(session, root)
    named = {
        r.bookie_id
        for r in healthy_ledgers(ledgers)
        .select(F.explode("segments").alias("s"))
        .select(F.explode("s.ensemble").alias("bookie_id"))
        .distinct()
        .collect()
    }
    rows = [r.as_row() for r in bookie_rows(registry, named)]
    return spark.createDataFrame(rows, BOOKIE_SCHEMA)


def learn_bookies_df(
    spark: SparkSession,
    session: MetadataStore,
    ledgers: DataFrame,
    bookies: DataFrame,
    settings: CheckSettings,
    check: str,
    *,
    root: str = DEFAULT_LEDGERS_ROOT,
    tls: TlsSettings | None = None,
) -> tuple[DataFrame, CheckSettings]:
    """The run's capability probe, from the driver (:func:`bklib.audit.engine.learn_bookies`):
    the bookies table with the answers, and the settings that carry them to every task. The
    probe's client is the check's own (:func:`~bklib.audit.engine.check_client`: its back-off
    and ``--bookie-protocol``), over the driver's ``session``."""
    from bklib.audit.engine import check_client

    closed = F.col("state") == LedgerState.CLOSED.name
    picks = {
        r.bookie_id: int(r.closed if r.closed is not None else r.any)
        for r in healthy_ledgers(ledgers)
        .select("ledger_id", "state", F.explode("segments").alias("s"))
        .select("ledger_id", "state", F.explode("s.ensemble").alias("bookie_id"))
        .groupBy("bookie_id")
        .agg(
            F.min(F.when(closed, F.col("ledger_id"))).alias("closed"),
            F.min("ledger_id").alias("any"),
        )
        .collect()
    }
    rows = [BookieRow(**r.asDict()) for r in bookies.collect()]
    with check_client(session, ledgers_root=root, settings=settings, tls=tls) as client:
        rows, settings = learn_bookies(client, rows, picks, settings, check)
    return spark.createDataFrame([r.as_row() for r in rows], BOOKIE_SCHEMA), settings


def _fetch_task(
    hosts: str,
    root: str,
    lost: frozenset[str],
    check: str,
    settings: CheckSettings,
    auth: ZkAuth = None,
    tls: TlsSettings | None = None,
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from bklib.audit.engine import check_client

        def views() -> Iterator[LedgerView]:
            for batch in batches:
                for row in batch.to_pylist():
                    yield LedgerView.from_row(row)

        out: list[dict[str, Any]] = []
        with (
            open_store(hosts, auth=auth) as store,  # the task's one session
            check_client(store, ledgers_root=root, settings=settings, tls=tls) as client,
        ):
            for _, reports, _ in check_ledgers(
                views(), lost, check, client=client, settings=settings
            ):
                out.extend(r.as_row() for r in reports)
                if len(out) >= _OUT_BATCH:
                    yield pa.RecordBatch.from_pylist(out, schema=BOOKIE_ENTRIES_ARROW)
                    out.clear()
        if out:
            yield pa.RecordBatch.from_pylist(out, schema=BOOKIE_ENTRIES_ARROW)

    return run


def fetch_bookie_entries(
    ledgers: DataFrame,
    bookies: DataFrame,
    hosts: str,
    check: str,
    *,
    root: str = DEFAULT_LEDGERS_ROOT,
    settings: CheckSettings | None = None,
    lost: frozenset[str] | None = None,
    auth: ZkAuth = None,
    tls: TlsSettings | None = None,
) -> DataFrame:
    """What every non-lost bookie of every readable ledger holds (BOOKIE_ENTRIES_SCHEMA), as
    :class:`bklib.audit.checker.ReplicaChecker` learns it. Lazy: persist before reuse."""
    from jobs.spark.transform import lost_bookie_ids

    settings = settings or CheckSettings()
    lost = lost if lost is not None else lost_bookie_ids(bookies)
    cols = [
        "ledger_id",
        "state",
        "ensemble_size",
        "write_quorum",
        "ack_quorum",
        "digest_type",
        "password",
        "segments",
    ]
    return (
        healthy_ledgers(ledgers)
        .select(*cols)
        .mapInArrow(
            _fetch_task(hosts, root, lost, check, settings, auth, tls), BOOKIE_ENTRIES_SCHEMA
        )
    )
