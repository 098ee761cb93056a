"""``bkaudit blastradius``: what each bookie and each rack failing alone would take down,
computed in one pass into the ``blast_radius`` table (docs/whatif.md).

    bkaudit blastradius --zk HOST:PORT[/chroot] --warehouse W [--executor auto|local|spark]

The cluster is read as ``bkaudit whatif`` reads it (:func:`jobs.commands.whatif.load_state`:
metadata, registrations, racks, and the latest audit's missing replicas unless
``--no-findings``); the arithmetic is :mod:`bklib.audit.blast_radius`, in this process (forked
workers for large clusters) or on Spark (:mod:`jobs.spark.blast_radius`).

Exit status: 0 written, 1 written but incomplete (the figures are a lower bound), 2 on error.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from bklib.audit.blast_radius import blast_radius, merge_scopes
from bklib.audit.engine import ScanPlan
from bklib.audit.model import LedgerView
from bklib.audit.whatif import ScanCoverage
from bklib.meta.racks import DEFAULT_RACKS_ZNODE
from bklib.meta.stores import MetadataStore
from bklib.meta.stores.session_guard import SessionGuard
from bklib.replacement import DEFAULT_MIN_RACKS
from bklib.states import DEFAULT_LEDGERS_ROOT, Executor, Scope
from jobs.commands.whatif import (
    ClusterState,
    Findings,
    UsageError,
    audit_used,
    findings_missing,
    load_state,
    read_cluster,
)
from jobs.options.warehouse import WAREHOUSE_HELP
from jobs.runtime.cores import usable_cores
from jobs.runtime.exit_status import ExitStatus, for_error
from jobs.runtime.messages import one_line
from jobs.runtime.startup import open_command_store

__all__ = [
    "PARALLEL_MIN_LEDGERS",
    "add_blastradius_arguments",
    "blast_rows",
    "parallel_blast_radius",
    "run_blastradius",
    "scope_row",
]

log = logging.getLogger("jobs.commands.blastradius")

BLAST_RADIUS = "blast_radius"


def add_blastradius_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The ``bkaudit blastradius`` flags."""
    from jobs.runs.executor import add_executor_arguments

    parser.add_argument("--zk", required=True, help="ZooKeeper connect string, HOST:PORT[/chroot]")
    parser.add_argument("--warehouse", required=True, help=WAREHOUSE_HELP)
    parser.add_argument(
        "--ledgers-root", default=DEFAULT_LEDGERS_ROOT, help="BookKeeper's ledgers root"
    )
    parser.add_argument("--zk-auth", default=None, help="ZooKeeper digest auth user:password")
    parser.add_argument("--racks-znode", default=DEFAULT_RACKS_ZNODE, help="Pulsar's rack document")
    parser.add_argument("--min-racks", type=int, default=DEFAULT_MIN_RACKS)
    parser.add_argument(
        "--no-findings",
        action="store_true",
        help="ignore the latest audit's missing replicas (by default they count as gone)",
    )
    parser.add_argument("--run-id", default=None, help="id for this run (default: time + random)")
    parser.add_argument("--master", default=None, help="Spark master (default: conf or local[2])")
    add_executor_arguments(parser)
    from jobs.options.zookeeper import add_connection_arguments, add_session_timeout_argument

    add_session_timeout_argument(
        parser, default=30.0, effect="a pause longer than this fails the run (exit 3)"
    )
    return add_connection_arguments(parser)


def _processes() -> int:
    # One worker per core (at most 4); parallel_blast_radius forks only for big clusters.
    return min(4, usable_cores())


PARALLEL_MIN_LEDGERS = 100_000
"""Below this many ledgers one process is faster than forking workers."""

_SHARED: tuple[Sequence[LedgerView], list[str], dict[str, Any]] | None = None
"""The forked workers' input: inherited, never pickled."""


def _slice_radius(bounds: tuple[int, int]) -> list[Any]:
    assert _SHARED is not None
    views, bookies, kw = _SHARED
    return blast_radius(views[bounds[0] : bounds[1]], bookies, **kw)


