"""``bkaudit watch``: flags, JSON logs, and the service's start.

    bkaudit watch --zk HOST:PORT[/chroot] --warehouse PATH [--every lost=1h,sample=24h]
                  [--lost-bookie-recovery-delay 60s] [--metrics-port 9464] [--log-format json]

``watch`` runs until SIGTERM (exit 0); 2 when it cannot start, or when rows the warehouse
did not take overflow the spool (``--spool-max-bytes``). ``bkaudit status`` is
:mod:`jobs.commands.status`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING

from bklib.audit.index_keeper import DEFAULT_BARRIER_TIMEOUT
from bklib.meta.model import DigestType
from bklib.states import DEFAULT_LEDGERS_ROOT
from jobs.options.bookie_protocol import add_bookie_protocol_argument
from jobs.options.units import (
    parse_count,
    parse_duration,
    parse_percentage,
    parse_rate,
    parse_size,
)
from jobs.options.warehouse import WAREHOUSE_HELP
from jobs.options.zookeeper import add_session_timeout_argument
from jobs.runs.audit_run import DEFAULT_READ_RATE
from jobs.runtime.exit_status import ExitStatus
from jobs.runtime.messages import one_line
from jobs.tables.object_store import is_s3, set_retry_budget
from jobs.tables.warehouse_probe import WarehouseUnreachable, WarehouseUnusable, probe_warehouse
from jobs.watch.first_ledgers import FIRST_LEDGERS
from jobs.watch.repair_workers import MIN_LEDGERS_PER_PROCESS
from jobs.watch.spool import DEFAULT_SPOOL_MAX_BYTES

if TYPE_CHECKING:
    from bklib.pulsar.admin import AdminSettings
    from jobs.watch.config import WatchConfig

__all__ = ["add_cluster_arguments", "add_watch_arguments", "run_watch"]

log = logging.getLogger("jobs.watch")

DEFAULT_EVERY = "lost=24h,sample=168h"
"""BookKeeper's defaults: auditorPeriodicBookieCheckInterval 1 day, auditorPeriodicCheckInterval
1 week."""


def _every(text: str) -> dict[str, float]:
    from jobs.watch.decide import parse_every

    try:
        return parse_every(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _size(text: str) -> int:
    """``--spool-max-bytes``: bytes, with an optional KB/MB/GB suffix."""
    value = int(parse_size(text))
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be above 0")
    return value


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--zk", required=True, help="ZooKeeper connect string, HOST:PORT[/chroot]")
    parser.add_argument(
        "--ledgers-root", default=DEFAULT_LEDGERS_ROOT, help="BookKeeper's ledgers root"
    )
    parser.add_argument("--zk-auth", default=None, help="ZooKeeper digest auth user:password")


def add_watch_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    add_cluster_arguments(parser)
    parser.add_argument("--warehouse", required=True, help=WAREHOUSE_HELP)
    parser.add_argument(
        "--spool-dir",
        default=None,
        help="where rows the warehouse cannot take wait, written later in order (default "
        "$XDG_STATE_HOME or ~/.local/state, then bkaudit/watch-spool/<hash of --warehouse>)",
    )
    parser.add_argument(
        "--spool-max-bytes",
        type=_size,
        default=DEFAULT_SPOOL_MAX_BYTES,
        help="above this the service stops with exit 2 rather than drop rows (default 512MiB)",
    )
    parser.add_argument(
        "--every",
        type=_every,
        default=_every(DEFAULT_EVERY),
        help=f"periodic audits, CHECK=DURATION[,...] or off (default {DEFAULT_EVERY}, "
        "BookKeeper's bookie-check and checkAllLedgers intervals)",
    )
    parser.add_argument(
        "--lost-bookie-recovery-delay",
        type=parse_duration,
        default=None,
        help="wait this long before repairing a single lost bookie (default: BookKeeper's "
        "underreplication/lostBookieRecoveryDelay znode, else 0)",
    )
    add_session_timeout_argument(
        parser, default=10.0, effect="how soon a killed leader is replaced and its locks are freed"
    )
    parser.add_argument(
        "--grace-period",
        type=parse_duration,
        default=30.0,
        help="an open ledger's finding must be this old before the ledger is fenced and closed "
        "(BookKeeper's openLedgerRereplicationGracePeriod)",
    )
    parser.add_argument(
        "--rate", type=parse_rate, default=50e6, help="bytes/s the repair may copy (0: unlimited)"
    )
    parser.add_argument("--window", type=int, default=64, help="entries in flight per copy")
    parser.add_argument(
        "--ledgers-in-flight", type=int, default=8, help="ledgers repaired at once per process"
    )
    parser.add_argument(
        "--first-ledgers",
        type=parse_count,
        default=FIRST_LEDGERS,
        help="closed ledgers of a new loss marked and repaired at once, while its audit reads "
        "the others (0: none; the audit's repair takes them all)",
    )
    parser.add_argument(
        "--repair-processes",
        type=parse_count,
        default=0,
        help="processes a repair runs in, the watch's own included, each with its own "
        f"session and its share of --rate (0: one per core once each share has "
        f"{MIN_LEDGERS_PER_PROCESS} ledgers)",
    )
    add_bookie_protocol_argument(
        parser, what="the scheduled audits' entry reads and the repairs' copies"
    )
    parser.add_argument(
        "--read-timeout", type=parse_duration, default=10.0, help="bookie read timeout"
    )
    parser.add_argument(
        "--connect-timeout", type=parse_duration, default=5.0, help="bookie connect timeout"
    )
    parser.add_argument(
        "--verify-percentage",
        type=parse_percentage,
        default=0.0,
        help="scheduled sample check: percent of each fragment read besides its ends",
    )
    parser.add_argument(
        "--read-rate",
        type=parse_rate,
        default=DEFAULT_READ_RATE,
        help="bytes/s the scheduled audits read from one bookie (0: unlimited; default 100MB)",
    )
    parser.add_argument(
        "--password", default=None, help="ledger password for metadata that stores none (v2)"
    )
    parser.add_argument(
        "--digest-type",
        choices=[d.name for d in DigestType],
        default=None,
        help="digest type for metadata that stores none",
    )
    parser.add_argument(
        "--retry-interval",
        type=parse_duration,
        default=5.0,
        help="how soon unfinished repairs (grace period, locked, failed) are tried again",
    )
    parser.add_argument(
        "--index-barrier-timeout",
        type=parse_duration,
        default=DEFAULT_BARRIER_TIMEOUT,
        help="how long the store may take to confirm the bookie index has every change before "
        "a loss; past it the loss is answered by a full scan, which rebuilds the index",
    )
    parser.add_argument(
        "--max-failed-cycles",
        type=int,
        default=5,
        help="/healthz fails after this many leader cycles in a row raised (0: never)",
    )
    parser.add_argument(
        "--poll-interval",
        type=parse_duration,
        default=2.0,
        help="backstop re-read of the cluster; registration changes wake the loop at once",
    )
    parser.add_argument(
        "--stop-timeout",
        type=parse_duration,
        default=30.0,
        help="after SIGTERM or SIGINT, how long the ledgers in flight may finish before the "
        "process exits",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve /metrics, /healthz and /readyz on this port (0: any free port; default: off)",
    )
    parser.add_argument("--metrics-host", default="0.0.0.0", help="address of the metrics server")
    parser.add_argument(
        "--instance-id", default=None, help="name in the election (default hostname:pid)"
    )
    parser.add_argument(
        "--log-format", choices=["text", "json"], default="text", help="log lines as text or JSON"
    )
    from jobs.options.pulsar import add_pulsar_admin_arguments
    from jobs.options.zookeeper import add_connection_arguments

    add_pulsar_admin_arguments(parser)
    return add_connection_arguments(parser)


# ---- logs -----------------------------------------------------------------------------------


def use_json_logs() -> None:
    """Every root handler writes one JSON object per line
    (:class:`jobs.runtime.logs.JsonFormatter`)."""
    from jobs.runtime.logs import JsonFormatter

    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(logging.StreamHandler())
    for h in root.handlers:
        h.setFormatter(JsonFormatter())


# ---- watch ------------------------------------------------------------------------------------


def watch_config(args: argparse.Namespace, pulsar_admin: AdminSettings | None) -> WatchConfig:
    """The service's configuration from the parsed flags (:func:`add_watch_arguments`)."""
    from jobs.watch.config import WatchConfig

    config = WatchConfig(
        zk=args.zk,
        warehouse=args.warehouse,
        ledgers_root=args.ledgers_root,
        zk_auth=args.zk_auth,
        zk_session_timeout=args.zk_session_timeout,
        delay_override=args.lost_bookie_recovery_delay,
        every=args.every,
        grace_period=args.grace_period,
        rate=args.rate,
        window=args.window,
        ledgers_in_flight=args.ledgers_in_flight,
        repair_processes=args.repair_processes,
        first_ledgers=args.first_ledgers,
        bookie_protocol=args.bookie_protocol,
        read_timeout=args.read_timeout,
        connect_timeout=args.connect_timeout,
        verify_percentage=args.verify_percentage,
        read_rate=args.read_rate,
        password=args.password.encode() if args.password is not None else None,
        digest_type=DigestType[args.digest_type] if args.digest_type else None,
        retry_interval=args.retry_interval,
        index_barrier_timeout=args.index_barrier_timeout,
        poll_interval=args.poll_interval,
        max_failed_cycles=args.max_failed_cycles,
        stop_timeout=args.stop_timeout,
        metrics_host=args.metrics_host,
        metrics_port=args.metrics_port,
        tls=getattr(args, "bookie_tls", None),
        spool_dir=args.spool_dir,
        spool_max_bytes=args.spool_max_bytes,
        pulsar_admin=pulsar_admin,
        unload_rate=args.unload_rate,
    )
    if args.instance_id:
        config.instance_id = args.instance_id
    return config


