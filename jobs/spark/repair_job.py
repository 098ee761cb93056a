"""The repair on Spark: one :class:`~bklib.repair.requests.LedgerRequest` per ledger,
repartitioned by ledger id; each task opens its own store session and bookie client and
repairs its ledgers a few at a time with :class:`bklib.repair.worker.LedgerRepairer`. Every
action goes to ``replication_actions``; the driver logs progress with an ETA.

A signal to the driver drains the run as the local executor's does (docs/exit-status.md): the
driver writes its stop marker (:mod:`jobs.runs.stop_marker`), each task starts no ledger once
it reads it and ends those in flight, and the driver writes every finished ledger's rows. Past
``--stop-timeout`` the driver cancels the tasks and leaves: theirs are a killed worker's
ledgers, safe to repair again, and their rows are not written."""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from pyspark.sql import SparkSession

from bklib.meta.stores import MetadataStore
from bklib.repair.requests import LedgerRequest
from bklib.states import Executor
from jobs.runs.repair_partition import worker_partition
from jobs.runs.repair_run import log_done, log_start, stamp, stop_if_signalled
from jobs.runs.stop_marker import StopMarker, stop_marker_path
from jobs.runtime import interrupts
from jobs.runtime.progress import SparkProgress
from jobs.spark import load
from jobs.spark.schema import ACTIONS_SCHEMA
from jobs.tables.runs import new_run_id

if TYPE_CHECKING:
    from jobs.runs.repair_run import RepairConfig

log = logging.getLogger("jobs.commands.repair")


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """SIGINT ignored for the span, where this is the main thread (PySpark's worker)."""
    try:
        before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread: no handler of ours to set
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def _repair_task(
    config: RepairConfig, stop_path: str
) -> Callable[[Iterable[LedgerRequest]], Iterator[dict[str, Any]]]:
    def run(rows: Iterable[LedgerRequest]) -> Iterator[dict[str, Any]]:
        # A terminal's Ctrl-C reaches local executors' Python workers too, and PySpark's
        # worker turns it into KeyboardInterrupt mid-copy: the driver decides, by the marker.
        with _sigint_ignored():
            for actions in worker_partition(config, rows, stop_path):
                yield from actions

    return run


# ---- driver side --------------------------------------------------------------------------------


class RepairJob:
    """One repair run: build the per-ledger requests, run the workers, record the actions."""

    def __init__(self, spark: SparkSession, config: RepairConfig, session: MetadataStore) -> None:
        self.spark = spark
        self.config = config
        self.session = session
        """The driver's store session: where it writes its stop marker."""
        started = datetime.now(timezone.utc)
        self.run_id = config.run_id or new_run_id(started)
        self.started_at = started

    def execute(self, reqs: list[LedgerRequest]) -> list[dict[str, Any]]:
        """Run the workers over ``reqs``; returns the action rows (also appended to
        ``replication_actions``). After SIGINT or SIGTERM no ledger starts, those in flight
        finish within ``--stop-timeout``, the finished ledgers' rows are written, and
        :class:`~jobs.runtime.interrupts.Interrupted` is raised."""
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
        marker = StopMarker(self.session, stop_marker_path(cfg.ledgers_root, self.run_id))
        rdd = (
            sc.parallelize([(r.ledger_id, r) for r in reqs], tasks)
            .partitionBy(tasks, lambda lid: lid % tasks)
            .values()
            .mapPartitions(_repair_task(cfg, marker.path))
        )

        collected: list[list[dict[str, Any]]] = []

        # Past --stop-timeout: the tasks are cancelled (their ledgers left as a killed
        # worker's, their locks going with their sessions) and the process leaves.
        def abandon() -> None:
            if collected:  # the tasks had ended: their rows were being written
                interrupts.note(
                    f"{cfg.mode} {self.run_id}: the actions of "
                    f"{len({r['ledger_id'] for r in collected[0]})} ledgers were being written"
                )
                return
            sc.cancelJobGroup(group)
            interrupts.note(
                f"{cfg.mode} {self.run_id}: the tasks in flight were cancelled and their "
                f"ledgers' actions not recorded; run {cfg.mode} again"
            )

        t0 = time.monotonic()
        try:
            with interrupts.draining(
                cfg.stop_timeout, on_stop=marker.raise_soon, on_deadline=abandon
            ):
                # Spark's console bar is off (jobs.spark.session): ours, with an ETA, or logs.
                with SparkProgress(self.spark, cfg.mode, group=group, ledgers=n, logger=log):
                    rows = rdd.collect()
                collected.append(rows)
                elapsed = time.monotonic() - t0
                stamp(rows, cfg, self.run_id, Executor.SPARK)
                names = [f.name for f in ACTIONS_SCHEMA.fields]
                table = [tuple(r[k] for k in names) for r in rows]
                load.append_actions(self.spark, cfg.warehouse, table)  # a signal waits for it
        finally:
            marker.clear()
        log_done(cfg, self.run_id, rows, n, elapsed)
        stop_if_signalled(cfg, self.run_id, rows, n)
        return rows
