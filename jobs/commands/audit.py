"""The audit: find every under-replicated fragment and append it to the Delta tables.

    bkaudit audit --zk HOST:PORT[/chroot] --warehouse PATH [--check CHECK]
                  [--executor auto|local|spark]
    spark-submit jobs/audit.py ...            (same flags; always Spark)

Steps, each logged with a summary line: the metadata scan (every ledger znode) and the bookie
registrations; the check (one kind of :mod:`bklib.audit.checks`, listed in docs/checks.md:
``lost`` uses metadata only, ``replicas`` asks each bookie what it holds, and so on);
the re-read of flagged ledgers, dropping findings for ledgers deleted or changed meanwhile;
and the load into ``audit_runs``, ``ledgers``, ``bookies`` and ``underreplicated_fragments``.

The steps are :mod:`bklib.audit`'s; ``--executor`` picks where they run (:mod:`jobs.runs.executor`):
in this process (:mod:`jobs.local.audit`) or on Spark (:mod:`jobs.spark.audit_job`).

Exit status (:mod:`jobs.runtime.exit_status`): 0 when the run completed and read everything
(findings or not), 2 on an operator error, 3 when the run missed something (COMPLETED_WITH_ERRORS,
or a run that failed part-way, e.g. on an expired session).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from bklib.audit.checker import LEDGERS_IN_FLIGHT, SAMPLED_LEDGERS_IN_FLIGHT
from bklib.audit.checks import DEFAULT_CHECK
from bklib.audit.checks import names as check_names
from bklib.audit.checks.render import help_text as check_help
from bklib.audit.completeness import incomplete_reasons
from bklib.audit.engine import ScanPlan
from bklib.meta.scan import DEFAULT_MAX_IN_FLIGHT
from bklib.meta.stores import MetadataStore, open_store
from bklib.meta.stores.zookeeper.bulk import DEFAULT_SESSION_TIMEOUT
from bklib.states import DEFAULT_LEDGERS_ROOT, Check, Executor, RunStatus
from jobs.options.bookie_protocol import add_bookie_protocol_argument
from jobs.options.units import parse_duration, parse_percentage, parse_rate
from jobs.options.warehouse import WAREHOUSE_HELP
from jobs.runs.audit_run import (
    DEFAULT_LEDGERS_PER_TASK,
    DEFAULT_READ_RATE,
    AuditConfig,
    record_interrupted,
    summary_line,
)
from jobs.runs.executor import (
    LocalTooBigError,
    add_executor_arguments,
    choose_executor,
    limits_from_args,
)
from jobs.runtime import interrupts
from jobs.runtime.exit_status import ExitStatus, for_run_status
from jobs.runtime.messages import one_line

__all__ = ["AuditConfig", "add_audit_arguments", "main", "run_audit"]

log = logging.getLogger("jobs.commands.audit")


# ---- command line ------------------------------------------------------------------------------


def add_audit_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the audit flags to ``parser`` (shared by ``bkaudit audit`` and spark-submit)."""
    parser.add_argument("--zk", required=True, help="ZooKeeper connect string, HOST:PORT[/chroot]")
    parser.add_argument("--warehouse", required=True, help=WAREHOUSE_HELP)
    parser.add_argument(
        "--check",
        choices=check_names(),
        default=DEFAULT_CHECK,
        help=check_help(),  # from the check registry (bklib.audit.checks)
    )
    parser.add_argument(
        "--verify-percentage",
        type=parse_percentage,
        default=0.0,
        help="sample check: percent of each fragment read besides its first and last entry "
        "(BookKeeper's auditorLedgerVerificationPercentage)",
    )
    parser.add_argument(
        "--ledgers-root", default=DEFAULT_LEDGERS_ROOT, help="BookKeeper's ledgers root"
    )
    parser.add_argument("--zk-auth", default=None, help="ZooKeeper digest auth user:password")
    from jobs.options.zookeeper import add_session_timeout_argument

    add_session_timeout_argument(
        parser,
        default=DEFAULT_SESSION_TIMEOUT,
        effect="a pause of the audit longer than this expires its session, and the run fails "
        "instead of recording what it read across the gap",
    )
    parser.add_argument("--master", default=None, help="Spark master (default: conf or local[2])")
    parser.add_argument("--run-id", default=None, help="id for this run (default: time + random)")
    parser.add_argument(
        "--read-timeout",
        type=parse_duration,
        default=5.0,
        help="how long to wait for a bookie's answer (e.g. 5s, 500ms); a list-entries timeout "
        "switches to probing",
    )
    parser.add_argument(
        "--connect-timeout",
        type=parse_duration,
        default=5.0,
        help="how long to wait for a bookie connection (e.g. 5s)",
    )
    parser.add_argument(
        "--scan-in-flight",
        type=int,
        default=DEFAULT_MAX_IN_FLIGHT,
        help="metadata reads in flight per task",
    )
    parser.add_argument("--ledgers-per-task", type=int, default=DEFAULT_LEDGERS_PER_TASK)
    parser.add_argument(
        "--ledgers-in-flight",
        type=int,
        default=None,
        help=f"ledgers being checked at once per task (default {LEDGERS_IN_FLIGHT}; "
        f"{SAMPLED_LEDGERS_IN_FLIGHT} for the sample check, a few reads each)",
    )
    parser.add_argument(
        "--reads-in-flight",
        type=int,
        default=256,
        help="entry reads in flight per bookie in each task",
    )
    parser.add_argument(
        "--read-rate",
        type=parse_rate,
        default=DEFAULT_READ_RATE,
        help="bytes/s each task may read from one bookie (e.g. 100MB, 50MiB; 0 = unlimited; "
        "default 100MB), so an audit leaves the bookies to Pulsar's own reads",
    )
    add_bookie_protocol_argument(parser, what="the check's entry reads")
    parser.add_argument(
        "--no-reread",
        action="store_true",
        help="do not re-read flagged ledgers before writing the report",
    )
    from jobs.options.placement import add_placement_arguments

    add_placement_arguments(parser, command="audit")
    from jobs.runs.pulsar_check import add_pulsar_check_arguments

    add_pulsar_check_arguments(parser)
    add_executor_arguments(parser)
    from jobs.options.zookeeper import add_connection_arguments

    return add_connection_arguments(parser)


