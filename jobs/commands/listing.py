"""``bkaudit listunderreplicated``: print the latest audit report, like BookKeeper's shell.

BookKeeper's ``listunderreplicated`` prints one ledger id per line and, with
``-printmissingreplica``, a ``MissingReplica : <bookie>`` line under it per bookie. This
prints the same shape from the Delta tables, with each fragment's range, reason, missing
entry count and severity, and what repairs did to it since the audit (from
``replication_actions``): a report never looks current when a later repair changed it.
``--live`` lists BookKeeper's under-replication marks in ZooKeeper instead, as Java's command
does. Exit status: 0 when nothing is left unrepaired, 1 when something is, 2 on error (no
warehouse, no completed run, unknown run id, unreadable table).

The tables are read through delta-rs (:mod:`jobs.tables.delta`): no JVM, so the command
answers in about a second for a small incident and runs where Spark is not installed. Only
the run's own partitions are read, so a month of history does not slow it (about 5 s for the
74,000 fragments of a lost bookie among a million ledgers; docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections import defaultdict
from typing import Any, TextIO

from bklib.meta.zkaccess import ZkAuth
from bklib.pulsar.unload import operator_command, topics_awaiting_unload
from bklib.repair.outcome import REPAIRED, RESOLVED, repair_status
from bklib.states import DEFAULT_LEDGERS_ROOT, ActionKind, Reason, Severity
from jobs.tables import delta
from jobs.tables.schema import ACTIONS

log = logging.getLogger(__name__)


def add_list_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the listunderreplicated flags to ``parser``."""
    parser.add_argument(
        "--warehouse", default=None, help="directory or URI of the Delta tables (not for --live)"
    )
    parser.add_argument(
        "--missing-replica",
        default=None,
        metavar="BOOKIE",
        help="only fragments whose missing replica is this bookie id",
    )
    parser.add_argument(
        "--run-id", default=None, help="report of this run (default: the latest completed one)"
    )
    parser.add_argument(
        "--live",
        action="store_true",
        help="list BookKeeper's current under-replication marks in ZooKeeper (needs --zk), "
        "like Java's listunderreplicated, instead of the latest audit",
    )
    parser.add_argument("--zk", default=None, help="ZooKeeper connect string (--live)")
    parser.add_argument(
        "--ledgers-root", default=DEFAULT_LEDGERS_ROOT, help="BookKeeper's ledgers root (--live)"
    )
    parser.add_argument("--zk-auth", default=None, help="ZooKeeper digest auth user:password")
    parser.add_argument(
        "--count-only", action="store_true", help="--live: print only the number of ledgers"
    )
    parser.add_argument(
        "--by-topic",
        action="store_true",
        help="group the report by Pulsar topic (from the ledgers' custom metadata)",
    )
    from jobs.options.zookeeper import add_connection_arguments

    return add_connection_arguments(parser)


FRAGMENT_COLUMNS = (
    "ledger_id", "segment_first_entry_id", "segment_last_entry_id", "bookie_id", "reason",
    "missing_entries", "unknown_entries", "severity", "min_replicas", "ledger_state",
    "first_detected_at", "error", "topic", "component",
)  # fmt: skip
"""The fragment columns the listing prints; missing_ranges and the rest stay on disk."""
ACTION_COLUMNS = ("ledger_id", "run_id", "mode", "action", "status", "error", "started_at")
"""The action columns :func:`repair_status` and the listing's repair notes use."""


def _fmt_range(first: int, last: int | None) -> str:
    return f"[{first}, {'LAC?' if last is None else last}]"


def _repair_note(repair: tuple[str, dict[str, Any]] | None) -> str | None:
    """What the repairs since the audit did to a ledger, as the listing says it."""
    if repair is None:
        return None
    status, last = repair
    why = f": {last['error']}" if status != REPAIRED and last.get("error") else ""
    return (
        f"repair since: {status}{why} ({last['mode']} {last['run_id']}, "
        f"{last['started_at']:%Y-%m-%d %H:%M:%S})"
    )


