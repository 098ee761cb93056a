"""``bkaudit listunderreplicated``: print the latest audit report, like BookKeeper's shell.

BookKeeper's ``listunderreplicated`` prints one ledger id per line and, with
``-printmissingreplica``, a ``MissingReplica : <bookie>`` line under it per bookie. This
prints the same shape from the Delta tables, with each fragment's range, reason, missing
entry count and severity, and what repairs did to it since the audit (from
``replication_actions``): a report never looks current when a later repair changed it, and a
dry run's plan is marked as one, never as a repair's status (docs/repair.md, "Dry run").
``--live`` lists BookKeeper's under-replication marks in ZooKeeper instead, as Java's command
does. Exit status: 0 when nothing is left unrepaired, 1 when something is, 2 on error (no
warehouse, no completed run, unknown run id, unreadable table).

The tables are read through delta-rs (:mod:`jobs.tables.delta`): no JVM, so the command
answers in about a second for a small incident and runs where Spark is not installed. Only
the run's own partitions are read, so a month of history does not slow it, and the report is
made over Arrow columns: only the printed lines become Python strings (2.3 to 2.8 s for the
74,000 fragments of a lost bookie among a million ledgers; docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TextIO

import pyarrow as pa
import pyarrow.compute as pc

from bklib.audit.completeness import incomplete_line
from bklib.meta.stores.zookeeper.security import ZkAuth
from bklib.pulsar.unload import operator_command, topics_awaiting_unload
from bklib.repair.outcome import DRY_RUN, REPAIRED, RESOLVED
from bklib.states import DEFAULT_LEDGERS_ROOT, ActionKind, Reason, Severity
from jobs.reports.arrow_queries import repair_status_of
from jobs.runtime.exit_status import ExitStatus, for_run_status, worst
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
"""The action columns the repair status (:func:`repair_status_of`) and its notes use."""


def _text(table: pa.Table, name: str, *, falsy_is_null: bool = False) -> pa.ChunkedArray:
    """Column ``name`` as the listing prints it (times to the second), null where absent:
    an older table may lack the column. ``falsy_is_null``: "" and 0 print nothing, as
    Python's ``if value:`` would have it."""
    if name not in table.column_names:
        return pa.chunked_array([pa.nulls(table.num_rows, pa.string())])
    column = table[name]
    if pa.types.is_timestamp(column.type):
        whole = column.cast(pa.timestamp("s", tz=column.type.tz), safe=False)  # floor, as %S
        return pc.strftime(whole, format="%Y-%m-%d %H:%M:%S")
    if falsy_is_null:
        falsy = "" if pa.types.is_string(column.type) else 0
        column = pc.if_else(pc.equal(column, falsy), pa.scalar(None, column.type), column)
    return column.cast(pa.string())


@dataclass(frozen=True)
class RepairsSince:
    """What the repair runs since the audit left each ledger in (:func:`repair_status_of`):
    its outcome, and the note the listing prints under it."""

    outcomes: dict[int, str] = field(default_factory=dict)
    notes: dict[int, str] = field(default_factory=dict)

    @classmethod
    def of(cls, decided: pa.Table) -> RepairsSince:
        """From :func:`repair_status_of`'s table, the notes made over its columns."""
        outcome = decided["outcome"]
        error = _text(decided, "error", falsy_is_null=True)
        has_error = pc.fill_null(pc.is_valid(error), False)
        why = pc.if_else(
            pc.and_(pc.not_equal(outcome, REPAIRED), has_error),
            pc.binary_join_element_wise(": ", error, ""),
            "",
        )
        # A dry run repaired nothing and failed nothing: its note says what the real run
        # would do (DRY_RUN), never a status a repair would leave.
        dry = pc.equal(outcome, DRY_RUN)
        said = pc.if_else(
            dry,
            pc.if_else(has_error, "dry run since: would not repair", "dry run since: would repair"),
            pc.binary_join_element_wise("repair since: ", outcome, ""),
        )
        note = pc.binary_join_element_wise(
            said, why, " (", decided["mode"], " ", decided["run_id"],
            ", ", _text(decided, "started_at"), ")", "",
        )  # fmt: skip
        ids = decided["ledger_id"].to_pylist()
        return cls(
            dict(zip(ids, outcome.to_pylist(), strict=True)),
            dict(zip(ids, note.to_pylist(), strict=True)),
        )

    def resolved(self, ledger_id: int) -> bool:
        """Whether a repair since the audit left nothing to do for this ledger."""
        return self.outcomes.get(ledger_id) in RESOLVED


