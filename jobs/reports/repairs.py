"""The report's repair-run queries: each repair run (a dry run marked as one), the repairs
that failed with their reasons, and the steps left to an operator. Plain Python over rows of
``replication_actions`` (rows in, rows out, as :mod:`jobs.reports.queries`);
:mod:`jobs.reports.data` reduces the table in Arrow first.

A dry run (``--dry-run``) writes PLANNED rows (:data:`bklib.repair.outcome.DRY_RUN`: a run
with any is a dry run); it changes nothing, so a step it could not plan is not a repair that
failed (older dry runs wrote such steps FAILED; docs/repair.md).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from bklib.pulsar.unload import topics_awaiting_unload
from bklib.repair.outcome import DRY_RUN
from bklib.states import ActionStatus
from jobs.reports.queries import Row

FAILURE_STATUSES = (ActionStatus.FAILED, ActionStatus.LOCKED, ActionStatus.DISABLED)
"""Unfinished statuses a later run retries that are not waits: the repair did not happen.
(WAITING_GRACE and NO_REPLICA are the stuck ledgers' table, :data:`~jobs.reports.queries.
STUCK_STATUSES`.)"""


def repair_runs(per_status: Iterable[Mapping[str, Any]]) -> list[Row]:
    """One row per repair run from its rows counted per status (run_id, mode, status,
    actions, started_at: the first start, finished_at: the last finish), newest first.

    Keys: run_id, mode, started_at, finished_at, dry_run, actions, statuses (status ->
    actions, in :class:`~bklib.states.ActionStatus` order of appearance).
    """
    runs: dict[str, Row] = {}
    for r in per_status:
        run = runs.setdefault(
            r["run_id"],
            {"run_id": r["run_id"], "mode": r["mode"], "started_at": r["started_at"],
             "finished_at": r["finished_at"], "dry_run": False, "actions": 0, "statuses": {}},
        )  # fmt: skip
        run["started_at"] = _min(run["started_at"], r["started_at"])
        run["finished_at"] = _max(run["finished_at"], r["finished_at"])
        run["actions"] += r["actions"]
        run["statuses"][r["status"]] = run["statuses"].get(r["status"], 0) + r["actions"]
        run["dry_run"] = run["dry_run"] or r["status"] == DRY_RUN
    return sorted(runs.values(), key=lambda r: (r["started_at"], r["run_id"]), reverse=True)


def failed_repairs(
    failing: Iterable[Mapping[str, Any]],
    latest_run: Mapping[int, str],
    latest_real_run: Mapping[int, str],
    dry_runs: Collection[str],
) -> list[Row]:
    """The failing rows (status in :data:`FAILURE_STATUSES`) of each ledger's latest repair
    run that was not a dry run (``latest_real_run``: ledger -> run_id), with the reason as
    the row's error, and those of a dry run that is the ledger's latest run of all
    (``latest_run``), marked: a later dry run changes nothing, so it does not hide a real
    failure. By ledger, segment, dry runs last. Keys: ledger_id, segment_first_entry_id,
    action, status, old_bookie, new_bookie, error, run_id, started_at, dry_run."""

    def shown(a: Mapping[str, Any]) -> bool:
        latest = latest_run if a["run_id"] in dry_runs else latest_real_run
        return a["status"] in FAILURE_STATUSES and latest.get(a["ledger_id"]) == a["run_id"]

    out = [
        {
            "ledger_id": a["ledger_id"],
            "segment_first_entry_id": a["segment_first_entry_id"],
            "action": a["action"],
            "status": a["status"],
            "old_bookie": a["old_bookie"],
            "new_bookie": a["new_bookie"],
            "error": a["error"],
            "run_id": a["run_id"],
            "started_at": a["started_at"],
            "dry_run": a["run_id"] in dry_runs,
        }
        for a in failing
        if shown(a)
    ]
    return sorted(
        out, key=lambda r: (r["ledger_id"], r["dry_run"], r["segment_first_entry_id"] or 0)
    )


def manual_steps(actions: Iterable[Mapping[str, Any]]) -> list[Row]:
    """Steps left to an operator: the topics still awaiting an unload
    (:func:`bklib.pulsar.unload.topics_awaiting_unload`, the listing's rule) whose latest
    MANUAL row carries the command to run; oldest first. A FAILED unload (the admin API
    refused) is a failure, not a step. Keys: action, topic, ledger_id, error (what to run),
    run_id, started_at."""
    rows = list(actions)
    awaiting = set(topics_awaiting_unload(rows))
    latest: dict[str, Mapping[str, Any]] = {}
    for a in rows:
        t = a.get("topic")
        if a["status"] != ActionStatus.MANUAL or t not in awaiting:
            continue
        if t not in latest or a["started_at"] >= latest[t]["started_at"]:
            latest[t] = a
    out = [
        {k: a.get(k) for k in ("action", "topic", "ledger_id", "error", "run_id", "started_at")}
        for a in latest.values()
    ]
    return sorted(out, key=lambda r: (r["started_at"], str(r["topic"])))


def _min(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else min(a, b)


def _max(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else max(a, b)