def _fragment_line(f: dict[str, Any], note: str | None) -> str:
    """One fragment of the report, with ``note`` (:func:`_repair_note`) on its ledger."""
    detail = [
        f"\tMissingReplica : {f['bookie_id']}",
        f"segment {_fmt_range(f['segment_first_entry_id'], f['segment_last_entry_id'])}",
        f["reason"],
    ]
    if f["missing_entries"] is not None:
        detail.append(f"{f['missing_entries']} entries")
    if f.get("unknown_entries"):
        detail.append(f"{f['unknown_entries']} unknown")
    if f["severity"]:
        detail.append(f"{f['severity']} (min replicas {f['min_replicas']})")
    if f.get("ledger_state"):
        detail.append(f["ledger_state"])
    if f.get("first_detected_at"):
        detail.append(f"since {f['first_detected_at']:%Y-%m-%d %H:%M:%S}")
    if f.get("error"):
        detail.append(f"({f['error']})")
    if note is not None:
        detail.append(note)
    return "  ".join(detail)


def format_report(
    run: dict[str, Any],
    fragments: list[dict[str, Any]],
    errors: list[dict[str, Any]],
    repairs: dict[int, tuple[str, dict[str, Any]]] | None = None,
) -> str:
    """The report text for one run's fragments and unreadable znodes; ``repairs`` (from
    :func:`repair_status`) says what happened to each ledger since."""
    repairs = repairs or {}
    lines = [
        f"audit run {run['run_id']}: check {run['check']}, {run['status']}, "
        f"finished {run['finished_at']:%Y-%m-%d %H:%M:%S} UTC, zk {run['zk']}"
        if run.get("finished_at")
        else f"audit run {run['run_id']}: check {run['check']}, {run['status']}"
    ]
    by_ledger: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for f in fragments:
        by_ledger[f["ledger_id"]].append(f)
    for lid in sorted(by_ledger):
        rows = sorted(by_ledger[lid], key=lambda f: (f["segment_first_entry_id"], f["bookie_id"]))
        lines.append(f"{lid}")
        note = _repair_note(repairs.get(lid))
        lines.extend(_fragment_line(f, note) for f in rows)
    for e in errors:
        lines.append(
            f"unreadable metadata: ledger {e['ledger_id']} at {e['znode_path']}: {e['error']}"
        )
    if not by_ledger and not errors:
        lines.append("no under-replicated ledgers")
    else:
        label = Severity.worst(f["severity"] for f in fragments)
        lines.append(
            f"{len(by_ledger)} under-replicated ledgers, {len(fragments)} fragments, "
            f"{len(errors)} unreadable znodes; worst severity {label}"
        )
        repaired = [lid for lid in by_ledger if repairs.get(lid, ("",))[0] in RESOLVED]
        if repaired:
            lines.append(
                f"{len(repaired)} of these ledgers were repaired after this audit and "
                f"{len(by_ledger) - len(repaired)} still need work; run `bkaudit audit` for a "
                "current report"
            )
    return "\n".join(lines)


NO_TOPIC = "(no topic)"