def _fragment_details(fragments: pa.Table) -> list[str]:
    """Each fragment's line of the report (its ledger's repair note aside), in the table's
    order, computed over the columns: a lost bookie among a million ledgers is 74,000
    lines. A part whose value is null (or empty, where marked) is left out."""

    def joined(*parts: Any) -> pa.ChunkedArray:  # null when any part is
        return pc.binary_join_element_wise(*parts, "")

    segment = joined(
        "segment [",
        _text(fragments, "segment_first_entry_id"),
        ", ",
        pc.coalesce(_text(fragments, "segment_last_entry_id"), "LAC?"),
        "]",
    )
    severity = joined(
        _text(fragments, "severity", falsy_is_null=True),
        " (min replicas ",
        pc.coalesce(_text(fragments, "min_replicas"), "?"),
        ")",
    )
    line = pc.binary_join_element_wise(
        joined("\tMissingReplica : ", _text(fragments, "bookie_id")),
        segment,
        _text(fragments, "reason"),
        joined(_text(fragments, "missing_entries"), " entries"),
        joined(_text(fragments, "unknown_entries", falsy_is_null=True), " unknown"),
        severity,
        _text(fragments, "ledger_state", falsy_is_null=True),
        joined("since ", _text(fragments, "first_detected_at")),
        joined("(", _text(fragments, "error", falsy_is_null=True), ")"),
        "  ",
        null_handling="skip",
    )
    return list(line.to_pylist())


def format_report(
    run: dict[str, Any],
    fragments: pa.Table,
    errors: list[dict[str, Any]],
    repairs: RepairsSince | None = None,
) -> str:
    """The report text for one run's fragments (a table of :data:`FRAGMENT_COLUMNS`) and
    unreadable znodes; ``repairs`` says what happened to each ledger since. Over a run that
    missed something the first line says so, and "no under-replicated ledgers" is never said."""
    repairs = repairs or RepairsSince()
    missed = incomplete_line(run)
    lines = [] if missed is None else [missed]
    lines += [
        f"audit run {run['run_id']}: check {run['check']}, {run['status']}, "
        f"finished {run['finished_at']:%Y-%m-%d %H:%M:%S} UTC, zk {run['zk']}"
        if run.get("finished_at")
        else f"audit run {run['run_id']}: check {run['check']}, {run['status']}"
    ]
    ordered = fragments.sort_by(
        [(k, "ascending") for k in ("ledger_id", "segment_first_entry_id", "bookie_id")]
    )
    ledger_ids: list[int] = ordered["ledger_id"].to_pylist()
    previous: int | None = None
    note: str | None = None
    for lid, detail in zip(ledger_ids, _fragment_details(ordered), strict=True):
        if lid != previous:
            lines.append(f"{lid}")
            note = repairs.notes.get(lid)
            previous = lid
        lines.append(detail if note is None else f"{detail}  {note}")
    for e in errors:
        lines.append(
            f"unreadable metadata: ledger {e['ledger_id']} at {e['znode_path']}: {e['error']}"
        )
    ledgers = set(ledger_ids)
    if not ledgers and not errors and missed is None:
        lines.append("no under-replicated ledgers")
    else:
        label = Severity.worst(_text(fragments, "severity").to_pylist())
        lines.append(
            f"{len(ledgers)} under-replicated ledgers, {fragments.num_rows} fragments, "
            f"{len(errors)} unreadable znodes; worst severity {label}"
        )
        repaired = [lid for lid in ledgers if repairs.resolved(lid)]
        if repaired:
            lines.append(
                f"{len(repaired)} of these ledgers were repaired after this audit and "
                f"{len(ledgers) - len(repaired)} still need work; run `bkaudit audit` for a "
                "current report"
            )
    return "\n".join(lines)


