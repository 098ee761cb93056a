"""``bkaudit status``: one screen of cluster state, where an operator looks first.

    bkaudit status --zk HOST:PORT[/chroot] [--warehouse PATH] [--format text|json]

Every registered bookie is asked for its disk info (GET_BOOKIE_INFO, v3) within
``--probe-timeout``: one that accepts the connection and never answers is ``unreachable``, not
writable. Bookie states use :class:`bklib.states.BookieState`'s words, as the audit's tables do.
An under-replication mark that cannot be decoded is counted and named: what it marks is
unknown, so the run is incomplete (exit 3), never clean.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from bklib.audit.checks import replication_names
from bklib.errors import BKError, CorruptMetadataError
from bklib.meta.stores import MetadataStore
from bklib.meta.stores.session_guard import SessionGuard
from bklib.states import BookieState, RunStatus
from bklib.tls import TlsSettings
from jobs.options.units import parse_duration
from jobs.runtime.exit_status import ExitStatus, for_error, worst
from jobs.runtime.messages import one_line
from jobs.runtime.startup import open_command_store

__all__ = [
    "BookieAnswer",
    "ClusterStatus",
    "add_status_arguments",
    "bookie_states",
    "cluster_status",
    "run_status",
]

log = logging.getLogger("jobs.commands.status")

PROBE_THREADS = 16
"""Bookies asked at once; a cluster of hundreds still answers within a few timeouts."""


def add_status_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    from jobs.commands.watch import add_cluster_arguments
    from jobs.options.zookeeper import add_connection_arguments

    add_cluster_arguments(parser)
    parser.add_argument(
        "--warehouse", default=None, help="Delta tables: adds the age of each check's last audit"
    )
    parser.add_argument("--format", choices=["text", "json"], default="text")
    parser.add_argument(
        "--probe-timeout",
        type=parse_duration,
        default=5.0,
        help="how long each registered bookie has to answer (connect and GET_BOOKIE_INFO); "
        "one that does not is unreachable (default 5s)",
    )
    return add_connection_arguments(parser)


@dataclass(frozen=True)
class BookieAnswer:
    """A registered bookie's answer to the probe: seconds it took, or why there was none."""

    seconds: float | None
    error: str | None = None

    @property
    def answered(self) -> bool:
        return self.error is None


def bookie_states(
    writable: set[str],
    readonly: set[str],
    cookies: set[str],
    marked: set[str],
    answers: dict[str, BookieAnswer],
) -> dict[str, list[str]]:
    """Each bookie's one state (:class:`~bklib.states.BookieState`): registered and answering
    (writable, readonly), registered and silent (unreachable), or not registered though it has a
    cookie or a mark names it (lost). A registered bookie with no answer recorded is unreachable:
    unknown is never writable."""
    states: dict[str, list[str]] = {s: [] for s in BookieState.STATUS}
    for bookie in sorted(writable | readonly):
        answer = answers.get(bookie)
        if answer is None or not answer.answered:
            states[BookieState.UNREACHABLE].append(bookie)
        elif bookie in readonly:
            states[BookieState.READONLY].append(bookie)
        else:
            states[BookieState.WRITABLE].append(bookie)
    states[BookieState.LOST] = sorted((cookies | marked) - writable - readonly)
    return states


@dataclass
class ClusterStatus:
    """Everything ``status`` prints (:meth:`as_dict` is the JSON form)."""

    states: dict[str, list[str]]
    answers: dict[str, BookieAnswer]
    marked_ledgers: int
    locked_ledgers: int
    marked_by_bookie: dict[str, int]
    unreadable_marks: list[str]
    watch_leader: dict[str, Any] | None
    watch_instances: int
    watch_election: str
    metadata_driver: str
    java_auditor: str | None
    java_auditor_key: str
    autorecovery_enabled: bool
    lost_bookie_recovery_delay: int | None
    last_audits: dict[str, Any] | None = field(default=None)

    def exit_status(self) -> ExitStatus:
        """3 when a mark could not be read; 1 when anything needs attention (marks, a lost or
        unreachable bookie); else 0."""
        attention = bool(
            self.marked_ledgers
            or self.states[BookieState.LOST]
            or self.states[BookieState.UNREACHABLE]
        )
        return worst(
            ExitStatus.INCOMPLETE if self.unreadable_marks else ExitStatus.OK,
            ExitStatus.FINDINGS if attention else ExitStatus.OK,
        )

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {s: list(b) for s, b in self.states.items()}
        out["bookie_answers"] = {
            b: {"seconds": a.seconds, "error": a.error} for b, a in sorted(self.answers.items())
        }
        for name in (
            "marked_ledgers",
            "locked_ledgers",
            "marked_by_bookie",
            "unreadable_marks",
            "watch_leader",
            "watch_instances",
            "watch_election",
            "metadata_driver",
            "java_auditor",
            "java_auditor_key",
            "autorecovery_enabled",
            "lost_bookie_recovery_delay",
            "last_audits",
        ):
            out[name] = getattr(self, name)
        return out