def format_by_topic(
    run: dict[str, Any],
    fragments: list[dict[str, Any]],
    repairs: dict[int, tuple[str, dict[str, Any]]] | None = None,
) -> str:
    """The report grouped by Pulsar topic: per topic its ledgers, fragments, worst severity
    and how many ledgers are still unrepaired; ledgers without topic metadata last."""
    repairs = repairs or {}
    by_topic: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for f in fragments:
        by_topic[f.get("topic") or NO_TOPIC].append(f)
    lines = [f"audit run {run['run_id']}: check {run['check']}, {run['status']}, by topic"]

    def worst(fs: list[dict[str, Any]]) -> str:
        return Severity.worst(f["severity"] for f in fs)

    def order(t: str) -> tuple[bool, int, int, str]:
        fs = by_topic[t]
        return (t == NO_TOPIC, Severity.ORDER.get(worst(fs), 9), -len(fs), t)

    for topic in sorted(by_topic, key=order):
        fs = by_topic[topic]
        ledgers = sorted({f["ledger_id"] for f in fs})
        left = [lid for lid in ledgers if repairs.get(lid, ("",))[0] not in RESOLVED]
        components = sorted({f.get("component") or "-" for f in fs})
        lines.append(
            f"{topic}  {len(ledgers)} ledgers, {len(fs)} fragments, worst {worst(fs)}, "
            f"{len(left)} unrepaired  component {','.join(components)}"
        )
        lines.append(
            "\tledgers: " + " ".join(map(str, ledgers[:50])) + (" ..." if len(ledgers) > 50 else "")
        )
    if not by_topic:
        lines.append("no under-replicated ledgers")
    else:
        named = len([t for t in by_topic if t != NO_TOPIC])
        lines.append(f"{named} topics affected, {len({f['ledger_id'] for f in fragments})} ledgers")
    return "\n".join(lines)


def _pulsar_by_topic(warehouse: str) -> str | None:
    """The latest Pulsar cross-check by topic, when one was recorded."""
    from jobs.reports.pulsar import format_pulsar_by_topic, latest_pulsar_check
    from jobs.tables.schema import PULSAR_CHECKS, PULSAR_REFERENCES

    if not delta.table_exists(warehouse, PULSAR_CHECKS):
        return None
    refs = (
        delta.read_rows(warehouse, PULSAR_REFERENCES)
        if delta.table_exists(warehouse, PULSAR_REFERENCES)
        else []
    )
    check, findings = latest_pulsar_check(delta.read_rows(warehouse, PULSAR_CHECKS), refs)
    return format_pulsar_by_topic(check, findings) if check is not None else None


def _one_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message (delta-rs errors span many)."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return first or type(exc).__name__


def _is_missing_dir(warehouse: str) -> bool:
    """True for a local warehouse directory that does not exist (URIs are not checked)."""
    local = warehouse.removeprefix("file://")
    return "://" not in local and not os.path.isdir(local)


def list_underreplicated(
    warehouse: str,
    *,
    missing_replica: str | None = None,
    run_id: str | None = None,
    out: TextIO | None = None,
    by_topic: bool = False,
) -> int:
    """Print the report of the latest completed run (or ``run_id``): 0 clean, 1 findings,
    2 on error (no warehouse, no such run, a table that cannot be read), with one line on
    stderr saying why."""
    try:
        if _is_missing_dir(warehouse):
            print(f"listunderreplicated: no warehouse at {warehouse}", file=sys.stderr)
            return 2
        run = delta.latest_run(warehouse, run_id)
        if run is None:
            what = f"run {run_id}" if run_id else "completed audit run"
            print(f"listunderreplicated: no {what} in {warehouse}", file=sys.stderr)
            return 2
        filters = {"bookie_id": missing_replica} if missing_replica else None
        # Placement violations are not under-replication (docs/placement.md): the audit's
        # summary and the HTML report show them; this listing is Java's, of missing replicas.
        frags = [
            f
            for f in delta.run_fragments(warehouse, run, filters, columns=FRAGMENT_COLUMNS)
            if f["reason"] != Reason.PLACEMENT_VIOLATION
        ]
        # Unreadable znodes name no bookie, so a per-bookie listing leaves them out.
        errors = [] if missing_replica else delta.run_metadata_errors(warehouse, run)
        wanted = sorted({f["ledger_id"] for f in frags})
        # Only the repairs since the audit count (repair_status), so older ones are not read.
        since = [("started_at", ">=", run["started_at"])]
        actions = (
            delta.read_rows(
                warehouse,
                ACTIONS,
                columns=ACTION_COLUMNS,
                filters=[("ledger_id", "in", wanted), *since],
            )
            if wanted
            else []
        )
        repairs = repair_status(actions, run["started_at"])
        unloads = (
            delta.read_rows(
                warehouse,
                ACTIONS,
                columns=["action", "status", "topic", "started_at"],
                filters=[("action", "=", ActionKind.UNLOAD_TOPIC)],
            )
            if delta.table_exists(warehouse, ACTIONS)
            else []
        )
        pulsar = _pulsar_by_topic(warehouse) if by_topic else None
    except Exception as exc:  # TableProtocolError, unreadable files, bad URIs: one line each
        log.debug("listunderreplicated could not read %s", warehouse, exc_info=True)
        print(f"listunderreplicated: {_one_line(exc)}", file=sys.stderr)
        return 2
    if by_topic:
        print(format_by_topic(run, frags, repairs), file=out or sys.stdout)
        if pulsar:
            print(pulsar, file=out or sys.stdout)
    else:
        print(format_report(run, frags, errors, repairs), file=out or sys.stdout)
    stale = topics_awaiting_unload(unloads)
    if stale:
        print(
            f"{len(stale)} Pulsar topics had ledgers repaired and were not unloaded since; "
            "their brokers may hold stale ledger handles until each is unloaded:",
            file=out or sys.stdout,
        )
        for topic in stale:
            print(f"  {operator_command(topic)}", file=out or sys.stdout)
    left = {f["ledger_id"] for f in frags} - {
        lid for lid, (status, _) in repairs.items() if status in RESOLVED
    }
    return 1 if left or errors else 0