NO_TOPIC = "(no topic)"


def format_by_topic(
    run: dict[str, Any],
    fragments: list[dict[str, Any]],
    repairs: RepairsSince | None = None,
) -> str:
    """The report grouped by Pulsar topic: per topic its ledgers, fragments, worst severity
    and how many ledgers are still unrepaired; ledgers without topic metadata last."""
    repairs = repairs or RepairsSince()
    by_topic: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for f in fragments:
        by_topic[f.get("topic") or NO_TOPIC].append(f)
    missed = incomplete_line(run)
    lines = [] if missed is None else [missed]
    lines.append(f"audit run {run['run_id']}: check {run['check']}, {run['status']}, by topic")

    def worst(fs: list[dict[str, Any]]) -> str:
        return Severity.worst(f["severity"] for f in fs)

    def order(t: str) -> tuple[bool, int, int, str]:
        fs = by_topic[t]
        return (t == NO_TOPIC, Severity.ORDER.get(worst(fs), 9), -len(fs), t)

    for topic in sorted(by_topic, key=order):
        fs = by_topic[topic]
        ledgers = sorted({f["ledger_id"] for f in fs})
        left = [lid for lid in ledgers if not repairs.resolved(lid)]
        components = sorted({f.get("component") or "-" for f in fs})
        lines.append(
            f"{topic}  {len(ledgers)} ledgers, {len(fs)} fragments, worst {worst(fs)}, "
            f"{len(left)} unrepaired  component {','.join(components)}"
        )
        lines.append(
            "\tledgers: " + " ".join(map(str, ledgers[:50])) + (" ..." if len(ledgers) > 50 else "")
        )
    if not by_topic and missed is None:
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


def _repairs_since(warehouse: str, run: dict[str, Any], ledger_ids: list[int]) -> RepairsSince:
    """What the repairs since the audit did to these ledgers. Only the actions since count
    (:func:`bklib.repair.outcome.repair_status`), so older ones are not read."""
    if not ledger_ids or not delta.table_exists(warehouse, ACTIONS):
        return RepairsSince()
    actions = delta.read_arrow(
        warehouse,
        ACTIONS,
        columns=ACTION_COLUMNS,
        filters=[("ledger_id", "in", ledger_ids), ("started_at", ">=", run["started_at"])],
    )
    return RepairsSince.of(plan_blockers(repair_status_of(actions, run["started_at"]), actions))


def plan_blockers(decided: pa.Table, actions: pa.Table) -> pa.Table:
    """``decided`` (:func:`repair_status_of`'s table) with each dry run's ``error`` the first
    step its plan could not take (a PLANNED row with an error), whichever of the run's rows
    decided: a plan one of whose copies has no target would not repair the ledger."""
    blocked = actions.filter(
        pc.and_(
            pc.equal(actions["status"], DRY_RUN),
            pc.fill_null(pc.not_equal(actions["error"], ""), False),
        )
    )
    if blocked.num_rows == 0 or decided.num_rows == 0:
        return decided
    first = (
        blocked.sort_by("started_at")
        .select(["ledger_id", "run_id", "error"])
        .group_by(["ledger_id", "run_id"], use_threads=False)
        .aggregate([("error", "first")])
    )
    joined = decided.join(first, ["ledger_id", "run_id"])
    dry = pc.and_(pc.equal(joined["outcome"], DRY_RUN), pc.is_valid(joined["error_first"]))
    error = pc.if_else(dry, joined["error_first"], joined["error"])
    at = joined.schema.get_field_index("error")
    return joined.drop_columns(["error_first"]).set_column(at, "error", error)


def _unloads(warehouse: str) -> list[dict[str, Any]]:
    """Every topic unload on record (:func:`topics_awaiting_unload` reads them). A month of
    daily repairs is tens of thousands of rows, whose times are only compared."""
    if not delta.table_exists(warehouse, ACTIONS):
        return []
    unloads = delta.read_arrow(
        warehouse,
        ACTIONS,
        columns=["action", "status", "topic", "started_at"],
        filters=[("action", "=", ActionKind.UNLOAD_TOPIC)],
    )
    return delta.arrow_rows(unloads, keep_micros=True)


