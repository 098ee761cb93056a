"""``bkaudit watch`` and ``bkaudit status``: flags, JSON logs and the status report.

    bkaudit watch --zk HOST:PORT[/chroot] --warehouse PATH [--every lost=1h,sample=24h]
                  [--lost-bookie-recovery-delay 60s] [--metrics-port 9464] [--log-format json]
    bkaudit status --zk HOST:PORT[/chroot] [--warehouse PATH] [--format text|json]

``watch`` runs until SIGTERM (exit 0); 2 when it cannot start, or when rows the warehouse
did not take overflow the spool (``--spool-max-bytes``). ``status`` exits 0 when no
ledger is marked under-replicated and no bookie is down, 1 otherwise, 2 on error.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import TYPE_CHECKING, Any

from bklib.audit.checks import replication_names
from bklib.meta.model import DigestType
from bklib.states import DEFAULT_LEDGERS_ROOT, RunStatus
from jobs.options.bookie_protocol import add_bookie_protocol_argument
from jobs.options.units import parse_duration, parse_percentage, parse_rate, parse_size
from jobs.options.zookeeper import add_session_timeout_argument
from jobs.runs.audit_run import DEFAULT_READ_RATE
from jobs.runtime.exit_status import ExitStatus
from jobs.runtime.messages import one_line
from jobs.watch.spool import DEFAULT_SPOOL_MAX_BYTES

if TYPE_CHECKING:
    from bklib.pulsar.admin import AdminSettings
    from jobs.watch.config import WatchConfig

__all__ = [
    "add_status_arguments",
    "add_watch_arguments",
    "run_status",
    "run_watch",
]

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


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--zk", required=True, help="ZooKeeper connect string, HOST:PORT[/chroot]")
    parser.add_argument(
        "--ledgers-root", default=DEFAULT_LEDGERS_ROOT, help="BookKeeper's ledgers root"
    )
    parser.add_argument("--zk-auth", default=None, help="ZooKeeper digest auth user:password")


def add_watch_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    _common(parser)
    parser.add_argument("--warehouse", required=True, help="directory or URI of the Delta tables")
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
    parser.add_argument("--ledgers-in-flight", type=int, default=8, help="ledgers repaired at once")
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
        help="after SIGTERM, how long the ledgers in flight may finish before the process exits",
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


def add_status_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    _common(parser)
    parser.add_argument(
        "--warehouse", default=None, help="Delta tables: adds the age of each check's last audit"
    )
    parser.add_argument("--format", choices=["text", "json"], default="text")
    from jobs.options.zookeeper import add_connection_arguments

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
        bookie_protocol=args.bookie_protocol,
        read_timeout=args.read_timeout,
        connect_timeout=args.connect_timeout,
        verify_percentage=args.verify_percentage,
        read_rate=args.read_rate,
        password=args.password.encode() if args.password is not None else None,
        digest_type=DigestType[args.digest_type] if args.digest_type else None,
        retry_interval=args.retry_interval,
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


def run_watch(args: argparse.Namespace) -> int:
    from jobs.options.pulsar import admin_settings
    from jobs.watch.loop import WatchService

    if args.log_format == "json":
        use_json_logs()
    try:  # checked before anything starts: a bad token file must not wait for the first repair
        pulsar_admin = admin_settings(args)
    except (ValueError, OSError) as exc:
        print(f"watch: {one_line(exc)}", file=sys.stderr)
        return ExitStatus.OPERATOR_ERROR
    config = watch_config(args, pulsar_admin)
    try:
        service = WatchService(config)
        service.install_signals()
        log.info(
            "watch: %s on %s%s into %s; periodic %s; delay %s",
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


# ---- status -----------------------------------------------------------------------------------


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit} ago"
    return f"{seconds:.0f}s ago"


def cluster_status(args: argparse.Namespace) -> dict[str, Any]:
    """Everything ``status`` prints, as a dict (the JSON form)."""
    from bklib.audit.engine import require_cluster
    from bklib.meta import paths
    from bklib.meta.registration import list_bookies
    from bklib.meta.stores import KeyNotFound, open_store
    from bklib.meta.underreplication import UnderReplicationManager
    from jobs.watch.election import election_path, read_leader
    from jobs.watch.watcher import auditor_key, java_auditor

    root = args.ledgers_root
    zk = open_store(args.zk, auth=args.zk_auth)  # the command's one session
    try:
        cluster = require_cluster(zk, root)
        reg = list_bookies(zk, root)
        try:
            cookies = set(zk.children(paths.join(root, "cookies")))
        except KeyNotFound:
            cookies = set()
        urm = UnderReplicationManager(zk, root)
        marks = list(urm.list_underreplicated())
        leader, members = read_leader(zk, root)
        out: dict[str, Any] = {
            "writable": sorted(reg.writable),
            "readonly": sorted(reg.readonly),
            "down": sorted(cookies - set(reg.all())),
            "marked_ledgers": len(marks),
            "marked_by_bookie": {},
            "locked_ledgers": sum(1 for m in marks if m.lock_holder),
            "watch_leader": leader,
            "watch_instances": members,
            "watch_election": election_path(root),
            "metadata_driver": cluster.driver.value,
            "java_auditor": java_auditor(zk, root),
            "java_auditor_key": auditor_key(root, cluster.driver),
            "autorecovery_enabled": urm.is_replication_enabled(),
            "lost_bookie_recovery_delay": urm.get_lost_bookie_recovery_delay(),
        }
        for m in marks:
            for b in m.missing_replicas:
                out["marked_by_bookie"][b] = out["marked_by_bookie"].get(b, 0) + 1
        # Lost: named by a mark but not registered (no full scan here; `audit --check lost`
        # finds the rest).
        out["lost"] = sorted(set(out["marked_by_bookie"]) - set(reg.all()))
    finally:
        zk.close()
    out["last_audits"] = _last_audits(args.warehouse) if args.warehouse else None
    return out


def _last_audits(warehouse: str) -> dict[str, Any]:
    from jobs.tables import delta
    from jobs.tables.schema import AUDIT_RUNS

    last: dict[str, Any] = {c: None for c in replication_names()}
    if not delta.table_exists(warehouse, AUDIT_RUNS):
        return last
    now = time.time()
    for r in delta.read_rows(
        warehouse, AUDIT_RUNS, columns=["run_id", "check", "status", "finished_at"]
    ):
        if r["status"] not in RunStatus.FINISHED or r["finished_at"] is None:
            continue
        prev = last.get(r["check"])
        ts = r["finished_at"].timestamp()
        if prev is None or ts > prev["finished_at"]:
            last[r["check"]] = {
                "run_id": r["run_id"],
                "status": r["status"],
                "finished_at": ts,
                "age_seconds": round(now - ts, 1),
            }
    return last


def run_status(args: argparse.Namespace) -> int:
    try:
        st = cluster_status(args)
    except Exception as exc:
        log.debug("status failed", exc_info=True)
        print(f"status: {one_line(exc)}", file=sys.stderr)
        return ExitStatus.OPERATOR_ERROR
    attention = bool(st["marked_ledgers"] or st["down"] or st["lost"])
    if args.format == "json":
        print(json.dumps(st, indent=2, sort_keys=True))
        return ExitStatus.FINDINGS if attention else ExitStatus.OK
    print(
        f"bookies: {len(st['writable'])} writable, {len(st['readonly'])} readonly, "
        f"{len(st['down'])} down (cookie, not registered), {len(st['lost'])} lost (marked, "
        "not registered)"
    )
    for state in ("writable", "readonly", "down", "lost"):
        for b in st[state]:
            print(f"  {state:<9} {b}")
    print(
        f"under-replicated ledgers (marks): {st['marked_ledgers']}"
        + (f", {st['locked_ledgers']} being repaired (locked)" if st["locked_ledgers"] else "")
    )
    for b, n in sorted(st["marked_by_bookie"].items()):
        print(f"  missing {b}: {n} ledgers")
    leader = st["watch_leader"]
    if leader:
        print(
            f"watch leader: {leader.get('id')} (pid {leader.get('pid')}, warehouse "
            f"{leader.get('warehouse')}, since {leader.get('since')}); "
            f"{st['watch_instances']} instance(s)"
        )
    else:
        print(f"watch leader: none (no instance in {st['watch_election']})")
    print(
        f"java auditor: {st['java_auditor'] or 'none elected'} ({st['java_auditor_key']}; "
        f"{st['metadata_driver']} metadata driver)"
    )
    print(
        "autorecovery: "
        + ("enabled" if st["autorecovery_enabled"] else "DISABLED (underreplication/disable)")
        + "; lostBookieRecoveryDelay: "
        + (
            f"{st['lost_bookie_recovery_delay']}s"
            if st["lost_bookie_recovery_delay"] is not None
            else "not set (0)"
        )
    )
    if st["last_audits"] is not None:
        parts = [
            f"{check} {_age(r['age_seconds'])} ({r['status']})" if r else f"{check} never"
            for check, r in st["last_audits"].items()
        ]
        print("last audits: " + ", ".join(parts))
    return ExitStatus.FINDINGS if attention else ExitStatus.OK