def run_audit(args: argparse.Namespace, spark: Any = None) -> int:
    """Run one audit from parsed arguments; its :class:`ExitStatus`.

    A caller that hands in a SparkSession gets Spark under ``--executor auto``.
    """
    config = AuditConfig.from_args(args)
    requested = getattr(args, "executor", Executor.AUTO)
    if spark is not None and requested == Executor.AUTO:
        requested = Executor.SPARK
    from jobs.runtime.startup import check_before_connecting

    try:
        check_before_connecting(args, spark)  # the executor and the warehouse, first
        # One session for every step this process runs (cluster check, racks, scan,
        # registrations, accounting, re-reads); Spark tasks open their own from the locator.
        session = open_store(
            config.zk, auth=config.zk_auth, session_timeout=config.zk_session_timeout
        )
    except Exception as exc:  # no session, no run: one line, exit 2, nothing recorded
        log.debug("audit could not start", exc_info=True)
        print(f"audit: {one_line(exc)}", file=sys.stderr)
        return ExitStatus.OPERATOR_ERROR
    with session:
        if args.check == Check.PULSAR:  # metadata only, in this process
            from jobs.runs.pulsar_check import run_pulsar_check

            return run_pulsar_check(args, session)
        return _run_with(args, config, session, requested, spark)


def _run_with(
    args: argparse.Namespace,
    config: AuditConfig,
    session: MetadataStore,
    requested: str,
    spark: Any,
) -> int:
    try:
        plan = ScanPlan.read(session, config.ledgers_root)
        _load_racks(config, session)
        choice = choose_executor(
            requested,
            ledgers=plan.expected,
            work_bytes=0,
            limits=limits_from_args(args),
            what="audit",
        )
    except LocalTooBigError as exc:
        print(f"audit: {exc}", file=sys.stderr)
        return ExitStatus.OPERATOR_ERROR
    except Exception as exc:
        log.debug("audit could not start", exc_info=True)
        print(f"audit: {one_line(exc)}", file=sys.stderr)
        return ExitStatus.OPERATOR_ERROR
    log.info(
        "audit: check %s of %s into %s, executor %s (%s)",
        config.check,
        config.zk,
        config.warehouse,
        choice.executor,
        choice.reason,
    )
    if choice.executor == Executor.LOCAL:
        return _run_local(config, plan, session)
    return _run_spark(config, plan, session, spark, getattr(args, "master", None))


def _load_racks(config: AuditConfig, session: MetadataStore) -> None:
    """Read the rack document for the placement pass, before anything heavy: a document that
    does not parse stops the audit with one line naming it (docs/placement.md)."""
    from jobs.options.placement import PLACEMENT_OFF, PLACEMENT_ON, document_to_check
    from jobs.runs.placement import load_rack_document

    if config.placement == PLACEMENT_OFF:
        return
    doc = load_rack_document(session, config.racks_znode, config.racks_file)
    if doc is None and config.placement == PLACEMENT_ON:
        raise ValueError(
            f"--placement on, but no racks: znode {config.racks_znode} does not exist and no "
            "--racks-file was given"
        )
    if doc is None:
        log.info("placement: not checked (no %s znode, no --racks-file)", config.racks_znode)
    elif document_to_check(config.placement, doc) is None:
        log.info("placement: not checked (%s names no rack; --placement on checks)", doc.source)
    config.rack_document = document_to_check(config.placement, doc)


