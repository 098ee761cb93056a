"""The audit job: find every under-replicated fragment and append it to the Delta tables.

    spark-submit jobs/audit.py --zk HOST:PORT[/chroot] --warehouse PATH [--check lost|replicas|deep]
    bkaudit audit ...            (same flags)

Phases, each logged with a summary line (Spark shows stage progress meanwhile):

1. metadata: every ledger znode scanned on the executors; bookie registrations read;
2. check: ``lost`` uses metadata only; ``replicas`` fetches each bookie's entry list per
   ledger (probing by reads where list-entries is not answered); ``deep`` reads every
   expected replica and verifies its digest;
3. re-read: the flagged ledgers' metadata is read again and findings for ledgers that were
   deleted or changed meanwhile are dropped;
4. load: rows appended to ``audit_runs``, ``ledgers``, ``bookies``,
   ``underreplicated_fragments``.

Exit status: 0 when the run completed (findings or not), 2 on error.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

if __package__ in (None, ""):  # `spark-submit jobs/audit.py`: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bklib.meta.paths import LayoutKind
from bklib.meta.scan import DEFAULT_MAX_IN_FLIGHT
from jobs import extract, load, transform
from jobs.report import add_list_arguments, run_listunderreplicated
from jobs.spark import build_spark

__all__ = [
    "AuditConfig",
    "AuditJob",
    "add_audit_arguments",
    "add_list_arguments",
    "main",
    "run_audit",
    "run_listunderreplicated",
]

log = logging.getLogger("jobs.audit")


@dataclass
class AuditConfig:
    """Everything one audit run needs (built from the command line by :meth:`from_args`)."""

    zk: str
    warehouse: str
    check: str = transform.CHECK_REPLICAS
    ledgers_root: str = "/ledgers"
    zk_auth: str | None = None
    scan_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    ledgers_per_task: int = extract.DEFAULT_LEDGERS_PER_TASK
    fetch: extract.FetchSettings = field(default_factory=extract.FetchSettings)
    reread: bool = True
    run_id: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> AuditConfig:
        """Build from arguments parsed by a parser :func:`add_audit_arguments` filled."""
        return cls(
            zk=args.zk,
            warehouse=args.warehouse,
            check=args.check,
            ledgers_root=args.ledgers_root,
            zk_auth=args.zk_auth,
            scan_in_flight=args.scan_in_flight,
            ledgers_per_task=args.ledgers_per_task,
            fetch=extract.FetchSettings(
                read_timeout=args.read_timeout,
                connect_timeout=args.connect_timeout,
                ledgers_in_flight=args.ledgers_in_flight,
                reads_in_flight=args.reads_in_flight,
            ),
            reread=not args.no_reread,
            run_id=args.run_id,
        )


class AuditJob:
    """One audit run, phase by phase (:meth:`run` does them all in order).

    Each phase persists what it produced, because the extract phases talk to ZooKeeper and
    bookies and must not run again when a later phase reuses their output.
    """

    def __init__(self, spark: SparkSession, config: AuditConfig) -> None:
        if config.check not in transform.CHECKS:
            raise ValueError(f"unknown check {config.check!r}; use one of {transform.CHECKS}")
        self.spark = spark
        self.config = config
        started = datetime.now(timezone.utc)
        run_id = config.run_id or f"{started:%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}"
        self.run = load.RunRecord(run_id, started, config.zk, config.check)
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

    def extract(self) -> None:
        """Scan all ledger metadata and read the bookie registrations."""
        cfg, counts = self.config, self.run.counts
        t0 = time.monotonic()
        self._phase("metadata scan")
        ledgers, self.kind = extract.scan_ledgers_df(
            self.spark,
            cfg.zk,
            root=cfg.ledgers_root,
            auth=cfg.zk_auth,
            max_in_flight=cfg.scan_in_flight,
            ledgers_per_task=cfg.ledgers_per_task,
        )
        self.ledgers = self._keep(ledgers)
        row = self.ledgers.agg(
            F.count(F.lit(1)).alias("n"),
            F.count("error").alias("errors"),
            F.sum(F.when(F.col("state") != "CLOSED", 1).otherwise(0)).alias("not_closed"),
        ).first()
        counts["ledgers"] = int(row["n"])
        counts["metadata_errors"] = int(row["errors"])
        counts["ledgers_not_closed"] = int(row["not_closed"] or 0)
        self._phase("bookies")
        self.bookies = self._keep(
            extract.bookies_df(
                self.spark, cfg.zk, self.ledgers, root=cfg.ledgers_root, auth=cfg.zk_auth
            )
        )
        states = {r["state"]: r["count"] for r in self.bookies.groupBy("state").count().collect()}
        for s in (transform.WRITABLE, transform.READONLY, transform.LOST):
            counts[f"bookies_{s}"] = int(states.get(s, 0))
        log.info(
            "metadata: %d ledgers (%d not closed, %d unreadable znodes); bookies: %d writable, "
            "%d readonly, %d lost; %.1fs",
            counts["ledgers"],
            counts["ledgers_not_closed"],
            counts["metadata_errors"],
            counts["bookies_writable"],
            counts["bookies_readonly"],
            counts["bookies_lost"],
            time.monotonic() - t0,
        )
        if counts["metadata_errors"]:
            for r in transform.metadata_errors(self.ledgers).limit(20).collect():
                log.warning("unreadable ledger %d: %s", r["ledger_id"], r["error"])

    def check(self) -> DataFrame:
        """Run the configured check; returns the fragments found (persisted)."""
        assert self.ledgers is not None and self.bookies is not None, "extract() first"
        cfg, counts = self.config, self.run.counts
        t0 = time.monotonic()
        entries = None
        if cfg.check != transform.CHECK_LOST:
            self._phase(f"{cfg.check}: bookie entry lists")
            lost = transform.lost_bookie_ids(self.bookies)
            entries = self._keep(
                extract.fetch_bookie_entries(
                    self.ledgers,
                    self.bookies,
                    cfg.zk,
                    cfg.check,
                    root=cfg.ledgers_root,
                    settings=cfg.fetch,
                    lost=lost,
                )
            )
            self.bookie_entries = entries
            stats = {
                (r["method"], r["status"]): r["count"]
                for r in entries.groupBy("method", "status").count().collect()
            }
            counts["bookie_ledger_pairs"] = int(sum(stats.values()))
            for (method, status), n in stats.items():
                counts[f"pairs_{method}_{status}"] = int(n)
            log.info(
                "%s: %d (ledger, bookie) entry lists fetched (%s); %.1fs",
                cfg.check,
                counts["bookie_ledger_pairs"],
                ", ".join(f"{m} {s}: {n}" for (m, s), n in sorted(stats.items())) or "none",
                time.monotonic() - t0,
            )
        self._phase(f"{cfg.check}: compare with stripes")
        t1 = time.monotonic()
        self.fragments = self._keep(
            transform.find_underreplicated(self.ledgers, self.bookies, entries)
        )
        n = self.fragments.count()
        counts["fragments_before_reread"] = n
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
        before = self.run.counts["fragments_before_reread"]
        self.fragments = self._keep(transform.keep_still_current(self.fragments, current))
        after = self.fragments.count()
        self.run.counts["dropped_after_reread"] = before - after
        log.info(
            "re-read: %d flagged ledgers read again; %d findings dropped (ledger deleted or "
            "changed meanwhile); %.1fs",
            n_flagged,
            before - after,
            time.monotonic() - t0,
        )
        return self.fragments

    def load(self) -> load.RunRecord:
        """Append the run to the Delta tables; returns the run record."""
        assert self.ledgers is not None and self.bookies is not None
        assert self.fragments is not None
        t0 = time.monotonic()
        self._phase("write Delta tables")
        counts = self.run.counts
        counts.update(transform.summarize(self.fragments))
        errors = counts.get("metadata_errors", 0) + counts.get(
            f"reason_{transform.BOOKIE_UNREACHABLE}", 0
        )
        self.run.status = load.STATUS_COMPLETED_WITH_ERRORS if errors else load.STATUS_COMPLETED
        self.run.finished_at = datetime.now(timezone.utc)
        load.write_run(
            self.spark,
            self.config.warehouse,
            self.run,
            ledgers=self.ledgers,
            bookies=self.bookies,
            fragments=self.fragments,
        )
        log.info(
            "load: run %s written to %s (%s); %.1fs",
            self.run.run_id,
            self.config.warehouse,
            self.run.status,
            time.monotonic() - t0,
        )
        return self.run

    def run_all(self) -> load.RunRecord:
        """extract, check, recheck, load."""
        self.extract()
        self.check()
        self.recheck()
        return self.load()

    def close(self) -> None:
        """Release the cached DataFrames."""
        for df in self._persisted:
            df.unpersist()
        self._persisted.clear()


# ---- command line ------------------------------------------------------------------------------


def add_audit_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the audit flags to ``parser`` (shared by ``bkaudit audit`` and spark-submit)."""
    parser.add_argument("--zk", required=True, help="ZooKeeper connect string, HOST:PORT[/chroot]")
    parser.add_argument("--warehouse", required=True, help="directory or URI of the Delta tables")
    parser.add_argument(
        "--check",
        choices=transform.CHECKS,
        default=transform.CHECK_REPLICAS,
        help="lost: metadata only; replicas: compare bookie entry lists (default); "
        "deep: read every replica and verify its digest",
    )
    parser.add_argument("--ledgers-root", default="/ledgers", help="BookKeeper's ledgers root")
    parser.add_argument("--zk-auth", default=None, help="ZooKeeper digest auth user:password")
    parser.add_argument("--master", default=None, help="Spark master (default: conf or local[2])")
    parser.add_argument("--run-id", default=None, help="id for this run (default: time + random)")
    parser.add_argument(
        "--read-timeout",
        type=float,
        default=5.0,
        help="seconds to wait for a bookie answer; a list-entries timeout switches to probing",
    )
    parser.add_argument("--connect-timeout", type=float, default=5.0)
    parser.add_argument(
        "--scan-in-flight",
        type=int,
        default=DEFAULT_MAX_IN_FLIGHT,
        help="metadata reads in flight per task",
    )
    parser.add_argument("--ledgers-per-task", type=int, default=extract.DEFAULT_LEDGERS_PER_TASK)
    parser.add_argument(
        "--ledgers-in-flight", type=int, default=64, help="ledgers being listed per task"
    )
    parser.add_argument(
        "--reads-in-flight", type=int, default=256, help="entry reads in flight per task"
    )
    parser.add_argument(
        "--no-reread",
        action="store_true",
        help="do not re-read flagged ledgers before writing the report",
    )
    return parser


