"""``bkaudit listunderreplicated``: print the latest audit report, like BookKeeper's shell.

BookKeeper's ``listunderreplicated`` prints one ledger id per line and, with
``-printmissingreplica``, a ``MissingReplica : <bookie>`` line under it per bookie. This
prints the same shape from the Delta tables, with each fragment's range, reason, missing
entry count and severity. Exit status: 0 when the report is clean, 1 when it has findings,
2 on error (no warehouse, no completed run, unknown run id, unreadable table).

The tables are read through delta-rs (:mod:`jobs.tables.delta`): no JVM, so the command
answers in about a second and runs where Spark is not installed.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections import defaultdict
from typing import Any, TextIO

from bklib.states import Severity
from jobs.tables import delta

log = logging.getLogger(__name__)


def add_list_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the listunderreplicated flags to ``parser``."""
    parser.add_argument("--warehouse", required=True, help="directory or URI of the Delta tables")
    parser.add_argument(
        "--missing-replica",
        default=None,
        metavar="BOOKIE",
        help="only fragments whose missing replica is this bookie id",
    )
    parser.add_argument(
        "--run-id", default=None, help="report of this run (default: the latest completed one)"
    )
    return parser


def _fmt_range(first: int, last: int | None) -> str:
    return f"[{first}, {'LAC?' if last is None else last}]"


def format_report(
    run: dict[str, Any], fragments: list[dict[str, Any]], errors: list[dict[str, Any]]
) -> str:
    """The report text for one run's fragments and unreadable znodes."""
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
        for f in rows:
            missing = f["missing_entries"]
            detail = [
                f"\tMissingReplica : {f['bookie_id']}",
                f"segment {_fmt_range(f['segment_first_entry_id'], f['segment_last_entry_id'])}",
                f["reason"],
            ]
            if missing is not None:
                detail.append(f"{missing} entries")
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
            lines.append("  ".join(detail))
    for e in errors:
        lines.append(
            f"unreadable metadata: ledger {e['ledger_id']} at {e['znode_path']}: {e['error']}"
        )
    if not by_ledger and not errors:
        lines.append("no under-replicated ledgers")
    else:
        ranked = [f["severity"] for f in fragments if f["severity"] in Severity.ORDER]
        label = min(ranked, key=Severity.ORDER.__getitem__, default="none")
        lines.append(
            f"{len(by_ledger)} under-replicated ledgers, {len(fragments)} fragments, "
            f"{len(errors)} unreadable znodes; worst severity {label}"
        )
    return "\n".join(lines)


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
        frags = delta.run_fragments(warehouse, run["run_id"], filters)
        # Unreadable znodes name no bookie, so a per-bookie listing leaves them out.
        errors = [] if missing_replica else delta.run_metadata_errors(warehouse, run["run_id"])
    except Exception as exc:  # TableProtocolError, unreadable files, bad URIs: one line each
        log.debug("listunderreplicated could not read %s", warehouse, exc_info=True)
        print(f"listunderreplicated: {_one_line(exc)}", file=sys.stderr)
        return 2
    print(format_report(run, frags, errors), file=out or sys.stdout)
    return 1 if frags or errors else 0


def run_listunderreplicated(args: argparse.Namespace, spark: Any = None) -> int:
    """Entry point for parsed arguments (``bkaudit listunderreplicated``). ``spark`` is
    accepted for older callers and ignored: the tables are read through delta-rs."""
    del spark
    try:
        return list_underreplicated(
            args.warehouse, missing_replica=args.missing_replica, run_id=args.run_id
        )
    except Exception as exc:  # formatting a malformed row, say: still one line, exit 2
        log.debug("listunderreplicated failed", exc_info=True)
        print(f"listunderreplicated: {_one_line(exc)}", file=sys.stderr)
        return 2
