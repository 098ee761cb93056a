"""``bkaudit report``: one self-contained HTML page about under-replication and repair.

    bkaudit report --warehouse PATH --out report.html [--run-id R] [--runs 30]

The page shows the latest finished run of each audit check (a sample audit's unreachable
findings stay after a later lost audit), the lost bookies with the time since each loss and
its time to repair, each bookie's state and last answer, the repair runs (a dry run marked),
the repair failures with their reasons, the manual steps, three charts (fragments per bookie
by severity, findings per severity over the recent audit runs, repair throughput), the
stuck ledgers and the findings table; a job that never ran says "not run"
(docs/operations.md).

Three layers under :mod:`jobs.reports`, kept apart so each is tested on its own:

* :mod:`jobs.reports.queries`, :mod:`~jobs.reports.bookies`, :mod:`~jobs.reports.repairs`:
  plain-Python functions over rows of the Delta tables (the first also used by
  ``notebooks/underreplication.ipynb``);
* :mod:`jobs.reports.data` and :mod:`~jobs.reports.incident`: read the tables through delta-rs
  (no JVM) and run the queries into small Python lists (:class:`~jobs.reports.data.ReportData`);
* :mod:`jobs.reports.charts`, :mod:`~jobs.reports.sections` and :mod:`jobs.reports.page`:
  pure functions from those lists to SVG and HTML strings.

This module is the command line only. Exit status: 0 when the page was written, 2 on error
(no warehouse, no completed run).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from jobs.options.warehouse import WAREHOUSE_HELP
from jobs.reports.data import DEFAULT_MAX_FINDINGS, DEFAULT_TITLE, collect_report_data
from jobs.reports.page import render_html
from jobs.reports.queries import DEFAULT_RUNS
from jobs.runtime.exit_status import ExitStatus

__all__ = ["add_report_arguments", "main", "run_report"]

log = logging.getLogger("jobs.commands.report")


def add_report_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the report flags to ``parser`` (shared by ``bkaudit report`` and :func:`main`)."""
    parser.add_argument("--warehouse", required=True, help=WAREHOUSE_HELP)
    parser.add_argument("--out", default="report.html", help="HTML file to write")
    parser.add_argument(
        "--run-id", default=None, help="findings of this audit run (default: latest completed)"
    )
    parser.add_argument(
        "--runs", type=int, default=DEFAULT_RUNS, help="audit runs in the severity chart"
    )
    parser.add_argument(
        "--max-findings",
        type=int,
        default=DEFAULT_MAX_FINDINGS,
        help="rows of the findings table, worst severity first",
    )
    parser.add_argument("--title", default=DEFAULT_TITLE, help="page title")
    return parser


def _one_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message (delta-rs errors span many)."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return first or type(exc).__name__


def run_report(args: argparse.Namespace) -> int:
    """Write the report from parsed arguments; 0 when written, 2 on error (one line on
    stderr). No SparkSession: the tables are read through delta-rs."""
    try:
        data = collect_report_data(
            args.warehouse,
            run_id=args.run_id,
            runs=args.runs,
            title=args.title,
            max_findings=args.max_findings,
        )
        if data is None:
            what = f"audit run {args.run_id}" if args.run_id else "completed audit run"
            print(f"report: no {what} in {args.warehouse}", file=sys.stderr)
            return ExitStatus.OPERATOR_ERROR
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(render_html(data), encoding="utf-8")
    except Exception as exc:  # TableProtocolError, unreadable tables, unwritable --out
        log.debug("report failed", exc_info=True)
        print(f"report: {_one_line(exc)}", file=sys.stderr)
        return ExitStatus.OPERATOR_ERROR
    print(
        f"report of run {data.run['run_id']}: {len(data.findings)} fragments, "
        f"{len(data.stuck)} stuck ledgers -> {out}"
    )
    return ExitStatus.OK


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m jobs.commands.report ...``: ``bkaudit report``."""
    from jobs.cli.main import command_main

    return command_main("report", argv)


if __name__ == "__main__":
    sys.exit(main())
