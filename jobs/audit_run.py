"""What every audit run ends with, whichever executor ran it: its status and its summary line."""

from __future__ import annotations

from collections.abc import Mapping

from bklib.states import CountKey, Reason, RunStatus

__all__ = ["run_status", "summary_line"]


def run_status(counts: Mapping[str, int]) -> str:
    """COMPLETED, or COMPLETED_WITH_ERRORS when some znode was unreadable or some bookie did not
    answer: what could not be read is never reported as fine."""
    errors = counts.get(CountKey.METADATA_ERRORS, 0) + counts.get(
        CountKey.reason(Reason.BOOKIE_UNREACHABLE), 0
    )
    return RunStatus.COMPLETED_WITH_ERRORS if errors else RunStatus.COMPLETED


def summary_line(run_id: str, status: str, counts: Mapping[str, int], executor: str) -> str:
    """The one line ``bkaudit audit`` prints."""
    c = counts
    return (
        f"audit {run_id} {status}: {c.get(CountKey.LEDGERS, 0)} ledgers, "
        f"{c.get(CountKey.UNDERREPLICATED_LEDGERS, 0)} under-replicated, "
        f"{c.get(CountKey.FRAGMENTS, 0)} fragments, {c.get(CountKey.MISSING_ENTRIES, 0)} missing "
        f"entries, {c.get(CountKey.METADATA_ERRORS, 0)} unreadable znodes [{executor}]"
    )
