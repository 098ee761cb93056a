"""The repair jobs: re-replicate what the latest audit found, recover named bookies, and
decommission a bookie.

    spark-submit jobs/rereplicate.py --zk HOST:PORT[/chroot] --warehouse PATH \
        [--grace-period 30s] [--rate 50MB] [--dry-run] [--run-id AUDIT_RUN]
    bkaudit rereplicate ...                       (same flags)
    bkaudit recover BOOKIE[,BOOKIE] --zk ... --warehouse ... [--target BOOKIE] [--dry-run]
    bkaudit decommission BOOKIE --zk ... --warehouse ...

Findings become one request per ledger, repartitioned by ledger id; each Spark task opens
its own ZooKeeper session and bookie client and repairs its ledgers a few at a time with
:class:`bklib.repair.worker.LedgerRepairer` (lock, re-read, fence after the grace period,
copy with recovery-add, compare-and-set). Every action is appended to the Delta table
``replication_actions``; the driver logs progress with an ETA and prints a summary.

Exit status: 0 when nothing is left to do, 1 when some ledgers still need work (waiting for
the grace period, locked elsewhere, failed, or with entries that have no replica), 2 on error.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import logging
import re
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `spark-submit jobs/rereplicate.py`: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bklib.meta.model import DigestType
from bklib.repair.worker import FINAL_STATUSES, RepairSettings
from jobs import extract, load, repair_input
from jobs.spark import build_spark

log = logging.getLogger("jobs.rereplicate")

MODE_REREPLICATE = "rereplicate"
MODE_RECOVER = "recover"
MODE_DECOMMISSION = "decommission"

DEFAULT_LEDGERS_PER_TASK = 200
"""Small tasks: each finished task moves the progress bar and the ETA."""

_SIZE_UNITS = {"": 1, "B": 1, "K": 1e3, "KB": 1e3, "KIB": 1024, "M": 1e6, "MB": 1e6}
_SIZE_UNITS |= {"MIB": 1024**2, "G": 1e9, "GB": 1e9, "GIB": 1024**3}
_TIME_UNITS = {"": 1, "S": 1, "MS": 1e-3, "M": 60, "MIN": 60, "H": 3600}


def parse_duration(text: str) -> float:
    """Seconds from ``30``, ``30s``, ``500ms``, ``5m``, ``1h``."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).upper() not in _TIME_UNITS:
        raise argparse.ArgumentTypeError(f"bad duration {text!r} (use e.g. 30s, 5m, 500ms)")
    return float(m.group(1)) * _TIME_UNITS[m.group(2).upper()]


def parse_rate(text: str) -> float | None:
    """Bytes/s from ``50MB``, ``50MB/s``, ``1GiB``, ``1000000``; ``0`` or ``unlimited``: None."""
    if text.strip().lower() in ("0", "unlimited", "none"):
        return None
    m = re.fullmatch(r"\s*([0-9.]+)\s*([a-zA-Z]*)(/s)?\s*", text)
    if not m or m.group(2).upper() not in _SIZE_UNITS:
        raise argparse.ArgumentTypeError(f"bad rate {text!r} (use e.g. 50MB, 20MiB, 0)")
    return float(m.group(1)) * _SIZE_UNITS[m.group(2).upper()]


@dataclass
class RepairConfig:
    """Everything one repair run needs (built from the command line by :meth:`from_args`)."""

    zk: str
    warehouse: str
    mode: str = MODE_REREPLICATE
    audit_run_id: str | None = None
    ledgers_root: str = "/ledgers"
    zk_auth: str | None = None
    zk_session_timeout: float = 10.0
    settings: RepairSettings = field(default_factory=RepairSettings)
    ledgers_per_task: int = DEFAULT_LEDGERS_PER_TASK
    tasks: int | None = None
    ledgers_in_flight: int = 8
    read_timeout: float = 10.0
    bookies: tuple[str, ...] = ()
    run_id: str | None = None
    racks_znode: str = "/bookies"

    @classmethod
    def from_args(cls, args: argparse.Namespace, mode: str) -> RepairConfig:
        """Build from arguments parsed by a parser :func:`add_repair_arguments` filled."""
        bookies = tuple(b for b in (getattr(args, "bookies", "") or "").split(",") if b)
        settings = RepairSettings(
            grace_period=args.grace_period,
            rate=args.rate,
            dry_run=args.dry_run,
            window=args.window,
            password=args.password.encode() if args.password is not None else None,
            digest_type=DigestType[args.digest_type] if args.digest_type else None,
            exclude=frozenset(bookies),
            target=getattr(args, "target", None),
            retry_no_replica=args.retry_no_replica,
        )
        return cls(
            zk=args.zk,
            warehouse=args.warehouse,
            mode=mode,
            audit_run_id=getattr(args, "run_id", None),
            ledgers_root=args.ledgers_root,
            zk_auth=args.zk_auth,
            zk_session_timeout=args.zk_session_timeout,
            settings=settings,
            ledgers_per_task=args.ledgers_per_task,
            tasks=args.tasks,
            ledgers_in_flight=args.ledgers_in_flight,
            read_timeout=args.read_timeout,
            bookies=bookies,
            racks_znode=args.racks_znode,
        )