def list_live(
    zk_hosts: str,
    *,
    ledgers_root: str = DEFAULT_LEDGERS_ROOT,
    auth: ZkAuth = None,
    missing_replica: str | None = None,
    count_only: bool = False,
    out: TextIO | None = None,
) -> int:
    """BookKeeper's current under-replication marks, as ``bookkeeper shell
    listunderreplicated -printmissingreplica`` shows them: 0 none, 1 some, 2 on error."""
    from bklib.meta.stores import open_store
    from bklib.meta.underreplication import UnderReplicationManager

    try:
        zk = open_store(zk_hosts, auth=auth)
        try:
            marks = [
                m
                for m in UnderReplicationManager(zk, ledgers_root).list_underreplicated()
                if missing_replica is None or missing_replica in m.missing_replicas
            ]
        finally:
            zk.close()
    except Exception as exc:
        log.debug("listunderreplicated --live failed", exc_info=True)
        print(f"listunderreplicated: {_one_line(exc)}", file=sys.stderr)
        return 2
    stream = out or sys.stdout
    if count_only:
        print(len(marks), file=stream)
    else:
        for m in sorted(marks, key=lambda m: m.ledger_id):
            print(m.ledger_id, file=stream)
            for b in m.missing_replicas:
                print(f"\tMissingReplica : {b}", file=stream)
            if m.lock_holder:
                print(f"\tReplicationWorkerId : {m.lock_holder}", file=stream)
        print(f"{len(marks)} ledgers marked under-replicated in {zk_hosts}", file=stream)
    return 1 if marks else 0


def run_listunderreplicated(args: argparse.Namespace) -> int:
    """Entry point for parsed arguments (``bkaudit listunderreplicated``). No SparkSession:
    the tables are read through delta-rs."""
    try:
        if args.live:
            if not args.zk:
                print("listunderreplicated: --live needs --zk", file=sys.stderr)
                return 2
            return list_live(
                args.zk,
                ledgers_root=args.ledgers_root,
                auth=args.zk_auth,
                missing_replica=args.missing_replica,
                count_only=args.count_only,
            )
        if not args.warehouse:
            print("listunderreplicated: --warehouse is required (or --live)", file=sys.stderr)
            return 2
        return list_underreplicated(
            args.warehouse,
            missing_replica=args.missing_replica,
            run_id=args.run_id,
            by_topic=getattr(args, "by_topic", False),
        )
    except Exception as exc:  # formatting a malformed row, say: still one line, exit 2
        log.debug("listunderreplicated failed", exc_info=True)
        print(f"listunderreplicated: {_one_line(exc)}", file=sys.stderr)
        return 2
