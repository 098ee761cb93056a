"""What every repair run shares, whichever executor runs it: its configuration, the lines it
starts and ends with, and the printed summary."""

from __future__ import annotations

import argparse
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bklib.client.pool import DEFAULT_BOOKIE_PROTOCOL
from bklib.meta.model import DigestType
from bklib.meta.stores.zookeeper.security import ZkAuth
from bklib.repair.worker import RepairSettings
from bklib.states import DEFAULT_LEDGERS_ROOT, ActionKind, ActionStatus, RepairMode
from bklib.tls import TlsSettings
from jobs.runtime import interrupts
from jobs.runtime.exit_status import ExitStatus
from jobs.runtime.interrupts import DEFAULT_STOP_TIMEOUT

__all__ = [
    "RepairConfig",
    "copied_bytes",
    "log_done",
    "log_start",
    "print_summary",
    "stamp",
    "stop_if_signalled",
    "summarize",
]

log = logging.getLogger("jobs.commands.repair")

DEFAULT_LEDGERS_PER_TASK = 200
"""Small Spark tasks: each finished task moves the progress bar and the ETA."""


@dataclass
class RepairConfig:
    """Everything one repair run needs (built from the command line by :meth:`from_args`)."""

    zk: str
    warehouse: str
    mode: str = RepairMode.REREPLICATE
    audit_run_id: str | None = None
    ledgers_root: str = DEFAULT_LEDGERS_ROOT
    zk_auth: ZkAuth = None
    zk_session_timeout: float = 10.0
    settings: RepairSettings = field(default_factory=RepairSettings)
    ledgers_per_task: int = DEFAULT_LEDGERS_PER_TASK
    tasks: int | None = None
    ledgers_in_flight: int = 8
    local_processes: int = 0
    read_timeout: float = 10.0
    bookies: tuple[str, ...] = ()
    run_id: str | None = None
    racks_znode: str = "/bookies"
    racks_file: str | None = None
    """Racks for plain BookKeeper (``--racks-file``), used instead of the znode."""
    fix_placement: bool = False
    """``rereplicate --fix-placement``: only PLACEMENT_VIOLATION findings, moved by
    :mod:`bklib.repair.placement_fix` under ``settings.placement_rule``."""
    tls: TlsSettings | None = None
    """Bookie TLS (``--tls-*`` flags) of every bookie connection the workers open."""
    stop_timeout: float = DEFAULT_STOP_TIMEOUT
    """After SIGINT or SIGTERM, how long the ledgers in flight may finish (``--stop-timeout``)."""

    @classmethod
    def from_args(cls, args: argparse.Namespace, mode: str) -> RepairConfig:
        """Build from arguments parsed by a parser :func:`add_repair_arguments` filled."""
        bookies = tuple(b for b in (getattr(args, "bookies", "") or "").split(",") if b)
        settings = RepairSettings(
            grace_period=args.grace_period,
            rate=args.rate,
            dry_run=args.dry_run,
            window=args.window,
            bookie_protocol=getattr(args, "bookie_protocol", DEFAULT_BOOKIE_PROTOCOL),
            password=args.password.encode() if args.password is not None else None,
            digest_type=DigestType[args.digest_type] if args.digest_type else None,
            exclude=frozenset(bookies),
            target=getattr(args, "target", None),
            retry_no_replica=args.retry_no_replica,
        )
        fix_placement = bool(getattr(args, "fix_placement", False))
        if fix_placement:
            from jobs.options.placement import rule_from_args

            settings.placement_rule = rule_from_args(args)
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
            local_processes=args.local_processes,
            read_timeout=args.read_timeout,
            bookies=bookies,
            racks_znode=args.racks_znode,
            racks_file=getattr(args, "racks_file", None),
            fix_placement=fix_placement,
            tls=getattr(args, "bookie_tls", None),
            stop_timeout=getattr(args, "stop_timeout", DEFAULT_STOP_TIMEOUT),
        )


def log_start(config: RepairConfig, run_id: str, ledgers: int, where: str) -> None:
    """The line a repair run starts with: how much, where, and its safety settings."""
    st = config.settings
    log.info(
        "%s %s: %d ledgers %s%s (audit run %s, grace %gs, rate %s)",
        config.mode,
        run_id,
        ledgers,
        where,
        " [dry run]" if st.dry_run else "",
        config.audit_run_id or "-",
        st.grace_period,
        f"{st.rate:.0f} B/s per worker" if st.rate else "unlimited",
    )


