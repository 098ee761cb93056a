"""What every audit run shares, whichever executor runs it: its configuration, its status and
its summary line."""

from __future__ import annotations

import argparse
import logging
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from bklib.audit.checker import CheckSettings
from bklib.audit.checks import DEFAULT_CHECK
from bklib.audit.placement import PlacementRule
from bklib.client.pool import DEFAULT_BOOKIE_PROTOCOL
from bklib.meta.racks import RackDocument
from bklib.meta.scan import DEFAULT_MAX_IN_FLIGHT
from bklib.meta.stores.zookeeper.bulk import DEFAULT_SESSION_TIMEOUT
from bklib.meta.stores.zookeeper.security import ZkAuth
from bklib.states import DEFAULT_LEDGERS_ROOT, BookieState, CountKey, RunStatus
from bklib.tls import TlsSettings
from jobs.options.placement import rule_from_args
from jobs.runs.placement import placement_note
from jobs.runtime import interrupts
from jobs.runtime.messages import one_line

__all__ = ["AuditConfig", "log_metadata", "record_interrupted", "summary_line"]

DEFAULT_LEDGERS_PER_TASK = 50_000
"""Target ledgers per Spark metadata-scan task: big enough to amortise a ZooKeeper session."""


DEFAULT_READ_RATE = 100e6
"""Bytes/s one audit task (or the watch's scheduled audits) reads from one bookie unless
``--read-rate`` says otherwise (:class:`bklib.audit.checker.CheckSettings`)."""


@dataclass
class AuditConfig:
    """Everything one audit run needs (built from the command line by :meth:`from_args`)."""

    zk: str
    warehouse: str
    check: str = DEFAULT_CHECK
    ledgers_root: str = DEFAULT_LEDGERS_ROOT
    zk_auth: ZkAuth = None
    zk_session_timeout: float = DEFAULT_SESSION_TIMEOUT
    scan_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    ledgers_per_task: int = DEFAULT_LEDGERS_PER_TASK
    fetch: CheckSettings = field(default_factory=CheckSettings)
    reread: bool = True
    run_id: str | None = None
    placement: str = "off"
    """``--placement`` auto / on / off (jobs.runs.placement); the pass runs when
    ``rack_document`` is set."""
    racks_znode: str = "/bookies"
    racks_file: str | None = None
    placement_rule: PlacementRule = field(default_factory=PlacementRule)
    rack_document: RackDocument | None = None
    tls: TlsSettings | None = None
    """Bookie TLS (``--tls-*`` flags); picklable, so executors' clients use it too
    (:func:`bklib.audit.engine.bookie_client_config`)."""

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> AuditConfig:
        """Build from arguments parsed by a parser :func:`add_audit_arguments` filled."""
        return cls(
            zk=args.zk,
            warehouse=args.warehouse,
            check=args.check,
            ledgers_root=args.ledgers_root,
            zk_auth=args.zk_auth,
            zk_session_timeout=getattr(args, "zk_session_timeout", DEFAULT_SESSION_TIMEOUT),
            scan_in_flight=args.scan_in_flight,
            ledgers_per_task=args.ledgers_per_task,
            fetch=CheckSettings(
                read_timeout=args.read_timeout,
                connect_timeout=args.connect_timeout,
                ledgers_in_flight=args.ledgers_in_flight,
                reads_in_flight=args.reads_in_flight,
                read_rate=getattr(args, "read_rate", None),
                verify_percentage=getattr(args, "verify_percentage", 0.0),
                bookie_protocol=getattr(args, "bookie_protocol", DEFAULT_BOOKIE_PROTOCOL),
            ),
            reread=not args.no_reread,
            run_id=args.run_id,
            placement=getattr(args, "placement", "off"),
            racks_znode=getattr(args, "racks_znode", "/bookies"),
            racks_file=getattr(args, "racks_file", None),
            placement_rule=rule_from_args(args),
            tls=getattr(args, "bookie_tls", None),
        )


def summary_line(run_id: str, status: str, counts: Mapping[str, int], executor: str) -> str:
    """The one line ``bkaudit audit`` prints."""
    c = counts
    return (
        f"audit {run_id} {status}: {c.get(CountKey.LEDGERS, 0)} ledgers, "
        f"{c.get(CountKey.UNDERREPLICATED_LEDGERS, 0)} under-replicated, "
        f"{c.get(CountKey.FRAGMENTS, 0)} fragments, {c.get(CountKey.MISSING_ENTRIES, 0)} missing "
        f"entries, {c.get(CountKey.METADATA_ERRORS, 0)} unreadable znodes"
        + (
            f", {c[CountKey.LEDGERS_UNACCOUNTED]} ledgers unaccounted for"
            if c.get(CountKey.LEDGERS_UNACCOUNTED)
            else ""
        )
        + placement_note(c)
        + f" [{executor}]"
    )


def log_metadata(counts: Mapping[str, int], seconds: float) -> None:
    """The line the metadata step ends with: ledgers read, and the bookies' states."""
    logging.getLogger("jobs.commands.audit").info(
        "metadata: %d ledgers (%d not closed, %d unreadable znodes); bookies: %d writable, "
        "%d readonly, %d lost; %.1fs",
        counts.get(CountKey.LEDGERS, 0),
        counts.get(CountKey.LEDGERS_NOT_CLOSED, 0),
        counts.get(CountKey.METADATA_ERRORS, 0),
        counts.get(CountKey.bookies(BookieState.WRITABLE), 0),
        counts.get(CountKey.bookies(BookieState.READONLY), 0),
        counts.get(CountKey.bookies(BookieState.LOST), 0),
        seconds,
    )


def record_interrupted(run: Any, signum: int, write: Callable[[], object]) -> None:
    """A run stopped by ``signum`` (SIGINT, SIGTERM): its record (a
    :class:`~jobs.tables.runs.RunRecord`) becomes INTERRUPTED, never acted on, and ``write``
    appends it where its executor records runs; the command's one line says which
    (:mod:`jobs.runtime.interrupts`). A record that cannot be written is said too: the run
    then has no ``audit_runs`` row, which no reader takes for a finished run either. A run
    already recorded INTERRUPTED is left alone."""
    if run.status == RunStatus.INTERRUPTED:
        return
    run.status = RunStatus.INTERRUPTED
    run.error = f"interrupted by {signal.Signals(signum).name}"
    run.finished_at = datetime.now(timezone.utc)
    try:
        write()
    except Exception as exc:  # said in the line; the exit is 130 / 143 anyway
        log = logging.getLogger("jobs.commands.audit")
        log.debug("run %s not recorded", run.run_id, exc_info=True)
        interrupts.note(f"run {run.run_id} could not be recorded ({one_line(exc)})")
        return
    interrupts.note(f"run {run.run_id} recorded as {RunStatus.INTERRUPTED}")
