"""Helpers for the ``bookkeeper_audit`` DAG, kept out of the DAG file so they can be tested
without parsing it (``.airflowignore`` keeps the scheduler from parsing this file as a DAG).

The branch and the verification read ``audit_runs`` with delta-rs (``deltalake``): no JVM and
no Spark on the Airflow worker, and they look at the exact run the DAG just wrote, found by
its run id, rather than at "the latest run" (which another writer could have appended).
``audit_runs`` gets a run's row last, after all its fragments are committed, so a row that is
there describes a finished run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# The Airflow worker may have the checkout (BKAUDIT_HOME) rather than the installed package;
# bklib.states and jobs.tables.schema need nothing beyond the standard library and pyarrow.
_HOME = os.environ.get("BKAUDIT_HOME") or str(Path(__file__).resolve().parents[1])
if _HOME not in sys.path:
    sys.path.append(_HOME)

from bklib.states import CountKey, Reason, RunStatus  # noqa: E402
from jobs.tables.schema import AUDIT_RUNS  # noqa: E402

COMPLETED = RunStatus.FINISHED

TASK_REPAIR = "rereplicate"
TASK_CLEAN = "no_findings"


def run_id_prefix(dag_run_ts: str, step: str) -> str:
    """Audit run ids the DAG gives a step: ``airflow-<ts_nodash>-<step>-t<try>``. The try
    number keeps a retried audit from appending rows under the failed attempt's id."""
    return f"airflow-{dag_run_ts}-{step}-t"


def _counts(value: Any) -> dict[str, int]:
    # A Delta map column comes back from Arrow as a list of (key, value) pairs.
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return {str(k): int(v) for k, v in value.items()}
    return {str(k): int(v) for k, v in value}


def read_audit_runs(warehouse: str, storage_options: Mapping[str, str] | None = None) -> list[dict]:
    """All rows of ``audit_runs`` (one per run, so small) as dicts, via delta-rs."""
    from deltalake import DeltaTable

    path = f"{warehouse.rstrip('/')}/{AUDIT_RUNS}"
    table = DeltaTable(path, storage_options=dict(storage_options or {}))
    cols = ["run_id", "started_at", "finished_at", "check", "status", "counts", "error"]
    rows = table.to_pyarrow_table(columns=cols).to_pylist()
    for r in rows:
        r["counts"] = _counts(r["counts"])
    return rows


def find_run(runs: Sequence[Mapping[str, Any]], prefix: str) -> dict[str, Any] | None:
    """The latest attempt among runs whose id starts with ``prefix`` (by started_at)."""
    mine = [dict(r) for r in runs if str(r["run_id"]).startswith(prefix)]
    if not mine:
        return None
    return max(mine, key=lambda r: (r["started_at"], r["run_id"]))


def has_findings(run: Mapping[str, Any]) -> bool:
    """True when a completed run found something to repair or look at."""
    c = run["counts"]
    return bool(c.get(CountKey.UNDERREPLICATED_LEDGERS, 0) or c.get(CountKey.FRAGMENTS, 0))


def unread(run: Mapping[str, Any]) -> str:
    """What a COMPLETED_WITH_ERRORS run could not read, in words."""
    c = run["counts"]
    return (
        f"{c.get(CountKey.METADATA_ERRORS, 0)} unreadable znodes, "
        f"{c.get(CountKey.reason(Reason.BOOKIE_UNREACHABLE), 0)} fragments on unreachable "
        f"bookies, {c.get(CountKey.LEDGERS_UNACCOUNTED, 0)} ledgers unaccounted for"
    )


def choose_branch(run: Mapping[str, Any] | None, prefix: str) -> str:
    """The task to follow the audit: ``rereplicate`` when the run found under-replicated
    fragments, ``no_findings`` when it is clean. A missing or failed run is an error, and so
    is a run that could not read everything and found nothing: the DAG must not report
    "clean" for an audit that did not read the whole cluster. Such a run's findings are
    still repaired."""
    if run is None:
        raise RuntimeError(f"no audit run with id {prefix}* in audit_runs")
    if run["status"] not in COMPLETED:
        raise RuntimeError(f"audit run {run['run_id']} is {run['status']}: {run.get('error')}")
    if has_findings(run):
        return TASK_REPAIR
    if run["status"] != RunStatus.COMPLETED:
        raise RuntimeError(
            f"audit run {run['run_id']} is {run['status']} ({unread(run)}): not clean"
        )
    return TASK_CLEAN


def verification_outcome(
    run: Mapping[str, Any] | None, prefix: str, *, dry_run: bool
) -> tuple[bool, str]:
    """(passed, summary) for the verifying audit. It passes when nothing is under-replicated
    any more, or on a dry run (nothing was meant to change)."""
    if run is None:
        return False, f"no verifying audit run with id {prefix}*"
    if run["status"] not in COMPLETED:
        return False, f"verifying audit {run['run_id']} is {run['status']}: {run.get('error')}"
    c = run["counts"]
    severities = ", ".join(
        f"{k.removeprefix('severity_')} {v}"
        for k, v in sorted(c.items())
        if k.startswith("severity_")
    )
    summary = (
        f"verifying audit {run['run_id']}: {c.get(CountKey.UNDERREPLICATED_LEDGERS, 0)} "
        f"under-replicated ledgers, {c.get(CountKey.FRAGMENTS, 0)} fragments"
        + (f" ({severities})" if severities else "")
        + f", {c.get('metadata_errors', 0)} unreadable znodes"
    )
    if dry_run:
        return True, summary + "; dry run, nothing was repaired"
    if run["status"] != RunStatus.COMPLETED:
        return False, summary + f"; {run['status']}: {unread(run)}"
    return not has_findings(run), summary


def drop_empty(args: Sequence[Any] | None) -> list[Any]:
    """Rendered command-line arguments without the empty ones, so a flag can be made
    conditional in a template (``"{{ '--dry-run' if params.dry_run else '' }}"``)."""
    return [a for a in (args or []) if a is not None and str(a) != ""]
