"""The repair jobs: re-replicate what the latest audit found, recover named bookies, and
decommission a bookie.

    spark-submit jobs/rereplicate.py --zk HOST:PORT[/chroot] --warehouse PATH \
        [--grace-period 30s] [--rate 50MB] [--dry-run] [--run-id AUDIT_RUN]
    bkaudit rereplicate ...                       (same flags)
    bkaudit recover BOOKIE[,BOOKIE] --zk ... --warehouse ... [--target BOOKIE] [--dry-run]
    bkaudit decommission BOOKIE --zk ... --warehouse ...

Findings (or, for recover and decommission, the ledgers naming the bookies) become one
:class:`bklib.repair.requests.LedgerRequest` per ledger, and
:class:`bklib.repair.worker.LedgerRepairer` repairs each (lock, re-read, fence after the grace
period, copy with recovery-add, compare-and-set). ``--executor`` picks where
(:mod:`jobs.runs.executor`): in this process (:mod:`jobs.local.repair`) or in Spark tasks
(:mod:`jobs.spark.repair_job`). Every action is appended to ``replication_actions``; progress
is logged with an ETA and a summary printed. ``spark-submit`` always runs on Spark.

Exit status: 0 when nothing is left to do, 1 when some ledgers still need work (waiting for
the grace period, locked elsewhere, failed, or with entries that have no replica), 2 on error.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

from bklib.meta.model import DigestType
from bklib.meta.stores import MetadataStore
from bklib.meta.stores.session_guard import SessionGuard
from bklib.repair.requests import LedgerRequest
from bklib.states import DEFAULT_LEDGERS_ROOT, BookieState, Executor, RepairMode
from jobs.options.bookie_protocol import add_bookie_protocol_argument
from jobs.options.units import parse_duration, parse_rate
from jobs.options.warehouse import WAREHOUSE_HELP
from jobs.options.zookeeper import add_session_timeout_argument
from jobs.runs.executor import (
    add_executor_arguments,
    choose_executor,
    limits_from_args,
)
from jobs.runs.repair_run import DEFAULT_LEDGERS_PER_TASK, RepairConfig, print_summary
from jobs.runtime import interrupts
from jobs.runtime.exit_status import ExitStatus, for_error, worst
from jobs.runtime.interrupts import DEFAULT_STOP_TIMEOUT
from jobs.runtime.messages import one_line

log = logging.getLogger("jobs.commands.repair")

MODE_REREPLICATE = RepairMode.REREPLICATE
MODE_RECOVER = RepairMode.RECOVER
MODE_DECOMMISSION = RepairMode.DECOMMISSION


# ---- executor side ------------------------------------------------------------------------------


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
    parser.add_argument("--warehouse", required=True, help=WAREHOUSE_HELP)
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
    parser.add_argument(
        "--ledgers-root", default=DEFAULT_LEDGERS_ROOT, help="BookKeeper's ledgers root"
    )
    parser.add_argument("--zk-auth", default=None, help="ZooKeeper digest auth user:password")
    add_session_timeout_argument(
        parser, default=10.0, effect="how soon a dead worker's locks are freed"
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
        "--local-processes",
        type=int,
        default=0,
        help="local executor: worker processes (0: one per core, each with at least "
        "--ledgers-in-flight ledgers)",
    )
    parser.add_argument(
        "--window", type=int, default=64, help="entries in flight per fragment copy"
    )
    parser.add_argument(
        "--stop-timeout",
        type=parse_duration,
        default=DEFAULT_STOP_TIMEOUT,
        help="after SIGINT or SIGTERM no ledger starts; how long those in flight may finish "
        f"before the process exits (their locks go with its session; default "
        f"{DEFAULT_STOP_TIMEOUT:g}s)",
    )
    add_bookie_protocol_argument(parser, what="the copy's reads and adds")
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
    from jobs.options.placement import add_placement_arguments

    add_placement_arguments(parser, command=mode)
    from jobs.options.pulsar import add_pulsar_admin_arguments

    add_pulsar_admin_arguments(parser)
    add_executor_arguments(parser)
    from jobs.options.zookeeper import add_connection_arguments

    return add_connection_arguments(parser)


Requests = Callable[[Any], "list[LedgerRequest] | None"]


def _choose(args: argparse.Namespace, spark: Any, ledgers: int, work_bytes: int) -> str:
    requested = getattr(args, "executor", Executor.AUTO)
    if spark is not None and requested == Executor.AUTO:
        requested = Executor.SPARK  # a caller that hands in a SparkSession wants Spark
    choice = choose_executor(
        requested,
        ledgers=ledgers,
        work_bytes=work_bytes,
        limits=limits_from_args(args),
        what=args.mode,
    )
    log.info("%s: executor %s (%s)", args.mode, choice.executor, choice.reason)
    return choice.executor


def _execute(
    config: RepairConfig,
    args: argparse.Namespace,
    spark: Any,
    reqs: list[LedgerRequest],
    local: Any,
) -> tuple[list[dict[str, Any]], str]:
    """Run ``reqs`` where the executor choice says; (action rows, run id)."""
    work_bytes = sum(local.lengths.get(r.ledger_id, 0) for r in reqs)
    executor = _choose(args, spark, len(reqs), work_bytes)
    if executor == Executor.LOCAL:
        return local.execute(reqs), local.run_id
    from jobs.spark.repair_job import RepairJob
    from jobs.spark.session import build_spark

    spark = spark or build_spark(
        f"bkaudit-{config.mode}", master=getattr(args, "master", None), warehouse=config.warehouse
    )
    job = RepairJob(spark, config, local.session)
    return job.execute(reqs), job.run_id


def _requests(
    mode: str, config: RepairConfig, local: Any
) -> tuple[list[LedgerRequest] | None, Any]:
    """The run's requests (None: no audit run to repair from) and, for recover and
    decommission, the account of the scan that found the ledgers naming the bookies."""
    from jobs.local.repair import scan_views

    if mode != MODE_REREPLICATE:
        views, account = scan_views(config, local.session)
        reqs = local.requests_for_bookies(views)
        for b in local.unnamed:
            print(
                f"{mode}: warning: no ledger's ensemble names bookie {b}; check the id "
                "(host:port as the bookie registers it)",
                file=sys.stderr,
            )
        return reqs, account
    reqs = local.requests_from_audit()
    if reqs is None:
        return None, None
    if not config.fix_placement:
        reqs += local.requests_for_marks(reqs)
    if local.placement_skipped and not config.fix_placement:
        print(
            f"{mode}: {local.placement_skipped} placement violations of the audit are "
            "not under-replication and are left alone; `rereplicate --fix-placement` "
            "moves replicas to satisfy the rack rule"
        )
    return reqs, None


def _open_session(
    mode: str, config: RepairConfig, args: argparse.Namespace, spark: Any
) -> MetadataStore | None:
    """The command's one store session (its in-process repairs' locks live on it), or None
    after one line saying why it could not be opened (or why the executor or the warehouse
    cannot take the run: checked first)."""
    from bklib.meta.stores import open_store
    from jobs.runtime.startup import check_before_connecting

    try:
        check_before_connecting(args, spark)
        return open_store(config.zk, auth=config.zk_auth, timeout=config.zk_session_timeout)
    except Exception as exc:
        log.debug("%s could not connect", mode, exc_info=True)
        print(f"{mode}: {one_line(exc)}", file=sys.stderr)
        return None


def _run(
    mode: str, args: argparse.Namespace, spark: Any, session: MetadataStore
) -> tuple[ExitStatus, str | None]:
    """Build the requests and run them over the command's ``session``; (exit status, run
    id). An error before any work is one line and 2; a run that started and could not
    finish, or could not read every ledger that may name its bookies, is 3
    (:mod:`jobs.runtime.exit_status`)."""
    from bklib.audit.engine import require_cluster
    from jobs.local.repair import LocalRepair

    args.mode = mode
    config = RepairConfig.from_args(args, mode)
    local = LocalRepair(config, session)
    try:
        from jobs.options.pulsar import admin_settings

        admin = admin_settings(args)
        # Fail closed: a wrong chroot must not look like a cluster whose ledgers were deleted.
        require_cluster(session, config.ledgers_root)
        if mode == MODE_REREPLICATE and config.fix_placement:
            _require_racks(config, session)
    except Exception as exc:  # before any work: an operator error
        log.debug("%s could not start", mode, exc_info=True)
        print(f"{mode}: {one_line(exc)}", file=sys.stderr)
        return ExitStatus.OPERATOR_ERROR, None
    try:
        with SessionGuard(session) as guard:
            reqs, account = _requests(mode, config, local)
            if reqs is None:
                print(
                    f"no completed audit run in {config.warehouse}; run `bkaudit audit` first",
                    file=sys.stderr,
                )
                return ExitStatus.OPERATOR_ERROR, None
            # What the scan read is one view of the cluster, or nothing is repaired from it.
            guard.check("the metadata scan")
            rows, run_id = _execute(config, args, spark, reqs, local)
    except Exception as exc:  # what it did is recorded; the store failing under it is a 3
        log.debug("%s run failed", mode, exc_info=True)
        print(f"{mode}: {one_line(exc)}; run {mode} again", file=sys.stderr)
        return for_error(exc), None
    status = print_summary(mode, run_id, rows)
    from jobs.runs.pulsar_unload import report_unloads, unload_changed_topics

    try:
        unloads = unload_changed_topics(
            rows,
            run_id=run_id,
            mode=mode,
            session=session,
            ledgers_root=config.ledgers_root,
            warehouse=config.warehouse,
            audit_run_id=config.audit_run_id,
            dry_run=config.settings.dry_run,
            settings=admin,
            unload_rate=args.unload_rate,
        )
        report_unloads(
            unloads, warehouse=config.warehouse, dry_run=config.settings.dry_run, settings=admin
        )
    except Exception as exc:  # the repair is done and recorded: unloads never undo that
        # Which topics still hold stale handles is now unknown, so this run is not "done":
        # exit 1, and the line says why.
        log.debug("topic unloads after %s %s failed", mode, run_id, exc_info=True)
        print(f"  Pulsar topic unloads not done: {one_line(exc)}")
        status = worst(status, ExitStatus.FINDINGS)
    if local.unreadable:
        # Fail closed: a ledger we cannot parse may still name the bookie.
        print(
            f"  {len(local.unreadable)} ledgers could not be read and may still name "
            f"{', '.join(config.bookies)}; fix their metadata and run {mode} again:"
        )
        for v in local.unreadable[:20]:
            print(f"    ledger {v.ledger_id}: {v.error}")
        status = worst(status, ExitStatus.INCOMPLETE)
    if account is not None and not account.complete:
        # Fail closed: ledgers the scan lost may name the bookie too.
        print(f"  the metadata scan was incomplete: {account.describe()}; run {mode} again")
        status = worst(status, ExitStatus.INCOMPLETE)
    return status, run_id


def _require_racks(config: RepairConfig, session: MetadataStore) -> None:
    """``--fix-placement`` needs racks: the rack document must exist and parse."""
    from jobs.runs.placement import load_rack_document

    doc = load_rack_document(session, config.racks_znode, config.racks_file)
    if doc is None:
        raise ValueError(
            f"--fix-placement needs racks: znode {config.racks_znode} does not exist and no "
            "--racks-file was given"
        )


def run_rereplicate(args: argparse.Namespace, spark: Any = None) -> int:
    """``bkaudit rereplicate``: repair the latest audit's findings (docs/exit-status.md)."""
    return _run_with_session(MODE_REREPLICATE, args, spark)