def probe_bookies(
    session: MetadataStore,
    root: str,
    bookies: list[str],
    timeout: float,
    tls: TlsSettings | None,
) -> dict[str, BookieAnswer]:
    """Ask each bookie for its disk info over the session's registrations."""
    from bklib.client.operations import run_client_config
    from bklib.client.pool import SyncBookieClient

    config = run_client_config(read_timeout=timeout, connect_timeout=timeout, tls=tls)
    client = SyncBookieClient(session, ledgers_root=root, config=config)

    def ask(bookie: str) -> BookieAnswer:
        started = time.monotonic()
        try:
            client.bookie_info(bookie, timeout=timeout)
        except (BKError, OSError) as exc:  # refused, timed out, TLS refused: no answer
            log.info("bookie %s: no answer to the status probe: %s", bookie, one_line(exc))
            return BookieAnswer(None, one_line(exc))
        return BookieAnswer(round(time.monotonic() - started, 3))

    pool = ThreadPoolExecutor(min(PROBE_THREADS, max(1, len(bookies))))
    try:
        return dict(zip(bookies, pool.map(ask, bookies), strict=True))
    finally:
        # The client first: on Ctrl-C its outstanding probes fail at once (ClientClosedError)
        # instead of holding the exit until a silent bookie's --probe-timeout.
        client.close()
        pool.shutdown()


def _marks(session: MetadataStore, root: str) -> tuple[list[Any], list[str]]:
    """Readable under-replication marks, and the keys of the ones that do not decode."""
    from bklib.meta.underreplication import UnderReplicationManager

    unreadable: list[str] = []

    def note(key: str, exc: CorruptMetadataError) -> None:
        log.warning("under-replication mark %s cannot be decoded: %s", key, exc)
        unreadable.append(key)

    marks = list(UnderReplicationManager(session, root).list_underreplicated(on_unreadable=note))
    return marks, unreadable


def cluster_status(args: argparse.Namespace, session: MetadataStore) -> ClusterStatus:
    """Read the cluster through ``session`` (and the warehouse, if given)."""
    from bklib.audit.engine import require_cluster
    from bklib.meta import paths
    from bklib.meta.registration import list_bookies
    from bklib.meta.stores import KeyNotFound
    from bklib.meta.underreplication import UnderReplicationManager
    from jobs.watch.election import election_path, read_leader
    from jobs.watch.watcher import auditor_key, java_auditor

    root = args.ledgers_root
    cluster = require_cluster(session, root)
    reg = list_bookies(session, root)
    try:
        cookies = set(session.children(paths.join(root, "cookies")))
    except KeyNotFound:
        cookies = set()
    marks, unreadable = _marks(session, root)
    marked_by_bookie: dict[str, int] = {}
    for m in marks:
        for b in m.missing_replicas:
            marked_by_bookie[b] = marked_by_bookie.get(b, 0) + 1
    registered = sorted(reg.all())
    answers = probe_bookies(
        session, root, registered, args.probe_timeout, getattr(args, "bookie_tls", None)
    )
    urm = UnderReplicationManager(session, root)
    leader, members = read_leader(session, root)
    return ClusterStatus(
        states=bookie_states(
            set(reg.writable), set(reg.readonly), cookies, set(marked_by_bookie), answers
        ),
        answers=answers,
        marked_ledgers=len(marks),
        locked_ledgers=sum(1 for m in marks if m.lock_holder),
        marked_by_bookie=marked_by_bookie,
        unreadable_marks=unreadable,
        watch_leader=leader,
        watch_instances=members,
        watch_election=election_path(root),
        metadata_driver=cluster.driver.value,
        java_auditor=java_auditor(session, root),
        java_auditor_key=auditor_key(root, cluster.driver),
        autorecovery_enabled=urm.is_replication_enabled(),
        lost_bookie_recovery_delay=urm.get_lost_bookie_recovery_delay(),
        last_audits=_last_audits(args.warehouse) if args.warehouse else None,
    )