# ---- executor side ------------------------------------------------------------------------------


def request_from_row(row: Any) -> Any:
    """A :class:`~bklib.repair.worker.LedgerRequest` from a :data:`REQUEST_SCHEMA` row."""
    from bklib.repair.worker import LedgerRequest

    per_segment: dict[int, set[str]] = {}
    for p in row["segment_bookies"] or ():
        per_segment.setdefault(int(p["segment_first_entry_id"]), set()).add(p["bookie_id"])
    detected = row["detected_segments"]
    first = row["first_detected_at"]
    if first is not None and first.tzinfo is None:
        first = first.astimezone(timezone.utc)  # Spark hands back naive local times
    return LedgerRequest(
        ledger_id=int(row["ledger_id"]),
        bad_bookies=frozenset(row["bad_bookies"] or ()),
        segment_bookies={k: frozenset(v) for k, v in per_segment.items()},
        detected_segments=frozenset(detected) if detected is not None else None,
        first_detected_at=first,
        no_replica=frozenset(
            (int(p["segment_first_entry_id"]), p["bookie_id"]) for p in row["no_replica"] or ()
        ),
    )


def _repair_task(config: RepairConfig) -> Callable[[Iterable[Any]], Iterator[dict[str, Any]]]:
    def run(rows: Iterable[Any]) -> Iterator[dict[str, Any]]:
        from bklib.client.connection import ClientConfig
        from bklib.client.pool import SyncBookieClient
        from bklib.meta.store import LedgerStore, connect
        from bklib.repair.worker import LedgerRepairer

        requests = [request_from_row(r) for r in rows]
        if not requests:
            return
        zk = connect(config.zk, auth=config.zk_auth, timeout=config.zk_session_timeout)
        client_config = ClientConfig(read_timeout=config.read_timeout)
        try:
            with SyncBookieClient(
                config.zk, ledgers_root=config.ledgers_root, config=client_config
            ) as client:
                from bklib.meta.racks import read_racks

                repairer = LedgerRepairer(
                    LedgerStore(zk, config.ledgers_root),
                    client,
                    config.settings,
                    racks=read_racks(zk, config.racks_znode),
                )
                with concurrent.futures.ThreadPoolExecutor(
                    max(1, config.ledgers_in_flight), thread_name_prefix="repair"
                ) as pool:
                    for actions in pool.map(repairer.repair, requests):
                        for a in actions:
                            yield a.as_row()
        finally:
            zk.stop()
            zk.close()

    return run


# ---- driver side --------------------------------------------------------------------------------


class _Progress:
    """Logs task progress of the running Spark job group, with an ETA, every few seconds."""

    def __init__(self, spark: SparkSession, group: str, ledgers: int, every: float = 5.0):
        self.tracker = spark.sparkContext.statusTracker()
        self.group, self.ledgers, self.every = group, ledgers, every
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="repair-progress", daemon=True)

    def __enter__(self) -> _Progress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _tasks(self) -> tuple[int, int]:
        done = total = 0
        for job in self.tracker.getJobIdsForGroup(self.group):
            info = self.tracker.getJobInfo(job)
            for sid in info.stageIds if info else ():
                st = self.tracker.getStageInfo(sid)
                if st is not None:
                    done += st.numCompletedTasks
                    total += st.numTasks
        return done, total

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            try:
                done, total = self._tasks()
            except Exception:  # the tracker is advisory
                continue
            if not total:
                continue
            elapsed = time.monotonic() - self.t0
            eta = elapsed / done * (total - done) if done else float("nan")
            log.info(
                "progress: %d/%d tasks (~%d of %d ledgers), %.0fs elapsed, ETA %s",
                done,
                total,
                self.ledgers * done // total,
                self.ledgers,
                elapsed,
                f"{eta:.0f}s" if done else "unknown",
            )