def run_audit(args: argparse.Namespace, spark: SparkSession | None = None) -> int:
    """Run one audit from parsed arguments; 0 when the run completed, 2 on error."""
    config = AuditConfig.from_args(args)
    spark = spark or build_spark("bkaudit-audit", master=getattr(args, "master", None))
    job = AuditJob(spark, config)
    log.info(
        "audit run %s: check %s of %s into %s",
        job.run.run_id,
        config.check,
        config.zk,
        config.warehouse,
    )
    try:
        run = job.run_all()
    except Exception as exc:
        log.exception("audit run %s failed", job.run.run_id)
        job.run.status = load.STATUS_FAILED
        job.run.error = f"{type(exc).__name__}: {exc}"
        job.run.finished_at = datetime.now(timezone.utc)
        try:
            load.write_run_record(spark, config.warehouse, job.run)
        except Exception as exc2:  # the warehouse itself may be the problem
            log.error("could not record the failed run: %s", exc2)
        return 2
    finally:
        job.close()
    c = run.counts
    print(
        f"audit {run.run_id} {run.status}: {c.get('ledgers', 0)} ledgers, "
        f"{c.get('underreplicated_ledgers', 0)} under-replicated, {c.get('fragments', 0)} "
        f"fragments, {c.get('missing_entries', 0)} missing entries, "
        f"{c.get('metadata_errors', 0)} unreadable znodes"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``spark-submit jobs/audit.py ...`` entry point."""
    parser = add_audit_arguments(
        argparse.ArgumentParser(prog="audit", description="Audit a BookKeeper cluster.")
    )
    from jobs.config import config_path_from_argv, configure_logging, parse_with_config

    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_with_config(parser, "audit", argv)
    configure_logging(False, config_path_from_argv(argv))
    return run_audit(args)


if __name__ == "__main__":
    sys.exit(main())