def list_underreplicated(
    warehouse: str,
    *,
    missing_replica: str | None = None,
    run_id: str | None = None,
    out: TextIO | None = None,
    by_topic: bool = False,
) -> int:
    """Print the report of the latest finished run (or ``run_id``): 0 clean, 1 findings,
    2 on error (no warehouse, no such run, a table that cannot be read), with one line on
    stderr saying why, and 3 when that run missed something (:func:`incomplete_line`)."""
    try:
        if _is_missing_dir(warehouse):
            print(f"listunderreplicated: no warehouse at {warehouse}", file=sys.stderr)
            return ExitStatus.OPERATOR_ERROR
        run = delta.latest_run(warehouse, run_id)
        if run is None:
            what = f"run {run_id}" if run_id else "completed audit run"
            print(f"listunderreplicated: no {what} in {warehouse}", file=sys.stderr)
            return ExitStatus.OPERATOR_ERROR
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="listing-read") as pool:
            # The reads that need no fragment run beside the ones that do: Arrow's scans
            # release the GIL, and a month of history makes each take a few tenths of a second.
            unloads_read = pool.submit(_unloads, warehouse)
            # Unreadable znodes name no bookie, so a per-bookie listing leaves them out.
            errors_read = (
                None if missing_replica else pool.submit(delta.run_metadata_errors, warehouse, run)
            )
            filters = {"bookie_id": missing_replica} if missing_replica else None
            # Placement violations are not under-replication (docs/placement.md): the audit's
            # summary and the HTML report show them; this listing is Java's, of missing replicas.
            frags = delta.run_fragments_arrow(warehouse, run, filters, columns=FRAGMENT_COLUMNS)
            frags = frags.filter(pc.not_equal(frags["reason"], Reason.PLACEMENT_VIOLATION))
            repairs = _repairs_since(warehouse, run, pc.unique(frags["ledger_id"]).to_pylist())
            errors = [] if errors_read is None else errors_read.result()
            unloads = unloads_read.result()
        pulsar = _pulsar_by_topic(warehouse) if by_topic else None
    except Exception as exc:  # TableProtocolError, unreadable files, bad URIs: one line each
        log.debug("listunderreplicated could not read %s", warehouse, exc_info=True)
        print(f"listunderreplicated: {_one_line(exc)}", file=sys.stderr)
        return ExitStatus.OPERATOR_ERROR
    if by_topic:
        print(format_by_topic(run, delta.arrow_rows(frags), repairs), file=out or sys.stdout)
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
    left = {lid for lid in frags["ledger_id"].to_pylist() if not repairs.resolved(lid)}
    return worst(
        ExitStatus.FINDINGS if left or errors else ExitStatus.OK,
        for_run_status(run["status"]),
    )


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
        return ExitStatus.OPERATOR_ERROR
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
    return ExitStatus.FINDINGS if marks else ExitStatus.OK


def run_listunderreplicated(args: argparse.Namespace) -> int:
    """Entry point for parsed arguments (``bkaudit listunderreplicated``). No SparkSession:
    the tables are read through delta-rs."""
    try:
        if args.live:
            if not args.zk:
                print("listunderreplicated: --live needs --zk", file=sys.stderr)
                return ExitStatus.OPERATOR_ERROR
            return list_live(
                args.zk,
                ledgers_root=args.ledgers_root,
                auth=args.zk_auth,
                missing_replica=args.missing_replica,
                count_only=args.count_only,
            )
        if not args.warehouse:
            print("listunderreplicated: --warehouse is required (or --live)", file=sys.stderr)
            return ExitStatus.OPERATOR_ERROR
        return list_underreplicated(
            args.warehouse,
            missing_replica=args.missing_replica,
            run_id=args.run_id,
            by_topic=getattr(args, "by_topic", False),
        )
    except Exception as exc:  # formatting a malformed row, say: still one line, exit 2
        log.debug("listunderreplicated failed", exc_info=True)
        print(f"listunderreplicated: {_one_line(exc)}", file=sys.stderr)
        return ExitStatus.OPERATOR_ERROR