def run_recover(args: argparse.Namespace, spark: Any = None) -> int:
    """``bkaudit recover``: re-replicate every fragment that uses the given bookies."""
    return _run_with_session(MODE_RECOVER, args, spark)


def _run_with_session(mode: str, args: argparse.Namespace, spark: Any) -> ExitStatus:
    """:func:`_run` over a session opened here, where the command starts, and closed after."""
    session = _open_session(mode, RepairConfig.from_args(args, mode), args, spark)
    if session is None:
        return ExitStatus.OPERATOR_ERROR
    with session:
        return _run(mode, args, spark, session)[0]


def run_decommission(args: argparse.Namespace, spark: Any = None) -> int:
    """``bkaudit decommission``: the bookie must be stopped; recover it, then verify no
    ensemble names it (listing any ledger that still does), then delete its cookie."""
    from bklib.meta.registration import delete_cookie, list_bookies
    from jobs.local.repair import scan_views

    config = RepairConfig.from_args(args, MODE_DECOMMISSION)
    (bookie,) = config.bookies or ("",)
    if not bookie or len(config.bookies) != 1:
        print("decommission takes exactly one bookie id", file=sys.stderr)
        return ExitStatus.OPERATOR_ERROR
    zk = _open_session(MODE_DECOMMISSION, config, args, spark)
    if zk is None:
        return ExitStatus.OPERATOR_ERROR
    try:
        registry = list_bookies(zk, config.ledgers_root)
        if registry.is_available(bookie):
            state = BookieState.WRITABLE if bookie in registry.writable else BookieState.READONLY
            print(
                f"bookie {bookie} is {state} (registered): stop it first (BookKeeper refuses "
                "to decommission a running bookie too)",
                file=sys.stderr,
            )
            return ExitStatus.OPERATOR_ERROR
        status, run_id = _run(MODE_DECOMMISSION, args, spark, zk)
        if run_id is None or config.settings.dry_run:
            return status
        views, account = scan_views(config, zk)
        remaining = [v for v in views if not v.ok or bookie in v.bookies()]
        if not account.complete:
            print(f"decommission of {bookie} unverified: {account.describe()}; its cookie is kept")
            return ExitStatus.INCOMPLETE
        if remaining:
            print(
                f"decommission of {bookie} incomplete: {len(remaining)} ledgers still name it "
                "or cannot be read; its cookie is kept"
            )
            for v in remaining[:50]:
                if not v.ok:
                    print(f"  ledger {v.ledger_id}: unreadable, may name it ({v.error})")
                    continue
                segs = [s.first_entry_id for s in v.segments or () if bookie in s.ensemble]
                print(f"  ledger {v.ledger_id} ({v.state}) segments {segs}")
            unreadable = any(not v.ok for v in remaining)
            return ExitStatus.INCOMPLETE if unreadable else ExitStatus.FINDINGS
        if not args.keep_cookie:
            delete_cookie(zk, bookie, config.ledgers_root)
        print(f"decommission of {bookie} complete: no ledger names it")
        return ExitStatus.OK
    finally:
        zk.close()


