"""What the repair runs since an audit left each ledger in: the one rule for "resolved by a
later repair", which ``listunderreplicated``, the HTML report, whatif, triage and maintain's
retention all apply to the rows of ``replication_actions``."""

from __future__ import annotations

from typing import Any

from bklib.states import ActionKind, ActionStatus

__all__ = ["DRY_RUN", "REPAIRED", "RESOLVED", "as_planned", "repair_status"]

REPAIRED = "REPAIRED"
"""A ledger whose latest repair since the audit did its work and left nothing to do."""

DRY_RUN = ActionStatus.PLANNED
"""The outcome of a ledger whose deciding run was a dry run: only ``--dry-run`` writes
PLANNED (:func:`as_planned`), so a reader marks it as a dry run (never as a repair), and the
deciding row's ``error``, if any, is what the real run would meet (docs/repair.md)."""


def as_planned(status: str) -> str:
    """The status a dry run records for a step whose real run would end in ``status``: a dry
    run does nothing, so nothing of it failed, waited or was locked out; each such step is
    PLANNED, and its row's ``error`` says why the real run would not do it. SKIPPED stays
    (nothing to do is a fact the dry run read, as a real run would)."""
    return status if status in ActionStatus.FINAL else ActionStatus.PLANNED


def repair_status(
    actions: list[dict[str, Any]], since: Any
) -> dict[int, tuple[str, dict[str, Any]]]:
    """Per ledger, what the repair runs that started after ``since`` left it in, with the
    deciding run's last action row: REPAIRED (a run did its work and left nothing to do),
    SKIPPED (nothing to do: already repaired or deleted), PLANNED (:data:`DRY_RUN`), or the first
    unfinished status (WAITING_GRACE, FAILED, NO_REPLICA, LOCKED, ...). A later run that only
    skips the ledger does not undo an earlier repair, and a dry run undoes no real run's
    outcome: it decides only a ledger no real run has touched since."""
    runs: dict[int, dict[str, list[dict[str, Any]]]] = {}
    for a in sorted(actions, key=lambda a: a["started_at"]):
        if a["action"] in ActionKind.NOT_LEDGER_REPAIRS:
            continue
        if since is None or a["started_at"] >= since:
            runs.setdefault(a["ledger_id"], {}).setdefault(a["run_id"], []).append(a)
    out: dict[int, tuple[str, dict[str, Any]]] = {}
    for lid, by_run in runs.items():
        decided = [(_run_outcome(rows), rows) for rows in by_run.values()]  # in start order
        if any(outcome != DRY_RUN for outcome, _ in decided):  # a plan changed nothing
            decided = [(outcome, rows) for outcome, rows in decided if outcome != DRY_RUN]
        for outcome, rows in decided:
            if outcome == ActionStatus.SKIPPED and out.get(lid, ("",))[0] == REPAIRED:
                continue
            out[lid] = (outcome, rows[-1])
    return out


def _run_outcome(rows: list[dict[str, Any]]) -> str:
    """One run's outcome for one ledger: its first unfinished status, else REPAIRED when it
    did work, else its last row's (final) status."""
    unfinished = [r["status"] for r in rows if r["status"] not in ActionStatus.FINAL]
    if unfinished:
        return str(unfinished[0])
    if any(r["status"] == ActionStatus.DONE for r in rows):
        return REPAIRED
    return str(rows[-1]["status"])


RESOLVED = (REPAIRED, ActionStatus.SKIPPED)
"""Outcomes after which nothing is left to do for a ledger."""