def parallel_blast_radius(
    views: Sequence[LedgerView], bookies: list[str], *, processes: int, **kw: Any
) -> list[Any]:
    """:func:`~bklib.audit.blast_radius.blast_radius` over ``processes`` forked workers, each on a
    slice of ``views`` (inherited copy-on-write), the partial results merged. ``bookies``
    must name every bookie the views name, so every part has every scope."""
    global _SHARED
    if processes <= 1 or len(views) < PARALLEL_MIN_LEDGERS or not hasattr(os, "fork"):
        return blast_radius(views, bookies, **kw)
    n = len(views)
    bounds = [(i * n // processes, (i + 1) * n // processes) for i in range(processes)]
    _SHARED = (views, bookies, kw)
    try:
        with multiprocessing.get_context("fork").Pool(processes) as pool:
            parts = pool.map(_slice_radius, bounds)
    finally:
        _SHARED = None
    return merge_scopes(parts)


def blast_rows(
    state: ClusterState, min_racks: int = DEFAULT_MIN_RACKS, processes: int = 1
) -> list[Any]:
    """Every bookie's and rack's :class:`~bklib.audit.blast_radius.ScopeImpact`, in-process (in
    ``processes`` forked workers for large clusters)."""
    return parallel_blast_radius(
        state.views,
        state.bookies,
        processes=processes,
        racks=state.racks,
        gone=state.lost,
        missing=state.missing,
        writable=state.writable,
        min_racks=min_racks,
    )


def scope_row(s: Any, run_id: str, computed_at: datetime, audit_run_id: str | None,
              executor: str) -> dict[str, Any]:  # fmt: skip
    """A ``blast_radius`` row of a ScopeImpact."""
    return {
        "run_id": run_id,
        "computed_at": computed_at,
        "audit_run_id": audit_run_id,
        "scope": s.scope,
        "name": s.name,
        "bookies": s.bookies,
        "ledgers": s.ledgers,
        "ledgers_below_aq": s.ledgers_below_aq,
        "ledgers_lost": s.ledgers_lost,
        "entries_below_aq": s.entries_below_aq,
        "entries_lost": s.entries_lost,
        "ledgers_entries_unknown": s.ledgers_entries_unknown,
        "writers_blocked": s.writers_blocked,
        "topics": sorted(s.topics),
        "topics_lost": sorted(s.topics_lost),
        "executor": executor,
    }


def run_blastradius(args: argparse.Namespace, spark: Any = None) -> int:
    """Entry point (``bkaudit blastradius``): 0 written, 2 on error, 3 written but incomplete
    (ledgers unreadable or missed by the scan: the counts are a lower bound).
    ``--executor`` picks in-process or Spark as the audit does (:mod:`jobs.runs.executor`); a
    caller that hands in a SparkSession gets Spark under ``auto``."""

    session = open_command_store(
        "blastradius", args, spark=spark, writes=True, session_timeout=args.zk_session_timeout
    )
    if session is None:
        return ExitStatus.OPERATOR_ERROR
    with session, SessionGuard(session) as guard:
        return _run_with(args, spark, session, guard)


def _run_with(
    args: argparse.Namespace, spark: Any, session: MetadataStore, guard: SessionGuard
) -> ExitStatus:
    from jobs.runs.executor import LocalTooBigError, choose_executor, limits_from_args
    from jobs.tables import delta
    from jobs.tables.runs import new_run_id

    started = datetime.now(timezone.utc)
    run_id = args.run_id or new_run_id(started)
    requested = args.executor
    if spark is not None and requested == Executor.AUTO:
        requested = Executor.SPARK
    try:
        plan = ScanPlan.read(session, args.ledgers_root)
        choice = choose_executor(
            requested,
            ledgers=plan.expected,
            work_bytes=0,
            limits=limits_from_args(args),
            what="blastradius",
        )
        log.info("blastradius: executor %s (%s)", choice.executor, choice.reason)
        delta.check_writable(args.warehouse, (BLAST_RADIUS,))
        has_findings = not args.no_findings and delta.table_exists(args.warehouse, "audit_runs")
        if choice.executor == Executor.LOCAL:
            state = load_state(
                session,
                root=args.ledgers_root,
                warehouse=args.warehouse if has_findings else None,
                racks_znode=args.racks_znode,
            )
            scopes = blast_rows(state, args.min_racks, _processes())
            audit_run_id, coverage = state.audit_run_id, state.coverage
        else:
            scopes, audit_run_id, coverage = _spark_scopes(args, spark, session, plan, has_findings)
        rows = [scope_row(s, run_id, started, audit_run_id, choice.executor) for s in scopes]
        guard.check("the metadata scan")  # no figures from a read across an expired session
        delta.append_rows(args.warehouse, BLAST_RADIUS, rows)
    except (LocalTooBigError, UsageError) as exc:
        print(f"blastradius: {exc}", file=sys.stderr)
        return ExitStatus.OPERATOR_ERROR
    except Exception as exc:  # a table, or the store failing under the run (then 3)
        log.debug("blastradius failed", exc_info=True)
        print(f"blastradius: {one_line(exc)}", file=sys.stderr)
        return for_error(exc)
    worst = [r for r in rows if r["entries_lost"] or r["ledgers_below_aq"]]
    print(
        f"blastradius {run_id}: {sum(r['scope'] == Scope.BOOKIE for r in rows)} bookies, "
        f"{sum(r['scope'] == Scope.RACK for r in rows)} racks, {len(worst)} with ledgers below "
        f"AQ -> {args.warehouse}/{BLAST_RADIUS} [{choice.executor}]; missing replicas from "
        f"{audit_used(audit_run_id)}"
    )
    if not coverage.complete:
        # Fail closed: an unread ledger may name any bookie, so no row here is an upper bound.
        for gap in coverage.notes():
            log.warning("blastradius %s: %s", run_id, gap)
            print(f"blastradius: INCOMPLETE: {gap}; the figures are a lower bound", file=sys.stderr)
        return ExitStatus.INCOMPLETE
    return ExitStatus.OK


def _spark_scopes(
    args: argparse.Namespace,
    spark: Any,
    session: MetadataStore,
    plan: ScanPlan,
    has_findings: bool,
) -> tuple[list[Any], str | None, ScanCoverage]:
    """The Spark path's scopes: the driver reads the racks and findings (small), the tasks
    scan the metadata and compute (:mod:`jobs.spark.blast_radius`)."""
    from jobs.spark.blast_radius import spark_blast_radius
    from jobs.spark.session import build_spark

    _, racks = read_cluster(session, args.ledgers_root, args.racks_znode, False)
    missing: Findings = {}
    audit_run_id = None
    if has_findings:
        missing, audit_run_id = findings_missing(args.warehouse)
    spark = spark or build_spark(
        "bkaudit-blastradius", master=args.master, warehouse=args.warehouse
    )
    scopes, coverage = spark_blast_radius(
        spark,
        session,
        args.zk,
        root=args.ledgers_root,
        auth=args.zk_auth,
        racks=racks,
        missing=missing,
        min_racks=args.min_racks,
        plan=plan,
    )
    return scopes, audit_run_id, coverage
