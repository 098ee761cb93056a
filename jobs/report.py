"""``bkaudit listunderreplicated``: print the latest audit report, like BookKeeper's shell.

BookKeeper's ``listunderreplicated`` prints one ledger id per line and, with
``-printmissingreplica``, a ``MissingReplica : <bookie>`` line under it per bookie. This
prints the same shape from the Delta tables, with each fragment's range, reason, missing
entry count and severity. Exit status: 0 when the report is clean, 1 when it has findings,
2 on error (no warehouse, no completed run, unknown run id).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections import defaultdict
from typing import Any, TextIO

from pyspark.sql import SparkSession

from jobs import load

log = logging.getLogger(__name__)

SEVERITY_ORDER = {"NO_REPLICA": 0, "BELOW_AQ": 1, "BELOW_WQ": 2}


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
    parser.add_argument("--master", default=None, help="Spark master (default: conf or local[2])")
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
        worst = min(
            (SEVERITY_ORDER[f["severity"]] for f in fragments if f["severity"]), default=None
        )
        label = next((k for k, v in SEVERITY_ORDER.items() if v == worst), "none")
        lines.append(
            f"{len(by_ledger)} under-replicated ledgers, {len(fragments)} fragments, "
            f"{len(errors)} unreadable znodes; worst severity {label}"
        )
    return "\n".join(lines)


def list_underreplicated(
    spark: SparkSession,
    warehouse: str,
    *,
    missing_replica: str | None = None,
    run_id: str | None = None,
    out: TextIO | None = None,
) -> int:
    """Print the report of the latest completed run (or ``run_id``); 0 clean, 1 findings,
    2 when there is no such run."""
    run = load.latest_run(spark, warehouse, run_id)
    if run is None:
        what = f"run {run_id}" if run_id else "completed audit run"
        print(f"listunderreplicated: no {what} in {warehouse}", file=sys.stderr)
        return 2
    filters = {"bookie_id": missing_replica} if missing_replica else {}
    frags = []
    if load.table_exists(spark, warehouse, load.FRAGMENTS):
        frags = [
            r.asDict(recursive=True)
            for r in load.run_fragments(spark, warehouse, run["run_id"], filters).collect()
        ]
    errors = []
    if missing_replica is None and load.table_exists(spark, warehouse, load.LEDGERS):
        errors = [
            r.asDict()
            for r in load.run_metadata_errors(spark, warehouse, run["run_id"])
            .orderBy("ledger_id")
            .collect()
        ]
    print(format_report(run, frags, errors), file=out or sys.stdout)
    return 1 if frags or errors else 0


def run_listunderreplicated(args: argparse.Namespace, spark: SparkSession | None = None) -> int:
    """Entry point for parsed arguments (``bkaudit listunderreplicated``)."""
    try:
        if spark is None:
            from jobs.spark import build_spark

            spark = build_spark(
                "bkaudit-listunderreplicated",
                master=getattr(args, "master", None),
                overrides={"spark.ui.showConsoleProgress": "false"},
            )
        return list_underreplicated(
            spark, args.warehouse, missing_replica=args.missing_replica, run_id=args.run_id
        )
    except Exception as exc:
        log.exception("listunderreplicated failed")
        print(f"listunderreplicated: {exc}", file=sys.stderr)
        return 2
