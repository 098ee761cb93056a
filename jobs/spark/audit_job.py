"""The audit on Spark: the engine's steps as DataFrame phases (scan, bookies, check, re-read,
load), each persisted because it talks to ZooKeeper and bookies and must not run twice."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bklib.audit.checks import check as check_kind
from bklib.audit.checks import replication_names
from bklib.audit.completeness import run_status
from bklib.audit.engine import BookieRow, ScanPlan, capability_counts
from bklib.audit.pipeline import run_audit_steps
from bklib.meta.model import LedgerState
from bklib.meta.paths import LayoutKind
from bklib.meta.stores import MetadataStore
from bklib.states import BookieState, CountKey, Executor, Reason
from jobs.runs.audit_run import log_metadata
from jobs.runs.placement import PlacementPass, placement_counts
from jobs.runtime import interrupts
from jobs.spark import extract, load, transform
from jobs.spark.schema import FRAGMENT_ARROW, FRAGMENT_SCHEMA
from jobs.tables.runs import RunRecord, new_run_id
from jobs.tables.schema import AUDIT_RUNS, BOOKIES, FRAGMENTS, LEDGERS

if TYPE_CHECKING:
    from jobs.runs.audit_run import AuditConfig

log = logging.getLogger("jobs.commands.audit")

CLOSED = LedgerState.CLOSED.name

COMMIT_STOP_TIMEOUT = 60.0
"""How long a signal lets the run's Delta writes finish (Spark jobs, slower than delta-rs)."""