def add_rereplicate_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``bkaudit rereplicate``'s flags."""
    return add_repair_arguments(parser, MODE_REREPLICATE)


def add_recover_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``bkaudit recover``'s flags."""
    return add_repair_arguments(parser, MODE_RECOVER)


def add_decommission_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``bkaudit decommission``'s flags."""
    return add_repair_arguments(parser, MODE_DECOMMISSION)


RUNNERS = {
    MODE_REREPLICATE: run_rereplicate,
    MODE_RECOVER: run_recover,
    MODE_DECOMMISSION: run_decommission,
}


def main(argv: Sequence[str] | None = None) -> int:
    """``spark-submit jobs/rereplicate.py [recover|decommission] ...`` entry point: always
    Spark."""
    argv = list(sys.argv[1:] if argv is None else argv)
    mode = argv.pop(0) if argv and argv[0] in (MODE_RECOVER, MODE_DECOMMISSION) else None
    mode = mode or MODE_REREPLICATE
    from jobs.cli.config import config_path_from_argv, configure_logging, parse_with_config
    from jobs.cli.main import command_parser
    from jobs.cli.registry import command

    args = parse_with_config(command_parser(command(mode)), mode, argv)
    args.executor = Executor.SPARK
    configure_logging(False, config_path_from_argv(argv))
    interrupts.install(mode)  # spark-submit's Python driver: the one road, as bkaudit's
    return interrupts.answered(lambda: RUNNERS[mode](args))