class RepairJob:
    """One repair run: build the per-ledger requests, run the workers, record the actions."""

    def __init__(self, spark: SparkSession, config: RepairConfig) -> None:
        self.spark = spark
        self.config = config
        started = datetime.now(timezone.utc)
        self.run_id = config.run_id or f"{started:%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}"
        self.started_at = started

    def requests_from_audit(self) -> DataFrame | None:
        """Requests for the latest completed audit run (or ``audit_run_id``); None if there
        is no audit run."""
        cfg = self.config
        run = load.latest_run(self.spark, cfg.warehouse, cfg.audit_run_id)
        if run is None:
            return None
        cfg.audit_run_id = run["run_id"]
        fragments = load.run_fragments(self.spark, cfg.warehouse, run["run_id"])
        previous = None
        if load.table_exists(self.spark, cfg.warehouse, load.ACTIONS):
            previous = load.read_table(self.spark, cfg.warehouse, load.ACTIONS).where(
                F.col("status") == "NO_REPLICA"
            )
        return repair_input.requests_from_fragments(fragments, previous)

    def requests_for_bookies(self) -> DataFrame:
        """Manual recover: every ledger whose metadata names one of the bookies."""
        cfg = self.config
        ledgers, _ = extract.scan_ledgers_df(
            self.spark, cfg.zk, root=cfg.ledgers_root, auth=cfg.zk_auth
        )
        return repair_input.requests_for_bookies(ledgers, cfg.bookies)

    def execute(self, requests: DataFrame) -> list[dict[str, Any]]:
        """Run the workers over ``requests``; returns the action rows (also appended to
        ``replication_actions``)."""
        cfg = self.config
        reqs = requests.collect()  # one small row per ledger; keeps task sizes exact
        n = len(reqs)
        if n == 0:
            log.info("%s %s: nothing to repair", cfg.mode, self.run_id)
            return []
        if cfg.tasks:
            tasks = max(1, min(cfg.tasks, n))
        else:
            tasks = max(1, min(-(-n // max(1, cfg.ledgers_per_task)), n))
            tasks = max(tasks, min(n, self.spark.sparkContext.defaultParallelism))
        log.info(
            "%s %s: %d ledgers in %d tasks%s (audit run %s, grace %gs, rate %s)",
            cfg.mode,
            self.run_id,
            n,
            tasks,
            " [dry run]" if cfg.settings.dry_run else "",
            cfg.audit_run_id or "-",
            cfg.settings.grace_period,
            f"{cfg.settings.rate:.0f} B/s per task" if cfg.settings.rate else "unlimited",
        )
        sc = self.spark.sparkContext
        group = f"bkaudit-{cfg.mode}-{self.run_id}"
        sc.setJobGroup(group, f"bkaudit {cfg.mode} {self.run_id}")
        rdd = (
            sc.parallelize([(int(r["ledger_id"]), r) for r in reqs], tasks)
            .partitionBy(tasks, lambda lid: lid % tasks)
            .values()
            .mapPartitions(_repair_task(cfg))
        )
        t0 = time.monotonic()
        with _Progress(self.spark, group, n):
            rows = rdd.collect()
        elapsed = time.monotonic() - t0
        for r in rows:
            r["run_id"] = self.run_id
            r["mode"] = cfg.mode
            r["audit_run_id"] = cfg.audit_run_id
        names = [f.name for f in load.ACTIONS_SCHEMA.fields]
        load.append_actions(self.spark, cfg.warehouse, [tuple(r[k] for k in names) for r in rows])
        copied = sum(
            r["bytes_copied"] for r in rows if r["action"] == "COPY" and r["status"] == "DONE"
        )
        log.info(
            "%s %s: %d actions for %d ledgers in %.1fs (%.1f MB copied, %.1f MB/s)",
            cfg.mode,
            self.run_id,
            len(rows),
            n,
            elapsed,
            copied / 1e6,
            copied / 1e6 / elapsed if elapsed > 0 else 0.0,
        )
        return rows


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Counts for the printed summary: actions by (action, status), ledgers left to do."""
    by = Counter((r["action"], r["status"]) for r in rows)
    pending = sorted({r["ledger_id"] for r in rows if r["status"] not in FINAL_STATUSES})
    # Repaired: some step was done and nothing is left (a fence may finish the job by itself,
    # an in-place copy needs no metadata update).
    repaired = {r["ledger_id"] for r in rows if r["status"] == "DONE"} - set(pending)
    copied = [r for r in rows if r["action"] == "COPY" and r["status"] == "DONE"]
    return {
        "actions": dict(by),
        "ledgers_repaired": len(repaired),
        "ledgers_pending": pending,
        "entries_copied": sum(r["entries_copied"] for r in copied),
        "bytes_copied": sum(r["bytes_copied"] for r in copied),
        "no_replica": sorted(
            (r["ledger_id"], r["segment_first_entry_id"], tuple(r["no_replica_entries"] or ()))
            for r in rows
            if r["status"] == "NO_REPLICA"
        ),
    }


def print_summary(mode: str, run_id: str, rows: Sequence[dict[str, Any]]) -> int:
    """Print what the run did; returns the exit status (0 done, 1 work left)."""
    s = summarize(rows)
    ledgers = len({r["ledger_id"] for r in rows})
    print(
        f"{mode} {run_id}: {ledgers} ledgers, {s['ledgers_repaired']} repaired, "
        f"{len(s['ledgers_pending'])} need another run; {s['entries_copied']} entries "
        f"({s['bytes_copied'] / 1e6:.1f} MB) copied"
    )
    for (action, status), count in sorted(s["actions"].items()):
        print(f"  {action:<16} {status:<14} {count}")
    reasons = Counter(
        (r["error"] or "").split(":", 1)[0] for r in rows if r["status"] == "FAILED" and r["error"]
    )
    for reason, count in reasons.most_common(5):
        example = next(r for r in rows if r["status"] == "FAILED" and r["error"].startswith(reason))
        print(f"  FAILED x{count}: {example['error']} (e.g. ledger {example['ledger_id']})")
    for lid, seg, entries in s["no_replica"][:20]:
        shown = ", ".join(map(str, entries[:20])) + (" ..." if len(entries) > 20 else "")
        print(f"  NO_REPLICA ledger {lid} segment {seg}: entries {shown or '(earlier run)'}")
    if s["ledgers_pending"]:
        print(f"  ledgers needing another run: {s['ledgers_pending'][:30]}")
    return 1 if s["ledgers_pending"] else 0


# ---- command line -------------------------------------------------------------------------------


def add_repair_arguments(
    parser: argparse.ArgumentParser, mode: str = MODE_REREPLICATE
) -> argparse.ArgumentParser:
    """The flags shared by rereplicate, recover and decommission."""
    if mode == MODE_RECOVER:
        parser.add_argument("bookies", help="bookie id(s) to recover, comma separated")
        parser.add_argument("--target", default=None, help="copy everything to this bookie")
    elif mode == MODE_DECOMMISSION:
        parser.add_argument("bookies", metavar="BOOKIE", help="bookie id to decommission")
        parser.add_argument(
            "--keep-cookie", action="store_true", help="do not delete the bookie's cookie"
        )
    parser.add_argument("--zk", required=True, help="ZooKeeper connect string, HOST:PORT[/chroot]")
    parser.add_argument("--warehouse", required=True, help="directory or URI of the Delta tables")
    if mode == MODE_REREPLICATE:
        parser.add_argument(
            "--run-id", default=None, help="audit run to repair (default: the latest completed)"
        )
    parser.add_argument(
        "--grace-period",
        type=parse_duration,
        default=30.0,
        help="how long an open ledger's finding must be known before the ledger is fenced "
        "and closed (BookKeeper's openLedgerRereplicationGracePeriod; default 30s)",
    )
    parser.add_argument(
        "--rate",
        type=parse_rate,
        default=50e6,
        help="bytes/s each task may copy (e.g. 50MB, 20MiB; 0 = unlimited; default 50MB)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="write the plan; change no znode and no bookie"
    )
    parser.add_argument("--ledgers-root", default="/ledgers", help="BookKeeper's ledgers root")
    parser.add_argument("--zk-auth", default=None, help="ZooKeeper digest auth user:password")
    parser.add_argument(
        "--zk-session-timeout",
        type=parse_duration,
        default=10.0,
        help="worker ZooKeeper session timeout: how soon a dead worker's locks are freed",
    )
    parser.add_argument("--master", default=None, help="Spark master (default: conf or local[2])")
    parser.add_argument(
        "--password",
        default=None,
        help="ledger password for metadata that stores none (v2); v3 metadata stores it",
    )
    parser.add_argument(
        "--digest-type",
        choices=[d.name for d in DigestType],
        default=None,
        help="digest type for metadata that stores none",
    )
    parser.add_argument("--ledgers-per-task", type=int, default=DEFAULT_LEDGERS_PER_TASK)
    parser.add_argument(
        "--tasks",
        type=int,
        default=None,
        help="number of Spark tasks (default: from --ledgers-per-task); with "
        "--ledgers-in-flight it bounds the ZooKeeper sessions and requests in flight",
    )
    parser.add_argument(
        "--ledgers-in-flight", type=int, default=8, help="ledgers repaired at once per task"
    )
    parser.add_argument(
        "--window", type=int, default=64, help="entries in flight per fragment copy"
    )
    parser.add_argument("--read-timeout", type=parse_duration, default=10.0)
    parser.add_argument(
        "--racks-znode",
        default="/bookies",
        help="Pulsar's bookie rack JSON (ZkBookieRackAffinityMapping); when it exists, "
        "replacements prefer racks the rest of the segment does not use",
    )
    parser.add_argument(
        "--retry-no-replica",
        action="store_true",
        help="try again fragments an earlier run found with entries on no bookie",
    )
    return parser


def _run(
    mode: str,
    args: argparse.Namespace,
    spark: SparkSession | None,
    requests: Callable[[RepairJob], DataFrame | None],
) -> tuple[int, RepairJob | None]:
    """Build the job, its requests and run it; (exit status, job). Errors are logged, 2."""
    config = RepairConfig.from_args(args, mode)
    spark = spark or build_spark(f"bkaudit-{mode}", master=getattr(args, "master", None))
    job = RepairJob(spark, config)
    try:
        reqs = requests(job)
        if reqs is None:
            print(f"no completed audit run in {config.warehouse}; run `bkaudit audit` first")
            return 2, None
        rows = job.execute(reqs)
    except Exception:
        log.exception("%s run %s failed", mode, job.run_id)
        return 2, None
    return print_summary(mode, job.run_id, rows), job


def run_rereplicate(args: argparse.Namespace, spark: SparkSession | None = None) -> int:
    """``bkaudit rereplicate``: repair the latest audit's findings. 0/1/2 as documented."""
    return _run(MODE_REREPLICATE, args, spark, RepairJob.requests_from_audit)[0]


def run_recover(args: argparse.Namespace, spark: SparkSession | None = None) -> int:
    """``bkaudit recover``: re-replicate every fragment that uses the given bookies."""
    return _run(MODE_RECOVER, args, spark, RepairJob.requests_for_bookies)[0]


def run_decommission(args: argparse.Namespace, spark: SparkSession | None = None) -> int:
    """``bkaudit decommission``: the bookie must be stopped; recover it, then verify no
    ensemble names it (listing any ledger that still does), then delete its cookie."""
    from bklib.meta.registration import delete_cookie, list_bookies
    from bklib.meta.store import connect

    config = RepairConfig.from_args(args, MODE_DECOMMISSION)
    (bookie,) = config.bookies or ("",)
    if not bookie or len(config.bookies) != 1:
        print("decommission takes exactly one bookie id", file=sys.stderr)
        return 2
    zk = connect(config.zk, auth=config.zk_auth)
    try:
        if list_bookies(zk, config.ledgers_root).is_available(bookie):
            print(
                f"bookie {bookie} is still registered: stop it first (BookKeeper refuses to "
                "decommission a running bookie too)",
                file=sys.stderr,
            )
            return 2
        status, job = _run(MODE_DECOMMISSION, args, spark, RepairJob.requests_for_bookies)
        if job is None:
            return status
        if config.settings.dry_run:
            return status
        ledgers, _ = extract.scan_ledgers_df(
            job.spark, config.zk, root=config.ledgers_root, auth=config.zk_auth
        )
        remaining = repair_input.ledgers_naming(ledgers, bookie).collect()
        if remaining:
            print(f"decommission of {bookie} incomplete: {len(remaining)} ledgers still name it")
            for r in remaining[:50]:
                print(f"  ledger {r['ledger_id']} ({r['state']}) segments {list(r['segments'])}")
            return 1
        if not args.keep_cookie:
            delete_cookie(zk, bookie, config.ledgers_root)
        print(f"decommission of {bookie} complete: no ledger names it")
        return 0
    finally:
        zk.stop()
        zk.close()


RUNNERS = {
    MODE_REREPLICATE: run_rereplicate,
    MODE_RECOVER: run_recover,
    MODE_DECOMMISSION: run_decommission,
}


def main(argv: Sequence[str] | None = None) -> int:
    """``spark-submit jobs/rereplicate.py [recover|decommission] ...`` entry point."""
    argv = list(sys.argv[1:] if argv is None else argv)
    mode = argv.pop(0) if argv and argv[0] in (MODE_RECOVER, MODE_DECOMMISSION) else None
    mode = mode or MODE_REREPLICATE
    from jobs.config import config_path_from_argv, configure_logging, parse_with_config

    parser = add_repair_arguments(
        argparse.ArgumentParser(prog=f"{mode}", description=f"bkaudit {mode}"), mode
    )
    args = parse_with_config(parser, mode, argv)
    configure_logging(False, config_path_from_argv(argv))
    return RUNNERS[mode](args)


if __name__ == "__main__":
    sys.exit(main())