def _last_audits(warehouse: str) -> dict[str, Any]:
    """Each check's latest finished run (None: never run), with its status and age."""
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


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit} ago"
    return f"{seconds:.0f}s ago"


_STATE_NOTES = {
    BookieState.WRITABLE: "registered, answering",
    BookieState.READONLY: "registered read-only, answering",
    BookieState.UNREACHABLE: "registered, no answer",
    BookieState.LOST: "not registered: a cookie or a mark names it",
}


def format_status(st: ClusterStatus) -> str:
    """The text form of ``status``."""
    lines = ["bookies: " + ", ".join(f"{len(st.states[s])} {s}" for s in BookieState.STATUS)]
    for state in BookieState.STATUS:
        for b in st.states[state]:
            answer = st.answers.get(b)
            detail = _STATE_NOTES[state]
            if answer is not None and answer.error:
                detail += f": {answer.error}"
            elif answer is not None:
                detail += f" in {answer.seconds * 1000:.0f} ms" if answer.seconds else ""
            lines.append(f"  {state:<11} {b}  ({detail})")
    marks = f"under-replicated ledgers (marks): {st.marked_ledgers}"
    if st.locked_ledgers:
        marks += f", {st.locked_ledgers} being repaired (locked)"
    lines.append(marks)
    if st.unreadable_marks:
        lines.append(
            f"INCOMPLETE: {len(st.unreadable_marks)} marks cannot be decoded (what they mark is "
            "unknown): " + ", ".join(st.unreadable_marks[:10])
        )
    for b, n in sorted(st.marked_by_bookie.items()):
        lines.append(f"  missing {b}: {n} ledgers")
    leader = st.watch_leader
    if leader:
        lines.append(
            f"watch leader: {leader.get('id')} (pid {leader.get('pid')}, warehouse "
            f"{leader.get('warehouse')}, since {leader.get('since')}); "
            f"{st.watch_instances} instance(s)"
        )
    else:
        lines.append(f"watch leader: none (no instance in {st.watch_election})")
    lines.append(
        f"java auditor: {st.java_auditor or 'none elected'} ({st.java_auditor_key}; "
        f"{st.metadata_driver} metadata driver)"
    )
    delay = st.lost_bookie_recovery_delay
    lines.append(
        "autorecovery: "
        + ("enabled" if st.autorecovery_enabled else "DISABLED (underreplication/disable)")
        + "; lostBookieRecoveryDelay: "
        + (f"{delay}s" if delay is not None else "not set (0)")
    )
    if st.last_audits is not None:
        parts = [
            f"{check} {_age(r['age_seconds'])} ({r['status']})" if r else f"{check} never"
            for check, r in st.last_audits.items()
        ]
        lines.append("last audits: " + ", ".join(parts))
    return "\n".join(lines)


def run_status(args: argparse.Namespace) -> int:
    """``bkaudit status``: print the screen, exit by :meth:`ClusterStatus.exit_status`."""
    session = open_command_store("status", args)
    if session is None:
        return ExitStatus.OPERATOR_ERROR
    try:
        with session, SessionGuard(session) as guard:
            st = cluster_status(args, session)
            guard.check("the status read")
    except Exception as exc:  # no cluster, an expired session, an unreadable table: one line
        log.debug("status failed", exc_info=True)
        print(f"status: {one_line(exc)}", file=sys.stderr)
        return for_error(exc)
    if args.format == "json":
        print(json.dumps(st.as_dict(), indent=2, sort_keys=True))
    else:
        print(format_status(st))
    return st.exit_status()
