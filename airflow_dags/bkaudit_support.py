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
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

# The Airflow worker may have the checkout (BKAUDIT_HOME) rather than the installed package;
# bklib.states, bklib.audit.checks and jobs.tables need nothing beyond the standard library,
# pyarrow and deltalake.
_HOME = os.environ.get("BKAUDIT_HOME") or str(Path(__file__).resolve().parents[1])
if _HOME not in sys.path:
    sys.path.append(_HOME)

from bklib.audit.checks import DEFAULT_CHECK, replication_names  # noqa: E402
from bklib.audit.checks.render import dag_description  # noqa: E402
from bklib.states import CountKey, Reason, RunStatus  # noqa: E402
from jobs.tables.schema import AUDIT_RUNS  # noqa: E402

COMPLETED = RunStatus.FINISHED

TASK_REPAIR = "rereplicate"
TASK_CLEAN = "no_findings"


def check_param() -> dict[str, Any]:
    """The DAG's ``check`` Param (default, enum, description), from the check registry: the
    replication checks, since the DAG repairs what ``audit_runs`` lists (``pulsar`` has tables
    of its own)."""
    return {
        "default": DEFAULT_CHECK,
        "enum": list(replication_names()),
        "description": dag_description(),
    }


def run_stamp(dag_run: Any) -> str:
    """The DAG run's time as ``YYYYMMDDTHHMMSS`` (UTC), the part of the audit run ids that ties
    them to one DAG run. It is ``ts_nodash`` whenever the run has a logical date, as every
    Airflow 2 run and every scheduled Airflow 3 run does; an Airflow 3 run triggered without
    one (``airflow dags trigger``, the REST API) has no ``ts_nodash`` in its context, so its
    ``run_after`` (when it was due) stands in."""
    when = getattr(dag_run, "logical_date", None) or getattr(dag_run, "run_after", None)
    if not isinstance(when, datetime):
        raise RuntimeError(f"DAG run {getattr(dag_run, 'run_id', dag_run)!r} has no date")
    if when.tzinfo is not None:
        when = when.astimezone(timezone.utc)
    return when.strftime("%Y%m%dT%H%M%S")


def secret_file_args(zk_auth_file: str | None, password_file: str | None = None) -> list[str]:
    """``--zk-auth-file``/``--password-file`` for a job's command line. Only paths go on the
    command line: spark-submit's arguments are in the task log and in the rendered-template
    view, so the secrets themselves come from these files or from ``$BKAUDIT_ZK_AUTH`` /
    ``$BKAUDIT_PASSWORD`` in the worker's environment, which spark-submit inherits."""
    args: list[str] = []
    if zk_auth_file:
        args += ["--zk-auth-file", zk_auth_file]
    if password_file:
        args += ["--password-file", password_file]
    return args


def run_id_prefix(dag_run_ts: str, step: str) -> str:
    """Audit run ids the DAG gives a step: ``airflow-<run stamp>-<step>-t<try>``. The try
    number keeps a retried audit from appending rows under the failed attempt's id."""
    return f"airflow-{dag_run_ts}-{step}-t"


def _counts(value: Any) -> dict[str, int]:
    # A Delta map column comes back from Arrow as a list of (key, value) pairs.
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return {str(k): int(v) for k, v in value.items()}
    return {str(k): int(v) for k, v in value}


def read_audit_runs(
    warehouse: str, storage_options: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """All rows of ``audit_runs`` (one per run, so small) as dicts, read with delta-rs through
    :func:`jobs.tables.delta.read_rows`, like every other bkaudit reader: whatever the tables'
    partitioning, and refusing a warehouse whose schema version is newer than this code.

    ``storage_options`` (object-store settings such as ``AWS_REGION``) go into this task
    process's environment, where delta-rs reads them; settings already there win."""
    from jobs.tables.delta import read_rows

    for key, value in (storage_options or {}).items():
        os.environ.setdefault(key.upper(), str(value))
    cols = ["run_id", "started_at", "finished_at", "check", "status", "counts", "error"]
    rows = read_rows(warehouse, AUDIT_RUNS, columns=cols)
    for r in rows:
        r["counts"] = _counts(r.get("counts"))
        r.setdefault("error", None)
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
        f"{k.removeprefix(CountKey.SEVERITY_PREFIX)} {v}"
        for k, v in sorted(c.items())
        if k.startswith(CountKey.SEVERITY_PREFIX)
    )
    summary = (
        f"verifying audit {run['run_id']}: {c.get(CountKey.UNDERREPLICATED_LEDGERS, 0)} "
        f"under-replicated ledgers, {c.get(CountKey.FRAGMENTS, 0)} fragments"
        + (f" ({severities})" if severities else "")
        + f", {c.get(CountKey.METADATA_ERRORS, 0)} unreadable znodes"
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
