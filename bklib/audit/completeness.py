"""Whether an audit run read everything it meant to: the one rule behind its status
(COMPLETED or COMPLETED_WITH_ERRORS), its exit status and the listings' first line
(docs/exit-status.md). Unknown is neither present nor missing, so a run that could not read
something never reads as clean."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bklib.states import CountKey, Reason, RunStatus

__all__ = ["incomplete_line", "incomplete_reasons", "run_status", "shortfall"]


def shortfall(counts: Mapping[str, int]) -> dict[str, int]:
    """What a run could not read, by what: unreadable znodes, findings of bookies that did not
    answer, and ledgers the scan could not account for (the directories announced more or
    fewer than it read, for no recorded reason). Empty for a run that read everything."""
    missed = {
        "unreadable znodes": counts.get(CountKey.METADATA_ERRORS, 0),
        "fragments on unreachable bookies": counts.get(
            CountKey.reason(Reason.BOOKIE_UNREACHABLE), 0
        ),
        "ledgers not accounted for": counts.get(CountKey.LEDGERS_UNACCOUNTED, 0),
    }
    return {what: n for what, n in missed.items() if n}


def incomplete_reasons(counts: Mapping[str, int]) -> str:
    """:func:`shortfall` as words, e.g. ``2 unreadable znodes, 44 fragments on unreachable
    bookies``; ``"the run failed part-way"`` when the counts name nothing."""
    missed = shortfall(counts)
    if not missed:
        return "the run failed part-way"
    return ", ".join(f"{n} {what}" for what, n in missed.items())


def run_status(counts: Mapping[str, int]) -> str:
    """COMPLETED, or COMPLETED_WITH_ERRORS when the run missed something (:func:`shortfall`):
    what could not be read is never reported as fine."""
    return RunStatus.COMPLETED_WITH_ERRORS if shortfall(counts) else RunStatus.COMPLETED


def incomplete_line(run: Mapping[str, Any]) -> str | None:
    """The first line of anything read from a run that missed something (any status but
    COMPLETED: a listing, a triage), or None over a complete run: what that run could not
    read is not in it."""
    if run["status"] == RunStatus.COMPLETED:
        return None
    return (
        f"INCOMPLETE: audit run {run['run_id']} is {run['status']} "
        f"({incomplete_reasons(run.get('counts') or {})}); ledgers it could not read are not "
        "listed, so this is not a clean bill: fix the cause and run `bkaudit audit` again"
    )