def stamp(
    rows: list[dict[str, Any]], config: RepairConfig, run_id: str, executor: str
) -> list[dict[str, Any]]:
    """Add the run's columns to the repairer's action rows."""
    for r in rows:
        r["run_id"] = run_id
        r["mode"] = config.mode
        r["audit_run_id"] = config.audit_run_id
        r["executor"] = executor
        r.setdefault("topic", None)
    return rows


def log_done(
    config: RepairConfig, run_id: str, rows: Sequence[Mapping[str, Any]], ledgers: int, secs: float
) -> None:
    """The line a repair run ends with: actions, bytes copied and the copy rate."""
    copied = copied_bytes(rows)
    log.info(
        "%s %s: %d actions for %d ledgers in %.1fs (%.1f MB copied, %.1f MB/s)",
        config.mode,
        run_id,
        len(rows),
        ledgers,
        secs,
        copied / 1e6,
        copied / 1e6 / secs if secs > 0 else 0.0,
    )


def stop_if_signalled(
    config: RepairConfig, run_id: str, rows: Sequence[Mapping[str, Any]], ledgers: int
) -> None:
    """After a drained run's rows are written: if a signal stopped it, say how far it got and
    raise :class:`~jobs.runtime.interrupts.Interrupted`."""
    if not interrupts.stop_requested():
        return
    done = len({r["ledger_id"] for r in rows})
    interrupts.note(
        f"{config.mode} {run_id}: the actions of {done} ledgers recorded, "
        f"{ledgers - done} not started; run {config.mode} again"
    )
    interrupts.checkpoint()


def _copied(r: Mapping[str, Any]) -> bool:
    return bool(r["action"] == ActionKind.COPY and r["status"] == ActionStatus.DONE)


def copied_bytes(rows: Sequence[Mapping[str, Any]]) -> int:
    """Bytes the run's finished copies wrote."""
    return sum(int(r["bytes_copied"]) for r in rows if _copied(r))


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Counts for the printed summary: actions by (action, status), ledgers left to do."""
    by = Counter((r["action"], r["status"]) for r in rows)
    pending = sorted({r["ledger_id"] for r in rows if r["status"] not in ActionStatus.FINAL})
    # Repaired: some step was done and nothing is left (a fence may finish the job by itself,
    # an in-place copy needs no metadata update).
    repaired = {r["ledger_id"] for r in rows if r["status"] == ActionStatus.DONE} - set(pending)
    copied = [r for r in rows if _copied(r)]
    return {
        "actions": dict(by),
        "ledgers_repaired": len(repaired),
        "ledgers_pending": pending,
        "entries_copied": sum(r["entries_copied"] for r in copied),
        "bytes_copied": sum(r["bytes_copied"] for r in copied),
        "no_replica": sorted(
            (r["ledger_id"], r["segment_first_entry_id"], tuple(r["no_replica_entries"] or ()))
            for r in rows
            if r["status"] == ActionStatus.NO_REPLICA
        ),
    }


def print_summary(mode: str, run_id: str, rows: Sequence[Mapping[str, Any]]) -> ExitStatus:
    """Print what the run did; returns the exit status (0 done, 1 work left, or a dry run's
    plan has steps the real run would not take)."""
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
        (r["error"] or "").split(":", 1)[0]
        for r in rows
        if r["status"] == ActionStatus.FAILED and r["error"]
    )
    for reason, count in reasons.most_common(5):
        example = next(
            r for r in rows if r["status"] == ActionStatus.FAILED and r["error"].startswith(reason)
        )
        print(f"  FAILED x{count}: {example['error']} (e.g. ledger {example['ledger_id']})")
    # A dry run's steps the real run would not take are PLANNED with their reason
    # (bklib.repair.outcome.as_planned): said so, and the run is not clean.
    blocked = [r for r in rows if r["status"] == ActionStatus.PLANNED and r["error"]]
    for error, count in Counter(r["error"] for r in blocked).most_common(5):
        example = next(r for r in blocked if r["error"] == error)
        print(f"  would not be done x{count}: {error} (e.g. ledger {example['ledger_id']})")
    for lid, seg, entries in s["no_replica"][:20]:
        shown = ", ".join(map(str, entries[:20])) + (" ..." if len(entries) > 20 else "")
        print(f"  NO_REPLICA ledger {lid} segment {seg}: entries {shown or '(earlier run)'}")
    if s["ledgers_pending"]:
        print(f"  ledgers needing another run: {s['ledgers_pending'][:30]}")
    return ExitStatus.FINDINGS if s["ledgers_pending"] or blocked else ExitStatus.OK