class AuditJob:
    """One audit run, phase by phase (:meth:`run` does them all in order).

    Each phase persists what it produced, because the extract phases talk to ZooKeeper and
    bookies and must not run again when a later phase reuses their output.
    """

    def __init__(
        self,
        spark: SparkSession,
        config: AuditConfig,
        plan: ScanPlan | None,
        session: MetadataStore,
    ) -> None:
        """``session``: the driver's store session, which every driver step uses; each task
        opens its own from ``config.zk``."""
        if config.check not in replication_names():
            raise ValueError(f"unknown check {config.check!r}; use one of {replication_names()}")
        self.spark = spark
        self.config = config
        self.plan = plan
        self.session = session
        started = datetime.now(timezone.utc)
        run_id = config.run_id or new_run_id(started)
        self.run = RunRecord(run_id, started, config.zk, config.check, executor=Executor.SPARK)
        self.ledgers: DataFrame | None = None
        self.bookies: DataFrame | None = None
        self.bookie_entries: DataFrame | None = None
        self.fragments: DataFrame | None = None
        self.kind = LayoutKind.HIERARCHICAL
        self._persisted: list[DataFrame] = []

    def _keep(self, df: DataFrame) -> DataFrame:
        df = df.persist(StorageLevel.MEMORY_AND_DISK)
        self._persisted.append(df)
        return df

    def _phase(self, name: str) -> None:
        self.spark.sparkContext.setJobDescription(f"bkaudit {self.run.run_id}: {name}")

    # ---- phases --------------------------------------------------------------------------------

    def scan(self) -> None:
        """Scan all ledger metadata and read the bookie registrations."""
        cfg, counts = self.config, self.run.counts
        t0 = time.monotonic()
        self._phase("metadata scan")
        ledgers, plan = extract.scan_ledgers_df(
            self.spark,
            self.session,
            cfg.zk,
            root=cfg.ledgers_root,
            auth=cfg.zk_auth,
            max_in_flight=cfg.scan_in_flight,
            ledgers_per_task=cfg.ledgers_per_task,
            plan=self.plan,
        )
        self.kind = plan.kind
        self.ledgers = self._keep(ledgers)
        per_dir = transform.ledgers_per_directory(self.ledgers)
        counts.update(plan.account(self.session, per_dir, cfg.ledgers_root).counts())
        row = transform.aggregate_row(
            self.ledgers.agg(
                F.count(F.lit(1)).alias("n"),
                F.count("error").alias("errors"),
                F.sum(F.when(F.col("state") != LedgerState.CLOSED.name, 1).otherwise(0)).alias(
                    "not_closed"
                ),
            )
        )
        counts[CountKey.LEDGERS] = int(row["n"])
        counts[CountKey.METADATA_ERRORS] = int(row["errors"])
        counts[CountKey.LEDGERS_NOT_CLOSED] = int(row["not_closed"] or 0)
        self._phase("bookies")
        self.bookies = self._keep(
            extract.bookies_df(self.spark, self.session, self.ledgers, root=cfg.ledgers_root)
        )
        states = {r["state"]: r["count"] for r in self.bookies.groupBy("state").count().collect()}
        for s in BookieState.ALL:
            counts[CountKey.bookies(s)] = int(states.get(s, 0))
        log_metadata(counts, time.monotonic() - t0)
        if counts[CountKey.METADATA_ERRORS]:
            for r in transform.metadata_errors(self.ledgers).limit(20).collect():
                log.warning("unreadable ledger %d: %s", r["ledger_id"], r["error"])

    def check(self) -> DataFrame:
        """Run the configured check; returns the fragments found (persisted)."""
        assert self.ledgers is not None and self.bookies is not None, "scan() first"
        cfg, counts = self.config, self.run.counts
        t0 = time.monotonic()
        entries = None
        if check_kind(cfg.check).reads_entries:
            self._phase(f"{cfg.check}: bookie entry lists")
            lost = transform.lost_bookie_ids(self.bookies)
            bookies, settings = extract.learn_bookies_df(
                self.spark,
                self.session,
                self.ledgers,
                self.bookies,
                cfg.fetch,
                cfg.check,
                root=cfg.ledgers_root,
                tls=cfg.tls,
            )
            self.bookies = self._keep(bookies)
            counts.update(
                capability_counts(BookieRow(**r.asDict()) for r in self.bookies.collect())
            )
            entries = self._keep(
                extract.fetch_bookie_entries(
                    self.ledgers,
                    self.bookies,
                    cfg.zk,
                    cfg.check,
                    root=cfg.ledgers_root,
                    settings=settings,
                    lost=lost,
                    auth=cfg.zk_auth,
                    tls=cfg.tls,
                )
            )
            self.bookie_entries = entries
            stats = {
                (r["method"], r["status"]): r["count"]
                for r in entries.groupBy("method", "status").count().collect()
            }
            counts[CountKey.BOOKIE_LEDGER_PAIRS] = int(sum(stats.values()))
            for (method, status), n in stats.items():
                counts[CountKey.pairs(method, status)] = int(n)
            log.info(
                "%s: %d (ledger, bookie) entry lists fetched (%s); %.1fs",
                cfg.check,
                counts[CountKey.BOOKIE_LEDGER_PAIRS],
                ", ".join(f"{m} {s}: {n}" for (m, s), n in sorted(stats.items())) or "none",
                time.monotonic() - t0,
            )
        self._phase(f"{cfg.check}: compare with stripes")
        t1 = time.monotonic()
        self.fragments = self._keep(
            transform.find_underreplicated(self.ledgers, self.bookies, entries)
        )
        n = self.fragments.count()
        counts[CountKey.FRAGMENTS_BEFORE_REREAD] = n
        log.info(
            "%s: %d under-replicated fragments found; %.1fs", cfg.check, n, time.monotonic() - t1
        )
        return self.fragments

    def recheck(self) -> DataFrame:
        """Re-read the flagged ledgers and drop findings for ledgers deleted or changed since
        they were scanned."""
        assert self.fragments is not None, "check() first"
        cfg = self.config
        if not cfg.reread:
            return self.fragments
        t0 = time.monotonic()
        self._phase("re-read flagged ledgers")
        flagged = self._keep(transform.flagged_ledger_ids(self.fragments))
        n_flagged = flagged.count()
        if n_flagged == 0:
            return self.fragments
        current = self._keep(
            extract.reread_ledgers(
                self.spark,
                flagged,
                cfg.zk,
                root=cfg.ledgers_root,
                kind=self.kind,
                auth=cfg.zk_auth,
                max_in_flight=cfg.scan_in_flight,
            )
        )
        before = self.run.counts[CountKey.FRAGMENTS_BEFORE_REREAD]
        self.fragments = self._keep(transform.keep_still_current(self.fragments, current))
        after = self.fragments.count()
        self.run.counts[CountKey.DROPPED_AFTER_REREAD] = before - after
        log.info(
            "re-read: %d flagged ledgers read again; %d findings dropped (ledger deleted or "
            "changed meanwhile); %.1fs",
            n_flagged,
            before - after,
            time.monotonic() - t0,
        )
        return self.fragments

    def load(self) -> RunRecord:
        """Append the run to the Delta tables; returns the run record."""
        assert self.ledgers is not None and self.bookies is not None
        assert self.fragments is not None
        t0 = time.monotonic()
        self._phase("write Delta tables")
        counts = self.run.counts
        placement = F.col("reason") == Reason.PLACEMENT_VIOLATION
        counts.update(transform.summarize(self.fragments.filter(~placement)))
        if CountKey.PLACEMENT_SEGMENTS in counts:
            rows = self.fragments.filter(placement).select("ledger_id").collect()
            counts[CountKey.PLACEMENT_VIOLATIONS] = len(rows)
            counts[CountKey.PLACEMENT_LEDGERS] = len({r["ledger_id"] for r in rows})
            counts[CountKey.reason(Reason.PLACEMENT_VIOLATION)] = len(rows)
        self.run.status = run_status(counts)
        self.run.finished_at = datetime.now(timezone.utc)
        # A signal now lets the writes finish (audit_runs is written last, by write_run):
        # the run is recorded once, as it is, and the command still exits 130 / 143.
        with interrupts.draining(COMMIT_STOP_TIMEOUT):
            load.write_run(
                self.spark,
                self.config.warehouse,
                self.run,
                ledgers=self.ledgers,
                bookies=self.bookies,
                fragments=self.fragments,
            )
            if interrupts.stop_requested():
                interrupts.note(
                    f"run {self.run.run_id} recorded as {self.run.status} before the signal "
                    "took effect"
                )
        log.info(
            "load: run %s written to %s (%s); %.1fs",
            self.run.run_id,
            self.config.warehouse,
            self.run.status,
            time.monotonic() - t0,
        )
        return self.run

    def abandon(self) -> None:
        """Nothing to stop: the phases' tasks end with their Spark jobs."""

    def commit(self) -> RunRecord:
        """:meth:`load` (the pipeline's ``commit`` step)."""
        return self.load()

    def run_all(self) -> RunRecord:
        """The audit's steps (:func:`run_audit_steps`: scan, check, placement, re-read,
        commit under the driver session's guard), after making sure this bkaudit may write
        the tables."""
        load.check_writable(
            self.spark, self.config.warehouse, (AUDIT_RUNS, LEDGERS, BOOKIES, FRAGMENTS)
        )
        run = run_audit_steps(self, self.session)
        assert run is not None
        return run

    def placement(self) -> None:
        """The placement pass (metadata only, docs/placement.md) over closed ledgers, in Spark
        tasks, when racks are known; its findings join the check's."""
        assert self.ledgers is not None and self.fragments is not None, "check() first"
        cfg = self.config
        if cfg.rack_document is None:
            return
        self._phase("placement check")
        check = PlacementPass(cfg.rack_document, cfg.placement_rule)
        closed = (
            transform.healthy_ledgers(self.ledgers)
            .filter(F.col("state") == CLOSED)
            .drop("password")
        )

        def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for batch in batches:
                out = check.rows(batch.to_pylist())
                if out:
                    yield pa.RecordBatch.from_pylist(out, schema=FRAGMENT_ARROW)

        found = self._keep(closed.mapInArrow(run, FRAGMENT_SCHEMA))
        rows = [r.asDict() for r in found.select("ledger_id").collect()]
        checked = transform.aggregate_row(closed.agg(F.sum(F.size("segments"))))[0] or 0
        named = [
            r["b"]
            for r in closed.select(F.explode(F.flatten(F.col("segments.ensemble"))).alias("b"))
            .distinct()
            .collect()
        ]
        self.run.counts.update(
            placement_counts(int(checked), rows, named, cfg.rack_document, cfg.placement_rule)
        )
        self.fragments = self._keep(self.fragments.unionByName(found))

    def close(self) -> None:
        """Release the cached DataFrames."""
        for df in self._persisted:
            df.unpersist()
        self._persisted.clear()