def _run_local(config: AuditConfig, plan: ScanPlan, session: MetadataStore) -> int:
    from jobs.local.audit import LocalAudit
    from jobs.tables import delta
    from jobs.tables.schema import AUDIT_RUNS

    job = LocalAudit(config, plan, session)
    try:
        run = job.run_all()
    except delta.TableError as exc:
        log.debug("audit run %s: warehouse refused", job.run.run_id, exc_info=True)
        print(f"audit: {exc}", file=sys.stderr)
        return ExitStatus.OPERATOR_ERROR
    except Exception as exc:
        log.debug("audit run %s failed", job.run.run_id, exc_info=True)
        _failed(job.run, exc)
        try:
            delta.append_rows(config.warehouse, AUDIT_RUNS, [job.run.as_row()])
        except Exception as exc2:  # noqa: BLE001 - the run still ends FAILED, exit 3
            log.error("could not record the failed run: %s", exc2)
        print(f"audit {job.run.run_id} FAILED: {one_line(exc)}", file=sys.stderr)
        return ExitStatus.INCOMPLETE
    except BaseException as exc:  # SIGINT, SIGTERM: recorded INTERRUPTED, then the line
        signum = interrupts.signal_of(exc)
        if signum is not None:
            run_row = job.run.as_row  # called once the record says INTERRUPTED
            record_interrupted(
                job.run,
                signum,
                lambda: delta.append_rows(config.warehouse, AUDIT_RUNS, [run_row()]),
            )
        raise
    return _finished(run)


def _run_spark(
    config: AuditConfig, plan: ScanPlan, session: MetadataStore, spark: Any, master: str | None
) -> int:
    from jobs.runtime.progress import SparkProgress
    from jobs.spark import load
    from jobs.spark.audit_job import AuditJob
    from jobs.spark.session import build_spark
    from jobs.tables.delta import TableError

    spark = spark or build_spark("bkaudit-audit", master=master, warehouse=config.warehouse)
    job = AuditJob(spark, config, plan, session)
    try:
        # Spark's console bar is off (jobs.spark.session): ours, or a line every few seconds.
        with SparkProgress(spark, "audit", logger=log):
            run = job.run_all()
    except TableError as exc:  # a warehouse this bkaudit may not write: nothing to record in it
        log.debug("audit run %s: warehouse refused", job.run.run_id, exc_info=True)
        print(f"audit: {exc}", file=sys.stderr)
        return ExitStatus.OPERATOR_ERROR
    except Exception as exc:
        log.debug("audit run %s failed", job.run.run_id, exc_info=True)
        _failed(job.run, exc)
        try:
            load.write_run_record(spark, config.warehouse, job.run)
        except Exception as exc2:  # noqa: BLE001 - the run still ends FAILED, exit 3
            log.error("could not record the failed run: %s", exc2)
        print(f"audit {job.run.run_id} FAILED: {one_line(exc)}", file=sys.stderr)
        return ExitStatus.INCOMPLETE
    except BaseException as exc:  # SIGINT (PySpark's handler: KeyboardInterrupt), SIGTERM
        signum = interrupts.signal_of(exc)
        if signum is not None:
            record_interrupted(
                job.run, signum, lambda: load.write_run_record(spark, config.warehouse, job.run)
            )
        raise
    finally:
        job.close()
    return _finished(run)


def _finished(run: Any) -> ExitStatus:
    """Print the run's summary line; a run that missed something exits 3, never 0."""
    print(summary_line(run.run_id, run.status, run.counts, run.executor))
    status = for_run_status(run.status)
    if status != ExitStatus.OK:
        print(
            f"audit {run.run_id} is incomplete ({run.status}): {incomplete_reasons(run.counts)}",
            file=sys.stderr,
        )
    return status


def _failed(run: Any, exc: BaseException) -> None:
    run.status = RunStatus.FAILED
    run.error = one_line(exc)
    run.finished_at = datetime.now(timezone.utc)


def main(argv: Sequence[str] | None = None) -> int:
    """``spark-submit jobs/audit.py ...`` entry point: always Spark."""
    from jobs.cli.config import config_path_from_argv, configure_logging, parse_with_config
    from jobs.cli.main import command_parser
    from jobs.cli.registry import command

    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_with_config(command_parser(command("audit")), "audit", argv)
    args.executor = Executor.SPARK
    configure_logging(False, config_path_from_argv(argv))
    interrupts.install("audit")  # spark-submit's Python driver: the one road, as bkaudit's
    return interrupts.answered(lambda: run_audit(args))
