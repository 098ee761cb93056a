"""The repair on Spark: one :class:`~bklib.repair.requests.LedgerRequest` per ledger,
repartitioned by ledger id; each task opens its own ZooKeeper session and bookie client and
repairs its ledgers a few at a time with :class:`bklib.repair.worker.LedgerRepairer`. Every
action goes to ``replication_actions``; the driver logs progress with an ETA."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from pyspark.sql import SparkSession

from bklib.repair.requests import LedgerRequest
from bklib.states import Executor
from jobs.runs.repair_partition import worker_partition
from jobs.runs.repair_run import log_done, log_start, stamp
from jobs.runtime.progress import SparkProgress
from jobs.spark import load
from jobs.spark.schema import ACTIONS_SCHEMA
from jobs.tables.runs import new_run_id

if TYPE_CHECKING:
    from jobs.runs.repair_run import RepairConfig

log = logging.getLogger("jobs.commands.repair")


def _repair_task(
    config: RepairConfig,
) -> Callable[[Iterable[LedgerRequest]], Iterator[dict[str, Any]]]:
    def run(rows: Iterable[LedgerRequest]) -> Iterator[dict[str, Any]]:
        for actions in worker_partition(config, rows):
            yield from actions

    return run


# ---- driver side --------------------------------------------------------------------------------


class RepairJob:
    """One repair run: build the per-ledger requests, run the workers, record the actions."""

    def __init__(self, spark: SparkSession, config: RepairConfig) -> None:
        self.spark = spark
        self.config = config
        started = datetime.now(timezone.utc)
        self.run_id = config.run_id or new_run_id(started)
        self.started_at = started

    def execute(self, reqs: list[LedgerRequest]) -> list[dict[str, Any]]:
        """Run the workers over ``reqs``; returns the action rows (also appended to
        ``replication_actions``)."""
        cfg = self.config
        n = len(reqs)
        if n == 0:
            log.info("%s %s: nothing to repair", cfg.mode, self.run_id)
            return []
        if cfg.tasks:
            tasks = max(1, min(cfg.tasks, n))
        else:
            tasks = max(1, min(-(-n // max(1, cfg.ledgers_per_task)), n))
            tasks = max(tasks, min(n, self.spark.sparkContext.defaultParallelism))
        log_start(cfg, self.run_id, n, f"in {tasks} Spark tasks")
        sc = self.spark.sparkContext
        group = f"bkaudit-{cfg.mode}-{self.run_id}"
        sc.setJobGroup(group, f"bkaudit {cfg.mode} {self.run_id}")
        rdd = (
            sc.parallelize([(r.ledger_id, r) for r in reqs], tasks)
            .partitionBy(tasks, lambda lid: lid % tasks)
            .values()
            .mapPartitions(_repair_task(cfg))
        )
        t0 = time.monotonic()
        # Spark's console bar is off (jobs.spark.session): ours, with an ETA, or log lines.
        with SparkProgress(self.spark, cfg.mode, group=group, ledgers=n, logger=log):
            rows = rdd.collect()
        elapsed = time.monotonic() - t0
        stamp(rows, cfg, self.run_id, Executor.SPARK)
        names = [f.name for f in ACTIONS_SCHEMA.fields]
        load.append_actions(self.spark, cfg.warehouse, [tuple(r[k] for k in names) for r in rows])
        log_done(cfg, self.run_id, rows, n, elapsed)
        return rows