WATCH_S3_RETRY_BUDGET = 10.0
"""Seconds the watch's delta-rs retries one S3 request before spooling the rows."""


def _check_warehouse(warehouse: str) -> None:
    """Refuse an S3 warehouse the watch could never write (a missing bucket, credentials
    refused or without permission, a store ignoring conditional creates); one that does not
    answer is an outage, ridden out by spooling rows (docs/watch.md, "Unreachable
    warehouse"), so it does not stop the repairs. The watch's S3 requests give up sooner
    than a one-shot command's, for the same reason."""
    if not is_s3(warehouse):
        return
    set_retry_budget(WATCH_S3_RETRY_BUDGET)
    try:
        probe_warehouse(warehouse)
    except WarehouseUnreachable as exc:
        log.warning("watch: %s; rows will be spooled until it answers", exc)


def run_watch(args: argparse.Namespace) -> int:
    from bklib.version import __version__
    from jobs.options.pulsar import admin_settings
    from jobs.watch.loop import WatchService

    if args.log_format == "json":
        use_json_logs()
    try:  # checked before anything starts: a bad token file must not wait for the first repair
        pulsar_admin = admin_settings(args)
        _check_warehouse(args.warehouse)
    except (ValueError, OSError, WarehouseUnusable) as exc:
        print(f"watch: {one_line(exc)}", file=sys.stderr)
        return ExitStatus.OPERATOR_ERROR
    config = watch_config(args, pulsar_admin)
    try:
        service = WatchService(config)
        log.info(
            "watch: bkaudit %s, %s on %s%s into %s; periodic %s; delay %s",
            __version__,
            config.instance_id,
            config.zk,
            config.ledgers_root,
            config.warehouse,
            ", ".join(f"{c} every {s:g}s" for c, s in config.every.items()) or "off",
            "znode" if config.delay_override is None else f"{config.delay_override:g}s",
        )
        return service.run()
    except Exception as exc:
        log.debug("watch failed", exc_info=True)
        print(f"watch: {one_line(exc)}", file=sys.stderr)
        return ExitStatus.OPERATOR_ERROR
